"""YASMF-BLAKE3 hashes, the hash format of p2panda entries and operation ids.

A YASMF hash is the VarU64 hash type (0 = BLAKE3), the VarU64 digest length
(32) and the digest: ``00 20 <32 bytes>``, 34 bytes in all. Ids (operation,
document, view) are the lowercase hex of those 34 bytes, 68 characters, so
they compare and sort as strings exactly as the bytes do.
"""

from __future__ import annotations

from blake3 import blake3

from sdk.documents.errors import HashError

#: Type 0 (BLAKE3) and length 32, both single-byte VarU64s.
YASMF_BLAKE3_PREFIX = b"\x00\x20"
HASH_SIZE = 34
HEX_ID_LENGTH = 2 * HASH_SIZE
_HEX_DIGITS = frozenset("0123456789abcdef")


def yasmf_hash(data: bytes) -> bytes:
    """Return the 34-byte YASMF-BLAKE3 hash of ``data``."""
    return YASMF_BLAKE3_PREFIX + blake3(data).digest()


def hash_id(data: bytes) -> str:
    """Return the hex id (68 lowercase characters) of the YASMF hash of ``data``."""
    return yasmf_hash(data).hex()


def decode_hash(data: bytes, offset: int) -> tuple[bytes, int]:
    """Read one YASMF-BLAKE3 hash at ``offset``; return ``(hash bytes, offset after)``."""
    end = offset + HASH_SIZE
    if end > len(data):
        raise HashError("data ends inside a hash")
    if data[offset : offset + 2] != YASMF_BLAKE3_PREFIX:
        raise HashError("hash is not YASMF BLAKE3 (type 0, length 32)")
    return data[offset:end], end


def is_hash_id(value: str) -> bool:
    """True if ``value`` is a canonical hex id of a YASMF-BLAKE3 hash."""
    return (
        len(value) == HEX_ID_LENGTH and value.startswith("0020") and _HEX_DIGITS.issuperset(value)
    )


def check_hash_id(value: str) -> str:
    """Return ``value`` if it is a hex YASMF-BLAKE3 id, else raise :class:`HashError`."""
    if not is_hash_id(value):
        raise HashError(f"{value[:80]!r} is not a lowercase hex YASMF-BLAKE3 hash")
    return value


__all__ = [
    "HASH_SIZE",
    "HEX_ID_LENGTH",
    "YASMF_BLAKE3_PREFIX",
    "check_hash_id",
    "decode_hash",
    "hash_id",
    "is_hash_id",
    "yasmf_hash",
]
