"""The asyncio driver: one :class:`~sdk.sync.session.Replication` over one stream.

Thin on purpose: it frames what the state machine sends, feeds it the frames
it reads, re-arms one timer and hands events on. All protocol rules live in
:mod:`sdk.sync.session`. The machine's steps read and write the store, so they
run on the store's worker thread (:class:`SyncConnection`), never on the loop's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from sdk.sds.varint import encode_uvarint
from sdk.sync.errors import ConnectionLost, LimitExceeded, MalformedMessage
from sdk.sync.events import ConnectionClosed, SessionAborted, SessionDone, SyncEvent
from sdk.sync.framing import MAX_FRAME, FrameDecoder
from sdk.sync.messages import Mode
from sdk.sync.run import on_worker
from sdk.sync.session import Replication, SyncConfig
from sdk.sync.store import StoredEntry, SyncStore
from transports.stream import Stream, StreamClosed
from transports.tasks import cancel_and_wait

#: Bytes of frames :class:`SyncConnection` joins into one stream write.
WRITE_CHUNK = 64 * 1024
#: Bytes asked of the stream per read. One read's Entry frames are stored in one
#: transaction; in a catch-up they queue up while a batch is stored, and taking
#: what is there (rather than 64 KiB, ~250 entries) makes fewer, larger batches:
#: fewer commits and fewer database pages written per entry.
READ_SIZE = 1024 * 1024
#: Bytes of messages one step on the store's worker takes from
#: :meth:`Replication.data_to_send` (several of its chunks): each step costs a
#: hand-over between threads, so a catch-up's sender makes few of them.
STEP_OUTPUT = 256 * 1024

_T = TypeVar("_T")


def length_prefix(size: int) -> bytes:
    """The frame prefix of a message of ``size`` bytes, as
    :func:`~sdk.sync.framing.encode_frame` writes it: a frame is not copied to be prefixed."""
    return encode_uvarint(size)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass
class WireStats:
    """Bytes and frames a connection moved (frame prefixes included)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    frames_sent: int = 0
    frames_received: int = 0


