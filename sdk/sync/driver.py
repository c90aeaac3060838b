"""The asyncio driver of p2panda replication: one :class:`~sdk.sync.session.Replication`
(a :class:`~sdk.sync.machine.Machine`) over one stream, on :class:`~sdk.sync.run.MachineRun`.

Every step of the replication (the frames of a read, the next writes, the timer,
closing) runs on the store's :attr:`~sdk.documents.store.DocumentStore.worker`
thread holding its lock (the run's ``step`` hook): the event loop goes on (other
connections, ingest, queries, health checks) while a batch is checked and
committed. This module adds what callers use on top: sessions opened and waited
for, live pushes of what the store stores meanwhile (a store listener wakes the
run) and the end of the connection. All protocol rules live in :mod:`sdk.sync.session`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TypeVar

from sdk.sync.errors import ConnectionLost
from sdk.sync.events import ConnectionClosed, SessionAborted, SessionDone, SyncEvent
from sdk.sync.framing import WireStats
from sdk.sync.messages import Mode
from sdk.sync.run import MachineRun, no_requests, now_ms, store_step
from sdk.sync.session import WRITE_CHUNK, Replication, SyncConfig
from sdk.sync.store import SyncStore
from transports.stream import Stream, StreamClosed
from transports.tasks import cancel_and_wait

#: Bytes asked of the stream per read. One read's Entry frames are stored in one
#: transaction; in a catch-up they queue up while a batch is stored, and taking
#: what is there (rather than 64 KiB, ~250 entries) makes fewer, larger batches:
#: fewer commits and fewer database pages written per entry.
READ_SIZE = 1024 * 1024

_T = TypeVar("_T")


class SyncConnection:
    """Drive ``replication`` over ``stream`` until either side closes.

    Use as an async context manager (or call :meth:`start` / :meth:`aclose`).
    Events go to ``on_event`` and to :meth:`events`. The steps of one connection
    keep their order: a read is handled before the next is read, and what the
    machine has to send is asked for again only after the last was written.
    """

    def __init__(
        self,
        replication: Replication,
        stream: Stream,
        *,
        clock: Callable[[], int] = now_ms,
        on_event: Callable[[SyncEvent], None] | None = None,
    ) -> None:
        self.replication = replication
        self.stream = stream
        self._clock = clock
        self._on_event = on_event
        self._queue: asyncio.Queue[SyncEvent | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        #: Runs a step of the machine on the store's worker holding the store's lock.
        self._step = store_step(replication.store)
        self._run = MachineRun(
            replication,
            stream,
            no_requests,
            clock=clock,
            read_size=READ_SIZE,
            on_event=self._dispatch,
            step=self._step,
        )
        self._unlisten = replication.store.add_listener(lambda _: self._run.wake())
        self.closed = asyncio.Event()
        #: Seconds :meth:`aclose` waits to send what is queued.
        self.close_timeout = 2.0

    @property
    def stats(self) -> WireStats:
        """Bytes and frames moved so far."""
        return self.replication.stats

    async def __aenter__(self) -> SyncConnection:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start reading, writing and the timer."""
        self._tasks = [asyncio.ensure_future(self._drive())]

    async def request(
        self, schema_ids: Iterable[str], *, mode: Mode | None = None, live_mode: bool | None = None
    ) -> int:
        """Open a session (see :meth:`Replication.request`, a step on the store's
        worker); returns its id."""
        ids, now = tuple(schema_ids), self._clock()
        return await self._call(
            lambda: self.replication.request(ids, now, mode=mode, live_mode=live_mode)
        )

    async def end_live(self, session_id: int) -> None:
        """Leave live mode for ``session_id`` (a step on the store's worker)."""
        now = self._clock()
        await self._call(lambda: self.replication.end_live(session_id, now))

    async def events(self) -> AsyncIterator[SyncEvent]:
        """Events until the connection closes."""
        while (event := await self._queue.get()) is not None:
            yield event

    async def wait_session(self, session_id: int) -> SessionDone:
        """Wait until ``session_id`` ends; raise its error if it was aborted."""
        async for event in self.events():
            if isinstance(event, SessionDone) and event.session_id == session_id:
                return event
            if isinstance(event, SessionAborted) and event.session_id == session_id:
                raise event.error
            if isinstance(event, ConnectionClosed) and event.error is not None:
                raise event.error
        raise ConnectionLost("the connection closed before the session ended")

    async def aclose(self) -> None:
        """Send what is queued (up to :attr:`close_timeout` seconds), close the stream, stop."""
        self._unlisten()
        try:
            await self._drain()
        finally:
            # Cancelled or not, everything below runs: the caller's cancellation
            # propagates after the stream is closed.
            try:
                await asyncio.shield(self._step(self.replication.close))
            finally:
                self._hand_out()
                try:
                    await cancel_and_wait(self._tasks)
                finally:
                    with contextlib.suppress(Exception):
                        await self.stream.close()
                    self._finish()

    # -- internals ---------------------------------------------------------------------

    async def _drain(self) -> None:
        """Let the run write what is queued (our SyncDone, a session's entries) and end,
        unless the peer stopped reading. asyncio.timeout, not wait_for: Python 3.11's
        wait_for drops a cancellation of the caller that arrives as the wait completes."""
        running = [task for task in self._tasks if not task.done()]
        if not running:
            return
        self.replication.close_when_sent()
        self._run.wake()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.close_timeout):
                await asyncio.wait(running)

    async def _drive(self) -> None:
        """Run the machine until the peer closes, the replication ends or the stream fails."""
        try:
            await self._run.run()
        except (StreamClosed, OSError):
            pass
        finally:
            if not self.replication.closed:
                await asyncio.shield(self._step(self.replication.close))
            self._hand_out()
            self._finish()

    async def _call(self, step: Callable[[], _T]) -> _T:
        """Run a step of the application's on the store's worker; hand out its events."""
        try:
            return await self._step(step)
        finally:
            self._hand_out()
            self._run.wake()

    def _hand_out(self) -> None:
        """Hand out the events of the steps so far (on the loop's thread)."""
        while (event := self.replication.next_event()) is not None:
            self._dispatch(event)

    def _dispatch(self, event: SyncEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
        self._queue.put_nowait(event)

    def _finish(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._queue.put_nowait(None)


async def sync(
    store: SyncStore,
    stream: Stream,
    schema_ids: Iterable[str],
    *,
    mode: Mode = Mode.SET_RECONCILIATION,
    config: SyncConfig | None = None,
    on_event: Callable[[SyncEvent], None] | None = None,
) -> SessionDone:
    """Catch ``store`` up with the peer at the other end of ``stream`` (one session), then close.

    Raises the session's :class:`~sdk.sync.errors.SyncError` if it was aborted.
    """
    ids = tuple(schema_ids)
    replication = Replication(store, ids, now=now_ms(), config=config or SyncConfig(mode=mode))
    async with SyncConnection(replication, stream, on_event=on_event) as connection:
        sid = await connection.request(ids, mode=mode, live_mode=False)
        return await connection.wait_session(sid)


async def serve_stream(
    store: SyncStore,
    stream: Stream,
    schema_ids: Iterable[str],
    *,
    config: SyncConfig | None = None,
    on_event: Callable[[SyncEvent], None] | None = None,
) -> WireStats:
    """Answer a peer's sessions on ``stream`` until it closes; return the wire figures."""
    # Agree to live mode: it starts only if the peer asks for it too.
    config = config or SyncConfig(initiator=False, live_mode=True)
    replication = Replication(store, tuple(schema_ids), now=now_ms(), config=config)
    connection = SyncConnection(replication, stream, on_event=on_event)
    connection.start()
    await connection.closed.wait()
    await connection.aclose()
    return connection.stats


__all__ = ["READ_SIZE", "WRITE_CHUNK", "SyncConnection", "WireStats", "serve_stream", "sync"]
