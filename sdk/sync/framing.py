"""One length-prefixed frame per message, sans I/O.

A frame is the message length as an unsigned LEB128 varint (1-3 bytes for any
frame we accept) followed by that many bytes. :class:`FrameDecoder` takes
stream bytes in any chunking and yields whole frames; a length over
``max_frame`` is refused as soon as its prefix is read, before anything is
buffered, so a peer cannot make us hold more than one bounded frame.
(aquadoggo frames with libp2p's CBOR codec, which relies on CBOR being
self-delimiting; a length prefix lets us bound a frame before decoding it.)
"""

from __future__ import annotations

from sdk.sync.errors import LimitExceeded, MalformedMessage

#: Default bound on one frame: an entry (< 400 bytes) plus the largest operation (128 KiB)
#: with room to spare, and a Have or a set-reconciliation message.
MAX_FRAME = 1024 * 1024


def encode_frame(payload: bytes) -> bytes:
    """``payload`` with its length prefix."""
    size = len(payload)
    head = bytearray()
    while size >= 0x80:
        head.append((size & 0x7F) | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + payload


class FrameDecoder:
    """Splits a byte stream into frames; raises on a frame over ``max_frame``."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held that do not make a whole frame yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add stream bytes; return the frames they complete."""
        self._buffer += data
        frames: list[bytes] = []
        while True:
            size = shift = pos = 0
            while True:
                if pos >= len(self._buffer):
                    if pos > 4:
                        raise MalformedMessage("frame length prefix too long")
                    return frames
                byte = self._buffer[pos]
                pos += 1
                size |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
                if pos >= 5:
                    raise MalformedMessage("frame length prefix too long")
            if size > self.max_frame:
                raise LimitExceeded(f"frame of {size} bytes, limit {self.max_frame}")
            if len(self._buffer) < pos + size:
                return frames
            frames.append(bytes(self._buffer[pos : pos + size]))
            del self._buffer[: pos + size]


__all__ = ["MAX_FRAME", "FrameDecoder", "encode_frame"]
