"""One channel of a :class:`~sdk.runtime.Node`: the application's handle.

Theory of operation
-------------------
A :class:`ReliableChannel` owns one :class:`~sdk.sds.MessageChannel` (the
sans-I/O core) and feeds it synchronously from the event loop: ``send``,
envelopes from the transport, store answers and the node's timer all call the
core at once and mark the channel dirty. Once per event-loop turn the node
*flushes*: each dirty channel drains the core's events and datagrams
(:meth:`ReliableChannel._collect`), the node commits what changed to SQLite in
one transaction, and only then are datagrams handed to the publisher and
events to the application (:meth:`ReliableChannel._release`). That ordering is
the durability guarantee: nothing is published or shown before it is saved.

What is committed is exactly the core's journal of durable changes
(:mod:`sdk.sds.journal`): the channel keeps no copy of core state, it only
numbers logged messages (``seq``) and counts what it received.

Catch-up from the store is the channel's own state (:mod:`sdk.runtime.catch_up`):
every window the core asks for (:class:`~sdk.sds.RetrieveRange`) becomes owed,
is committed with the turn that asked for it, and is settled only once the
store answered for all of it; until then the status says why not (catching up,
store unreachable, channel not archived) and the channel retries on the node's
timer (:meth:`ReliableChannel._next_deadline`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from sdk.encryption.errors import EncryptionError, NotOurMessage
from sdk.encryption.hook import (
    DecryptionFailed,
    Encryption,
    counter_names,
    decryption_failed,
    open_payload,
    sealed_hint,
    sealed_limit,
)
from sdk.runtime import events as rt
from sdk.runtime.catch_up import Backoff, OwedWindows
from sdk.runtime.errors import ChannelClosed, SendExpired, SendFailed
from sdk.runtime.options import RuntimeOptions
from sdk.runtime.persistence import ChannelBatch, HistoryRecord, Persistence
from sdk.sds import events as ev
from sdk.sds.channel import Datagram, MessageChannel
from sdk.sds.errors import LocalProtocolError, MessageTooLarge, RemoteProtocolError
from sdk.sds.journal import Logged, LostAdded, LostRemoved, MissingRemoved, MissingSaved
from sdk.sds.message import Message, MessageKind, decode_message
from sdk.store.client import StoreClient
from sdk.store.errors import NotArchived
from transports.base import (
    Envelope,
    PayloadTooLarge,
    QueueSubscription,
    Subscription,
    Transport,
    TransportError,
    message_hash,
)
from transports.tasks import cancel_and_wait

if TYPE_CHECKING:
    from sdk.encryption.channel import SealedBatch

_CLOSED = object()
#: Changes after which the sync status must be recomputed.
_DEPENDENCY_CHANGES = (MissingSaved, MissingRemoved, LostAdded, LostRemoved)
#: Queued in place of deliveries that spilled to the database (see ``events``).
_SPILLED = object()
#: Recently published retrieval hints remembered to recognise their echoes.
_OWN_HINTS = 4_096
#: Sealed envelopes from which they are opened as a batch, seals and signatures on a worker
#: thread (fewer, one by one on the loop: a hand-over costs the loop about what a check
#: costs, and each one waits for the GIL; docs/encryption.md, "Costs").
_OPEN_BATCH_MIN = 4
#: Own messages awaiting the store's confirmation; beyond it the oldest are not checked.
_UNCONFIRMED = 10_000
#: Ids per confirmation query.
_CONFIRM_BATCH = 500
_IDLE = rt.CatchUpState.IDLE


class _Opening(NamedTuple):
    """A batch of sealed envelopes handed to a worker thread (``ReliableChannel._read``)."""

    items: Sequence[tuple[bytes, bytes | None]]
    sealed: SealedBatch | None
    #: The worker's :meth:`~sdk.encryption.channel.SealedBatch.check`, if it could start.
    checking: asyncio.Future[None] | None

    async def opened(self) -> None:
        """Return once the worker is done with the batch (at once if it never started)."""
        if self.checking is not None:
            with contextlib.suppress(RuntimeError):
                await self.checking


class SendHandle:
    """What :meth:`ReliableChannel.send` returns: the message id, and its acknowledgement."""

    __slots__ = ("_channel", "message_id")

    def __init__(self, channel: ReliableChannel, message_id: str) -> None:
        self._channel = channel
        #: The SDS message id (hex), also in every event about this message.
        self.message_id = message_id

    async def acknowledged(self, timeout: float | None = None) -> None:
        """Wait until a peer acknowledged the message.

        Raises :class:`~sdk.runtime.SendExpired` or :class:`~sdk.runtime.SendFailed`
        when it never will be, ``TimeoutError`` after ``timeout`` seconds.
        """
        await self._channel.wait_acknowledged(self.message_id, timeout)

    def __str__(self) -> str:
        return self.message_id

    def __repr__(self) -> str:
        return f"SendHandle({self.message_id[:16]}...)"


class ChannelHost(Protocol):
    """What a channel needs of its node (:class:`~sdk.runtime.Node` satisfies it).

    The channel depends only on this, never on the node's module, so the two do
    not import each other (the seam: :mod:`sdk.runtime.node`, "Theory of operation").
    """

    transport: Transport
    store: StoreClient | None
    options: RuntimeOptions
    persistence: Persistence | None
    #: The current time in epoch milliseconds.
    now: Callable[[], int]

    def mark_dirty(self, channel: ReliableChannel) -> None:
        """``channel``'s core changed: commit and hand out its outputs this turn."""
        ...

    async def send_capacity(self) -> None:
        """Wait until the publish queue has room for an application send."""
        ...

    def check_running(self) -> None:
        """Raise if the node failed or is closed."""
        ...

    async def leave(self, channel: ReliableChannel) -> None:
        """``channel`` closes: commit what it changed and stop driving it."""
        ...

    def catch_up_start(self, active_at: int | None) -> int:
        """Where a catch-up from the store starts for a channel last active at ``active_at``."""
        ...

    def republish(self, channel: ReliableChannel, datagram: Datagram) -> None:
        """Queue an already committed datagram again (the store lacks it)."""
        ...


