"""The socket paho reads and writes in :mod:`transports.mqtt`, and the packet
framing of the adapter's fast path.

:class:`BufferedSocket` wraps paho's socket: it serves paho's many tiny ``recv``
calls from one 64 KiB read, hands whole packets to the adapter
(:meth:`BufferedSocket.next_packet`, put back with :meth:`BufferedSocket.rewind`
when paho should read one itself) and collects paho's one-``send``-per-packet
writes into one. No paho name is used here: paho accepts any object with this
socket-like surface.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

__all__ = ["BufferedSocket", "MalformedLength"]

log = logging.getLogger("transports.mqtt")


class MalformedLength(Exception):
    """A packet's remaining length runs over four bytes (MQTT's maximum)."""


class BufferedSocket:
    """Socket wrapper serving paho's many tiny ``recv`` calls from one big read, and
    collecting its one-``send``-per-packet writes into one.

    paho reads a packet as recv(1) for the type, recv(1) per length byte, then
    the body: three or more system calls per small message. One 64 KiB read
    here cuts that to one per batch of messages. While :attr:`collect` is set
    (the adapter sets it around ``loop_write``), ``send`` takes every byte into
    a buffer that :meth:`flush` writes with as few system calls as the kernel
    allows; bytes are never reordered (``send`` appends while anything is
    unsent). paho accepts any object with this "socket-like" surface (it wraps
    WebSockets the same way).
    """

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        # The last read and how far paho has taken it: a slice per call, no copy
        # into (and deletion from) a bytearray.
        self._buf = b""
        self._pos = 0
        #: Whether ``send`` collects instead of writing.
        self.collect = False
        self._out = bytearray()
        #: Set when a read in :meth:`next_packet` found the stream ended or failed.
        self.closed_by_peer = False
        self._packet_start = 0

    def recv(self, bufsize: int) -> bytes:
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            data = self._sock.recv(65536)
            if len(data) <= bufsize:
                return bytes(data)
            self._buf = buf = bytes(data)
            pos = 0
        end = pos + bufsize
        self._pos = end
        return buf[pos:end]

    def next_packet(self) -> tuple[int, bytes] | None:
        """The next whole MQTT packet as (first byte, body), reading the socket when
        the buffer holds less; ``None`` when no whole packet is available yet (or
        the stream ended: :attr:`closed_by_peer`). Raises what the socket raises, and
        :class:`MalformedLength` (the bytes stay for paho to read and reject)."""
        while True:
            buf = self._buf
            pos = self._pos
            size = len(buf)
            if size - pos >= 2:
                length = 0
                shift = 0
                at = pos + 1
                while at < size and at - pos <= 4:
                    byte = buf[at]
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    at += 1
                    if not byte & 0x80:
                        end = at + length
                        if end <= size:
                            self._packet_start = pos
                            self._pos = end
                            return buf[pos], buf[at:end]
                        break
                else:
                    if at - pos > 4:
                        raise MalformedLength  # paho's reader reports it
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None
            if not data:
                self.closed_by_peer = True
                return None
            self._buf = buf[pos:] + data if pos < size else bytes(data)
            self._pos = 0

    def rewind(self) -> None:
        """Put back the packet :meth:`next_packet` returned last, for paho to read."""
        self._pos = self._packet_start

    def send(self, data: bytes | bytearray) -> int:
        if self.collect or self._out:
            self._out += data
            return len(data)
        return int(self._sock.send(data))

    def flush(self) -> bool:
        """Write the collected bytes; ``False`` while some wait for writability.

        A connection that fails here loses what was collected, as it would have
        lost it in paho's queue; the read side (or keep-alive) then reports the
        loss and paho re-sends its un-acknowledged publishes after the reconnect.
        """
        out = self._out
        while out:
            try:
                sent = self._sock.send(out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return False
            except OSError as err:
                log.debug("MQTT write failed, %d bytes dropped: %s", len(out), err)
                out.clear()
                return True
            if sent == len(out):
                out.clear()
            else:
                del out[:sent]
        return True

    def unsent(self) -> int:
        """Collected bytes not yet written."""
        return len(self._out)

    def pending(self) -> int:
        inner = getattr(self._sock, "pending", None)
        return max(0, len(self._buf) - self._pos) + (int(inner()) if inner is not None else 0)

    def close(self) -> None:
        # paho closes right after queueing DISCONNECT: write it first if possible.
        self.flush()
        self._sock.close()

    def fileno(self) -> int:
        return int(self._sock.fileno())

    def setblocking(self, flag: bool) -> None:
        self._sock.setblocking(flag)
