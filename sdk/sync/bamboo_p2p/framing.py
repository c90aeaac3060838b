"""A minimal framing that carries the control and the data channel over one stream.

The spec suggests bymux for running both channels over one connection; this
implementation uses a smaller framing of its own instead (documented in
``docs/bamboo-p2p.md``)::

    connection := setup-bytes frame*
    frame      := channel (1 byte: 0 control, 1 data) length (VarU64, 1..MAX_FRAME_SIZE) bytes

A frame holds one or more *whole* messages of its channel; a message never spans
two frames, so a decoder needs no state across frames, and a truncated message is
an error. Frames keep the order in which the sender produced them, across both
channels: an endpoint's control message sent before its data is received before
it. There is no per-channel backpressure (bymux gives the data channel
backpressure); the pure endpoint instead produces data only when the caller asks
for it, ``data_to_send(limit)``, which is where a driver applies backpressure.
"""

from __future__ import annotations

from enum import IntEnum

from sdk.documents.errors import DocumentError
from sdk.documents.varu64 import decode_varu64, encode_varu64
from sdk.sync.bamboo_p2p.errors import FramingError

#: Largest frame body accepted or produced (a peer cannot make us buffer more).
MAX_FRAME_SIZE = 1 << 20


class Channel(IntEnum):
    """The two logical channels of the protocol."""

    CONTROL = 0
    DATA = 1


def encode_frame(channel: Channel, body: bytes) -> bytes:
    """One frame; ``body`` must be whole messages, 1..MAX_FRAME_SIZE bytes."""
    if not 0 < len(body) <= MAX_FRAME_SIZE:
        raise ValueError(f"a frame body is 1..{MAX_FRAME_SIZE} bytes")
    return bytes((channel,)) + encode_varu64(len(body)) + body


class ChannelFrameDecoder:
    """Splits an incoming byte stream into frames; buffers at most one frame."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Channel, bytes]]:
        """Add bytes; return the frames that are now complete, in order."""
        self._buffer += data
        frames: list[tuple[Channel, bytes]] = []
        buf = self._buffer
        pos = 0
        while pos < len(buf):
            channel = buf[pos]
            if channel > Channel.DATA:
                raise FramingError(f"unknown channel {channel}")
            if pos + 1 >= len(buf):
                break
            first = buf[pos + 1]
            header_end = pos + 2 if first < 248 else pos + 2 + (first - 247)
            if header_end > len(buf):
                break
            try:
                length, body_start = decode_varu64(bytes(buf[pos + 1 : header_end]), 0)
                body_start += pos + 1
            except DocumentError as exc:
                raise FramingError(f"frame length: {exc.detail}") from exc
            if not 0 < length <= MAX_FRAME_SIZE:
                raise FramingError(f"frame of {length} bytes, allowed 1..{MAX_FRAME_SIZE}")
            end = body_start + length
            if end > len(buf):
                break
            frames.append((Channel(channel), bytes(buf[body_start:end])))
            pos = end
        del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buffer)


class ChannelFrameMeter:
    """Follows the setup bytes and frame boundaries of a connection without keeping them.

    A listener (:class:`transports.guarded.GuardedListener`) feeds it what a
    connection reads, to time each frame (and the setup) from its first byte to
    its last and to count the bytes of partly received ones.
    """

    __slots__ = ("_body", "_lead", "_numbers", "_rest", "_setup", "_value", "completed", "partial")

    def __init__(self) -> None:
        #: Bytes read of the setup or frame in progress (0 between frames).
        self.partial = 0
        #: Units (the setup, then frames) completed so far.
        self.completed = 0
        self._setup = True  # the setup comes first: flag byte and two VarU64s
        self._lead = True  # next byte is the flag (setup) or channel (frame) byte
        self._numbers = 0  # VarU64s still to read in this unit's header
        self._rest = 0  # bytes still to read of a long VarU64
        self._value = 0
        self._body = 0

    def feed(self, data: bytes) -> None:
        """Account for the next bytes of the connection."""
        pos, n = 0, len(data)
        while pos < n:
            if self._body:
                take = min(self._body, n - pos)
                self._body -= take
                pos += take
                self.partial += take
                if not self._body:
                    self._unit_done()
                continue
            byte = data[pos]
            pos += 1
            self.partial += 1
            if self._lead:
                self._lead = False
                self._numbers = 2 if self._setup else 1
            elif self._rest:
                self._value = (self._value << 8) | byte
                self._rest -= 1
                if not self._rest:
                    self._number_done()
            elif byte < 248:  # VarU64: one byte, or a count of big-endian bytes to follow
                self._value = byte
                self._number_done()
            else:
                self._value, self._rest = 0, byte - 247

    def _number_done(self) -> None:
        self._numbers -= 1
        if self._numbers:
            return
        if self._setup:
            self._setup = False
            self._unit_done()
        elif self._value:
            self._body = self._value
        else:
            self._unit_done()  # an empty frame: the decoder refuses it

    def _unit_done(self) -> None:
        self.completed += 1
        self.partial = 0
        self._lead = True


__all__ = ["MAX_FRAME_SIZE", "Channel", "ChannelFrameDecoder", "ChannelFrameMeter", "encode_frame"]