class SyncConnection:
    """Drive ``replication`` over ``stream`` until either side closes.

    Use as an async context manager (or call :meth:`start` / :meth:`aclose`).
    Events go to ``on_event`` and to :meth:`events`.

    Every step of the state machine that may read or write the store (the frames
    of a read, the next chunk to send, the timer, closing) runs on the store's
    :attr:`~sdk.documents.store.DocumentStore.worker` thread holding its lock, one
    step at a time: the event loop goes on (other connections, ingest, queries,
    health checks) while a batch is checked and committed. The steps of one
    connection keep their order: a read is handled before the next is read, and
    what the machine has to send is asked for again only after the last chunk was
    written (backpressure as before).
    """

    def __init__(
        self,
        replication: Replication,
        stream: Stream,
        *,
        max_frame: int = MAX_FRAME,
        clock: Callable[[], int] = _now_ms,
        on_event: Callable[[SyncEvent], None] | None = None,
    ) -> None:
        self.replication = replication
        self.stream = stream
        self.stats = WireStats()
        self._decoder = FrameDecoder(max_frame)
        self._clock = clock
        self._on_event = on_event
        self._queue: asyncio.Queue[SyncEvent | None] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._write_lock = asyncio.Lock()
        #: Events the machine emitted during steps, handed out on the loop's thread
        #: (a deque: appended on the worker, taken on the loop).
        self._emitted: deque[SyncEvent] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_pending = False
        self._unlisten = replication.store.add_listener(self._on_stored)
        self.closed = asyncio.Event()
        #: Seconds :meth:`aclose` waits to send what is queued.
        self.close_timeout = 2.0

    async def __aenter__(self) -> SyncConnection:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start reading, writing and the timer."""
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.ensure_future(self._read_loop()),
            asyncio.ensure_future(self._write_loop()),
            asyncio.ensure_future(self._timer_loop()),
        ]

    def now(self) -> int:
        """The clock the state machine is given (ms)."""
        return self._clock()

    def request(
        self,
        schema_ids: Iterable[str],
        *,
        mode: Mode | None = None,
        live_mode: bool | None = None,
    ) -> int:
        """Open a session (see :meth:`Replication.request`); returns its id.

        Runs on the calling thread, holding the store's lock (it may wait for a
        step in progress); :meth:`open_session` is the same off the event loop.
        """
        now = self.now()
        sid = self._locked(
            lambda: self.replication.request(schema_ids, now, mode=mode, live_mode=live_mode)
        )
        self._hand_out()
        self._wake.set()
        return sid

    async def open_session(
        self,
        schema_ids: Iterable[str],
        *,
        mode: Mode | None = None,
        live_mode: bool | None = None,
    ) -> int:
        """Open a session on the store's worker thread; returns its id."""
        ids, now = tuple(schema_ids), self.now()
        sid = await self._step(
            lambda: self.replication.request(ids, now, mode=mode, live_mode=live_mode)
        )
        self._wake.set()
        return sid

    def end_live(self, session_id: int) -> None:
        """Leave live mode for ``session_id`` (holding the store's lock, like :meth:`request`)."""
        now = self.now()
        self._locked(lambda: self.replication.end_live(session_id, now))
        self._hand_out()
        self._wake.set()

    async def events(self) -> AsyncIterator[SyncEvent]:
        """Events until the connection closes."""
        while True:
            event = await self._queue.get()
            if event is None:
                return
            yield event

    async def wait_session(self, session_id: int) -> SessionDone:
        """Wait until ``session_id`` ends; raise its error if it was aborted."""
        async for event in self.events():
            if isinstance(event, SessionDone) and event.session_id == session_id:
                return event
            if isinstance(event, SessionAborted) and event.session_id == session_id:
                raise event.error
            if isinstance(event, ConnectionClosed):
                raise event.error or ConnectionLost(
                    "the connection closed before the session ended"
                )
        raise ConnectionLost("the connection closed before the session ended")

    async def aclose(self) -> None:
        """Close the stream and stop."""
        self._unlisten()
        try:
            with contextlib.suppress(StreamClosed, OSError, TimeoutError):
                # What the last step queued (e.g. our SyncDone) still goes out,
                # unless the peer stopped reading. asyncio.timeout, not wait_for:
                # Python 3.11's wait_for drops a cancellation of the caller that
                # arrives as the flush completes.
                async with asyncio.timeout(self.close_timeout):
                    await self._flush()
        finally:
            # Cancelled or not, everything below runs: the caller's cancellation
            # propagates after the stream is closed.
            try:
                await asyncio.shield(self._submit(self.replication.close))
            finally:
                self._hand_out()
                self._wake.set()
                try:
                    await cancel_and_wait(self._tasks)
                finally:
                    with contextlib.suppress(Exception):
                        await self.stream.close()
                    self._finish()

    # -- internals ---------------------------------------------------------------------

    def _locked(self, step: Callable[[], _T]) -> _T:
        """Run ``step`` holding the store's lock; keep the events it emitted."""
        with self.replication.store.lock:
            try:
                return step()
            finally:
                emitted, next_event = self._emitted, self.replication.next_event
                while (event := next_event()) is not None:
                    emitted.append(event)

    def _submit(self, step: Callable[[], _T]) -> asyncio.Future[_T]:
        """Queue ``step`` on the store's worker thread (run here if the store is closed)."""
        return on_worker(self.replication.store.worker, functools.partial(self._locked, step))

    async def _step(self, step: Callable[[], _T]) -> _T:
        """Run a step of the machine off the event loop, then hand out its events."""
        try:
            return await self._submit(step)
        finally:
            self._hand_out()

    def _on_stored(self, _: StoredEntry) -> None:
        # Called on the thread that stored the entry, for each entry: one wake-up
        # of the loop for a batch, not one per entry.
        loop = self._loop
        if loop is None or self._wake_pending or loop.is_closed():
            return
        self._wake_pending = True
        loop.call_soon_threadsafe(self._wake_writer)

    def _wake_writer(self) -> None:
        self._wake_pending = False
        self._wake.set()

    def _hand_out(self) -> None:
        """Hand out the events of the steps so far (on the loop's thread)."""
        emitted = self._emitted
        while emitted:
            event = emitted.popleft()
            if self._on_event is not None:
                self._on_event(event)
            self._queue.put_nowait(event)

    async def _flush(self, *, all_of_it: bool = True) -> None:
        """Write what the state machine has to send: everything, or one helping of it.

        Entries come out of :meth:`Replication.data_to_send` a chunk at a time
        (read from the store on its worker thread); between chunks the loop
        yields, so reads and other sessions go on. Frames go out joined, up to
        ``WRITE_CHUNK`` bytes per write: a catch-up queues thousands of small
        Entry frames, and a write per frame cost a send call and a drain each.
        """
        while True:
            async with self._write_lock:
                out = await self._step(self._output)
                # Each frame's length prefix and bytes, joined once per write.
                chunk: list[bytes] = []
                size = 0
                for data in out:
                    head = length_prefix(len(data))
                    chunk += (head, data)
                    size += len(head) + len(data)
                    if size >= WRITE_CHUNK:
                        await self._write(chunk, size)
                        chunk, size = [], 0
                if chunk:
                    await self._write(chunk, size)
            if not out or not all_of_it:
                return
            await asyncio.sleep(0)

    def _output(self) -> list[bytes]:
        """What the machine has to send, up to about ``STEP_OUTPUT`` bytes (a step)."""
        data_to_send = self.replication.data_to_send
        out = data_to_send()
        size = sum(map(len, out))
        while out and size < STEP_OUTPUT:
            more = data_to_send()
            if not more:
                break
            out += more
            size += sum(map(len, more))
        return out

    async def _write(self, pieces: list[bytes], size: int) -> None:
        """Write frames given as ``[prefix, message, prefix, message, ...]``."""
        await self.stream.write(b"".join(pieces))
        self.stats.bytes_sent += size
        self.stats.frames_sent += len(pieces) // 2

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._flush()
                if self.replication.closed:
                    await self._flush()
                    return
        except (StreamClosed, OSError):
            await self._lost()

    def _timer_step(self) -> tuple[int | None, bool]:
        """Fire the machine's timer if it is due; return when it is due next and
        whether it fired."""
        replication = self.replication
        timer = replication.get_timer()
        if timer is None or self.now() < timer:
            return timer, False
        replication.handle_timer(self.now())
        return replication.get_timer(), True

    async def _timer_loop(self) -> None:
        while not self.replication.closed:
            timer, fired = await self._step(self._timer_step)
            if fired:
                self._wake.set()
            delay = 1.0 if timer is None else max(timer - self.now(), 0) / 1000
            await asyncio.sleep(min(delay, 1.0))

    def _receive(self, data: bytes, now: int) -> bool:
        """Take one read's bytes (a step on the worker); False if the connection failed."""
        try:
            frames = self._decoder.feed(data)
        except (MalformedMessage, LimitExceeded) as exc:
            self.replication.fail(exc)
            return False
        self.stats.frames_received += len(frames)
        # One read's entries are stored in one transaction.
        self.replication.receive_many(frames, now)
        return True

    async def _read_loop(self) -> None:
        try:
            while not self.replication.closed:
                # While a read's entries are stored on the worker, what the peer sends
                # next fills the stream's buffer: the next read (and batch) takes it all.
                data = await self.stream.read(READ_SIZE)
                if not data:
                    break
                self.stats.bytes_received += len(data)
                now = self.now()
                if not await self._step(functools.partial(self._receive, data, now)):
                    break
                self._wake.set()
                # Backpressure: do not read more while our replies wait to be written
                # (entries we stream go out from the write loop, in between reads).
                await self._flush(all_of_it=False)
                self._wake.set()
        except (StreamClosed, OSError):
            pass
        await self._lost()

    async def _lost(self) -> None:
        if not self.replication.closed:
            await self._step(self.replication.close)
        self._hand_out()
        self._wake.set()
        self._finish()

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
    replication = Replication(store, ids, now=_now_ms(), config=config or SyncConfig(mode=mode))
    async with SyncConnection(replication, stream, on_event=on_event) as connection:
        sid = await connection.open_session(ids, mode=mode, live_mode=False)
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
    replication = Replication(store, tuple(schema_ids), now=_now_ms(), config=config)
    connection = SyncConnection(replication, stream, on_event=on_event)
    connection.start()
    await connection.closed.wait()
    await connection.aclose()
    return connection.stats


__all__ = ["SyncConnection", "WireStats", "serve_stream", "sync"]
