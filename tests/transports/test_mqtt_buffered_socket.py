"""The MQTT adapter's read buffer: paho's many small reads served from one socket read."""

from __future__ import annotations

import pytest

from transports.mqtt_socket import BufferedSocket, MalformedLength


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
    sock = BufferedSocket(raw)
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
    sock = BufferedSocket(_ChunkSocket([b""]))
    assert sock.recv(1) == b""  # the peer closed: paho sees it


class _WriteSocket:
    """Takes at most ``room`` bytes per send (``None``: all); raises when it is 0."""

    def __init__(self, room: int | None = None) -> None:
        self.room = room
        self.sends: list[bytes] = []

    def send(self, data: bytes | bytearray) -> int:
        if self.room == 0:
            raise BlockingIOError
        taken = bytes(data if self.room is None else data[: self.room])
        self.sends.append(taken)
        if self.room is not None:
            self.room -= len(taken)
        return len(taken)

    def close(self) -> None:
        pass


def test_collected_writes_go_out_in_one_send() -> None:
    raw = _WriteSocket()
    sock = BufferedSocket(raw)
    sock.collect = True
    assert sock.send(b"\x30\x03abc") == 5  # paho sees every packet written
    assert sock.send(b"\x40\x02\x00\x01") == 4
    assert raw.sends == [] and sock.unsent() == 9
    sock.collect = False
    assert sock.flush() is True
    assert raw.sends == [b"\x30\x03abc\x40\x02\x00\x01"] and sock.unsent() == 0
    assert sock.send(b"xy") == 2  # not collecting, nothing waiting: written at once
    assert raw.sends[-1] == b"xy"


def test_what_the_kernel_refuses_waits_and_keeps_its_order() -> None:
    raw = _WriteSocket(room=3)
    sock = BufferedSocket(raw)
    sock.collect = True
    sock.send(b"abcdef")
    sock.collect = False
    assert sock.flush() is False  # 3 bytes taken, then the socket is full
    assert sock.unsent() == 3
    assert sock.send(b"gh") == 2  # queued behind the rest, never ahead of it
    raw.room = None
    assert sock.flush() is True
    assert b"".join(raw.sends) == b"abcdefgh"


def test_close_writes_what_was_collected_first() -> None:
    raw = _WriteSocket()
    sock = BufferedSocket(raw)
    sock.collect = True
    sock.send(b"\xe0\x00")  # DISCONNECT: paho closes the socket right after queueing it
    sock.close()
    assert raw.sends == [b"\xe0\x00"]


class _NoMoreSocket(_ChunkSocket):
    """Returns the chunks, then raises BlockingIOError (nothing more has arrived)."""

    def recv(self, bufsize: int) -> bytes:
        if not self.chunks:
            raise BlockingIOError
        return super().recv(bufsize)


def test_whole_packets_come_out_and_a_partial_one_waits() -> None:
    body = b"\x00\x01t" + b"x" * 200  # remaining length 203: two length bytes
    packet = b"\x30\xcb\x01" + body
    raw = _NoMoreSocket([b"\x40\x02\x00\x07" + packet[:50], packet[50:]])
    sock = BufferedSocket(raw)
    assert sock.next_packet() == (0x40, b"\x00\x07")
    assert sock.next_packet() == (0x30, body)  # completed by a second read
    assert sock.next_packet() is None and not sock.closed_by_peer


def test_a_packet_put_back_is_read_again_byte_by_byte() -> None:
    sock = BufferedSocket(_NoMoreSocket([b"\x40\x02\x00\x07\xd0\x00"]))
    assert sock.next_packet() == (0x40, b"\x00\x07")
    assert sock.next_packet() == (0xD0, b"")
    sock.rewind()
    assert sock.recv(1) == b"\xd0"  # paho reads it as if nothing had been taken
    assert sock.recv(1) == b"\x00"


def test_the_end_of_the_stream_is_reported() -> None:
    sock = BufferedSocket(_ChunkSocket([b"\x30\x05ab", b""]))
    assert sock.next_packet() is None
    assert sock.closed_by_peer
    assert sock.recv(1) == b"\x30"  # paho gets the partial packet, then the end


def test_a_length_over_four_bytes_is_left_to_paho() -> None:
    sock = BufferedSocket(_NoMoreSocket([b"\x30\xff\xff\xff\xff\x01rest"]))
    with pytest.raises(MalformedLength):
        sock.next_packet()
    assert sock.recv(1) == b"\x30"  # nothing was taken: paho reads it and rejects it
