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

from dataclasses import dataclass

from sdk.sds.varint import VarintError, encode_uvarint, read_uvarint
from sdk.sync.errors import LimitExceeded, MalformedMessage, SyncError

#: Default bound on one frame: an entry (< 400 bytes) plus the largest operation (128 KiB)
#: with room to spare, and a Have or a set-reconciliation message.
MAX_FRAME = 1024 * 1024


def encode_frame(payload: bytes) -> bytes:
    """``payload`` with its length prefix."""
    return encode_uvarint(len(payload)) + payload


def read_length(data: bytes, pos: int) -> tuple[int, int] | None:
    """The frame whose length prefix starts at ``pos``: ``(where its body starts, its
    length)``, or ``None`` while the prefix is incomplete. A prefix over 5 bytes is
    :class:`MalformedMessage` (no frame we accept needs one)."""
    byte = data[pos]
    if byte < 0x80:
        return pos + 1, byte
    if pos + 1 < len(data) and data[pos + 1] < 0x80:  # up to 16 KiB: two bytes
        return pos + 2, (byte & 0x7F) | (data[pos + 1] << 7)
    try:
        size, start = read_uvarint(data, pos, max_bytes=5)
    except VarintError as exc:
        if exc.truncated:
            return None
        raise MalformedMessage("frame length prefix too long") from None
    return start, size


@dataclass
class WireStats:
    """Bytes and frames a connection moved (frame prefixes included)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    frames_sent: int = 0
    frames_received: int = 0


class FrameDecoder:
    """Splits a byte stream into frames; raises on a frame over ``max_frame``."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        #: The bytes after the last whole frame (part of the next one).
        self._rest = b""

    @property
    def buffered(self) -> int:
        """Bytes held that do not make a whole frame yet."""
        return len(self._rest)

    def feed(self, data: bytes) -> list[bytes]:
        """Add stream bytes; return the frames they complete."""
        # The frames are sliced out of one bytes object (a read, joined to what was
        # left of the last one): one copy per frame, and nothing moved per frame.
        if self._rest:
            data = self._rest + data
        elif type(data) is not bytes:
            data = bytes(data)
        n = len(data)
        max_frame = self.max_frame
        frames: list[bytes] = []
        append = frames.append
        pos = 0
        while pos < n:
            # The length prefix: 1 byte read here (any frame up to 127 bytes), longer
            # ones by read_length.
            byte = data[pos]
            if byte < 0x80:
                start, size = pos + 1, byte
            else:
                header = read_length(data, pos)
                if header is None:
                    break  # the rest of the prefix is still to come
                start, size = header
            if size > max_frame:
                raise LimitExceeded(f"frame of {size} bytes, limit {max_frame}")
            end = start + size
            if end > n:
                break
            append(data[start:end])
            pos = end
        self._rest = data[pos:]
        return frames


class FrameMeter:
    """Follows the frame boundaries of a stream without keeping its bytes.

    A listener (:class:`transports.guarded.GuardedListener`) feeds it what a
    connection reads, to time each frame from its first byte to its last and to
    count the bytes of partly received frames. It reads each frame's header as the
    connection's decoder does (:meth:`header`).
    """

    __slots__ = ("_body", "_head", "completed", "partial")

    def __init__(self) -> None:
        #: Bytes read of the frame in progress (header included; 0 between frames).
        self.partial = 0
        #: Frames completed so far.
        self.completed = 0
        self._head = b""  # the start of a header the last read cut
        self._body = 0  # body bytes still to come

    def header(self, data: bytes, pos: int) -> tuple[int, int] | None:
        """As :func:`read_length` (a protocol framed otherwise overrides this with its
        decoder's reading)."""
        return read_length(data, pos)

    def feed(self, data: bytes) -> None:
        """Account for the next bytes of the stream."""
        if self._head:  # a header the last read cut: read it whole
            data, self.partial = self._head + bytes(data), self.partial - len(self._head)
            self._head = b""
        pos, n = 0, len(data)
        while pos < n:
            if not self._body:
                try:
                    found = self.header(data, pos)
                except SyncError:
                    found = (n, 0)  # the decoder refuses it: the connection ends
                if found is None:  # the rest of the header is still to come
                    self._head = bytes(data[pos:])
                    self.partial += n - pos
                    return
                start, self._body = found
                self.partial += start - pos
                pos = start
            take = min(self._body, n - pos)
            self._body -= take
            pos += take
            self.partial += take
            if not self._body:
                self.completed += 1
                self.partial = 0


__all__ = ["MAX_FRAME", "FrameDecoder", "FrameMeter", "WireStats", "encode_frame", "read_length"]
