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

The channel mirrors a few sets (missing, lost, buffered ids) from the core's
events so that building a turn's changes costs what the turn changed, not
what the channel holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sdk.persistence import ChannelChanges, HistoryRecord
from sdk.runtime import events as rt
from sdk.runtime.errors import ChannelClosed, SendExpired, SendFailed
from sdk.sds import events as ev
from sdk.sds.channel import Datagram, MessageChannel
from sdk.sds.errors import LocalProtocolError, RemoteProtocolError
from sdk.sds.message import MessageKind, decode_message
from sdk.sds.snapshot import IncomingRecord, MissingRecord, outgoing_record
from transports.base import Envelope, Subscription, TransportError, message_hash

if TYPE_CHECKING:
    from sdk.runtime.node import Node

_CLOSED = object()
#: Queued in place of deliveries that spilled to the database (see ``events``).
_SPILLED = object()
#: Recently published retrieval hints remembered to recognise their echoes.
_OWN_HINTS = 4_096


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


class ReliableChannel:
    """A reliable, causally ordered group channel; create with :meth:`Node.join`."""

    def __init__(self, node: Node, core: MessageChannel, topic: str) -> None:
        self._node = node
        #: The SDS core state machine (read it, don't feed it: the channel does).
        self.core = core
        self.channel_id = core.channel_id
        #: The transport topic carrying the channel.
        self.topic = topic
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
        self._catcher: asyncio.Task[int] | None = None
        self._waiters: dict[str, asyncio.Future[None]] = {}
        #: Outcomes of our messages that ended without acknowledgement (bounded).
        self._failures: dict[str, Exception] = {}
        # Mirrors of core state, kept from events (see the module docstring).
        self._missing_ids: set[str] = set()
        self._lost_ids: set[str] = set()
        self._incoming_ids: set[str] = set()
        # Encoded bytes of accepted messages not yet written to the log.
        self._raw: dict[str, bytes] = {}
        self._to_fetch: dict[str, bytes | None] = {}
        # Hints of what we published recently, to drop the transport's echoes cheaply.
        self._own_hints: dict[bytes, None] = {}
        self._seq = 0
        self._received = 0
        #: When this channel's state last changed (epoch ms); catch-up starts there.
        self._active_at: int | None = None
        self._status = rt.SyncStatus(rt.SyncState.SYNCED, 0, 0, 0)
        # This turn's changes.
        self._pending_log: list[tuple[int, str, int, str, bytes | None, bytes | None]] = []
        self._pending_hints: list[tuple[str, bytes]] = []
        self._pending_outcomes: list[tuple[str, str]] = []
        self._dirty_outgoing: set[str] = set()
        self._dirty_missing: set[str] = set()
        self._dirty_lost: set[str] = set()
        self._dirty_incoming: set[str] = set()
        self._bloom_added: list[str] = []
        self._saved_lamport = -1
        self._saved_heads: list[str] = []
        self._saved_referenced: list[str] = []
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
        await node._send_capacity()
        self._check_open()
        node._check_payload(self, len(content))
        mid = self.core.send(content, node.now())
        node._mark_dirty(self)
        # The turn's flush was scheduled (call_soon) before this task's wake-up, so
        # after one yield the message is committed and queued for publishing; sends
        # made concurrently in the same turn share that one transaction.
        await asyncio.sleep(0)
        node._check_running()
        return SendHandle(self, mid)

    async def send_ephemeral(self, content: bytes) -> None:
        """Broadcast ``content`` once: no ordering, acknowledgement, persistence or resend
        (so there is nothing to wait for and nothing is returned)."""
        self._check_open()
        node = self._node
        node._check_payload(self, len(content))
        self.core.send_ephemeral(content, node.now())
        node._mark_dirty(self)

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
        start = node._catch_up_start(self._active_at) if since is None else int(since * 1000)
        return await self._catch_up(start)

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
        await asyncio.wait_for(asyncio.shield(fut), timeout)

    async def events(self, *, after_seq: int | None = None) -> AsyncIterator[ev.Event]:
        """Iterate the channel's events until it closes.

        Deliveries come as :class:`~sdk.runtime.events.MessageDelivered` in
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
            if isinstance(item, rt.MessageDelivered):
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
        """Synced or syncing, with received/missing/lost counts (reliable-channel API)."""
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
        await self._node._leave(self)

    async def __aenter__(self) -> ReliableChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- node-facing: lifecycle ---------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self.channel_id!r} is closed")
        self._node._check_running()

    def _restored(
        self, last_seq: int, received: int, incoming: list[IncomingRecord], active_at: int | None
    ) -> None:
        self._active_at = active_at
        self._seq = self._yielded_seq = last_seq
        self._received = received
        self._missing_ids = set(self.core.missing())
        self._lost_ids = self.core.lost()
        for rec in incoming:
            self._raw[rec.message_id] = rec.data
        self._incoming_ids = {p.message.message_id for p in self.core.incoming.pending()}
        log = self.core.log
        self._saved_heads = log.heads()
        self._saved_referenced = log.referenced_unlogged()
        self._saved_lamport = self.core.lamport_timestamp
        self._status = self._compute_status()

    def _start(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self._reader = asyncio.create_task(self._read(), name=f"chorus-read-{self.channel_id}")

    async def _shutdown(self) -> None:
        self._closed = True
        tasks = [t for t in (self._reader, self._fetcher, self._catcher) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
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
        n = 0
        try:
            async for envelope in sub:
                self._on_envelope(envelope)
                n += 1
                if n % batch == 0:
                    # Let the flush run: deliveries are not held back by a long burst.
                    await asyncio.sleep(0)
                if not room.is_set():
                    # Backpressure (no database to spill to): the application is not
                    # reading events; stop reading the transport until it does.
                    self.counters["reader_paused"] += 1
                    await room.wait()
        except TransportError as exc:
            self._emit_now(rt.SubscriptionEnded(self.channel_id, f"{type(exc).__name__}: {exc}"))
            return
        if not self._closed:
            self._emit_now(rt.SubscriptionEnded(self.channel_id, "the transport ended it"))

    def _emit_now(self, event: ev.Event) -> None:
        self._out_events.append(event)
        self._node._mark_dirty(self)

    # -- node-facing: inputs ------------------------------------------------------------
    def _on_envelope(self, envelope: Envelope) -> None:
        if envelope.retrieval_hint in self._own_hints:
            # The broker's echo of our own publish (MQTT 3.1.1 cannot suppress it):
            # the core would decode it only to ignore it.
            self.counters["own_echo"] += 1
            return
        self._receive(envelope.payload, envelope.retrieval_hint)

    def _receive(self, data: bytes, retrieval_hint: bytes | None) -> None:
        core = self.core
        now = self._node.now()
        try:
            message = decode_message(data, core.config.limits)
        except RemoteProtocolError:
            # The core counts it and emits MessageRejected; nothing else changes.
            core.receive(data, now, retrieval_hint)
            self._node._mark_dirty(self)
            return
        mid = message.message_id
        watch = (
            message.kind is MessageKind.CONTENT
            and message.sender_id != core.participant_id
            and message.channel_id == core.channel_id
            and mid not in core.log
            and mid not in core.incoming
        )
        core.receive_message(message, data, now, retrieval_hint)
        if watch:
            if mid in core.incoming:
                self._incoming_ids.add(mid)
                self._dirty_incoming.add(mid)
                self._raw[mid] = data
                self._bloom_added.append(mid)
            elif mid in core.log:
                self._raw.setdefault(mid, data)
                self._bloom_added.append(mid)
        self._node._mark_dirty(self)

    def _on_published(self, datagram: Datagram, hint: bytes) -> None:
        own = self._own_hints
        own[hint] = None
        if len(own) > _OWN_HINTS:
            del own[next(iter(own))]
        mid = datagram.message_id
        if datagram.kind is not MessageKind.CONTENT or not mid:
            return
        entry = self.core.log.get(mid)
        if entry is None or entry.history_entry.retrieval_hint == hint:
            return
        self.core.set_retrieval_hint(mid, hint)
        self._pending_hints.append((mid, hint))
        self._node._mark_dirty(self)

    def _on_publish_failed(self, datagram: Datagram, error: Exception, recoverable: bool) -> None:
        self.counters["publish_failed"] += 1
        mid = datagram.message_id if datagram.kind is MessageKind.CONTENT else ""
        detail = f"{type(error).__name__}: {error}"
        self._out_events.append(rt.PublishFailed(self.channel_id, mid, detail, recoverable))
        if not recoverable and mid and self.core.outgoing.remove(mid) is not None:
            self._dirty_outgoing.add(mid)
            self._pending_outcomes.append((mid, f"failed:{detail}"))
            self._finish(mid, SendFailed(mid, detail))
        self._node._mark_dirty(self)

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
    def _collect(self, persist: bool) -> ChannelChanges | None:
        """Drain the core; return this turn's changes (``None`` if nothing to save)."""
        core = self.core
        self._out_datagrams.extend(core.datagrams_to_send())
        out = self._out_events
        while (event := core.next_event()) is not None:
            if isinstance(event, ev.MessageDelivered):
                mid = event.message_id
                self._seq += 1
                self._received += 1
                data = self._raw.pop(mid, None)
                if data is None and core.repair is not None:
                    data = core.repair.cached(mid)
                self._pending_log.append(
                    (
                        self._seq,
                        mid,
                        event.lamport_timestamp,
                        event.sender_id,
                        event.retrieval_hint,
                        data,
                    )
                )
                if mid in self._incoming_ids:
                    self._incoming_ids.discard(mid)
                    self._dirty_incoming.add(mid)
                if mid in self._missing_ids:
                    self._missing_ids.discard(mid)
                    self._dirty_missing.add(mid)
                if mid in self._lost_ids:
                    self._lost_ids.discard(mid)
                    self._dirty_lost.add(mid)
                out.append(
                    rt.MessageDelivered(
                        event.channel_id,
                        mid,
                        event.sender_id,
                        event.lamport_timestamp,
                        event.content,
                        event.retrieval_hint,
                        self._seq,
                    )
                )
                continue
            if isinstance(event, ev.MessageSent):
                mid = event.message_id
                self._dirty_outgoing.add(mid)
                if event.attempt == 0:
                    entry = core.log.get(mid)
                    outgoing = core.outgoing.get(mid)
                    if entry is not None:
                        hint = entry.history_entry.retrieval_hint
                        if hint is None and outgoing is not None:
                            # Every adapter's hint is message_hash(topic, payload): set it
                            # now, saved with the send, instead of after the publish in a
                            # second transaction (_on_published corrects a different one).
                            hint = message_hash(self.topic, outgoing.data)
                            core.set_retrieval_hint(mid, hint)
                        self._seq += 1
                        self._pending_log.append(
                            (
                                self._seq,
                                mid,
                                entry.lamport_timestamp,
                                entry.sender_id,
                                hint,
                                outgoing.data if outgoing else None,
                            )
                        )
            elif isinstance(event, ev.MessageAcknowledged):
                self._dirty_outgoing.add(event.message_id)
                self._finish(event.message_id, None)
            elif isinstance(event, ev.MessagePossiblyAcknowledged):
                self._dirty_outgoing.add(event.message_id)
            elif isinstance(event, ev.MessageSendExpired):
                self._dirty_outgoing.add(event.message_id)
                self._pending_outcomes.append((event.message_id, f"expired:{event.attempts}"))
                self._finish(event.message_id, SendExpired(event.message_id, event.attempts))
            elif isinstance(event, ev.MessageMissing):
                mid = event.message_id
                if mid not in self._missing_ids:
                    self._missing_ids.add(mid)
                    self._dirty_missing.add(mid)
                self._to_fetch[mid] = event.retrieval_hint
            elif isinstance(event, ev.MessageLost):
                mid = event.message_id
                self._missing_ids.discard(mid)
                self._lost_ids.add(mid)
                self._dirty_missing.add(mid)
                self._dirty_lost.add(mid)
                self._to_fetch.pop(mid, None)
            elif isinstance(event, ev.MessageRejected):
                self.counters["rejected"] += 1
            out.append(event)
        if persist:
            return self._changes()
        self._forget_changes()
        return None

    def _forget_changes(self) -> None:
        if not (
            self._pending_log
            or self._pending_hints
            or self._pending_outcomes
            or self._dirty_outgoing
            or self._dirty_missing
            or self._dirty_lost
            or self._dirty_incoming
            or self._bloom_added
        ):
            return
        self._pending_log.clear()
        self._pending_hints.clear()
        self._pending_outcomes.clear()
        self._dirty_outgoing.clear()
        self._dirty_missing.clear()
        self._dirty_lost.clear()
        self._dirty_incoming.clear()
        self._bloom_added.clear()

    def _changes(self) -> ChannelChanges | None:
        core = self.core
        log = core.log
        heads = log.heads()
        referenced = log.referenced_unlogged()
        lamport = core.lamport_timestamp
        if not (
            self._pending_log
            or self._pending_hints
            or self._pending_outcomes
            or self._dirty_outgoing
            or self._dirty_missing
            or self._dirty_lost
            or self._dirty_incoming
            or self._bloom_added
            or lamport != self._saved_lamport
            or heads != self._saved_heads
            or referenced != self._saved_referenced
        ):
            return None
        c = ChannelChanges(self.channel_id, core.participant_id, lamport)
        c.log, self._pending_log = self._pending_log, []
        c.hints, self._pending_hints = self._pending_hints, []
        c.outcomes, self._pending_outcomes = self._pending_outcomes, []
        c.active_at = self._active_at = self._node.now()
        if heads != self._saved_heads:
            c.heads = self._saved_heads = heads
        if referenced != self._saved_referenced:
            c.referenced = self._saved_referenced = referenced
        self._saved_lamport = lamport
        for mid in self._dirty_outgoing:
            entry = core.outgoing.get(mid)
            if entry is None:
                c.outgoing_removed.append(mid)
            else:
                c.outgoing.append(outgoing_record(entry))
        for mid in self._dirty_missing:
            info = core.missing_since(mid)
            if info is None:
                c.missing_removed.append(mid)
            else:
                c.missing.append(MissingRecord(*info))
        for mid in self._dirty_lost:
            (c.lost if mid in self._lost_ids else c.lost_removed).append(mid)
        for mid in self._dirty_incoming:
            pending = core.incoming.get(mid)
            if pending is None:
                c.incoming_removed.append(mid)
            else:
                c.incoming.append(
                    IncomingRecord(mid, pending.data, pending.retrieval_hint, pending.received_at)
                )
        c.bloom_added, self._bloom_added = self._bloom_added, []
        c.bloom_keep = max(1, core.config.bloom.capacity // 2)
        self._dirty_outgoing.clear()
        self._dirty_missing.clear()
        self._dirty_lost.clear()
        self._dirty_incoming.clear()
        return c

    def _release(self) -> list[Datagram]:
        """After the commit: hand events to the application; return datagrams to publish."""
        missing, lost = len(self._missing_ids), len(self._lost_ids)
        previous = self._status
        # Cheap test first: a synced channel that stays synced emits nothing.
        if missing or previous.missing or lost != previous.lost:
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
            if isinstance(event, rt.MessageDelivered):
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
        missing = len(self._missing_ids)
        return rt.SyncStatus(
            rt.SyncState.SYNCING if missing else rt.SyncState.SYNCED,
            self._received,
            missing,
            len(self._lost_ids),
        )

    async def _catch_up(self, time_start: int) -> int:
        """Feed the core every message the store received since ``time_start`` (epoch ms)."""
        store = self._node.store
        assert store is not None
        timeout = self._node.options.store_timeout
        self.counters["catch_up_queries"] += 1
        retrieved = 0
        pages = store.messages_between(self.channel_id, time_start).__aiter__()
        while True:
            try:
                page = await asyncio.wait_for(pages.__anext__(), timeout)
            except StopAsyncIteration:
                break
            for data in page:
                self._receive(data, message_hash(self.topic, data))
            retrieved += len(page)
            self.counters["catch_up_retrieved"] += len(page)
            await asyncio.sleep(0)  # the turn's flush runs between pages
        return retrieved

    def _start_catch_up(self, time_start: int) -> None:
        """Run :meth:`_catch_up` in the background; failures become events."""
        if self._node.store is None or self._closed:
            return
        if self._catcher is not None and not self._catcher.done():
            self._catcher.cancel()
        self._catcher = asyncio.create_task(
            self._catch_up_reporting(time_start), name=f"chorus-catch-up-{self.channel_id}"
        )

    async def _catch_up_reporting(self, time_start: int) -> int:
        try:
            return await self._catch_up(time_start)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced as an event; the next reconnect or call retries
            self.counters["store_errors"] += 1
            self._emit_now(
                rt.StoreRetrievalFailed(self.channel_id, (), f"{type(exc).__name__}: {exc}")
            )
            return 0

    async def _fetch(self) -> None:
        """Ask the store for missing messages until none is left to ask for."""
        store = self._node.store
        assert store is not None
        timeout = self._node.options.store_timeout
        while self._to_fetch and not self._closed:
            batch = {m: h for m, h in self._to_fetch.items() if m in self._missing_ids}
            self._to_fetch.clear()
            if not batch:
                continue
            self.counters["store_queries"] += 1
            try:
                found = await asyncio.wait_for(
                    store.get_messages(
                        self.channel_id, list(batch), [h for h in batch.values() if h]
                    ),
                    timeout,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any store failure is surfaced, then retried later
                self.counters["store_errors"] += 1
                self._emit_now(
                    rt.StoreRetrievalFailed(
                        self.channel_id, tuple(batch), f"{type(exc).__name__}: {exc}"
                    )
                )
                continue
            self.counters["store_retrieved"] += len(found)
            for data in found:
                self._receive(data, message_hash(self.topic, data))

    def _replayed_event(self, record: HistoryRecord) -> rt.MessageDelivered | None:
        if record.sender_id == self.core.participant_id or record.data is None:
            return None
        try:
            message = decode_message(record.data, self.core.config.limits)
        except RemoteProtocolError:
            return None
        return rt.MessageDelivered(
            self.channel_id,
            record.message_id,
            record.sender_id,
            record.lamport_timestamp,
            message.content or b"",
            record.retrieval_hint,
            record.seq,
        )


def _outcome_error(message_id: str, outcome: str) -> Exception:
    """The exception for a persisted send outcome (``"expired:<n>"`` / ``"failed:<error>"``)."""
    kind, _, detail = outcome.partition(":")
    if kind == "expired":
        return SendExpired(message_id, int(detail or 0))
    return SendFailed(message_id, detail)
