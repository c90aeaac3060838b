"""memory_pipe: writes wait for room, and a write larger than the capacity still goes through."""

from __future__ import annotations

import asyncio

from sdk.testing.waiting import idle
from transports.stream import PipeFaults, memory_pipe


async def _read_exactly(stream: object, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = await stream.read(n - len(out))  # type: ignore[attr-defined]
        assert chunk, "the pipe closed early"
        out += chunk
    return out


async def test_a_write_larger_than_the_capacity_is_delivered_once_the_pipe_is_drained() -> None:
    a, b, _ = memory_pipe(PipeFaults(capacity=1_000))
    await a.write(b"x" * 600)
    big = bytes(range(256)) * 10  # 2,560 bytes: more than the whole capacity
    writer = asyncio.create_task(a.write(big))
    await idle()  # in-process: a write that did not wait would be done
    assert not writer.done()  # 600 bytes are still unread: it waits for them
    assert await _read_exactly(b, 600) == b"x" * 600
    async with asyncio.timeout(5):
        await writer
    assert await _read_exactly(b, len(big)) == big


async def test_writes_within_the_capacity_wait_for_room() -> None:
    a, b, _ = memory_pipe(PipeFaults(capacity=1_000))
    await a.write(b"a" * 800)
    writer = asyncio.create_task(a.write(b"b" * 300))
    await idle()  # in-process: a write that did not wait would be done
    assert not writer.done()
    assert await _read_exactly(b, 800) == b"a" * 800
    async with asyncio.timeout(5):
        await writer
    assert await _read_exactly(b, 300) == b"b" * 300
