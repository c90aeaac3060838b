"""The asyncio driver for any :class:`~sdk.sync.machine.Machine` over any stream.

Four small loops around the machine, each woken after every input to it: read (while
the machine :attr:`~sdk.sync.machine.Machine.wants_data`), write (one write at a time,
so a peer that does not read stops our output), requests (in order, through
``perform``, which runs them off the loop: :func:`store_step` gives a store's worker,
holding its lock) and timer (one deadline, from
:meth:`~sdk.sync.machine.Machine.get_timer`). The machine's own calls run on the loop.

The run ends when the machine is finished and its output written (returns), or when
it failed (raises its error, without writing more), or when a read, a write or a
request raises (that error). The stream is left open for the caller.
:meth:`MachineRun.wake` tells the run, from any thread, that the machine changed
outside it (a store listener, the application calling it between inputs).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, Self, TypeVar

from sdk.sync.machine import Machine
from transports.stream import Stream, StreamClosed
from transports.tasks import cancel_and_wait

#: Bytes asked of the stream per read.
READ_SIZE = 64 * 1024

#: Carries out one request off the event loop and returns its result.
Perform = Callable[[Any], Awaitable[Any]]

_T = TypeVar("_T")
_M = TypeVar("_M", bound=Machine)


async def no_requests(request: Any) -> Any:
    """The ``perform`` of a machine that makes no requests: being asked one is a bug."""
    raise AssertionError(f"this machine makes no requests, got {request!r}")


class Step(Protocol):
    """Runs one call of the machine where it must run (without one: on the loop)."""

    def __call__(self, call: Callable[[], _T], /) -> Awaitable[_T]:
        """Run ``call`` and return what it returned."""
        ...


class WorkerStore(Protocol):
    """A store whose work runs on one thread of its own, one user at a time."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Held around each use of the store."""
        ...

    @property
    def worker(self) -> Executor:
        """The store's thread for work off the event loop."""
        ...


def store_step(store: WorkerStore) -> Step:
    """A :class:`Step` that runs each call on ``store``'s worker holding its lock (the
    loop goes on; the store's users take turns), or here at once if the worker was shut
    down with its store (an exception the call raises on the worker is the future's:
    the call never runs twice)."""

    def step(call: Callable[[], _T]) -> asyncio.Future[_T]:
        def locked() -> _T:
            with store.lock:
                return call()

        loop = asyncio.get_running_loop()
        try:
            return loop.run_in_executor(store.worker, locked)
        except RuntimeError:  # cannot schedule new futures after shutdown
            done: asyncio.Future[_T] = loop.create_future()
            try:
                done.set_result(locked())
            except Exception as exc:
                done.set_exception(exc)
            return done

    return step


