"""Bamboo entries with their tag: regular (0) and end-of-log (1).

The entry layout, signatures, hashes and lipmaa links are those of
:mod:`sdk.documents.bamboo`; this module only adds what point-to-point needs on
top: the tag byte (p2panda logs never end, so the document layer accepts tag 0
only, while this protocol must carry and detect end-of-log entries), building an
entry from the metadata that travels on the data channel, and decoding a full
entry from inside a longer message (cancellations 133 and 135 carry them).

The tag is the first byte of ``Entry.encoded``; the signature and the hash cover
it as they cover every other byte.
"""

from __future__ import annotations

from sdk.documents import bamboo
from sdk.documents.bamboo import AUTHOR_SIZE, SIGNATURE_SIZE, Entry, links_expected
from sdk.documents.errors import DocumentError
from sdk.documents.hashing import decode_hash, yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.documents.varu64 import decode_varu64
from sdk.sync.bamboo_p2p.errors import MalformedMessage

LogKey = tuple[bytes, int]
"""A log: (author public key, log id)."""

TAG_REGULAR = 0
TAG_END_OF_LOG = 1


def entry_tag(entry: Entry) -> int:
    """The tag byte of ``entry``: 0 regular, 1 end-of-log."""
    return entry.encoded[0]


def is_end_of_log(entry: Entry) -> bool:
    """Whether ``entry`` ends its log (tag 1): no entry may follow it."""
    return entry.encoded[0] == TAG_END_OF_LOG


def build_entry(
    tag: int,
    author: bytes,
    log_id: int,
    seq_num: int,
    backlink: bytes | None,
    lipmaa_link: bytes | None,
    payload_size: int,
    payload_hash: bytes,
    signature: bytes,
) -> Entry:
    """The entry these fields encode, tag first (:func:`sdk.documents.bamboo.build_entry`)."""
    return bamboo.build_entry(
        author, log_id, seq_num, backlink, lipmaa_link, payload_size, payload_hash, signature, tag
    )


def sign_log_entry(
    key: KeyPair,
    log_id: int,
    seq_num: int,
    payload: bytes,
    backlink: bytes | None = None,
    lipmaa_link: bytes | None = None,
    *,
    end_of_log: bool = False,
) -> Entry:
    """Sign entry ``seq_num`` of ``key``'s log ``log_id``; ``end_of_log`` sets tag 1.

    :func:`sdk.documents.bamboo.sign_entry` with the tag and without the document
    layer's bound on an operation (the endpoints agree on their own, ``max_payload``).
    """
    return bamboo.sign_entry(
        key,
        log_id,
        seq_num,
        payload,
        backlink,
        lipmaa_link,
        tag=TAG_END_OF_LOG if end_of_log else TAG_REGULAR,
        max_payload=None,
    )


def decode_full_entry(data: bytes, pos: int, entry_hash: bytes | None = None) -> tuple[Entry, int]:
    """Decode one complete encoded entry starting at ``pos``; return it and the end.

    Raises only :class:`MalformedMessage`. The signature is not checked here.
    Every field is read in its one canonical form (VarU64s in their shortest form),
    so the bytes read *are* the entry's encoding; ``entry_hash``, when the caller
    already knows it (a store that kept it), saves hashing them again.
    """
    try:
        if pos >= len(data):
            raise MalformedMessage("data ends before an entry")
        tag = data[pos]
        if tag not in (TAG_REGULAR, TAG_END_OF_LOG):
            raise MalformedMessage(f"entry tag {tag}; 0 and 1 exist")
        start = pos + 1
        if start + AUTHOR_SIZE > len(data):
            raise MalformedMessage("data ends inside an entry's author")
        author = bytes(data[start : start + AUTHOR_SIZE])
        log_id, p = decode_varu64(data, start + AUTHOR_SIZE)
        seq_num, p = decode_varu64(data, p)
        if seq_num == 0:
            raise MalformedMessage("entry with sequence number 0")
        has_lipmaa, has_backlink = links_expected(seq_num)
        lipmaa_link = backlink = None
        if has_lipmaa:
            lipmaa_link, p = decode_hash(data, p)
        if has_backlink:
            backlink, p = decode_hash(data, p)
        payload_size, p = decode_varu64(data, p)
        payload_hash, p = decode_hash(data, p)
        end = p + SIGNATURE_SIZE
        if end > len(data):
            raise MalformedMessage("data ends inside an entry's signature")
        signature = bytes(data[p:end])
    except DocumentError as exc:
        raise MalformedMessage(f"entry: {exc.detail}") from exc
    encoded = bytes(data[pos:end])
    entry = Entry(
        author=author,
        log_id=log_id,
        seq_num=seq_num,
        backlink=None if backlink is None else bytes(backlink),
        lipmaa_link=None if lipmaa_link is None else bytes(lipmaa_link),
        payload_size=payload_size,
        payload_hash=bytes(payload_hash),
        signature=signature,
        encoded=encoded,
        hash=yasmf_hash(encoded) if entry_hash is None else entry_hash,
    )
    return entry, end


__all__ = [
    "TAG_END_OF_LOG",
    "TAG_REGULAR",
    "LogKey",
    "build_entry",
    "decode_full_entry",
    "entry_tag",
    "is_end_of_log",
    "sign_log_entry",
]
