"""Unsigned LEB128 varints (protobuf's base-128 varint), the one codec for them.

Seven bits a byte, least significant group first, the top bit set on every byte
but the last. Every wire of the project that writes a number this way uses
these functions: the SDS message (:mod:`sdk.sds.message`, protobuf), the sync
frame prefix (:mod:`sdk.sync.framing`), range-index nodes (:mod:`sdk.sync.rbsr`),
store-to-store sync (:mod:`store_node.store_sync.wire`), collection sync
(:mod:`sdk.sync.collection`). It lives in the SDS core because the core may
import nothing from the sync layer, while the sync layer may import the core.

Readers differ only in how long a varint they accept (``max_bytes``), whether
they insist on the shortest form (:func:`read_canonical_uvarint`) and in the
error they report to their peer; they catch :class:`VarintError` and say it in
their own words.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "UVARINTS",
    "VarintError",
    "encode_uvarint",
    "read_canonical_uvarint",
    "read_uvarint",
    "write_uvarint",
]


_MESSAGES = {
    "truncated": "truncated varint",
    "too long": "varint too long",
    "not shortest": "varint not in its shortest form",
}


class VarintError(ValueError):
    """A varint that ends with the data, runs over ``max_bytes`` (or 64 bits), or,
    where only the shortest form is accepted, has a needless trailing zero group."""

    def __init__(self, reason: Literal["truncated", "too long", "not shortest"]) -> None:
        super().__init__(_MESSAGES[reason])
        #: ``"truncated"``, ``"too long"`` or ``"not shortest"``.
        self.reason = reason

    @property
    def truncated(self) -> bool:
        """Whether the data ended first (more bytes could complete it)."""
        return self.reason == "truncated"


def _encode(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_uvarint(out: bytearray, value: int) -> None:
    """Append ``value`` (>= 0) to ``out``."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


#: The encodings of 0 .. 2**15 - 1, by value: every id, entry, filter and most
#: frames have a length below 32 KiB, and a table lookup is the fastest encoder
#: (hot encoders index it inline: ``UVARINTS[n] if n < 32_768 else encode_uvarint(n)``).
UVARINTS: tuple[bytes, ...] = tuple(_encode(n) for n in range(1 << 15))


def encode_uvarint(value: int) -> bytes:
    """The bytes of ``value`` (>= 0)."""
    return UVARINTS[value] if value < 32_768 else _encode(value)


def read_uvarint(data: bytes, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the position after it.

    Raises :class:`VarintError` if the data ends inside it or it is longer than
    ``max_bytes`` (10 covers any 64-bit value; 5 any 32-bit length).
    """
    n = len(data)
    if pos < n:
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
    value = shift = 0
    end = pos + max_bytes
    while True:
        if pos >= end:
            raise VarintError("too long")
        if pos >= n:
            raise VarintError("truncated")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def read_canonical_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """:func:`read_uvarint` of a wire that accepts one encoding per value (collection
    sync, as beelay): the shortest form, at most 64 bits; :class:`VarintError` otherwise."""
    value, end = read_uvarint(data, pos)
    if value > 0xFFFF_FFFF_FFFF_FFFF:
        raise VarintError("too long")
    if end - pos > 1 and data[end - 1] == 0:
        raise VarintError("not shortest")
    return value, end
