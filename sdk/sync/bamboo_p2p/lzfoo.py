"""LZFoo, the compression of Bamboo point-to-point payloads (data byte 9).

Format (the LZFoo README, "The Encoding Format"): a sequence of elements, each a
*literal* (first byte's top bit 0, then the bytes) or a *copy* (top bit 1, then
the offset back into the output as a VarU64). Both carry a length in the low
seven bits of the first byte: below 120 it is the length itself; 120..127 mean
1..8 more bytes follow holding the length big-endian. A copy's length may exceed
its offset: bytes are copied one after the other, so the copy repeats itself.

Bamboo point-to-point (spec, "The Data Channel") shares one backlog of
decompressed data across all proposals of a direction, never reset; raw payload
bytes (data byte 8) do not join it, and copies may not reach further back than
the negotiated window. :class:`Compressor` and :class:`Decompressor` each keep
the last ``window`` bytes of that backlog, one per direction.

The format says nothing about how to compress: :class:`Compressor` is a greedy
matcher over 4-byte prefixes (one candidate per prefix), simple rather than
strong. :meth:`Decompressor.decompress` is bounded: it never produces more than
the declared length, and raises :class:`~.errors.CompressionViolation` on any
malformed input, a copy past the window or the output, or a length mismatch.
"""

from __future__ import annotations

from sdk.documents.errors import DocumentError
from sdk.documents.varu64 import decode_varu64, encode_varu64
from sdk.sync.bamboo_p2p.errors import CompressionViolation

_COPY = 0x80
_SHORT = 120  # lengths below this fit in the first byte
_MIN_MATCH = 4
#: Longest copy the compressor emits (any length is valid; this bounds one search).
_MAX_MATCH = 1 << 16


def encode_length(flag: int, length: int) -> bytes:
    """The first byte (``flag`` is 0 for a literal, 0x80 for a copy) and length bytes."""
    if not 0 <= length < 1 << 64:
        raise ValueError("an LZFoo length is at most 2^64 - 1")
    if length < _SHORT:
        return bytes((flag | length,))
    size = (length.bit_length() + 7) // 8
    return bytes((flag | (_SHORT - 1 + size),)) + length.to_bytes(size, "big")


def encode_literal(data: bytes) -> bytes:
    """A literal element."""
    return encode_length(0, len(data)) + data


def encode_copy(offset: int, length: int) -> bytes:
    """A copy element: ``length`` bytes from ``offset`` bytes back (``offset >= 1``)."""
    if offset < 1:
        raise ValueError("a copy offset is at least 1")
    return encode_length(_COPY, length) + encode_varu64(offset)


def _length(data: bytes, pos: int) -> tuple[int, int]:
    low = data[pos] & 0x7F
    pos += 1
    if low < _SHORT:
        return low, pos
    size = low - _SHORT + 1
    if pos + size > len(data):
        raise CompressionViolation("LZFoo data ends inside a length")
    return int.from_bytes(data[pos : pos + size], "big"), pos + size


class Decompressor:
    """The receiving side's backlog of one direction, and decompression into it."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._history = bytearray()

    def decompress(self, data: bytes, length: int) -> bytes:
        """Decompress ``data`` into exactly ``length`` bytes (and add them to the backlog).

        The caller bounds ``length`` before calling (here it is the memory spent), and
        refuses compressed data where the negotiated window is 0 (no decompressor then)."""
        buf = self._history
        base = len(buf)  # output starts here; copies reach back at most `window`
        end = base + length
        pos = 0
        try:
            while pos < len(data):
                first = data[pos]
                n, pos = _length(data, pos)
                if len(buf) + n > end:
                    raise CompressionViolation(f"LZFoo output longer than the {length} declared")
                if first & _COPY:
                    offset, pos = decode_varu64(data, pos)
                    if offset < 1 or offset > self.window or offset > len(buf):
                        raise CompressionViolation(
                            f"LZFoo copy from {offset} back (window {self.window}, "
                            f"{len(buf)} bytes known)"
                        )
                    start = len(buf) - offset
                    if n <= offset:  # the common case: no overlap with its own output
                        buf += buf[start : start + n]
                    else:
                        buf += (buf[start:] * (n // offset + 1))[:n]
                else:
                    if pos + n > len(data):
                        raise CompressionViolation("LZFoo data ends inside a literal")
                    buf += data[pos : pos + n]
                    pos += n
        except DocumentError as exc:
            raise CompressionViolation(f"LZFoo copy offset: {exc.detail}") from exc
        if len(buf) != end:
            raise CompressionViolation(f"LZFoo output shorter than the {length} declared")
        out = bytes(buf[base:])
        if len(buf) > self.window:
            del buf[: len(buf) - self.window]
        return out


class Compressor:
    """The sending side's backlog of one direction, and a greedy compressor over it."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._history = b""

    def compress(self, data: bytes) -> bytes:
        """LZFoo elements that decompress to ``data`` given the backlog (not changed:
        call :meth:`commit` once the result is sent compressed)."""
        history = self._history
        buf = history + data
        start = len(history)
        window = self.window
        table: dict[bytes, int] = {}
        for i in range(max(0, start - window), start - _MIN_MATCH + 1):
            table[buf[i : i + _MIN_MATCH]] = i
        out: list[bytes] = []
        literal_from = start
        i = start
        limit = len(buf) - _MIN_MATCH
        while i <= limit:
            key = buf[i : i + _MIN_MATCH]
            candidate = table.get(key)
            table[key] = i
            if candidate is None or i - candidate > window:
                i += 1
                continue
            n = _MIN_MATCH
            top = min(len(buf) - i, _MAX_MATCH)
            while n < top and buf[candidate + n] == buf[i + n]:
                n += 1
            if literal_from < i:
                out.append(encode_literal(buf[literal_from:i]))
            out.append(encode_copy(i - candidate, n))
            for j in range(i + 1, min(i + n, limit + 1)):
                table[buf[j : j + _MIN_MATCH]] = j
            i += n
            literal_from = i
        if literal_from < len(buf):
            out.append(encode_literal(buf[literal_from:]))
        return b"".join(out)

    def commit(self, data: bytes) -> None:
        """``data`` went out compressed: it joins the backlog."""
        self._history = (self._history + data)[-self.window :] if self.window else b""


__all__ = ["Compressor", "Decompressor", "encode_copy", "encode_length", "encode_literal"]
