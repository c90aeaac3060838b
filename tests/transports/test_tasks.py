"""cancel_and_wait: children stop, and the closer's own cancellation is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from transports.tasks import cancel_and_wait


async def _slow_to_stop(stopped: asyncio.Event) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # cleanup that takes a moment
        stopped.set()
        raise


async def test_children_are_cancelled_and_awaited() -> None:
    stopped = asyncio.Event()
    child = asyncio.ensure_future(_slow_to_stop(stopped))
    await asyncio.sleep(0)
    await cancel_and_wait([child, None])
    assert child.cancelled() and stopped.is_set()


async def test_a_child_failure_is_retrieved_not_raised() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    child = asyncio.ensure_future(fails())
    await asyncio.sleep(0)
    await cancel_and_wait([child])
    assert isinstance(child.exception(), RuntimeError)


async def test_the_closers_own_cancellation_propagates() -> None:
    """The hang this fixes: a service loop cancelled while it closed a session
    went on looping, and whoever awaited it waited forever."""
    cleaning, release = asyncio.Event(), asyncio.Event()
    loops = 0

    async def child_task() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cleaning.set()
            await release.wait()  # cleanup that takes until the test says
            raise

    async def service() -> None:
        nonlocal loops
        while True:
            loops += 1
            child = asyncio.ensure_future(child_task())
            await asyncio.sleep(0)
            await cancel_and_wait([child])  # cancelled while waiting here
            await asyncio.sleep(0.01)

    runner = asyncio.ensure_future(service())
    await asyncio.wait_for(cleaning.wait(), 5)  # runner is inside cancel_and_wait now
    runner.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(runner, 2)
    assert loops == 1


async def test_timeout_leaves_a_stubborn_child_behind() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    child = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait([child], timeout=0.05)
    assert not child.done()
    release.set()
    child.cancel()
    await asyncio.wait([child])