class ReliableChannel:
    """A reliable, causally ordered group channel; create with :meth:`Node.join`."""

    def __init__(
        self,
        node: ChannelHost,
        core: MessageChannel,
        topic: str,
        encryption: Encryption | None = None,
    ) -> None:
        self._node = node
        #: Seals what is published and opens what arrives (``docs/encryption.md``), or None.
        self.encryption = encryption
        self._payload_limit = sealed_limit(node.transport.max_payload_size, encryption)
        #: The SDS core state machine (read it, don't feed it: the channel does).
        self.core = core
        self.channel_id = core.channel_id
        #: The transport topic carrying the channel.
        self.topic = topic
        # The retrieval hint every adapter gives a payload published on the topic.
        self._hint_of = functools.partial(message_hash, topic)
        self._sealed_stable = encryption is not None and bool(
            getattr(encryption, "stable_envelopes", False)
        )
        #: What rebuilds the envelope another member's message arrived in (kept on disk
        #: to answer a repair of it with its sender's signature), when the handle says.
        self._seal_record: Callable[[bytes], bytes | None] | None = getattr(
            encryption, "seal_record", None
        )
        if encryption is not None and self._sealed_stable:
            self._hint_of = functools.partial(sealed_hint, self._hint_of, encryption)
        #: Opens a payload and returns the SDS message with its decoding, which the core
        #: takes as is (one decode per received message, not the handle's and the
        #: core's): only from a handle that decodes with the core's limits.
        self._decrypt_decoded: Callable[[bytes], tuple[bytes, Message]] | None = (
            getattr(encryption, "decrypt_decoded", None)
            if getattr(encryption, "limits", None) == core.config.limits
            else None
        )
        #: Runtime counters (the core's are in ``core.stats``; :attr:`stats` merges both).
        self.counters: Counter[str] = Counter()
        self._subscription: Subscription | None = None
        self._reader: asyncio.Task[None] | None = None
        self._fetcher: asyncio.Task[None] | None = None
        self._closed = False
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        #: Set while the event queue has room (the reader waits on it without a database).
        self._room = asyncio.Event()
        self._room.set()
        #: Whether deliveries go to the database instead of the queue until ``events``
        #: has read them back (see ``RuntimeOptions.event_queue_limit``).
        self._spilling = False
        #: ``seq`` of the last delivery ``events`` handed out.
        self._yielded_seq = 0
        self._catcher: asyncio.Task[None] | None = None
        #: Own published messages the store has not confirmed: id -> (when to check,
        #: epoch ms; the bytes to publish again; checks that found it missing).
        #: See :meth:`_confirm`.
        self._unconfirmed: dict[str, tuple[int, bytes, int]] = {}
        self._confirmer: asyncio.Task[None] | None = None
        options = node.options
        #: The catch-up windows owed from the store (persisted with the turn's batch
        #: when ``_owed_changed``); see :mod:`sdk.runtime.catch_up`.
        self._owed = OwedWindows()
        self._owed_changed = False
        # Jitter seeded per participant and channel: participants that failed together
        # retry apart, and the node's own random sequence is left as it was.
        self._backoff = Backoff(
            options.catch_up_retry_min,
            options.catch_up_retry_max,
            random.Random(f"{core.participant_id}/{core.channel_id}"),
        )
        #: When the next catch-up attempt is due (epoch ms; the node's timer fires it).
        self._retry_at: int | None = None
        #: A reconnect asked for the owed windows at once (see :meth:`_reconnected`).
        self._reconnect_pending = False
        #: When the store first failed to answer for the owed windows (None: it answers);
        #: with ``_owed``, where the catch-up stands (:attr:`_catch_up_state`).
        self._store_down_since: int | None = None
        self._store_error = ""
        #: Pages the store returned for the window being fetched.
        self._pages = 0
        #: The store's answer that it does not archive this channel, while it holds.
        self._not_archived: str | None = None
        self._waiters: dict[str, asyncio.Future[None]] = {}
        #: Outcomes of our messages that ended without acknowledgement (bounded).
        self._failures: dict[str, Exception] = {}
        self._to_fetch: dict[str, bytes | None] = {}
        # Hints of what we published recently, to drop the transport's echoes cheaply.
        self._own_hints: dict[bytes, None] = {}
        self._seq = 0
        self._received = 0
        #: When this channel's state last changed (epoch ms); catch-up starts there.
        self._active_at: int | None = None
        self._status = rt.SyncStatus(rt.SyncState.SYNCED, 0, 0, 0)
        #: Whether a drained change touched missing or lost dependencies.
        self._status_stale = False
        # This turn's output, released after the commit.
        self._out_datagrams: list[Datagram] = []
        self._out_events: list[ev.Event] = []

    # -- application API ---------------------------------------------------------------
    async def send(self, content: bytes) -> SendHandle:
        """Send ``content`` reliably; return once it is persisted and queued for publishing.

        Waits while the node's publish queue is full (backpressure). Raises
        :class:`~sdk.sds.LocalProtocolError` for empty or oversized content,
        :class:`~sdk.runtime.ChannelClosed` after :meth:`close`.
        """
        self._check_open()
        node = self._node
        await node.send_capacity()
        self._check_open()
        core = self.core
        # Every adapter's hint is message_hash(topic, payload): logged and saved with
        # the send (_on_published corrects it if the transport returns another).
        mid = _sized(
            core.send,
            content,
            node.now(),
            self._payload_limit,
            retrieval_hint=self._hint_of,
        )
        node.mark_dirty(self)
        # The turn's flush was scheduled (call_soon) before this task's wake-up, so
        # after one yield the message is committed and queued for publishing; sends
        # made concurrently in the same turn share that one transaction.
        await asyncio.sleep(0)
        node.check_running()
        return SendHandle(self, mid)

    async def send_ephemeral(self, content: bytes) -> None:
        """Broadcast ``content`` once: no ordering, acknowledgement, persistence or resend
        (so there is nothing to wait for and nothing is returned)."""
        self._check_open()
        node = self._node
        _sized(self.core.send_ephemeral, content, node.now(), self._payload_limit)
        node.mark_dirty(self)

    async def catch_up(self, since: float | None = None) -> int:
        """Fetch from the store everything it received on this channel since ``since``
        (epoch seconds) and feed it through the core; return how many messages it sent.

        Without ``since``: from when this participant was last active in the
        channel (saved in the database), minus ``RuntimeOptions.catch_up_overlap``.
        The node runs this by itself when a channel with saved state is joined and
        after a transport reconnect; call it when you know the participant missed
        something (e.g. the app was suspended). Raises what the store raises;
        :class:`~sdk.sds.LocalProtocolError` without a ``store``.
        """
        self._check_open()
        if self._node.store is None:
            raise LocalProtocolError("catch_up needs a store: Node(..., store=client)")
        node = self._node
        start = node.catch_up_start(self._active_at) if since is None else int(since * 1000)
        end = node.now() + 1
        retrieved = await self._catch_up(start, end)
        self._settle(start, end)  # owed windows it covered are answered for
        return retrieved

    async def wait_acknowledged(self, message_id: str, timeout: float | None = None) -> None:
        """Wait for one of our messages to be acknowledged (see :meth:`SendHandle.acknowledged`).

        Returns at once for a message no longer in the outgoing buffer that
        neither expired nor failed in this session (acknowledged, possibly in
        an earlier session). Raises :class:`~sdk.sds.LocalProtocolError` for an
        id this channel never sent.
        """
        failure = self._failures.get(message_id)
        if failure is not None:
            raise failure
        if self.core.outgoing.get(message_id) is None:
            entry = self.core.log.get(message_id)
            if entry is None or entry.sender_id != self.core.participant_id:
                raise LocalProtocolError(f"{message_id!r} is not a message this channel sent")
            persistence = self._node.persistence
            outcome = persistence.send_outcome(self.channel_id, message_id) if persistence else None
            if outcome is not None:
                raise _outcome_error(message_id, outcome)
            return
        self._check_open()
        fut = self._waiters.get(message_id)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[message_id] = fut
        async with asyncio.timeout(timeout):
            await asyncio.shield(fut)

    async def events(self, *, after_seq: int | None = None) -> AsyncIterator[ev.Event]:
        """Iterate the channel's events until it closes.

        Deliveries come as :class:`~sdk.runtime.events.Delivery` in
        causal order; every other core event and the runtime's own events
        (:mod:`sdk.runtime.events`) come as they happen. Events are queued from
        :meth:`Node.join` on, so none are missed before iteration starts; the
        queue has one consumer (concurrent iterators share it).

        ``after_seq`` (needs a database): first replay persisted deliveries
        with a greater ``seq`` — those delivered before a restart that your
        application had not processed — then continue live, skipping any
        delivery already replayed. With it, an application that records the
        ``seq`` of each delivery it processes sees every message exactly once
        across crashes.
        """
        replayed_up_to = 0
        if after_seq is not None:
            for record in self.history(after_seq=after_seq):
                replayed_up_to = record.seq
                delivered = self._replayed_event(record)
                if delivered is not None:
                    yield delivered
        queue = self._queue
        while True:
            item = await queue.get()
            if queue.qsize() < self._node.options.event_queue_limit:
                self._room.set()
            if item is _CLOSED:
                queue.put_nowait(_CLOSED)  # for any other iterator
                return
            if item is _SPILLED:
                # Deliveries went to the database while nobody read: read them back,
                # in order, until caught up; only then do new ones queue again.
                replayed_up_to = max(replayed_up_to, self._yielded_seq)
                while True:
                    records = self.history(after_seq=replayed_up_to, limit=256)
                    if not records:
                        self._spilling = False
                        break
                    for record in records:
                        replayed_up_to = self._yielded_seq = record.seq
                        delivered = self._replayed_event(record)
                        if delivered is not None:
                            yield delivered
                continue
            assert isinstance(item, ev.Event)
            if isinstance(item, rt.Delivery):
                if item.seq <= replayed_up_to:
                    continue
                replayed_up_to = self._yielded_seq = item.seq
            yield item

    def history(self, *, after_seq: int = 0, limit: int | None = None) -> list[HistoryRecord]:
        """The persisted local log with ``seq > after_seq`` in delivery order (needs a database)."""
        persistence = self._node.persistence
        if persistence is None:
            raise LocalProtocolError("history needs a database: Node(..., db=path)")
        return persistence.history(self.channel_id, after_seq=after_seq, limit=limit)

    @property
    def sync_status(self) -> rt.SyncStatus:
        """Synced or syncing, with received/missing/lost counts (reliable-channel API)
        and where the catch-up from the store stands (:class:`~sdk.runtime.CatchUpState`,
        the owed window, pages received, since when the store is unreachable).

        Never synced while a catch-up window is owed or the store refuses the channel.
        """
        return self._compute_status()

    @property
    def stats(self) -> Counter[str]:
        """The core's counters plus the runtime's (``store_queries``, ``publish_failed``, ...)."""
        return self.core.stats + self.counters

    @property
    def participant_id(self) -> str:
        """Our sender id in this channel."""
        return self.core.participant_id

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    async def close(self) -> None:
        """Leave the channel: flush, unsubscribe, end :meth:`events`; state stays persisted."""
        if self._closed:
            return
        await self._node.leave(self)

    async def __aenter__(self) -> ReliableChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- node-facing: lifecycle ---------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self.channel_id!r} is closed")
        self._node.check_running()

    def _restored(
        self,
        last_seq: int,
        received: int,
        active_at: int | None,
        owed: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self._active_at = active_at
        self._seq = self._yielded_seq = last_seq
        self._received = received
        if self._node.store is not None:
            # Owed before the restart (the store was down, or we crashed mid-window).
            self._owed = OwedWindows(owed)
        self._status = self._compute_status()

    def _start(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self._reader = asyncio.create_task(self._read(), name=f"chorus-read-{self.channel_id}")
        if self._owed:
            self._run_catch_up()

    async def _shutdown(self) -> None:
        self._closed = True
        running = (self._reader, self._fetcher, self._catcher, self._confirmer)
        tasks = [t for t in running if t is not None]
        await cancel_and_wait(tasks)
        if self._subscription is not None:
            with contextlib.suppress(TransportError):
                await self._subscription.close()
        closed = ChannelClosed(f"channel {self.channel_id!r} closed")
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(closed)
                fut.exception()  # retrieved: nobody may be waiting any more
        self._waiters.clear()
        self._queue.put_nowait(_CLOSED)

    async def _read(self) -> None:
        sub = self._subscription
        assert sub is not None
        batch = self._node.options.receive_batch
        room = self._room
        # Sealed envelopes already queued are opened together, their seals and signatures
        # on a worker thread (docs/encryption.md, "Costs"), while the next envelopes
        # queue up: a burst makes large batches. When some did by the time the worker is
        # done, the next batch goes to the worker before this one goes to the core, so
        # the loop gives one batch to the core while the worker opens the next.
        open_batch: Callable[[list[bytes]], SealedBatch] | None = getattr(
            self.encryption, "open_batch", None
        )
        queued = sub.pending if isinstance(sub, QueueSubscription) else None
        unyielded = 0
        # A batch opened (or being opened) by the worker, not yet given to the core: kept
        # only while envelopes are queued, and given to the core before any of them.
        opening: _Opening | None = None
        try:
            async for envelope in sub:
                if (
                    open_batch is not None
                    and queued is not None
                    and queued() + 1 >= _OPEN_BATCH_MIN
                ):
                    ready = [envelope]
                    while len(ready) < batch and queued():
                        ready.append(await sub.__anext__())  # queued: returns at once
                    started = self._start_opening(self._fresh(ready), open_batch)
                    if opening is not None:
                        await self._finish_opening(opening)  # the worker opens `started`
                    opening = started
                    if not queued():
                        await started.opened()  # the next envelopes queue meanwhile
                        if not queued():
                            opening = None
                            await self._finish_opening(started)
                    # Let the flush run (the worker may have been done before it was
                    # awaited: no yield then) before the next batch is read.
                    unyielded = 0
                    await asyncio.sleep(0)
                else:
                    if opening is not None:
                        pending, opening = opening, None
                        await self._finish_opening(pending)
                    self._on_envelope(envelope)
                    unyielded += 1
                    if unyielded >= batch:
                        # Let the flush run: deliveries are not held back by a long burst.
                        unyielded = 0
                        await asyncio.sleep(0)
                if not room.is_set():
                    # Backpressure (no database to spill to): the application is not
                    # reading events; stop reading the transport until it does.
                    self.counters["reader_paused"] += 1
                    if opening is not None:
                        pending, opening = opening, None
                        await self._finish_opening(pending)
                    await room.wait()
        except TransportError as exc:
            if opening is not None:
                await self._finish_opening(opening)
            self._emit_now(rt.SubscriptionEnded(self.channel_id, f"{type(exc).__name__}: {exc}"))
            return
        if opening is not None:
            await self._finish_opening(opening)
        if not self._closed:
            self._emit_now(rt.SubscriptionEnded(self.channel_id, "the transport ended it"))

    def _fresh(self, envelopes: list[Envelope]) -> list[tuple[bytes, bytes | None]]:
        """The subscription's ``envelopes`` as ``(payload, hint)``, our own echoes dropped."""
        own = self._own_hints
        fresh: list[tuple[bytes, bytes | None]] = [
            (e.payload, e.retrieval_hint) for e in envelopes if e.retrieval_hint not in own
        ]
        self.counters["own_echo"] += len(envelopes) - len(fresh)
        return fresh

    async def _receive_batch(
        self, envelopes: list[Envelope], open_batch: Callable[[list[bytes]], SealedBatch]
    ) -> None:
        """Open the subscription's ``envelopes`` as one batch (our own echoes dropped)."""
        await self._open_many(self._fresh(envelopes), open_batch)

    async def _receive_many(self, payloads: list[bytes]) -> None:
        """Receive what the store returned (a catch-up page, fetched messages): on an
        encrypted channel, opened as one batch when there are enough of them."""
        items = [(data, message_hash(self.topic, data)) for data in payloads]
        open_batch: Callable[[list[bytes]], SealedBatch] | None = getattr(
            self.encryption, "open_batch", None
        )
        if open_batch is not None and len(items) >= _OPEN_BATCH_MIN:
            await self._open_many(items, open_batch)
            return
        for data, hint in items:
            self._receive(data, hint)

    async def _open_many(
        self,
        items: Sequence[tuple[bytes, bytes | None]],
        open_batch: Callable[[list[bytes]], SealedBatch],
    ) -> None:
        """Open sealed ``(payload, retrieval hint)`` pairs as one batch (one hand-over to a
        worker thread for all their seals and signatures), then give them to the core in
        order, exactly as :meth:`_receive` would one by one (docs/encryption.md, "Costs")."""
        await self._finish_opening(self._start_opening(items, open_batch))

    def _start_opening(
        self,
        items: Sequence[tuple[bytes, bytes | None]],
        open_batch: Callable[[list[bytes]], SealedBatch],
    ) -> _Opening:
        """Hand the batch of ``items`` to a worker thread (:meth:`SealedBatch.check`)."""
        if not items:
            return _Opening(items, None, None)
        sealed = open_batch([data for data, _ in items])
        checking: asyncio.Future[None] | None = None
        # Without a worker (interpreter exit), results() opens the batch on the loop.
        with contextlib.suppress(RuntimeError):
            checking = asyncio.get_running_loop().run_in_executor(None, sealed.check)
        return _Opening(items, sealed, checking)

    async def _finish_opening(self, opening: _Opening) -> None:
        """Give the batch :meth:`_start_opening` handed over to the core, in order, once the
        worker is done with it."""
        items, sealed, _ = opening
        if sealed is None:
            return
        await opening.opened()
        if self._decrypt_decoded is not None:
            core = self.core
            now = self._node.now()
            for (data, hint), opened in zip(items, sealed.decoded(), strict=True):
                if isinstance(opened, Exception):
                    self._give(decryption_failed(self.channel_id, opened, data, hint), hint)
                else:
                    core.receive_message(opened[1], opened[0], now, hint)
            self._node.mark_dirty(self)
        else:
            for (data, hint), result in zip(items, sealed.results(), strict=True):
                if isinstance(result, Exception):
                    self._give(decryption_failed(self.channel_id, result, data, hint), hint)
                else:
                    self._give(result, hint)
        self.counters["batches_opened"] += 1

    def _node_failed(self, failure: Exception, cause: BaseException) -> None:
        """The node stopped: every waiter gets ``failure``, the application an event."""
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(failure)
        self._queue.put_nowait(rt.NodeFailed(self.channel_id, repr(cause)))

    def _emit_now(self, event: ev.Event) -> None:
        self._out_events.append(event)
        self._node.mark_dirty(self)

    # -- node-facing: inputs ------------------------------------------------------------
    def _on_envelope(self, envelope: Envelope) -> None:
        if envelope.retrieval_hint in self._own_hints:
            # The broker's echo of our own publish (MQTT 3.1.1 cannot suppress it):
            # the core would decode it only to ignore it.
            self.counters["own_echo"] += 1
            return
        self._receive(envelope.payload, envelope.retrieval_hint)

    def _receive(self, data: bytes, retrieval_hint: bytes | None) -> None:
        decrypt_decoded = self._decrypt_decoded
        if decrypt_decoded is not None:
            try:
                sds, message = decrypt_decoded(data)
            except Exception as exc:  # as open_payload: the peer's payload's failure
                self._give(
                    decryption_failed(self.channel_id, exc, data, retrieval_hint), retrieval_hint
                )
                return
            self.core.receive_message(message, sds, self._node.now(), retrieval_hint)
            self._node.mark_dirty(self)
            return
        if self.encryption is not None:
            self._give(
                open_payload(self.encryption, self.channel_id, data, retrieval_hint),
                retrieval_hint,
            )
            return
        self._give(data, retrieval_hint)

    def _give(self, sds: bytes | DecryptionFailed, retrieval_hint: bytes | None) -> None:
        """Hand an SDS message to the core, or emit why a payload did not open."""
        if isinstance(sds, DecryptionFailed):
            self.counters.update(counter_names(sds))
            self._emit_now(sds)  # never given to the core: nothing logged
            return
        self.core.receive(sds, self._node.now(), retrieval_hint)
        self._node.mark_dirty(self)

    def _on_published(self, datagram: Datagram, hint: bytes) -> None:
        own = self._own_hints
        own[hint] = None
        if len(own) > _OWN_HINTS:
            del own[next(iter(own))]
        mid = datagram.message_id
        if datagram.kind is not MessageKind.CONTENT or not mid:
            return
        entry = self.core.log.get(mid)
        if entry is None:
            return
        if entry.sender_id == self.core.participant_id:
            self._await_store(mid, datagram.data)
        if entry.history_entry.retrieval_hint == hint:
            return
        self.core.set_retrieval_hint(mid, hint)
        self._node.mark_dirty(self)

    def _await_store(self, message_id: str, data: bytes, due: int | None = None) -> None:
        """Have :meth:`_confirm` check, from ``due`` (epoch ms; default one interval
        from now), that the store holds our message ``message_id``."""
        interval = self._node.options.store_confirm_interval
        pending = self._unconfirmed
        if self._node.store is None or interval <= 0 or self._closed or message_id in pending:
            return
        if self.encryption is not None and not self._sealed_stable:
            # The store keys a sealed message by its envelope's hash, which only a
            # handle with stable envelopes lets us know ahead (docs/encryption.md).
            return
        if self._not_archived is not None:
            # The store refuses the channel: checking (and publishing again) is futile.
            self.counters["store_unconfirmed_dropped"] += 1
            return
        if len(pending) >= _UNCONFIRMED:
            del pending[next(iter(pending))]
            self.counters["store_unconfirmed_dropped"] += 1
        pending[message_id] = (
            self._node.now() + int(interval * 1000) if due is None else due,
            data,
            0,
        )
        if self._confirmer is None or self._confirmer.done():
            self._confirmer = asyncio.create_task(
                self._confirm(), name=f"chorus-confirm-{self.channel_id}"
            )

    def _sealed_hash(self, message_id: str, data: bytes) -> bytes:
        """The hash a store archived our sealed message ``message_id`` under: the
        logged retrieval hint (the envelope's, from the first publish), else that of
        the envelope the handle seals ``data`` in now (after a restart, the cache is
        empty: the store lacks that one, and it is what a republish sends)."""
        entry = self.core.log.get(message_id)
        hint = entry.history_entry.retrieval_hint if entry is not None else None
        return hint or self._hint_of(data)

    def _seal(self, datagram: Datagram) -> bytes | None:
        """The envelope to publish for ``datagram`` on this encrypted channel; ``None``
        when there is none to send (counted as ``repair_unsealed``): another member's
        message whose envelope the handle neither remembers nor can rebuild from disk."""
        assert self.encryption is not None
        try:
            return self.encryption.encrypt(datagram.data)
        except NotOurMessage as exc:
            # A repair answered from disk: the original envelope carries the sender's
            # signature, a new one would carry ours and be refused (docs/encryption.md).
            persistence = self._node.persistence
            record = (
                persistence.seal_record(self.channel_id, exc.message_id)
                if persistence is not None
                else None
            )
            rebuild = getattr(self.encryption, "envelope_from", None)
            if record is not None and rebuild is not None:
                with contextlib.suppress(EncryptionError):  # its epoch left the ring
                    envelope: bytes = rebuild(datagram.data, record)
                    return envelope
            self.counters["repair_unsealed"] += 1
            return None

    def _on_publish_failed(self, datagram: Datagram, error: Exception, recoverable: bool) -> None:
        self.counters["publish_failed"] += 1
        mid = datagram.message_id if datagram.kind is MessageKind.CONTENT else ""
        detail = f"{type(error).__name__}: {error}"
        self._out_events.append(rt.PublishFailed(self.channel_id, mid, detail, recoverable))
        if not recoverable and mid and self.core.abandon(mid, detail):
            self._finish(mid, SendFailed(mid, detail))
        self._node.mark_dirty(self)

    def _finish(self, message_id: str, failure: Exception | None) -> None:
        if failure is not None:
            self._failures[message_id] = failure
            if len(self._failures) > 10_000:
                self._failures.pop(next(iter(self._failures)))
        fut = self._waiters.pop(message_id, None)
        if fut is None or fut.done():
            return
        if failure is None:
            fut.set_result(None)
        else:
            fut.set_exception(failure)

    # -- node-facing: the flush ---------------------------------------------------------
    def _collect(self, persist: bool) -> ChannelBatch | None:
        """Drain the core: its durable changes (numbering logged messages), datagrams and
        events; return the batch to commit (``None`` without a database or changes)."""
        core = self.core
        changes = core.drain_changes()
        seqs: dict[str, int] = {}
        seal_record = self._seal_record if persist else None
        sealed: dict[str, bytes] = {}
        for change in changes:
            kind = type(change)
            if kind is Logged:
                assert isinstance(change, Logged)
                self._seq += 1
                seqs[change.message_id] = self._seq
                if not change.own:
                    self._received += 1
                    if seal_record is not None and (record := seal_record(change.data)):
                        sealed[change.message_id] = record
            elif kind in _DEPENDENCY_CHANGES:
                self._status_stale = True
        self._out_datagrams.extend(core.datagrams_to_send())
        out = self._out_events
        while (event := core.next_event()) is not None:
            if isinstance(event, ev.MessageDelivered):
                out.append(
                    rt.Delivery(
                        event.channel_id,
                        event.message_id,
                        event.sender_id,
                        event.lamport_timestamp,
                        event.content,
                        event.retrieval_hint,
                        seqs[event.message_id],
                    )
                )
                continue
            if isinstance(event, ev.MessageAcknowledged):
                self._finish(event.message_id, None)
            elif isinstance(event, ev.MessageSendExpired):
                self._finish(event.message_id, SendExpired(event.message_id, event.attempts))
            elif isinstance(event, ev.MessageMissing):
                self._to_fetch[event.message_id] = event.retrieval_hint
            elif isinstance(event, ev.MessageLost):
                self._to_fetch.pop(event.message_id, None)
            elif isinstance(event, ev.RetrieveRange):
                # The core's request for a time window: around a gap, or the
                # window away after a restart or reconnect (MessageChannel.announce).
                # Owed from now on, committed with this turn.
                self._start_catch_up(event.from_ms, event.to_ms)
            elif isinstance(event, ev.MessageRejected):
                self.counters["rejected"] += 1
            out.append(event)
        if self._reconnect_pending:  # no window came with it: the owed ones, at once
            self._run_catch_up(at_once=True)
        owed = self._owed.windows if self._owed_changed else None
        self._owed_changed = False
        if not persist or not (changes or owed is not None):
            return None
        now = None
        if changes:
            now = self._active_at = self._node.now()
        return ChannelBatch(
            self.channel_id,
            core.participant_id,
            changes,
            seqs,
            now,
            core.bloom.carry_over,
            owed,
            sealed or None,
        )

    def _release(self) -> list[Datagram]:
        """After the commit: hand events to the application; return datagrams to publish."""
        previous = self._status
        # Cheap test first: a synced channel whose dependencies did not change stays synced.
        if self._status_stale or previous.state is rt.SyncState.SYNCING:
            self._status_stale = False
            status = self._compute_status()
            if status != previous and (
                status.state is not previous.state or status.state is rt.SyncState.SYNCING
            ):
                self._out_events.append(rt.SyncStatusChanged(self.channel_id, status))
            self._status = status
        limit = self._node.options.event_queue_limit
        queue = self._queue
        spill = self._node.persistence is not None
        for event in self._out_events:
            if isinstance(event, rt.Delivery):
                if self._spilling:
                    self.counters["deliveries_spilled"] += 1
                    continue
                if queue.qsize() >= limit:
                    if spill:
                        # Committed already: events() reads it back from the database.
                        self._spilling = True
                        self.counters["deliveries_spilled"] += 1
                        queue.put_nowait(_SPILLED)
                        continue
                    self._room.clear()  # the reader waits; this one is still queued
                queue.put_nowait(event)
            elif queue.qsize() >= limit:
                # Nobody is consuming; status and other events are not kept.
                self.counters["events_dropped"] += 1
            else:
                queue.put_nowait(event)
        self._out_events.clear()
        if self._to_fetch and (self._fetcher is None or self._fetcher.done()):
            if self._node.store is not None and not self._closed:
                self._fetcher = asyncio.create_task(
                    self._fetch(), name=f"chorus-store-{self.channel_id}"
                )
            else:
                self._to_fetch.clear()
        out, self._out_datagrams = self._out_datagrams, []
        return out

    def _compute_status(self) -> rt.SyncStatus:
        core = self.core
        missing = len(core.missing())
        catch_up = self._catch_up_state
        if self._not_archived is not None:
            catch_up = rt.CatchUpState.NOT_ARCHIVED
        span = self._owed.span()
        return rt.SyncStatus(
            rt.SyncState.SYNCING if missing or catch_up is not _IDLE else rt.SyncState.SYNCED,
            self._received,
            missing,
            len(core.lost()),
            catch_up,
            None if span is None else span[0],
            None if span is None else span[1],
            self._pages if catch_up is rt.CatchUpState.CATCHING_UP else 0,
            self._store_down_since if catch_up is rt.CatchUpState.STORE_UNREACHABLE else None,
            self._store_error if catch_up is not _IDLE else "",
        )

    def _next_deadline(self) -> int | None:
        """The earliest of the core's timer and the next catch-up attempt (the node's
        one timer is armed for the earliest over all channels)."""
        t = self.core.get_timer()
        r = self._retry_at
        if r is None:
            return t
        return r if t is None or r < t else t

    async def _catch_up(
        self, time_start: int, time_end: int | None = None, *, owed: bool = False
    ) -> int:
        """Feed the core every message the store received in ``[time_start, time_end)``
        (epoch ms; ``None``: up to now); ``owed``: an owed window (its pages are counted
        in the status)."""
        store = self._node.store
        assert store is not None
        timeout = self._node.options.store_timeout
        self.counters["catch_up_queries"] += 1
        retrieved = 0
        pages = store.messages_between(self.channel_id, time_start, time_end).__aiter__()
        while True:
            try:
                async with asyncio.timeout(timeout):
                    page = await pages.__anext__()
            except StopAsyncIteration:
                break
            self._store_answered()
            if owed:
                self._pages += 1
                self._set_store_down_since(None)  # answering: catching up
            await self._receive_many(page)
            retrieved += len(page)
            self.counters["catch_up_retrieved"] += len(page)
            await asyncio.sleep(0)  # the turn's flush runs between pages
        self._store_answered()
        return retrieved

    def _start_catch_up(self, time_start: int, time_end: int | None = None) -> None:
        """Owe the window ``[time_start, time_end)`` (``None``: up to now) and fetch it
        now, with every other owed window (see :mod:`sdk.runtime.catch_up`)."""
        if self._node.store is None or self._closed:
            return
        end = self._node.now() + 1 if time_end is None else time_end
        if self._owed.add(time_start, end):
            self._owed_changed = True
            self._status_stale = True
            self._node.mark_dirty(self)
        # A new window (restart, reconnect, gap) is a reason to try again at once.
        self._run_catch_up(at_once=True)

    def _run_catch_up(self, *, at_once: bool = False) -> None:
        """Start the catch-up task unless it runs (it takes every owed window in turn);
        ``at_once``: also when a retry is scheduled (a reconnect: the store may be back)."""
        if at_once:
            self._reconnect_pending = False  # this is the attempt a reconnect asked for
        if self._node.store is None or self._closed or not self._owed:
            return
        if at_once:
            self._backoff.reset()
        elif self._retry_at is not None and self._retry_at > self._node.now():
            return
        self._retry_at = None
        if self._catcher is None or self._catcher.done():
            self._catcher = asyncio.create_task(
                self._catch_up_windows(), name=f"chorus-catch-up-{self.channel_id}"
            )

    def _reconnected(self) -> None:
        """The transport is back: try the owed windows at once, with the backoff started
        over, once: at this turn's flush (the node marks the channel dirty), with the
        window away when the core asks for it (:meth:`_start_catch_up`), else alone."""
        self._reconnect_pending = True

    def _retry_due(self, now: int) -> None:
        """The node's timer: run the catch-up if its retry is due."""
        at = self._retry_at
        if at is not None and at <= now:
            self._retry_at = None
            self.counters["catch_up_retries"] += 1
            self._run_catch_up()

    @property
    def _catch_up_state(self) -> rt.CatchUpState:
        """Where the catch-up stands (:class:`~sdk.runtime.events.CatchUpState`, bar
        ``NOT_ARCHIVED``): derived from the owed windows and the store-down time."""
        if not self._owed:
            return _IDLE
        if self._store_down_since is None:
            return rt.CatchUpState.CATCHING_UP
        return rt.CatchUpState.STORE_UNREACHABLE

    def _set_store_down_since(self, since: int | None) -> None:
        if since == self._store_down_since:
            return
        self._store_down_since = since
        self._status_stale = True
        self._node.mark_dirty(self)

    def _settle(self, start: int, end: int) -> None:
        """The store answered for ``[start, end)``: it is no longer owed."""
        if self._owed.settle(start, end):
            self._owed_changed = True
            self._status_stale = True
            self._node.mark_dirty(self)
        if not self._owed:
            self._set_store_down_since(None)  # nothing owed: nothing down for

    async def _catch_up_windows(self) -> None:
        """Fetch the owed windows oldest first, settling each once the store answered for
        all of it; on failure, leave it owed and schedule a retry."""
        while self._owed and not self._closed:
            window = self._owed.first()
            assert window is not None
            start, end = window
            self._pages = 0
            try:
                retrieved = await self._catch_up(start, end, owed=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # owed still: surfaced, retried with backoff
                self._catch_up_failed(exc)
                return
            self.counters["catch_up_windows"] += 1
            self._emit_now(rt.CatchUpCompleted(self.channel_id, start, end, retrieved, self._pages))
            self._settle(start, end)
        self._backoff.reset()

    def _catch_up_failed(self, exc: Exception) -> None:
        now = self._node.now()
        detail = self._store_error = self._store_failed((), exc)
        if not isinstance(exc, NotArchived) and self._store_down_since is None:
            self._set_store_down_since(now)
            span = self._owed.span()
            if span is not None:
                self._emit_now(rt.StoreUnreachable(self.channel_id, now, span[0], span[1], detail))
        # The node's timer fires the retry (armed at the flush _emit_now scheduled). A
        # store that refuses the channel is asked again only at the longest wait (its
        # operator may add the channel).
        delay = self._backoff.next_delay_ms()
        if isinstance(exc, NotArchived):
            delay = int(self._node.options.catch_up_retry_max * 1000)
        self._retry_at = now + delay
        self._status_stale = True

    def _store_failed(self, ids: tuple[str, ...], exc: Exception) -> str:
        """A store query failed: count it, tell the application
        (:class:`~sdk.runtime.events.StoreRetrievalFailed`), and note a store that does
        not archive this channel. Returns the error's one-line detail."""
        detail = f"{type(exc).__name__}: {exc}"
        self.counters["store_errors"] += 1
        self._emit_now(rt.StoreRetrievalFailed(self.channel_id, ids, detail))
        if isinstance(exc, NotArchived):
            self._store_refused(exc)
        return detail

    def _store_refused(self, exc: NotArchived) -> None:
        """The store does not archive this channel: say so once, stop checking that it
        holds our messages (it never will)."""
        self._store_error = f"{type(exc).__name__}: {exc}"
        self._status_stale = True
        self._node.mark_dirty(self)
        if self._not_archived is not None:
            return
        self._not_archived = exc.detail or str(exc)
        self._emit_now(rt.ChannelNotArchived(self.channel_id, self._store_error))
        if self._unconfirmed:
            self.counters["store_unconfirmed_dropped"] += len(self._unconfirmed)
            self._unconfirmed.clear()

    def _store_answered(self) -> None:
        """A store query succeeded: the store is back, and archives this channel."""
        if self._not_archived is not None:
            self._not_archived = None
            self._status_stale = True
            self._node.mark_dirty(self)
        if self._retry_at is not None:
            # Owed windows wait for a retry: the store is back, try them now.
            self._run_catch_up(at_once=True)

    async def _fetch(self) -> None:
        """Ask the store for missing messages until none is left to ask for."""
        store = self._node.store
        assert store is not None
        timeout = self._node.options.store_timeout
        while self._to_fetch and not self._closed:
            core = self.core
            batch = {m: h for m, h in self._to_fetch.items() if core.missing_since(m) is not None}
            self._to_fetch.clear()
            if not batch:
                continue
            self.counters["store_queries"] += 1
            try:
                async with asyncio.timeout(timeout):
                    found = await store.get_messages(
                        self.channel_id, list(batch), [h for h in batch.values() if h]
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any store failure is surfaced, then retried later
                self._store_failed(tuple(batch), exc)
                continue
            self._store_answered()
            self.counters["store_retrieved"] += len(found)
            await self._receive_many(found)

    async def _confirm(self) -> None:
        """Check that the store holds our published messages; publish again those it
        lacks, until it holds them.

        SDS stops resending a message once peers acknowledge it, but a store node
        can miss what its peers got: a broker killed with SIGKILL forgets the store
        node's persistent session (and what it queued for it) since its last
        autosave, and participants that reconnect first publish into the void.
        Waku's answer is the same (store-based reliability for publishing,
        ``waku-org/specs`` ``standards/application/p2p-reliability.md``; nwaku's
        send monitor checks every 3 s).

        Each message the store lacks is checked again later and later (the interval
        doubling up to ``store_confirm_max_interval``), and at most
        ``store_republish_limit`` messages are published again per interval (the rest
        wait: ``store_republish_deferred``), so a store that is slow to archive never
        draws an unbounded stream. A store that does not archive the channel ends the
        checks (:meth:`_store_refused`).
        """
        store = self._node.store
        assert store is not None
        options = self._node.options
        interval_ms = int(options.store_confirm_interval * 1000)
        max_ms = max(interval_ms, int(options.store_confirm_max_interval * 1000))
        limit = options.store_republish_limit
        pending = self._unconfirmed
        more = False
        budget_from, budget_used = self._node.now(), 0
        while pending and not self._closed:
            if not more:  # after a full batch, more are due at once (a fast sender)
                await asyncio.sleep(options.store_confirm_interval)
            now = self._node.now()
            due = [m for m, (at, _, _) in pending.items() if at <= now][:_CONFIRM_BATCH]
            more = len(due) == _CONFIRM_BATCH
            if not due:
                continue
            # A sealed message is archived under its envelope's hash, not its id.
            hashes = (
                {self._sealed_hash(m, pending[m][1]): m for m in due} if self.encryption else {}
            )
            try:
                async with asyncio.timeout(options.store_timeout):
                    if hashes:
                        found = await store.get_messages(self.channel_id, [], list(hashes))
                    else:
                        found = await store.get_messages(self.channel_id, due)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # surfaced; the next interval asks again (one query)
                more = False
                self._store_failed(tuple(due), exc)
                if isinstance(exc, NotArchived):
                    return
                continue
            self._store_answered()
            held = set()
            for data in found:
                if hashes:
                    held.add(hashes.get(message_hash(self.topic, data), ""))
                    continue
                with contextlib.suppress(RemoteProtocolError):
                    held.add(decode_message(data, self.core.config.limits).message_id)
            now = self._node.now()
            if now - budget_from >= interval_ms:
                budget_from, budget_used = now, 0
            for message_id in due:
                entry = pending.get(message_id)
                if entry is None:
                    continue
                if message_id in held:
                    del pending[message_id]
                    self.counters["store_confirmed"] += 1
                    continue
                if budget_used >= limit:
                    # Over this interval's budget: checked (not counted) next interval.
                    pending[message_id] = (now + interval_ms, entry[1], entry[2])
                    self.counters["store_republish_deferred"] += 1
                    continue
                budget_used += 1
                wait = min(max_ms, interval_ms << min(entry[2], 16))
                pending[message_id] = (now + wait, entry[1], entry[2] + 1)
                self.counters["store_republished"] += 1
                datagram = Datagram(self.channel_id, entry[1], message_id, MessageKind.CONTENT)
                self._node.republish(self, datagram)
            if budget_used >= limit:
                more = False

    def _replayed_event(self, record: HistoryRecord) -> rt.Delivery | None:
        if record.sender_id == self.core.participant_id or record.data is None:
            return None
        try:
            message = decode_message(record.data, self.core.config.limits)
        except RemoteProtocolError:
            return None
        return rt.Delivery(
            self.channel_id,
            record.message_id,
            record.sender_id,
            record.lamport_timestamp,
            message.content or b"",
            record.retrieval_hint,
            record.seq,
        )


def _sized(
    send: Callable[..., str],
    content: bytes,
    now: int,
    transport_limit: int | None,
    **options: Callable[[bytes], bytes],
) -> str:
    """Call the core's ``send`` or ``send_ephemeral`` with the transport's size limit
    (and ``options``, passed on); the core encodes the message and refuses it when it
    is over (one size rule, the core's). Over the transport's limit is
    :class:`~transports.base.PayloadTooLarge`, as the transport itself would say."""
    try:
        return send(content, now, max_size=transport_limit, **options)
    except MessageTooLarge as exc:
        if transport_limit is not None and exc.limit == transport_limit:
            raise PayloadTooLarge(exc.size, exc.limit) from exc
        raise


def _outcome_error(message_id: str, outcome: str) -> Exception:
    """The exception for a persisted send outcome (``"expired:<n>"`` / ``"failed:<error>"``)."""
    kind, _, detail = outcome.partition(":")
    if kind == "expired":
        return SendExpired(message_id, int(detail or 0))
    return SendFailed(message_id, detail)
