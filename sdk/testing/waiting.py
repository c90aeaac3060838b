"""Waiting in tests for what is awaited, never for a fixed time.

A fixed ``sleep`` before an assertion flakes on a loaded machine when the thing
is slow to happen, and proves nothing when the assertion is that something did
*not* happen. Instead:

- for "it happens": :func:`eventually` (or :func:`eventually_blocking` outside an
  event loop) polls the condition itself, with a generous timeout that only a
  real failure reaches;
- for "it does not happen": make happen what would have to come first (a later
  message through the same ordered path, a round trip on the same connection),
  wait for that, then assert; or, for work that is all in-process, :func:`idle`
  runs the event loop until nothing is left ready to run, then assert.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: How long a positive check may take before it counts as failed: far beyond what
#: a passing run needs, so a slow machine never fails a correct program.
DEFAULT_TIMEOUT = 20.0


async def eventually(
    check: Callable[[], object | Awaitable[object]],
    timeout: float = DEFAULT_TIMEOUT,
    step: float = 0.05,
) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds pass; return the last answer.

    ``check`` may be a plain function or return an awaitable (an ``async def``).
    Use as ``assert await eventually(lambda: ...)`` so a failure names the line.
    """
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(step)


def eventually_blocking(
    check: Callable[[], object], timeout: float = DEFAULT_TIMEOUT, step: float = 0.05
) -> bool:
    """:func:`eventually` for code without an event loop (subprocesses, files)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return bool(check())
        time.sleep(step)
    return True


async def idle(max_turns: int = 10_000) -> None:
    """Let the running loop run until no callback but this one is ready.

    Everything in-process that was going to happen without a timer or I/O has
    then happened: a task that is still not done is waiting for something. Reads
    the loop's ready queue (CPython's ``BaseEventLoop._ready``); on a loop without
    one it yields ``max_turns`` times instead.
    """
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)
    for _ in range(max_turns):
        await asyncio.sleep(0)
        if ready is not None and not ready:
            return
    if ready is not None:
        raise AssertionError(f"the event loop was still busy after {max_turns} turns")
