"""Bamboo entries: the signed, hash-linked log records that carry operations.

Layout of an encoded entry (Bamboo specification, "Encoding"; p2panda uses
ed25519 signatures and YASMF-BLAKE3 hashes)::

    tag           1 byte   0 (1 would be an end-of-log entry, which p2panda does not use)
    author       32 bytes  ed25519 public key
    log_id       VarU64
    seq_num      VarU64    starts at 1
    lipmaa_link  34 bytes  only if seq_num > 1 and lipmaa(seq_num) != seq_num - 1
    backlink     34 bytes  only if seq_num > 1: hash of the entry at seq_num - 1
    payload_size VarU64
    payload_hash 34 bytes
    signature    64 bytes  ed25519 over every byte before it

The entry hash (YASMF-BLAKE3 of all these bytes) is the operation id of the
operation in its payload. Lipmaa links make a log verifiable in logarithmic
hops; this module computes :func:`lipmaa` and checks links only for
presence; :mod:`.store` checks them against stored entries.

Signatures: :func:`signature_ok` is the one rule, libsodium's
``crypto_sign_open`` through PyNaCl. The reference, p2panda-rs 0.8.1, verifies
with ed25519-dalek 1.0.1 (``p2panda-rs/Cargo.toml`` line 35) through its
``Verifier::verify`` (``src/identity/key_pair.rs`` lines 131-139, called by
``src/entry/validate.rs`` line 108 and ``src/entry/decode.rs``): the key must
decode to a curve point, ``S`` must be below the group order, and the check is
cofactorless with the recomputed ``R`` compared byte for byte, so non-canonical
``S`` and ``R`` encodings are refused (dalek ``src/public.rs`` lines 322-354,
``src/signature.rs`` lines 83-101). libsodium applies the same equation and the
same encoding checks but is stricter in one respect: it refuses small-order
public keys and small-order ``R``, which dalek's ``verify`` accepts. So libsodium is
the fast path and never accepts what dalek refuses; a signature it refuses is asked
again of OpenSSL's Ed25519 (through ``cryptography``), whose answers equal dalek's on
every case of ``tests/documents/test_signature_rule.py`` (small-order keys and ``R``,
non-canonical ``S``, ``R`` and key encodings, mixed-order keys) against a pure-Python
model of the dalek rule. Valid entries cost one libsodium check (~90-110 us here);
only refused ones pay for the second check, and the answer is the reference's.
The other Python bindings measured here (ed25519-zebra, orlp's ref10) were not
faster, and zebra's (ZIP 215) and orlp's rules accept signatures dalek refuses; none
offers batch verification with dalek's answers (batch equations cannot tell a
torsion component in ``R`` apart, see ``docs/sync.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from blake3 import blake3
from cryptography.exceptions import InvalidSignature as _OpenSSLRefused
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from sdk.documents.errors import (
    EntryFormatError,
    InvalidSignature,
    PayloadMismatch,
    SequenceError,
    SizeLimitExceeded,
    UsageError,
)
from sdk.documents.hashing import HASH_SIZE, YASMF_BLAKE3_PREFIX, decode_hash, yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.documents.limits import MAX_ENTRY_SIZE, MAX_OPERATION_SIZE
from sdk.documents.varu64 import decode_varu64, encode_varu64
from sdk.documents.verifier import PARALLEL_VERIFY_MIN, VERIFY_CHUNK, LibsodiumChecks
from sdk.sds.records import fast_init

AUTHOR_SIZE = 32
SIGNATURE_SIZE = 64
#: Largest log id and sequence number accepted (signed 64-bit, what SQLite stores).
MAX_LOG_INTEGER = (1 << 63) - 1


@lru_cache(maxsize=1 << 16)
def lipmaa(n: int) -> int:
    """The sequence number the lipmaa link of entry ``n`` points to (Bamboo, "Links").

    Sequence numbers of the form (3^k - 1) / 2 (1, 4, 13, 40, ...) jump back to
    the previous such number; others jump within their ternary block. Cached:
    syncing a log asks for the same few targets once per entry.
    """
    m, po3, x = 1, 3, n
    # Smallest k with (3^k - 1) / 2 >= n.
    while m < x:
        po3 *= 3
        m = (po3 - 1) // 2
    po3 //= 3
    if m != x:
        # Longest back-jump: strip whole blocks until n sits at a block boundary.
        while x != 0:
            m = (po3 - 1) // 2
            po3 //= 3
            x %= m
        if m != po3:
            po3 = m
    return n - po3


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded or freshly signed Bamboo entry.

    ``backlink``, ``lipmaa_link`` and ``payload_hash`` are 34-byte YASMF hashes;
    ``lipmaa_link`` is ``None`` when it would equal the backlink (it is then not
    encoded). ``encoded`` is the entry's wire form and ``hash`` its id.
    """

    author: bytes
    log_id: int
    seq_num: int
    backlink: bytes | None
    lipmaa_link: bytes | None
    payload_size: int
    payload_hash: bytes
    signature: bytes
    encoded: bytes
    hash: bytes

    @property
    def id(self) -> str:
        """Hex id of the entry hash (= the operation id)."""
        return self.hash.hex()

    @property
    def author_hex(self) -> str:
        """Author public key as lowercase hex."""
        return self.author.hex()

    @property
    def lipmaa_seq_num(self) -> int:
        """Sequence number of the lipmaa link target (0 for the first entry)."""
        return lipmaa(self.seq_num) if self.seq_num > 1 else 0

    @property
    def signed_bytes(self) -> bytes:
        """The bytes the signature covers: the encoding without the signature."""
        return self.encoded[:-SIGNATURE_SIZE]

    def verify_signature(self) -> None:
        """Raise :class:`InvalidSignature` unless the author signed this entry."""
        if not self.signature_valid():
            raise InvalidSignature(f"entry {self.seq_num} of log {self.log_id}")

    def signature_valid(self) -> bool:
        """Whether the author signed this entry (:func:`signature_ok` on its bytes)."""
        return signature_ok(self.author, self.encoded[:-SIGNATURE_SIZE], self.signature)

    def verify_payload(self, payload: bytes) -> None:
        """Raise :class:`PayloadMismatch` unless ``payload`` is this entry's payload."""
        if len(payload) != self.payload_size:
            raise PayloadMismatch(
                f"payload is {len(payload)} bytes, the entry says {self.payload_size}"
            )
        if yasmf_hash(payload) != self.payload_hash:
            raise PayloadMismatch("payload hash differs from the entry's payload hash")


