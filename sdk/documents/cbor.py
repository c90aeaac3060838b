"""The CBOR subset p2panda operations use, encoded exactly as the reference does.

Why not cbor2: its canonical mode sorts map keys length-first (RFC 7049
section 3.9), while p2panda-rs writes maps in plain string order (its field maps
are ``BTreeMap<String, _>``), and cbor2's default mode writes every float as
64 bits while the reference writes the shortest width that keeps the value.
This module writes and reads only what an operation can hold:

* unsigned and negative integers (RFC 8949 section 3.1, majors 0 and 1),
* byte strings and UTF-8 text strings (majors 2 and 3),
* arrays and maps with text keys (majors 4 and 5),
* ``false``, ``true`` and floats of 16, 32 or 64 bits (major 7).

Everything is definite-length. Decoding is strict: it accepts only the
canonical form this encoder produces (shortest integer arguments, shortest
lossless float width, NaN as ``f9 7e00``, map keys unique and in ascending
order), so one operation has one byte string and one hash. Tags, ``null``,
``undefined``, other simple values and indefinite lengths are rejected. Every
length is checked against the bytes that remain before anything is allocated.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

from sdk.documents.errors import CBORError, SizeLimitExceeded
from sdk.documents.limits import MAX_CBOR_DEPTH

CBORValue: TypeAlias = (
    "bool | int | float | str | bytes | list[CBORValue] | tuple[CBORValue, ...] "
    "| dict[str, CBORValue]"
)

_MIN_INT = -(1 << 64)
_MAX_INT = (1 << 64) - 1
_NAN16 = b"\xf9\x7e\x00"


def _head(major: int, argument: int) -> bytes:
    """The initial byte and shortest argument for ``major`` (RFC 8949 section 3)."""
    mt = major << 5
    if argument < 24:
        return _SMALL_HEADS[mt | argument]
    if argument < 0x100:
        return bytes((mt | 24, argument))
    if argument < 0x10000:
        return bytes((mt | 25,)) + argument.to_bytes(2, "big")
    if argument < 0x100000000:
        return bytes((mt | 26,)) + argument.to_bytes(4, "big")
    return bytes((mt | 27,)) + argument.to_bytes(8, "big")


#: One-byte heads (argument below 24) of every major type, indexed by the byte.
_SMALL_HEADS = tuple(bytes((b,)) for b in range(256))


def encode_float(value: float) -> bytes:
    """The shortest of f16/f32/f64 that holds ``value`` exactly (NaN as ``f9 7e00``)."""
    if value != value:
        return _NAN16
    try:
        half = struct.pack(">e", value)
    except OverflowError:
        half = b""
    if half and struct.unpack(">e", half)[0] == value:
        return b"\xf9" + half
    try:
        single = struct.pack(">f", value)
    except OverflowError:
        single = b""
    if single and struct.unpack(">f", single)[0] == value:
        return b"\xfa" + single
    return b"\xfb" + struct.pack(">d", value)


def encode(value: CBORValue) -> bytes:
    """Encode ``value`` in the canonical form described in the module docstring."""
    out = bytearray()
    _encode_into(value, out)
    return bytes(out)


def _encode_into(value: CBORValue, out: bytearray) -> None:
    # Most frequent first: byte strings (entries, hashes) and small integers.
    if isinstance(value, bytes):
        out += _head(2, len(value))
        out += value
    # bool before int: bool is a subclass of int in Python.
    elif value is True:
        out += b"\xf5"
    elif value is False:
        out += b"\xf4"
    elif isinstance(value, int):
        if 0 <= value <= _MAX_INT:
            out += _head(0, value)
        elif _MIN_INT <= value < 0:
            out += _head(1, -1 - value)
        else:
            raise ValueError("CBOR integers are limited to 64 bits")
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += _head(3, len(raw))
        out += raw
    elif isinstance(value, list | tuple):
        out += _head(4, len(value))
        # An array's byte strings and integers below 24 (entries, hashes, message
        # types) are written here; everything else goes through _encode_into.
        for item in value:
            if isinstance(item, bytes):
                out += _head(2, len(item))
                out += item
            elif type(item) is int and 0 <= item < 24:
                out += _SMALL_HEADS[item]
            else:
                _encode_into(item, out)
    elif isinstance(value, float):
        out += encode_float(value)
    elif isinstance(value, bytearray | memoryview):
        raw = bytes(value)
        out += _head(2, len(raw))
        out += raw
    elif isinstance(value, dict):
        out += _head(5, len(value))
        # Plain string order: Python compares str by code point, which is the
        # byte order of their UTF-8 encodings, i.e. Rust's String ordering.
        for key in sorted(value):
            if not isinstance(key, str):
                raise TypeError("CBOR map keys must be str")
            _encode_into(key, out)
            _encode_into(value[key], out)
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as operation CBOR")


def decode(data: bytes, *, max_depth: int = MAX_CBOR_DEPTH) -> CBORValue:
    """Decode exactly one canonical data item filling all of ``data``.

    Raises :class:`CBORError` for anything outside the subset, non-canonical
    forms or trailing bytes, and :class:`SizeLimitExceeded` for nesting deeper
    than ``max_depth``.
    """
    value, end = _Decoder(bytes(data), max_depth).item(0, 0)
    if end != len(data):
        raise CBORError(f"{len(data) - end} trailing bytes after the data item")
    return value


def string_span(data: bytes, pos: int, major: int) -> tuple[int, int] | None:
    """``(start, end)`` of the string whose head is at ``pos``, if it is one of the subset.

    ``major`` is 2 (byte string) or 3 (text). Answers only for a head of that major
    type with its length in the shortest form (in the head, or in 1, 2 or 4 bytes)
    and a string that ends within ``data``; anything else, well formed or not, is
    ``None`` and left to :func:`decode`. The rule the decoding fast paths
    (``decode_operation``, sync's Entry frames) share; text is not checked as UTF-8.
    """
    n = len(data)
    if pos >= n:
        return None
    info = data[pos] - (major << 5)
    if 0 <= info < 24:
        start = pos + 1
        end = start + info
    elif info == 24 and pos + 1 < n and data[pos + 1] >= 24:
        start = pos + 2
        end = start + data[pos + 1]
    elif info == 25 and pos + 2 < n and data[pos + 1]:
        start = pos + 3
        end = start + ((data[pos + 1] << 8) | data[pos + 2])
    elif info == 26 and pos + 4 < n and (data[pos + 1] or data[pos + 2]):
        start = pos + 5
        end = start + int.from_bytes(data[pos + 1 : start], "big")
    else:
        return None
    if end > n:
        return None
    return start, end


class _Decoder:
    __slots__ = ("data", "max_depth")

    def __init__(self, data: bytes, max_depth: int) -> None:
        self.data = data
        self.max_depth = max_depth

    def _argument(self, info: int, pos: int) -> tuple[int, int]:
        data = self.data
        if info < 24:
            return info, pos
        if info > 27:
            # 28-30 are reserved, 31 is indefinite length: neither is in the subset.
            raise CBORError("indefinite length or reserved additional information")
        size = 1 << (info - 24)
        end = pos + size
        if end > len(data):
            raise CBORError("data ends inside an argument")
        argument = int.from_bytes(data[pos:end], "big")
        if argument < (24 if size == 1 else 1 << (4 * size)):
            raise CBORError("integer argument not in its shortest form")
        return argument, end

    def _take(self, length: int, pos: int) -> tuple[bytes, int]:
        end = pos + length
        if end > len(self.data):
            raise CBORError(f"string of {length} bytes runs past the end of the data")
        return self.data[pos:end], end

    def item(self, pos: int, depth: int) -> tuple[CBORValue, int]:
        # The hot path of every operation and sync message: arguments below 24 and
        # strings are read inline; the rest goes through _argument and _take.
        data = self.data
        if pos >= len(data):
            raise CBORError("data ends before a data item")
        initial = data[pos]
        major, info = initial >> 5, initial & 0x1F
        pos += 1
        if major == 7:
            return self._simple(initial, pos)
        if info < 24:
            argument = info
        else:
            argument, pos = self._argument(info, pos)
        if major == 0:
            return argument, pos
        if major == 2 or major == 3:
            end = pos + argument
            if end > len(data):
                raise CBORError(f"string of {argument} bytes runs past the end of the data")
            if major == 2:
                return data[pos:end], end
            try:
                return data[pos:end].decode("utf-8"), end
            except UnicodeDecodeError as exc:
                raise CBORError("text string is not valid UTF-8") from exc
        if major == 1:
            return -1 - argument, pos
        if major == 6:
            raise CBORError("tags are not used in operations")
        if depth >= self.max_depth:
            raise SizeLimitExceeded(f"CBOR nested deeper than {self.max_depth}")
        # Every item takes at least one byte: a count beyond the remaining bytes
        # is a lie, refused before any allocation.
        if argument > len(data) - pos:
            raise CBORError(f"container claims {argument} items, fewer bytes remain")
        item = self.item
        depth += 1
        if major == 5:
            # Keys shorter than 24 bytes and values that are booleans or small
            # unsigned integers (field names and flags) are read here; the rest,
            # and every error, goes through item().
            n = len(data)
            mapping: dict[str, CBORValue] = {}
            previous: str | None = None
            value: CBORValue
            for _ in range(argument):
                initial = data[pos] if pos < n else 0
                end = pos + 1 + initial - 0x60
                if 0x60 <= initial < 0x78 and end <= n:
                    try:
                        key = data[pos + 1 : end].decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise CBORError("text string is not valid UTF-8") from exc
                    pos = end
                else:
                    raw_key, pos = item(pos, depth)
                    if not isinstance(raw_key, str):
                        raise CBORError("map keys must be text strings")
                    key = raw_key
                if previous is not None and key <= previous:
                    raise CBORError(f"map key {key[:64]!r} duplicated or out of order")
                previous = key
                initial = data[pos] if pos < n else 0xFF
                if initial < 0x18:
                    value = initial
                    pos += 1
                elif initial == 0xF4 or initial == 0xF5:
                    value = initial == 0xF5
                    pos += 1
                else:
                    value, pos = item(pos, depth)
                mapping[key] = value
            return mapping, pos
        # An array's small unsigned integers, booleans and strings shorter than 256
        # bytes (most of what operations and sync messages hold) are read here;
        # anything else, and every error, goes through item().
        n = len(data)
        items: list[CBORValue] = []
        append = items.append
        for _ in range(argument):
            if pos < n:
                initial = data[pos]
                if initial < 0x18:
                    append(initial)
                    pos += 1
                    continue
                if 0x40 <= initial <= 0x78:
                    info = initial & 0x1F
                    if info < 24:
                        start, end = pos + 1, pos + 1 + info
                    elif info == 24 and pos + 1 < n and data[pos + 1] >= 24:
                        start, end = pos + 2, pos + 2 + data[pos + 1]
                    else:
                        start, end = 0, n + 1
                    if end <= n:
                        if initial < 0x60:
                            append(data[start:end])
                        else:
                            try:
                                append(data[start:end].decode("utf-8"))
                            except UnicodeDecodeError as exc:
                                raise CBORError("text string is not valid UTF-8") from exc
                        pos = end
                        continue
                elif initial == 0xF5 or initial == 0xF4:
                    append(initial == 0xF5)
                    pos += 1
                    continue
            value, pos = item(pos, depth)
            append(value)
        return items, pos

    def _simple(self, initial: int, pos: int) -> tuple[CBORValue, int]:
        if initial == 0xF4:
            return False, pos
        if initial == 0xF5:
            return True, pos
        widths = {0xF9: (2, ">e"), 0xFA: (4, ">f"), 0xFB: (8, ">d")}
        if initial not in widths:
            raise CBORError(f"simple value 0x{initial:02x} is not used in operations")
        size, fmt = widths[initial]
        raw, end = self._take(size, pos)
        value: float = struct.unpack(fmt, raw)[0]
        if encode_float(value) != self.data[pos - 1 : end]:
            raise CBORError("float not in its shortest lossless width")
        return value, end


__all__ = ["CBORValue", "decode", "encode", "encode_float", "string_span"]
