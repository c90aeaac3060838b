"""The asyncio driver of p2panda replication: one :class:`~sdk.sync.session.Replication`
over one stream, a :class:`~sdk.sync.run.MachineConnection`.

Its requests are carried out by :func:`sdk.sync.store_work.perform` on the store's
:attr:`~sdk.documents.store.DocumentStore.worker` thread holding its lock: the event
loop goes on (other connections, ingest, queries, health checks) while a batch is
checked and committed. This module adds sessions opened and waited for, live pushes of
what the store stores meanwhile (a store listener tells the machine) and the end of
the connection. All protocol rules live in :mod:`sdk.sync.session`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from sdk.documents.bamboo import Entry, SignatureChecks, decode_entry
from sdk.documents.errors import DocumentError
from sdk.sync.errors import ConnectionLost
from sdk.sync.events import ConnectionClosed, SessionAborted, SessionDone, SyncEvent
from sdk.sync.framing import WireStats
from sdk.sync.messages import Mode
from sdk.sync.run import MachineConnection, now_ms, store_step
from sdk.sync.session import WRITE_CHUNK, Replication, Stored, SyncConfig
from sdk.sync.session_state import StoreBatch
from sdk.sync.store import StoredEntry, SyncStore
from sdk.sync.store_work import Prepared, perform
from transports.stream import Stream

#: Bytes asked of the stream per read. One read's Entry frames are stored in one
#: transaction; in a catch-up they queue up while a batch is stored, and taking
#: what is there (rather than 64 KiB, ~250 entries) makes fewer, larger batches:
#: fewer commits and fewer database pages written per entry.
READ_SIZE = 1024 * 1024


class SyncConnection(MachineConnection[Replication]):
    """Drive ``replication`` over ``stream`` until either side closes; its requests are
    carried out on ``store``, in order, one at a time. Use as an async context manager
    (or :meth:`start` / :meth:`aclose`). Events go to ``on_event`` and to :meth:`events`.
    """

    def __init__(
        self,
        replication: Replication,
        stream: Stream,
        *,
        store: SyncStore,
        clock: Callable[[], int] = now_ms,
        on_event: Callable[[SyncEvent], None] | None = None,
    ) -> None:
        self.replication = replication
        self.store = store
        self._step = store_step(store)
        self._clock = clock
        self._on_event = on_event
        self._queue: asyncio.Queue[SyncEvent | None] = asyncio.Queue()
        super().__init__(
            replication,
            stream,
            self._perform,
            clock=clock,
            read_size=READ_SIZE,
            on_event=self._dispatch,
        )
        #: True on the worker while one of our requests is carried out: what the store
        #: stores then is the peer's, not news for it.
        self._own = False
        #: What the store stored meanwhile, for the machine (filled on any thread).
        self._grown: deque[Stored] = deque()
        #: The request being carried out (the run may end while it is).
        self._performing: tuple[Any, Awaitable[Any]] | None = None
        self._unlisten = store.add_listener(self._on_stored)
        #: Seconds :meth:`aclose` waits to send what is queued.
        self.close_timeout = 2.0
        #: The batch being read while the one before is stored (the machine's list),
        #: its entries decoded so far and their signature checks, running meanwhile.
        self._ahead: tuple[list[tuple[bytes, bytes]], list[Entry], SignatureChecks] | None = None

    async def request(
        self, schema_ids: Iterable[str], *, mode: Mode | None = None, live_mode: bool | None = None
    ) -> int:
        """Open a session (see :meth:`Replication.request`); returns its id."""
        try:
            return self.replication.request(
                schema_ids, self._clock(), mode=mode, live_mode=live_mode
            )
        finally:
            self._poke()

    async def end_live(self, session_id: int) -> None:
        """Leave live mode for ``session_id``."""
        try:
            self.replication.end_live(session_id, self._clock())
        finally:
            self._poke()

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
                await self._close()
            finally:
                self._hand_out()
                await super().aclose()

    # -- internals ---------------------------------------------------------------------

    async def _drain(self) -> None:
        """Let the run write what is queued (our SyncDone, a session's entries) and end,
        unless the peer stopped reading. asyncio.timeout, not wait_for: Python 3.11's
        wait_for drops a cancellation of the caller that arrives as the wait completes."""
        running = [task for task in self._tasks if not task.done()]
        if not running:
            return
        self.replication.close_when_sent()
        self.wake()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.close_timeout):
                await asyncio.wait(running)

    async def _ended(self) -> None:
        """The run ended: settle, close the machine, hand out its last events."""
        try:
            with contextlib.suppress(Exception):
                await self._settle()
        finally:
            await self._close()
            self._hand_out()

    async def _settle(self) -> None:
        """Store what was read before the run ended (the peer closed, the replication
        ended or the stream failed) as if the peer had closed, the request the run was
        carrying out first."""
        replication, now = self.replication, self._clock()
        if replication.closed:
            return
        if self._performing is not None:
            (request, done), self._performing = self._performing, None
            replication.request_done(request, await done, now)
        replication.receive_data(b"", now)
        while (request := replication.next_request()) is not None:
            replication.request_done(request, await self._perform(request), now)

    async def _close(self) -> None:
        """Close the machine and persist the store's indexes (once)."""
        self._take_ahead()
        if not self.replication.closed:
            self.replication.close()
            await asyncio.shield(self._step(self.store.flush))

    async def _perform(self, request: Any) -> Any:
        """Carry out one request on the store's worker, holding its lock."""
        prepared = self._take_ahead(request.entries if isinstance(request, StoreBatch) else None)

        def work() -> Any:
            self._own = True
            try:
                return perform(self.store, request, prepared)
            finally:
                self._own = False

        # Shielded: if the run ends meanwhile, _settle still takes the result.
        done = self._step(work)
        self._performing = (request, done)
        result = await asyncio.shield(done)
        self._performing = None
        return result

    def _take_ahead(self, batch: object = None) -> Prepared | None:
        """The entries decoded ahead and their checks if the batch checked ahead is
        ``batch``, else ``None`` (its checks, if any, cancelled); either way it is no
        longer this connection's."""
        ahead, self._ahead = self._ahead, None
        if self.store.checking_ahead is self:
            self.store.checking_ahead = None
        if ahead is None:
            return None
        if ahead[0] is batch:
            return ahead[1:]
        ahead[2].cancel()
        return None

    def _on_stored(self, stored: StoredEntry) -> None:
        """A store listener (any thread, the store's lock held): what others stored goes
        to the machine on the loop, once the run wakes (:meth:`_on_change`)."""
        if self._own or stored.schema_id not in self.replication.schema_ids:
            return
        self._grown.append((stored.schema_id, stored.author, stored.log_id, stored.seq_num))
        self.wake()

    def _on_change(self) -> None:
        """Before the run's loops look again: hand the machine what the store stored;
        start checking the signatures of the entries read while a batch is stored."""
        grown = [self._grown.popleft() for _ in range(len(self._grown))]
        if grown and not self.replication.closed:
            self.replication.stored(grown)
            self._hand_out()
        self._check_ahead()
        super()._on_change()

    def _check_ahead(self) -> None:
        """Decode the entries the machine read into its next batch since last time and
        add them to that batch's signature checks: the verification threads work on
        them while the batch before commits (:func:`~sdk.sync.store_work.perform`
        takes them over)."""
        batch = self.replication.reading_batch()
        if batch is None or self.store.checking_ahead not in (None, self):
            return
        ahead = self._ahead
        if ahead is None or ahead[0] is not batch:
            self._take_ahead()
            capacity = self.replication.config.max_batch
            ahead = self._ahead = (batch, [], SignatureChecks.growing(capacity))
            self.store.checking_ahead = self
        _, decoded, checks = ahead
        for entry_bytes, _operation in batch[len(decoded) :]:
            try:
                entry = decode_entry(entry_bytes)
            except DocumentError:
                return  # the worker decodes it again and says why
            decoded.append(entry)
            checks.add(entry)

    def _poke(self) -> None:
        """The application changed the machine: hand out its events, wake the run."""
        self._hand_out()
        self.wake()

    def _hand_out(self) -> None:
        """Hand out the events of the steps so far (on the loop's thread)."""
        while (event := self.replication.next_event()) is not None:
            self._dispatch(event)

    def _dispatch(self, event: SyncEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
        self._queue.put_nowait(event)

    def _closing(self) -> None:
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
    replication = Replication(ids, now=now_ms(), config=config or SyncConfig(mode=mode))
    async with SyncConnection(replication, stream, store=store, on_event=on_event) as connection:
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
    replication = Replication(schema_ids, now=now_ms(), config=config)
    await SyncConnection(replication, stream, store=store, on_event=on_event).until_closed()
    return replication.stats


__all__ = ["READ_SIZE", "WRITE_CHUNK", "SyncConnection", "WireStats", "serve_stream", "sync"]