def signature_ok(author: bytes, signed: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``author``'s ed25519 signature of ``signed``: the rule.

    See the module docstring for how it relates to p2panda-rs. Wrong lengths are
    refused here, before libsodium reads a fixed-size buffer.
    """
    if len(author) != AUTHOR_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        crypto_sign_open(signature + signed, author)
    except (BadSignatureError, ValueError):
        pass
    else:
        return True
    # libsodium refuses small-order keys and R that the reference accepts: ask the
    # verifier whose rule equals dalek 1.0.1's (module docstring).
    try:
        Ed25519PublicKey.from_public_bytes(author).verify(signature, signed)
    except (_OpenSSLRefused, ValueError):
        return False
    return True


def links_expected(seq_num: int) -> tuple[bool, bool]:
    """``(lipmaa link encoded, backlink encoded)`` in the encoding of entry ``seq_num``."""
    if seq_num <= 1:
        return False, False
    return lipmaa(seq_num) != seq_num - 1, True


def encode_unsigned(
    author: bytes,
    log_id: int,
    seq_num: int,
    backlink: bytes | None,
    lipmaa_link: bytes | None,
    payload_size: int,
    payload_hash: bytes,
    tag: int = 0,
) -> bytes:
    """The entry bytes without the signature (what the author signs).

    ``tag`` is the first byte: 0 for every p2panda entry; Bamboo point-to-point
    also writes 1, end-of-log (:mod:`sdk.sync.bamboo_p2p.entries`).
    """
    has_lipmaa, has_backlink = links_expected(seq_num)
    if seq_num < 1:
        raise UsageError("sequence numbers start at 1")
    if has_backlink != (backlink is not None) or has_lipmaa != (lipmaa_link is not None):
        raise UsageError(f"links given do not fit seq_num {seq_num}")
    parts = [
        b"\x00" if tag == 0 else bytes((tag,)),
        author,
        encode_varu64(log_id),
        encode_varu64(seq_num),
    ]
    if lipmaa_link is not None:
        parts.append(lipmaa_link)
    if backlink is not None:
        parts.append(backlink)
    parts += [encode_varu64(payload_size), payload_hash]
    return b"".join(parts)


def build_entry(
    author: bytes,
    log_id: int,
    seq_num: int,
    backlink: bytes | None,
    lipmaa_link: bytes | None,
    payload_size: int,
    payload_hash: bytes,
    signature: bytes,
    tag: int = 0,
) -> Entry:
    """The entry these fields encode (not verified: call :meth:`Entry.verify_signature`)."""
    unsigned = encode_unsigned(
        author, log_id, seq_num, backlink, lipmaa_link, payload_size, payload_hash, tag
    )
    fields: _Fields = (author, log_id, seq_num, backlink, lipmaa_link, payload_size, payload_hash)
    return _entry(fields, unsigned, signature)


#: An entry's fields from author to payload hash, in :class:`Entry`'s order.
_Fields = tuple[bytes, int, int, bytes | None, bytes | None, int, bytes]


def _entry(fields: _Fields, unsigned: bytes, signature: bytes) -> Entry:
    """The entry of ``fields`` (author to payload hash), signed and encoded."""
    encoded = unsigned + signature
    return Entry(*fields, signature, encoded, yasmf_hash(encoded))


def sign_entry(
    key: KeyPair,
    log_id: int,
    seq_num: int,
    payload: bytes,
    backlink: bytes | None = None,
    lipmaa_link: bytes | None = None,
    *,
    tag: int = 0,
    max_payload: int | None = MAX_OPERATION_SIZE,
) -> Entry:
    """Sign a new entry carrying ``payload``.

    ``backlink`` is the hash of entry ``seq_num - 1``; ``lipmaa_link`` the hash
    of entry ``lipmaa(seq_num)``, passed only when that is not the backlink.
    ``max_payload`` bounds the payload (an operation's limit by default; ``None``
    for none, as Bamboo point-to-point, whose endpoints agree on their own bound);
    ``tag`` as in :func:`encode_unsigned`.
    """
    if max_payload is not None and len(payload) > max_payload:
        raise SizeLimitExceeded(f"payload of {len(payload)} bytes, limit {max_payload}")
    author = key.public_key
    payload_hash = yasmf_hash(payload)
    unsigned = encode_unsigned(
        author, log_id, seq_num, backlink, lipmaa_link, len(payload), payload_hash, tag
    )
    fields: _Fields = (author, log_id, seq_num, backlink, lipmaa_link, len(payload), payload_hash)
    return _entry(fields, unsigned, key.sign(unsigned))


def decode_entry(data: bytes) -> Entry:
    """Decode an entry from a peer's bytes; raise only ``MalformedInput`` subclasses.

    Checks the layout only. The signature is checked by
    :meth:`Entry.verify_signature`, the links against the log by the store.
    """
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data)
    if size > MAX_ENTRY_SIZE:
        raise SizeLimitExceeded(f"entry of {size} bytes, limit {MAX_ENTRY_SIZE}")
    if not data:
        raise EntryFormatError("empty entry")
    if data[0] != 0:
        # Tag 1 marks an end-of-log entry; p2panda logs never end.
        raise EntryFormatError(f"entry tag {data[0]}, only 0 is allowed")
    pos = 1 + AUTHOR_SIZE
    if pos > size:
        raise EntryFormatError("data ends inside the author key")
    # Log ids and sequence numbers below 248 are one byte (VarU64); the rest, and
    # every error, go through decode_varu64.
    if pos + 1 < size and data[pos] < 248 and data[pos + 1] < 248:
        log_id, seq_num, pos = data[pos], data[pos + 1], pos + 2
    else:
        log_id, pos = decode_varu64(data, pos)
        seq_num, pos = decode_varu64(data, pos)
    lipmaa_link = backlink = None
    if seq_num > 1:
        if seq_num > MAX_LOG_INTEGER or log_id > MAX_LOG_INTEGER:
            # Stores keep them as signed 64-bit integers (SQLite); no real log gets near.
            raise SequenceError(f"log ids and sequence numbers stop at {MAX_LOG_INTEGER}")
        if lipmaa(seq_num) != seq_num - 1:
            lipmaa_link, pos = _read_hash(data, pos)
        backlink, pos = _read_hash(data, pos)
    elif seq_num < 1:
        raise SequenceError("sequence number 0; logs start at 1")
    elif log_id > MAX_LOG_INTEGER:
        raise SequenceError(f"log ids and sequence numbers stop at {MAX_LOG_INTEGER}")
    # A payload size below 248 is one byte; the rest, and every error, go through
    # decode_varu64.
    if pos < size and data[pos] < 248:
        payload_size = data[pos]
        pos += 1
    else:
        payload_size, pos = decode_varu64(data, pos)
        if payload_size > MAX_OPERATION_SIZE:
            raise SizeLimitExceeded(f"payload of {payload_size} bytes, limit {MAX_OPERATION_SIZE}")
    end = pos + HASH_SIZE
    if end <= size and data[pos] == 0 and data[pos + 1] == 0x20:
        payload_hash, pos = data[pos:end], end
    else:
        payload_hash, pos = decode_hash(data, pos)  # raises the typed error
    end = pos + SIGNATURE_SIZE
    if end != size:
        if end > size:
            raise EntryFormatError("data ends inside the signature")
        raise EntryFormatError(f"{size - end} trailing bytes after the signature")
    return Entry(
        data[1 : 1 + AUTHOR_SIZE],
        log_id,
        seq_num,
        backlink,
        lipmaa_link,
        payload_size,
        payload_hash,
        data[pos:],
        data,
        YASMF_BLAKE3_PREFIX + blake3(data).digest(),
    )


def _read_hash(data: bytes, pos: int) -> tuple[bytes, int]:
    """The YASMF hash at ``pos`` and the position after it (:func:`decode_hash`'s errors)."""
    end = pos + HASH_SIZE
    if end <= len(data) and data[pos] == 0 and data[pos + 1] == 0x20:
        return data[pos:end], end
    return decode_hash(data, pos)  # raises the typed error


# An Entry is built for every entry a peer sends: its __init__ sets the slots through
# their descriptors instead of the frozen dataclass's object.__setattr__ per field.
fast_init(Entry)


class SignatureChecks:
    """The signatures of a batch, being checked on verification threads in batch order.

    libsodium's answers come from :class:`~sdk.documents.verifier.LibsodiumChecks`
    (a compiled loop that holds no GIL between checks, so they are computed on
    another core while the caller does the rest of the validation); a signature
    libsodium refuses is decided here by :func:`signature_ok`. :meth:`valid` waits
    only for the answer it needs. The answers are those of
    :meth:`Entry.signature_valid`, one by one.

    A batch can also be :meth:`growing`: entries are :meth:`add`-ed as they are
    decoded and checked a chunk at a time meanwhile, then the batch is handed to
    ``DocumentStore.ingest_many(items, checks=...)``.
    """

    __slots__ = ("_checks", "_entries")

    def __init__(self, entries: Sequence[Entry]) -> None:
        self._entries = entries
        self._checks = LibsodiumChecks(
            [entry.author for entry in entries],
            [entry.encoded for entry in entries],
            [entry.signature for entry in entries],
        )

    @classmethod
    def growing(cls, capacity: int) -> SignatureChecks:
        """An empty batch of up to ``capacity`` entries, checked as they are added."""
        checks = cls.__new__(cls)
        checks._entries = []
        checks._checks = LibsodiumChecks.growing(capacity)
        return checks

    def add(self, entry: Entry) -> None:
        """Append ``entry`` to a :meth:`growing` batch; its check may start at once."""
        self._checks.add(entry.author, entry.encoded, entry.signature)
        assert isinstance(self._entries, list)
        self._entries.append(entry)

    def seal(self) -> None:
        """End a :meth:`growing` batch (the last chunk's checks start); no-op otherwise."""
        self._checks.seal()

    def covers(self, entries: Sequence[Entry]) -> bool:
        """Whether this batch is exactly ``entries`` (the same objects, in order)."""
        return len(entries) == len(self._entries) and all(
            a is b for a, b in zip(entries, self._entries, strict=True)
        )

    def valid(self, index: int) -> bool:
        """Whether entry ``index`` of the batch is signed by its author (waits for it)."""
        if self._checks.accepted(index):
            return True
        # Refused by libsodium: the rule's second opinion (module docstring).
        return self._entries[index].signature_valid()

    def all(self) -> list[bool]:
        """Every answer, in batch order."""
        return [self.valid(i) for i in range(len(self._entries))]

    def cancel(self) -> None:
        """Stop the checks not done yet (the caller stopped reading the batch)."""
        self._checks.cancel()


def start_verifying(entries: Sequence[Entry]) -> SignatureChecks:
    """Start checking the signatures of ``entries``; read them with ``valid(i)``."""
    return SignatureChecks(entries)


def verify_signatures(entries: Sequence[Entry]) -> list[bool]:
    """``signature_valid()`` of each entry, computed on verification threads for a large batch."""
    return SignatureChecks(entries).all()


__all__ = [
    "AUTHOR_SIZE",
    "HASH_SIZE",
    "MAX_LOG_INTEGER",
    "PARALLEL_VERIFY_MIN",
    "SIGNATURE_SIZE",
    "VERIFY_CHUNK",
    "Entry",
    "SignatureChecks",
    "build_entry",
    "decode_entry",
    "encode_unsigned",
    "lipmaa",
    "sign_entry",
    "signature_ok",
    "start_verifying",
    "verify_signatures",
]
