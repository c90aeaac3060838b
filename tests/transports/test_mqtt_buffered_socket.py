"""The MQTT adapter's read buffer: paho's many small reads served from one socket read."""

from __future__ import annotations

from transports.mqtt import _BufferedSocket


class _ChunkSocket:
    """Returns the given chunks, one per recv, whatever size is asked."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.reads = 0

    def recv(self, bufsize: int) -> bytes:
        self.reads += 1
        return self.chunks.pop(0)


def test_small_reads_come_from_one_socket_read_in_order() -> None:
    raw = _ChunkSocket([b"\x30\x05hello" + b"\x40\x02\x00\x01", b"next"])
    sock = _BufferedSocket(raw)
    assert sock.pending() == 0
    assert sock.recv(1) == b"\x30"
    assert sock.pending() == 10
    assert sock.recv(1) == b"\x05"
    assert sock.recv(5) == b"hello"
    assert sock.recv(2) == b"\x40\x02"
    assert sock.recv(10) == b"\x00\x01"  # what is buffered, short of the size asked
    assert raw.reads == 1 and sock.pending() == 0
    assert sock.recv(100) == b"next"  # fits: handed over without buffering
    assert raw.reads == 2 and sock.pending() == 0


def test_an_empty_read_is_passed_on() -> None:
    sock = _BufferedSocket(_ChunkSocket([b""]))
    assert sock.recv(1) == b""  # the peer closed: paho sees it
