"""Bamboo entries with their tag: regular (0) and end-of-log (1).

The entry layout, signatures, hashes and lipmaa links are those of
:mod:`sdk.documents.bamboo`; this module only adds what point-to-point needs on
top: the tag byte (p2panda logs never end, so the document layer accepts tag 0
only, while this protocol must carry and detect end-of-log entries), and decoding
a full entry from inside a longer message (cancellations 133 and 135 carry them).

The tag is the first byte of ``Entry.encoded``; the signature and the hash cover
it as they cover every other byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sdk.documents import bamboo
from sdk.documents.bamboo import AUTHOR_SIZE, SIGNATURE_SIZE, Entry, links_expected
from sdk.documents.errors import DocumentError
from sdk.documents.hashing import decode_hash, yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.documents.varu64 import decode_varu64
from sdk.sync.bamboo_p2p.errors import MalformedMessage
from sdk.sync.fields import FieldReader

_T = TypeVar("_T")

LogKey = tuple[bytes, int]
"""A log: (author public key, log id)."""

TAG_REGULAR = 0
TAG_END_OF_LOG = 1


def entry_tag(entry: Entry) -> int:
    """The tag byte of ``entry``: 0 regular, 1 end-of-log."""
    return entry.encoded[0]


def is_end_of_log(entry: Entry) -> bool:
    """Whether ``entry`` ends its log (tag 1): no entry may follow it."""
    return entry_tag(entry) == TAG_END_OF_LOG


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
    tag = TAG_END_OF_LOG if end_of_log else TAG_REGULAR
    return bamboo.sign_entry(
        key, log_id, seq_num, payload, backlink, lipmaa_link, tag=tag, max_payload=None
    )


class EntryReader(FieldReader):
    """Reads Bamboo's fields in order (VarU64s, YASMF hashes, whole entries) from
    ``pos`` on; any malformed or missing byte is :class:`MalformedMessage`. Entries
    inside longer messages (cancellations 133 and 135) and stored ones are read so."""

    __slots__ = ()

    def __init__(self, data: bytes, pos: int = 0) -> None:
        # FieldReader's fields, set here at once: a reader is made per message.
        self.data, self.pos, self.malformed = data, pos, MalformedMessage

    def u64(self, what: str) -> int:
        """The next VarU64 (in its shortest form)."""
        return self._decode(decode_varu64, what)

    def hash(self, what: str) -> bytes:
        """The next YASMF-BLAKE3 hash."""
        return bytes(self._decode(decode_hash, what))

    def _decode(self, decode: Callable[[bytes, int], tuple[_T, int]], what: str) -> _T:
        try:
            value, self.pos = decode(self.data, self.pos)
        except DocumentError as exc:
            raise MalformedMessage(f"{what}: {exc.detail}") from exc
        return value

    def entry(self, entry_hash: bytes | None = None) -> Entry:
        """The next complete encoded entry; its signature is not checked here.

        Every field is read in its one canonical form (VarU64s in their shortest form),
        so the bytes read *are* the entry's encoding; ``entry_hash``, when the caller
        already knows it (a store that kept it), saves hashing them again.
        """
        start = self.pos
        tag = self.byte("an entry")
        if tag not in (TAG_REGULAR, TAG_END_OF_LOG):
            raise MalformedMessage(f"entry tag {tag}; 0 and 1 exist")
        author = bytes(self.take(AUTHOR_SIZE, "an entry's author"))
        log_id = self.u64("entry log id")
        seq_num = self.u64("entry sequence number")
        if seq_num == 0:
            raise MalformedMessage("entry with sequence number 0")
        has_lipmaa, has_backlink = links_expected(seq_num)
        lipmaa_link = self.hash("entry lipmaa link") if has_lipmaa else None
        backlink = self.hash("entry backlink") if has_backlink else None
        payload_size = self.u64("entry payload size")
        payload_hash = self.hash("entry payload hash")
        signature = bytes(self.take(SIGNATURE_SIZE, "an entry's signature"))
        encoded = bytes(self.data[start : self.pos])
        return Entry(
            author=author,
            log_id=log_id,
            seq_num=seq_num,
            backlink=backlink,
            lipmaa_link=lipmaa_link,
            payload_size=payload_size,
            payload_hash=payload_hash,
            signature=signature,
            encoded=encoded,
            hash=yasmf_hash(encoded) if entry_hash is None else entry_hash,
        )


__all__ = [
    "TAG_END_OF_LOG",
    "TAG_REGULAR",
    "EntryReader",
    "LogKey",
    "entry_tag",
    "is_end_of_log",
    "sign_log_entry",
]
