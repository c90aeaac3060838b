"""sdk.testing.waiting: the tests' way to wait for what they check."""

from __future__ import annotations

import asyncio
import time

from sdk.testing.waiting import eventually, eventually_blocking, idle


async def test_eventually_returns_once_the_check_holds() -> None:
    loop = asyncio.get_running_loop()
    flag: list[int] = []
    loop.call_later(0.1, flag.append, 1)
    assert await eventually(lambda: flag, timeout=10)


async def test_eventually_awaits_an_async_check_and_gives_up_at_the_timeout() -> None:
    calls = 0

    async def never() -> bool:
        nonlocal calls
        calls += 1
        return False

    started = time.monotonic()
    assert not await eventually(never, timeout=0.2, step=0.05)
    assert 0.2 <= time.monotonic() - started < 5
    assert calls >= 3


def test_eventually_blocking_without_a_loop() -> None:
    deadline = time.monotonic() + 0.1
    assert eventually_blocking(lambda: time.monotonic() > deadline, timeout=10, step=0.01)
    assert not eventually_blocking(lambda: False, timeout=0.05, step=0.01)


async def test_idle_runs_what_is_ready_and_leaves_what_waits() -> None:
    steps: list[int] = []
    gate = asyncio.Event()

    async def chain(n: int) -> None:
        for k in range(n):  # a task that needs many turns, none of them waiting
            steps.append(k)
            await asyncio.sleep(0)

    async def waits() -> None:
        await gate.wait()

    busy = asyncio.create_task(chain(50))
    blocked = asyncio.create_task(waits())
    await idle()
    assert busy.done() and steps == list(range(50))
    assert not blocked.done()
    gate.set()
    await blocked
