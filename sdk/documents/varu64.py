"""VarU64, the variable-length unsigned integer encoding Bamboo uses.

Rule (github.com/AljoschaMeyer/varu64): a value below 248 is one byte. Otherwise
the first byte is ``247 + n`` and ``n`` (1..8) big-endian bytes follow, with ``n``
the fewest bytes that hold the value. Any longer form is non-canonical and
rejected, so every number has exactly one encoding and entry hashes are stable.
"""

from __future__ import annotations

from sdk.documents.errors import VarU64Error

MAX_U64 = (1 << 64) - 1


def encode_varu64(value: int) -> bytes:
    """Encode ``value`` (0..2^64-1) in its canonical VarU64 form."""
    if value < 248:
        if value < 0:
            raise ValueError("VarU64 encodes non-negative integers only")
        return bytes((value,))
    if value > MAX_U64:
        raise ValueError("VarU64 encodes integers below 2^64 only")
    n = (value.bit_length() + 7) // 8
    return bytes((247 + n,)) + value.to_bytes(n, "big")


def decode_varu64(data: bytes, offset: int = 0) -> tuple[int, int]:
    """Decode one VarU64 at ``offset``; return ``(value, offset after it)``.

    Raises :class:`VarU64Error` if the bytes end early or the form is not the
    shortest one.
    """
    if offset >= len(data):
        raise VarU64Error("data ends before a VarU64")
    first = data[offset]
    if first < 248:
        return first, offset + 1
    n = first - 247
    end = offset + 1 + n
    if end > len(data):
        raise VarU64Error(f"VarU64 announces {n} bytes, fewer remain")
    value = int.from_bytes(data[offset + 1 : end], "big")
    # Canonical: one byte is only allowed for values >= 248, and n bytes only when
    # n - 1 bytes would not suffice.
    if (n == 1 and value < 248) or (n > 1 and value < (1 << (8 * (n - 1)))):
        raise VarU64Error(f"VarU64 {value} not in its shortest form")
    return value, end


__all__ = ["MAX_U64", "decode_varu64", "encode_varu64"]
