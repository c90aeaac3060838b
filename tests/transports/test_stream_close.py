"""TcpStream: a closer that is cancelled does not break the close for the others; reads
take what a large buffer holds."""

from __future__ import annotations

import asyncio

import pytest

from sdk.testing.waiting import eventually
from transports.stream import TcpStream, connect_tcp, serve_tcp


async def test_a_cancelled_close_leaves_the_next_close_working() -> None:
    """A connection's reader closing the stream is cancelled by its owner, which then
    closes the stream itself (the Bamboo driver does exactly this): the owner's close
    must return, not raise the first closer's cancellation."""
    held: list[TcpStream] = []

    async def handle(stream: TcpStream) -> None:
        held.append(stream)
        await stream.read()  # until the client's close reaches us

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    stream = await connect_tcp("127.0.0.1", port)
    try:
        first = asyncio.ensure_future(stream.close())
        await asyncio.sleep(0)  # first is waiting for the close to complete
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        async with asyncio.timeout(10):
            await stream.close()  # must neither hang nor raise
    finally:
        server.close()
        await server.wait_closed()


async def test_stop_tcp_server_stops_listening_and_ends_the_connections() -> None:
    from transports.stream import stop_tcp_server

    connections: set[asyncio.Task[None]] = set()

    async def handle(stream: TcpStream) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        await asyncio.sleep(3600)  # a connection that would never end by itself

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    client = await connect_tcp("127.0.0.1", port)
    while not connections:
        await asyncio.sleep(0.01)
    assert await stop_tcp_server(server, connections, connection_timeout=5)
    assert all(task.done() for task in connections)
    assert await client.read() == b""  # the server side closed the connection
    with pytest.raises(OSError):
        await connect_tcp("127.0.0.1", port)
    await client.close()


@pytest.mark.parametrize("side", ["dialled", "accepted"])
async def test_a_read_takes_what_arrived_beyond_asyncios_default_buffer(side: str) -> None:
    """Both ends of a TCP stream buffer up to READ_LIMIT: after 1 MiB has arrived a
    read of 1 MiB gets far more than asyncio's default limit lets it hold (reading
    pauses at 128 KiB), so one read's frames make a large batch."""
    payload = bytes(range(256)) * 4096  # 1 MiB
    accepted: asyncio.Future[TcpStream] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def handle(stream: TcpStream) -> None:
        accepted.set_result(stream)
        await done.wait()

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    dialled = await connect_tcp("127.0.0.1", port)
    try:
        other = await asyncio.wait_for(accepted, 10)
        writer, reader = (other, dialled) if side == "dialled" else (dialled, other)
        await asyncio.wait_for(writer.write(payload), 10)
        # Let it arrive: the reader's transport keeps reading until its buffer
        # holds twice its limit.
        buffered = reader._reader._buffer  # type: ignore[attr-defined]
        assert await eventually(lambda: len(buffered) > 512 * 1024)
        first = await reader.read(len(payload))
        assert len(first) > 512 * 1024
        received = first
        while len(received) < len(payload):
            received += await reader.read(len(payload))
        assert received == payload
    finally:
        done.set()
        await dialled.close()
        server.close()
        await server.wait_closed()


def test_a_connection_cancelled_while_it_closes_reports_no_error() -> None:
    """The handler returned and the loop shuts down while the connection task waits
    for its close: asyncio must not report the cancellation as an error of the
    server's callback (bench/sync.py printed a traceback per session)."""
    reported: list[dict[str, object]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        served = asyncio.Event()

        async def handle(stream: TcpStream) -> None:
            served.set()

        server = await serve_tcp(handle)
        port = server.sockets[0].getsockname()[1]
        await connect_tcp("127.0.0.1", port)
        await served.wait()
        server.close()
        # Returning now: asyncio.run cancels the connection task while it closes.

    asyncio.run(main())
    assert reported == []
