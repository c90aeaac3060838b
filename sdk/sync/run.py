"""The asyncio driver for any :class:`~sdk.sync.machine.Machine` over any stream.

Four small loops around the machine, each woken when the machine may have
changed (after every input to it):

* read: reads while the machine :attr:`~sdk.sync.machine.Machine.wants_data`
  and feeds it what came;
* write: writes what :meth:`~sdk.sync.machine.Machine.data_to_send` gives, one
  write at a time, so a peer that does not read stops our output (backpressure);
* requests: carries out the machine's requests in order with ``perform`` (which
  runs them off the event loop: on a store's worker thread, the verifier) and
  feeds back the results;
* timer: one deadline, re-armed from :meth:`~sdk.sync.machine.Machine.get_timer`
  (the machine's idle and stall limits).

The run ends when the machine is finished and its output written (returns), or
when it failed (raises its error, without writing more), or when a read, a write
or a request raises (that error). The stream is left open for the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sdk.sync.machine import Machine
from transports.stream import Stream
from transports.tasks import cancel_and_wait

#: Bytes asked of the stream per read.
READ_SIZE = 64 * 1024

#: Carries out one request off the event loop and returns its result.
Perform = Callable[[Any], Awaitable[Any]]


def now_ms() -> int:
    """The drivers' clock: monotonic milliseconds."""
    return int(time.monotonic() * 1000)


class MachineRun:
    """One run of ``machine`` over ``stream``; see the module docstring."""

    def __init__(
        self,
        machine: Machine,
        stream: Stream,
        perform: Perform,
        *,
        clock: Callable[[], int] = now_ms,
        read_size: int = READ_SIZE,
        on_event: Callable[[Any], None] | None = None,
    ) -> None:
        self.machine = machine
        self.stream = stream
        self._perform = perform
        self._clock = clock
        self._read_size = read_size
        self._on_event = on_event
        self._wakes = [asyncio.Event() for _ in range(4)]
        self._eof = False

    async def run(self) -> None:
        """Drive the machine until it is finished (returns) or fails (raises)."""
        read, write, requests, timer = self._wakes
        tasks = [
            asyncio.ensure_future(self._read_loop(read)),
            asyncio.ensure_future(self._write_loop(write)),
            asyncio.ensure_future(self._request_loop(requests)),
            asyncio.ensure_future(self._timer_loop(timer)),
        ]
        try:
            # Only the write loop returns (finished and flushed, or failed); the
            # others end by raising.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(tasks)
        for task in done:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc
        if self.machine.error is not None:
            raise self.machine.error

    def _changed(self) -> None:
        """The machine took an input: hand out its events and wake every loop."""
        machine = self.machine
        while (event := machine.next_event()) is not None:
            if self._on_event is not None:
                self._on_event(event)
        for wake in self._wakes:
            wake.set()

    def _stopped(self) -> bool:
        return self.machine.error is not None or self.machine.finished

    async def _read_loop(self, wake: asyncio.Event) -> None:
        machine = self.machine
        while True:
            wake.clear()
            if self._eof or self._stopped() or not machine.wants_data:
                await wake.wait()
                continue
            data = await self.stream.read(self._read_size)
            self._eof = not data
            machine.receive_data(data, self._clock())
            self._changed()

    async def _write_loop(self, wake: asyncio.Event) -> None:
        machine = self.machine
        while True:
            wake.clear()
            if machine.error is not None:
                return
            data = machine.data_to_send()
            if data:
                # Taking the output may let the machine make more (its buffer is
                # empty): at most one buffer waits while this one is written.
                self._changed()
                await self.stream.write(data)
                continue
            if machine.finished:
                return
            await wake.wait()

    async def _request_loop(self, wake: asyncio.Event) -> None:
        machine = self.machine
        while True:
            wake.clear()
            request = None if self._stopped() else machine.next_request()
            if request is None:
                await wake.wait()
                continue
            result = await self._perform(request)
            machine.request_done(request, result, self._clock())
            self._changed()

    async def _timer_loop(self, wake: asyncio.Event) -> None:
        machine = self.machine
        while True:
            wake.clear()
            timer = None if self._stopped() else machine.get_timer()
            if timer is None:
                await wake.wait()
                continue
            now = self._clock()
            if now >= timer:
                machine.handle_timer(now)
                self._changed()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout((timer - now) / 1000):
                    await wake.wait()


async def run_machine(
    machine: Machine,
    stream: Stream,
    perform: Perform,
    *,
    clock: Callable[[], int] = now_ms,
    read_size: int = READ_SIZE,
    on_event: Callable[[Any], None] | None = None,
) -> None:
    """Drive ``machine`` over ``stream`` until it is finished; raise why if it failed.

    ``perform`` carries out the machine's requests (off the event loop); ``clock``
    is the ``now`` the machine is given and must be the one it was created with.
    Does not close the stream.
    """
    await MachineRun(
        machine, stream, perform, clock=clock, read_size=read_size, on_event=on_event
    ).run()


__all__ = ["READ_SIZE", "MachineRun", "Perform", "now_ms", "run_machine"]
