"""The one driver (:func:`sdk.sync.run.run_machine`) with a toy machine over a memory pipe."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sdk.sync.errors import LimitExceeded
from sdk.sync.run import MachineConnection, now_ms, run_machine
from transports.stream import memory_pipe


class Keeper:
    """Keeps each line the peer sends (a request), answers ``ok <line>`` once it is
    kept; ``bye`` finishes. Silent for ``idle_ms`` while waiting: fails."""

    def __init__(self, now: int, idle_ms: int = 60_000) -> None:
        self.buffer = b""
        self.out = b""
        self.requests: list[bytes] = []
        self.waiting = 0
        self.idle_ms = idle_ms
        self.last = now
        self.finished = False
        self.error: Exception | None = None

    @property
    def wants_data(self) -> bool:
        return not self.finished and not self.waiting and self.error is None

    def receive_data(self, data: bytes, now: int) -> None:
        self.last = now
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self.requests.append(line)
            self.waiting += 1

    def data_to_send(self) -> bytes:
        out, self.out = self.out, b""
        return out

    def next_event(self) -> Any | None:
        return None

    def get_timer(self) -> int | None:
        return self.last + self.idle_ms if self.wants_data else None

    def handle_timer(self, now: int) -> None:
        if now >= self.last + self.idle_ms:
            self.error = LimitExceeded("silent")

    def next_request(self) -> Any | None:
        return self.requests.pop(0) if self.requests else None

    def request_done(self, request: Any, result: Any, now: int) -> None:
        self.waiting -= 1
        self.last = now
        self.out += b"ok " + result + b"\n"
        if request == b"bye":
            self.finished = True


async def test_requests_run_in_order_and_the_output_is_written_before_the_run_ends() -> None:
    ours, theirs, _ = memory_pipe()
    kept: list[bytes] = []

    async def keep(line: bytes) -> bytes:
        await asyncio.sleep(0.01)  # storage off the loop takes a while
        kept.append(line)
        return line

    await theirs.write(b"a\nb\nbye\n")
    async with asyncio.timeout(10):
        await run_machine(Keeper(now_ms()), ours, keep)
    assert kept == [b"a", b"b", b"bye"]
    got = b""
    async with asyncio.timeout(5):
        while got.count(b"\n") < 3:
            got += await theirs.read()
    assert got == b"ok a\nok b\nok bye\n"


async def test_a_request_that_fails_ends_the_run_with_its_error() -> None:
    ours, theirs, _ = memory_pipe()

    async def broken(line: bytes) -> bytes:
        raise OSError("disk full")

    await theirs.write(b"a\n")
    with pytest.raises(OSError, match="disk full"):
        async with asyncio.timeout(10):
            await run_machine(Keeper(now_ms()), ours, broken)


async def test_the_machine_s_timer_cuts_off_a_silent_peer() -> None:
    ours, _, _ = memory_pipe()

    async def keep(line: bytes) -> bytes:
        return line

    with pytest.raises(LimitExceeded):
        async with asyncio.timeout(10):
            await run_machine(Keeper(now_ms(), idle_ms=50), ours, keep)


class Connection(MachineConnection[Keeper]):
    """A MachineConnection whose peer's LimitExceeded ends it; counts its endings."""

    peer_errors = (LimitExceeded,)

    def __init__(self, machine: Keeper, stream: Any, perform: Any) -> None:
        super().__init__(machine, stream, perform)
        self.waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.endings = 0

    def _closing(self) -> None:
        self.endings += 1
        self._fail_waiting([self.waiter], ConnectionError("ended"))


async def echo(line: bytes) -> bytes:
    return line


async def test_machine_connection_keeps_the_peers_error_closes_the_stream_and_ends_once() -> None:
    ours, theirs, _ = memory_pipe()
    connection = Connection(Keeper(now_ms(), idle_ms=50), ours, echo)
    async with connection:
        async with asyncio.timeout(10):
            await connection.closed.wait()
            assert isinstance(connection.error, LimitExceeded)  # the silent peer's
            assert await theirs.read() == b""  # the stream was closed on the peer's error
        with pytest.raises(ConnectionError):
            await connection.waiter
    assert connection.endings == 1  # aclose after the end ends nothing twice


async def test_machine_connection_aclose_stops_a_running_connection() -> None:
    ours, theirs, _ = memory_pipe()
    async with Connection(Keeper(now_ms()), ours, echo) as connection:
        await theirs.write(b"a\n")
        async with asyncio.timeout(10):
            assert await theirs.read() == b"ok a\n"
        assert not connection.closed.is_set()
    assert connection.closed.is_set() and connection.error is None
    assert connection.endings == 1
    async with asyncio.timeout(10):
        assert await theirs.read() == b""


async def test_machine_connection_aclose_closes_the_stream_even_when_it_is_cancelled() -> None:
    """A caller cancelled while aclose waits for the run to stop (a request that takes a
    while to give up) still gets the stream closed and the connection ended, once."""
    ours, theirs, _ = memory_pipe()

    async def slow_to_stop(line: bytes) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)
            raise
        return line

    connection = Connection(Keeper(now_ms()), ours, slow_to_stop)
    connection.start()
    await theirs.write(b"a\n")
    await asyncio.sleep(0.05)  # the request is being carried out
    closer = asyncio.create_task(connection.aclose())
    await asyncio.sleep(0.05)  # aclose waits for the run to stop
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert connection.closed.is_set() and connection.endings == 1
    async with asyncio.timeout(10):
        assert await theirs.read() == b""