async def serve_listening(server: asyncio.Server) -> None:
    """A command line's server: print ``listening HOST:PORT`` on stdout once ``server``
    accepts connections (what scripts wait for), then serve until killed."""
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


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
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.machine = machine
        self.stream = stream
        self._perform = perform
        self._clock = clock
        self._read_size = read_size
        self._on_event = on_event
        self._on_change = on_change
        self._wakes = [asyncio.Event() for _ in range(4)]
        self._eof = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake_pending = False

    def wake(self) -> None:
        """The machine changed outside the run: soon hand out its events and let every
        loop look again. Safe from any thread, and inside a call into the machine
        (nothing runs before that call returned); does nothing before :meth:`run` started."""
        loop = self._loop
        if loop is None or self._wake_pending:
            return
        self._wake_pending = True
        if threading.get_ident() == self._loop_thread:
            loop.call_soon(self._woken)
        elif not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        self._changed()

    async def run(self) -> None:
        """Drive the machine until it is finished (returns) or fails (raises)."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        loops = (self._read_loop, self._write_loop, self._request_loop, self._timer_loop)
        tasks = [
            asyncio.ensure_future(loop(wake)) for loop, wake in zip(loops, self._wakes, strict=True)
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
        if self._on_change is not None:
            self._on_change()

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
                # Let the other loops in between writes that did not have to wait.
                await asyncio.sleep(0)
                continue
            if machine.finished:
                return
            await wake.wait()

    async def _next(self, wake: asyncio.Event, get: Callable[[], _T | None]) -> _T:
        """What ``get`` gives once it gives something while the run goes on."""
        while True:
            wake.clear()
            if not self._stopped() and (value := get()) is not None:
                return value
            await wake.wait()

    async def _request_loop(self, wake: asyncio.Event) -> None:
        machine = self.machine
        while True:
            request = await self._next(wake, machine.next_request)
            machine.request_done(request, await self._perform(request), self._clock())
            self._changed()

    async def _timer_loop(self, wake: asyncio.Event) -> None:
        machine = self.machine
        while True:
            timer = await self._next(wake, machine.get_timer)
            now = self._clock()
            if now >= timer:
                machine.handle_timer(now)
                self._changed()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout((timer - now) / 1000):
                    await wake.wait()


class MachineConnection(Generic[_M]):
    """One :class:`MachineRun` of ``machine`` over ``stream`` as a connection object.

    Use as an async context manager (or :meth:`start` / :meth:`aclose`). The run
    goes in a task of its own; an error of the types in :attr:`peer_errors` ends the
    connection as the peer's doing (kept in :attr:`error`, the stream closed), a
    stream that breaks ends it quietly. Either way, or on :meth:`aclose`,
    the connection ends once: :meth:`_closing` runs, :attr:`closed` is set and
    waiters of :meth:`_wait_change` look again. Subclasses add their API and the
    hooks :meth:`_ended` (after the run) and :meth:`_closing`.
    """

    #: The run's errors that mean the peer misbehaved or went silent.
    peer_errors: tuple[type[Exception], ...] = ()

    def __init__(
        self,
        machine: _M,
        stream: Stream,
        perform: Perform = no_requests,
        *,
        clock: Callable[[], int] = now_ms,
        read_size: int = READ_SIZE,
        on_event: Callable[[Any], None] | None = None,
    ) -> None:
        self.machine = machine
        self.stream = stream
        #: The peer's error (one of :attr:`peer_errors`) that ended the connection.
        self.error: Exception | None = None
        #: Set once the connection has ended.
        self.closed = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Future[None]] = []
        self._run = MachineRun(
            machine,
            stream,
            perform,
            clock=clock,
            read_size=read_size,
            on_event=on_event,
            on_change=self._on_change,
        )

    def _on_change(self) -> None:
        """The machine took an input (on the loop, before the run's loops look again):
        wake waiters of :meth:`_wait_change`; subclasses may do more first."""
        self._changed.set()

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start driving the machine; idempotent."""
        if not self._tasks:
            self._tasks.append(asyncio.ensure_future(self._drive()))

    def wake(self) -> None:
        """The machine changed outside the run (see :meth:`MachineRun.wake`)."""
        self._run.wake()

    async def until_closed(self) -> Self:
        """Serve the peer: start, wait until the connection ended (the peer closed,
        failed or went silent), close it; the ended connection (its :attr:`error`)."""
        async with self:
            await self.closed.wait()
        return self

    async def aclose(self) -> None:
        """Stop the run, close the stream, end the connection (cancelled or not)."""
        try:
            await cancel_and_wait(self._tasks)
        finally:
            await self._close_stream()
            self._finish()

    async def _wait_change(self) -> None:
        """Wait until the machine took an input or the connection ended."""
        self._changed.clear()
        await self._changed.wait()

    async def _close_stream(self) -> None:
        with contextlib.suppress(Exception):
            await self.stream.close()

    async def _drive(self) -> None:
        try:
            await self._run.run()
        except self.peer_errors as exc:
            self.error = exc
        except (StreamClosed, OSError):
            pass
        finally:
            await self._ended()
            self._finish()
            if self.error is not None:
                await self._close_stream()

    async def _ended(self) -> None:
        """The run ended (the connection did not yet): nothing by default."""

    def _closing(self) -> None:
        """The connection ends (once): nothing by default."""

    def _finish(self) -> None:
        if not self.closed.is_set():
            self._closing()
            self.closed.set()
            self._changed.set()

    @staticmethod
    def _fail_waiting(futures: Iterable[asyncio.Future[Any]], error: Exception) -> None:
        """Fail the futures not done yet with ``error`` (retrieved here: a future nobody
        awaits is no error)."""
        for future in futures:
            if not future.done():
                future.set_exception(error)
                future.exception()


async def run_machine(machine: Machine, stream: Stream, perform: Perform) -> None:
    """Drive ``machine`` over ``stream`` until it is finished, its requests carried out
    by ``perform`` and its clock :func:`now_ms` (the machine's too); raise why if it
    failed. (:class:`MachineRun` takes another clock, read size and event hook.)"""
    await MachineRun(machine, stream, perform).run()


__all__ = [
    "READ_SIZE",
    "MachineConnection",
    "MachineRun",
    "Perform",
    "Step",
    "no_requests",
    "now_ms",
    "run_machine",
    "serve_listening",
    "store_step",
]
