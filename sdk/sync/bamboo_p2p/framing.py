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
from sdk.sync.bamboo_p2p.setup import setup_length
from sdk.sync.framing import FrameMeter

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


def read_frame_header(data: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """The frame starting at ``pos``: ``(where its body starts, its length)``, or
    ``None`` while its header is incomplete. Raises :class:`FramingError` for an
    unknown channel or a length outside 1..MAX_FRAME_SIZE."""
    channel = data[pos]
    if channel > Channel.DATA:
        raise FramingError(f"unknown channel {channel}")
    if pos + 1 >= len(data):
        return None
    length = data[pos + 1]  # a VarU64: one byte below 248, else a count of bytes to follow
    header_end = pos + 2 if length < 248 else pos + 2 + (length - 247)
    if header_end > len(data):
        return None
    if length >= 248:
        try:
            length, _ = decode_varu64(data, pos + 1)  # type: ignore[arg-type]
        except DocumentError as exc:
            raise FramingError(f"frame length: {exc.detail}") from exc
    if not 0 < length <= MAX_FRAME_SIZE:
        raise FramingError(f"frame of {length} bytes, allowed 1..{MAX_FRAME_SIZE}")
    return header_end, length


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
            header = read_frame_header(buf, pos)
            if header is None:
                break
            body_start, length = header
            end = body_start + length
            if end > len(buf):
                break
            frames.append((Channel(buf[pos]), bytes(buf[body_start:end])))
            pos = end
        del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buffer)


class ChannelFrameMeter(FrameMeter):
    """Follows the setup bytes and frame boundaries of a connection without keeping them
    (:class:`~sdk.sync.framing.FrameMeter`): the setup (:func:`.setup.setup_length`)
    counts as the first unit, then each frame (:func:`read_frame_header`)."""

    __slots__ = ("_setup",)

    def __init__(self) -> None:
        super().__init__()
        self._setup = True  # the setup comes first: flag byte and two VarU64s

    def header(self, data: bytes, pos: int) -> tuple[int, int] | None:
        """The setup's end (no body), then each frame's body start and length."""
        if not self._setup:
            return read_frame_header(data, pos)
        length = setup_length(data[pos:])
        self._setup = length is None
        return None if length is None else (pos + length, 0)


__all__ = [
    "MAX_FRAME_SIZE",
    "Channel",
    "ChannelFrameDecoder",
    "ChannelFrameMeter",
    "encode_frame",
    "read_frame_header",
]
