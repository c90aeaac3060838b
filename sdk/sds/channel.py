"""One participant's state machine for one SDS channel.

Theory of operation
-------------------
``MessageChannel`` is sans-I/O in the aioquic shape. Inputs are method calls
that carry the current time ``now`` (epoch milliseconds): :meth:`send`,
:meth:`send_ephemeral`, :meth:`receive` and :meth:`handle_timer`. Outputs are
drained by the caller: :meth:`datagrams_to_send` (bytes to broadcast),
:meth:`next_event` (what happened) and :meth:`get_timer` (when to call
:meth:`handle_timer` next). Nothing here reads a clock, sleeps or touches a
socket, so every behaviour is reproducible with a manual clock.

Each protocol rule has one home: the Lamport rule in ``lamport``, log order
in ``local_log``, acknowledgement states in ``outgoing``, dependency waiting
in ``incoming``, SDS-R in ``repair``, the filter in ``bloom``; this module
sequences them as specs/sds.md's "Protocol Steps" do.

A peer's bad input never raises: it becomes :class:`MessageRejected` and a
count in :attr:`stats`, and leaves the channel's state untouched.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from sdk.sds.bloom import RollingBloomFilter
from sdk.sds.config import ChannelConfig
from sdk.sds.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdk.sds.events import (
    BloomProfileMismatch,
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageRejected,
    MessageSendExpired,
    MessageSent,
)
from sdk.sds.incoming import IncomingBuffer, PendingMessage
from sdk.sds.journal import (
    Change,
    ClockAdvanced,
    FilterInserted,
    HeadsChanged,
    HintSet,
    IncomingAdded,
    IncomingRemoved,
    Logged,
    LostAdded,
    LostRemoved,
    MissingRemoved,
    MissingSaved,
    OutgoingRemoved,
    outgoing_saved,
)
from sdk.sds.lamport import LamportClock
from sdk.sds.local_log import LocalLog
from sdk.sds.message import (
    HistoryEntry,
    Message,
    MessageKind,
    decode_message,
    encode_fields,
    encode_message,
)
from sdk.sds.message_id import compute_ephemeral_id, compute_message_id
from sdk.sds.outgoing import OutgoingBuffer, OutgoingEntry, OutgoingState
from sdk.sds.repair import RepairState


@dataclass(frozen=True, slots=True)
class Datagram:
    """Bytes to broadcast on the channel's topic."""

    channel_id: str
    data: bytes
    #: Id of the message carried (for retrieval hints); sync messages have one too.
    message_id: str
    kind: MessageKind


@dataclass(slots=True)
class _Missing:
    entry: HistoryEntry
    first_seen: int
    next_report_at: int


class MessageChannel:
    """SDS for one channel, as one participant.

    ``participant_id`` is this participant's globally unique id (the
    ``sender_id`` it puts on the wire). ``now`` initializes the Lamport clock.
    ``rng`` drives the sync backoff; pass a seeded ``random.Random`` for
    reproducible runs. ``events`` and ``outbox`` let a :class:`Participant`
    share one queue across its channels. With ``journal`` the channel records
    its durable changes for :meth:`drain_changes` (``sdk.sds.journal``).
    """

    def __init__(
        self,
        channel_id: str,
        participant_id: str,
        now: int,
        config: ChannelConfig | None = None,
        *,
        rng: random.Random | None = None,
        events: deque[Event] | None = None,
        outbox: list[Datagram] | None = None,
        journal: bool = False,
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be a non-empty string")
        self.channel_id = channel_id
        self.participant_id = participant_id
        self.config = config or ChannelConfig()
        cfg = self.config
        self.clock = LamportClock(now)
        self.log = LocalLog(with_sender=cfg.repair is not None)
        self.bloom = RollingBloomFilter(cfg.bloom)
        self.outgoing = OutgoingBuffer(cfg.ack_false_positive_target, cfg.bloom)
        self.incoming = IncomingBuffer()
        self.repair = RepairState(cfg.repair, participant_id) if cfg.repair else None
        #: Counters: ``received``, ``delivered``, ``duplicates``, ``rejected.<reason>``, ...
        self.stats: Counter[str] = Counter()
        self._rng = rng or random.Random()
        self._events: deque[Event] = events if events is not None else deque()
        self._outbox: list[Datagram] = outbox if outbox is not None else []
        self._missing: dict[str, _Missing] = {}
        self._lost: set[str] = set()
        self._ephemeral_nonce = 0
        self._next_sweep_at = now + cfg.sweep_interval_ms
        self._last_activity = now
        self._last_own_broadcast = now
        self._sync_backoff = self._draw_sync_backoff()
        self._last_sync_sent: int | None = None
        #: Durable changes not yet drained; ``None`` when not journaling.
        self._journal: list[Change] | None = [] if journal else None
        self._drained_clock = -1
        #: Peers already reported as running another bloom profile (bounded).
        self._mismatched_peers: set[str] = set()
        self._drained_heads: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    # -- outputs -----------------------------------------------------------------------
    def next_event(self) -> Event | None:
        """The oldest undrained event, or ``None``."""
        return self._events.popleft() if self._events else None

    def datagrams_to_send(self) -> list[Datagram]:
        """Drain the datagrams to broadcast, in order."""
        out = self._outbox[:]
        self._outbox.clear()
        return out

    def drain_changes(self) -> list[Change]:
        """The durable changes made since the last drain, in order (with ``journal=True``;
        always empty otherwise). See :mod:`sdk.sds.journal`."""
        journal = self._journal
        if journal is None:
            return []
        clock = self.clock.value
        if clock != self._drained_clock:
            self._drained_clock = clock
            journal.append(ClockAdvanced(clock))
        heads = (tuple(self.log.heads()), tuple(self.log.referenced_unlogged()))
        if heads != self._drained_heads:
            self._drained_heads = heads
            journal.append(HeadsChanged(*heads))
        self._journal = []
        return journal

    def get_timer(self) -> int | None:
        """When :meth:`handle_timer` must next be called, or ``None`` if never."""
        times: list[int] = []
        if self.outgoing or self._missing or (self.repair and self.repair.pending):
            times.append(self._next_sweep_at)
        sync_at = self._next_sync_at()
        if sync_at is not None:
            times.append(sync_at)
        return min(times) if times else None

    # -- inputs: local -----------------------------------------------------------------
    def send(self, content: bytes, now: int) -> str:
        """Broadcast ``content`` reliably; return its message id (specs/sds.md, "Send Message").

        The message is queued in :meth:`datagrams_to_send`, entered in the local
        log and kept in the outgoing buffer until acknowledged.
        """
        if not content:
            raise LocalProtocolError("content must be non-empty (empty content is a sync message)")
        lamport = self.clock.tick(now)
        history = self.log.causal_history(self.config.causal_history_size, self._rng)
        history_ids = [e.message_id for e in history]
        message_id = compute_message_id(
            self.channel_id, self.participant_id, lamport, content, history_ids
        )
        data = encode_fields(
            self.participant_id,
            message_id,
            self.channel_id,
            lamport,
            history,
            self.bloom.to_bytes(),
            content,
            self.repair.take_requests(now) if self.repair else (),
        )
        if len(data) > self.config.limits.max_message_size:
            raise LocalProtocolError(
                f"encoded message is {len(data)} bytes, over limits.max_message_size="
                f"{self.config.limits.max_message_size}; send smaller content"
            )
        self.log.add(message_id, lamport, self.participant_id)
        self.log.mark_referenced(history_ids)
        if self.repair:
            self.repair.cache(message_id, self.participant_id, data)
        entry = OutgoingEntry(
            message_id, data, None, next_resend_at=now + self.config.resend_interval_ms
        )
        self.outgoing.add(entry)
        if self._journal is not None:
            self._journal += (
                Logged(
                    message_id, lamport, self.participant_id, None, data, tuple(history_ids), True
                ),
                outgoing_saved(entry),
            )
        self._broadcast(data, message_id, MessageKind.CONTENT, now)
        self._events.append(MessageSent(self.channel_id, message_id, 0))
        self.stats["sent"] += 1
        return message_id

    def send_ephemeral(self, content: bytes, now: int) -> str:
        """Broadcast ``content`` once, without ordering or acknowledgement (specs/sds.md,
        "Ephemeral Messages"); return its message id."""
        if not content:
            raise LocalProtocolError("ephemeral content must be non-empty")
        self._ephemeral_nonce += 1
        message_id = compute_ephemeral_id(
            self.channel_id, self.participant_id, (now << 16) + self._ephemeral_nonce, content
        )
        data = encode_message(
            Message(self.participant_id, message_id, self.channel_id, content=content)
        )
        self._outbox.append(Datagram(self.channel_id, data, message_id, MessageKind.EPHEMERAL))
        self.stats["ephemeral_sent"] += 1
        return message_id

    def set_retrieval_hint(self, message_id: str, retrieval_hint: bytes) -> None:
        """Record how to retrieve a logged message (e.g. the transport hash of what we
        published); later causal histories carry it."""
        if self.log.set_retrieval_hint(message_id, retrieval_hint) and self._journal is not None:
            self._journal.append(HintSet(message_id, retrieval_hint))

    def abandon(self, message_id: str, reason: str) -> bool:
        """Stop resending one of our messages that can never go out (e.g. the transport
        refused it for good); ``False`` if it was not buffered."""
        if self.outgoing.remove(message_id) is None:
            return False
        if self._journal is not None:
            self._journal.append(OutgoingRemoved(message_id, f"failed:{reason}"))
        return True

    def handle_timer(self, now: int) -> None:
        """Run whatever is due: buffer sweeps, SDS-R responses, the sync message."""
        if now >= self._next_sweep_at:
            self._sweep(now)
            # Stay on the sweep grid whenever we are called, so deadlines that
            # fall on it are met exactly.
            interval = self.config.sweep_interval_ms
            self._next_sweep_at += ((now - self._next_sweep_at) // interval + 1) * interval
        sync_at = self._next_sync_at()
        if sync_at is not None and now >= sync_at:
            self.send_sync(now)

    def announce(self, now: int) -> str | None:
        """Broadcast a sync message now, unless one went out within the last
        ``sweep_interval_ms``; return its id or ``None``.

        For a participant that just (re)joined, after a restart or a reconnect:
        its filter and causal history tell peers at once what it holds, so they
        learn what it acknowledges and what it lacks without waiting for the
        periodic sync (specs/sds.md, "Periodic Sync Message").
        """
        last = self._last_sync_sent
        if last is not None and now - last < self.config.sweep_interval_ms:
            return None
        return self.send_sync(now)

    def send_sync(self, now: int) -> str:
        """Broadcast a sync message now (specs/sds.md, "Periodic Sync Message")."""
        cfg = self.config
        lamport = self.clock.tick(now)
        history = self.log.causal_history(
            cfg.causal_history_size, self._rng, heads=max(cfg.sync_heads, cfg.causal_history_size)
        )
        message_id = compute_message_id(
            self.channel_id, self.participant_id, lamport, b"", [e.message_id for e in history]
        )
        message = Message(
            sender_id=self.participant_id,
            message_id=message_id,
            channel_id=self.channel_id,
            lamport_timestamp=lamport,
            causal_history=history,
            bloom_filter=self.bloom.to_bytes(),
            repair_request=self.repair.take_requests(now) if self.repair else (),
        )
        # Not buffered, not logged, not in filters or histories: sync messages only
        # carry state.
        self._broadcast(encode_message(message), message_id, MessageKind.SYNC, now)
        self._last_sync_sent = now
        self.stats["sync_sent"] += 1
        return message_id

    # -- inputs: from the wire ---------------------------------------------------------
    def receive(self, data: bytes, now: int, retrieval_hint: bytes | None = None) -> None:
        """Process bytes that arrived on the channel's topic."""
        try:
            message = decode_message(data, self.config.limits)
        except RemoteProtocolError as exc:
            self._reject("", exc.reason, exc.detail, None)
            return
        self.receive_message(message, data, now, retrieval_hint)

    def receive_message(
        self, message: Message, data: bytes, now: int, retrieval_hint: bytes | None = None
    ) -> None:
        """Process an already decoded message (``data`` is its encoding, kept for SDS-R)."""
        if message.channel_id != self.channel_id:
            self.stats["foreign_channel"] += 1
            return
        if message.sender_id == self.participant_id:
            self.stats["own_ignored"] += 1  # spec: SHOULD ignore our own messages
            return
        self.stats["received"] += 1
        kind = message.kind
        if kind is MessageKind.EPHEMERAL:
            self.stats["ephemeral_received"] += 1
            self._events.append(
                EphemeralReceived(
                    self.channel_id, message.message_id, message.sender_id, message.content or b""
                )
            )
            return
        lamport = message.lamport_timestamp
        assert lamport is not None  # content and sync messages carry one
        if lamport > now + self.config.max_lamport_drift_ms:
            self._reject(
                self.channel_id,
                RejectReason.LAMPORT_DRIFT,
                f"lamport_timestamp {lamport} more than {self.config.max_lamport_drift_ms} ms "
                f"ahead of now ({now})",
                message.sender_id,
            )
            return
        message_id = message.message_id
        is_content = kind is MessageKind.CONTENT
        history_ids = [e.message_id for e in message.causal_history]
        if is_content:
            unmet = self._unmet(history_ids)
            if message_id in self.log or (message_id in self.incoming and unmet):
                self.stats["duplicates"] += 1
                if self.repair:
                    self.repair.on_message_seen(message_id)
                return
            if self.config.verify_message_ids and message_id != compute_message_id(
                message.channel_id,
                message.sender_id,
                lamport,
                message.content or b"",
                history_ids,
            ):
                self._reject(
                    self.channel_id,
                    RejectReason.MESSAGE_ID_MISMATCH,
                    f"message_id {message_id[:16]}... does not match its fields",
                    message.sender_id,
                )
                return
            if message_id in self.incoming:
                # A deliverable copy of an id that waits for dependencies: without
                # id verification a peer could have sent a forgery with
                # unresolvable dependencies first to block the real message.
                self.incoming.discard(message_id)
                if self._journal is not None:
                    self._journal.append(IncomingRemoved(message_id))
                self.stats["buffered_replaced"] += 1
            elif unmet and len(self.incoming) >= self.config.max_incoming_buffer:
                self._reject(
                    self.channel_id,
                    RejectReason.INCOMING_BUFFER_FULL,
                    f"{len(self.incoming)} messages already wait for dependencies",
                    message.sender_id,
                )
                return
        else:
            unmet = self._unmet(history_ids)

        self._last_activity = now
        bloom_filter = message.bloom_filter
        if bloom_filter is not None and len(bloom_filter) != self.config.bloom.size_bytes:
            self._profile_mismatch(message.sender_id, len(bloom_filter))
        self._review_acks(message, history_ids)
        if self.repair:
            self.repair.on_message_seen(message_id)
            for entry in message.repair_request:
                self.repair.on_repair_request(entry, now)
        if unmet:
            for entry in message.causal_history:
                if entry.message_id in unmet:
                    self._report_missing(entry, now)
        if not is_content:
            self.stats["sync_received"] += 1
            return
        self.bloom.insert(message_id)
        if self._journal is not None:
            self._journal.append(FilterInserted(message_id))
            if unmet:
                self._journal.append(IncomingAdded(message_id, data, retrieval_hint, now))
        if unmet:
            self.incoming.add(PendingMessage(message, data, retrieval_hint, now, set(unmet)))
            self.stats["buffered"] += 1
        else:
            self._deliver(message, data, retrieval_hint)

    # -- internals ---------------------------------------------------------------------
    def _unmet(self, history_ids: list[str]) -> set[str]:
        if not history_ids:
            return set()
        unmet = self.log.not_logged(history_ids)
        if unmet and self._lost:
            unmet -= self._lost
        return unmet

    def _review_acks(self, message: Message, history_ids: list[str]) -> None:
        # specs/sds.md, "Review ACK Status".
        outgoing = self.outgoing
        if not len(outgoing):
            return
        channel = self.channel_id
        events = self._events
        journal = self._journal
        for mid in outgoing.acknowledge_history(history_ids):
            events.append(MessageAcknowledged(channel, mid))
            self.stats["acknowledged"] += 1
            if journal is not None:
                journal.append(OutgoingRemoved(mid, "acknowledged"))
        bloom_filter = message.bloom_filter
        if bloom_filter is None or not len(outgoing):
            return
        if len(bloom_filter) != self.config.bloom.size_bytes:
            # A peer on another profile: its filter says nothing we can read.
            return
        if self.config.bloom.is_saturated(bloom_filter):
            # Overfilled (e.g. never rolled over): its hits would be false
            # acknowledgements, so it acknowledges nothing (docs/interop.md).
            self.stats["filter_saturated"] += 1
            return
        acked, possibly = outgoing.review_filter(bloom_filter, message.sender_id)
        for mid in acked:
            events.append(MessageAcknowledged(channel, mid))
            self.stats["acknowledged"] += 1
            if journal is not None:
                journal.append(OutgoingRemoved(mid, "acknowledged"))
        for mid, hits in possibly:
            events.append(MessagePossiblyAcknowledged(channel, mid, hits))
            self.stats["possibly_acknowledged"] += 1
            if journal is not None:
                possibly_entry = outgoing.get(mid)
                assert possibly_entry is not None
                journal.append(outgoing_saved(possibly_entry))

    def _profile_mismatch(self, sender_id: str, size: int) -> None:
        self.stats["filter_size_mismatch"] += 1
        if sender_id not in self._mismatched_peers and len(self._mismatched_peers) < 1_024:
            self._mismatched_peers.add(sender_id)
            expected = self.config.bloom.size_bytes
            self._events.append(BloomProfileMismatch(self.channel_id, sender_id, size, expected))

    def _report_missing(self, entry: HistoryEntry, now: int) -> None:
        mid = entry.message_id
        known = self._missing.get(mid)
        if known is not None:
            if entry.retrieval_hint is not None and known.entry.retrieval_hint is None:
                known.entry = entry
                if self._journal is not None:
                    self._journal.append(MissingSaved(entry, known.first_seen))
            return
        if mid in self.incoming:
            return  # we hold it; it waits for its own dependencies
        if len(self._missing) >= self.config.max_missing:
            self.stats["missing_untracked"] += 1
            return
        self._missing[mid] = _Missing(entry, now, now + self.config.retrieval_interval_ms)
        if self._journal is not None:
            self._journal.append(MissingSaved(entry, now))
        self.stats["missing"] += 1
        self._events.append(
            MessageMissing(self.channel_id, mid, entry.retrieval_hint, entry.sender_id)
        )
        if self.repair:
            self.repair.on_missing(entry, now)

    def _deliver(self, message: Message, data: bytes, retrieval_hint: bytes | None) -> None:
        # specs/sds.md, "Deliver Message"; then everything this unblocks, in
        # (lamport, id) order so delivery order is deterministic.
        ready: list[tuple[int, str, PendingMessage | None]] = []
        first = PendingMessage(message, data, retrieval_hint, 0, set())
        self._deliver_one(first, ready)
        while ready:
            _, _, pending = heapq.heappop(ready)
            assert pending is not None
            self._deliver_one(pending, ready)

    def _deliver_one(
        self, pending: PendingMessage, ready: list[tuple[int, str, PendingMessage | None]]
    ) -> None:
        message = pending.message
        mid = message.message_id
        lamport = message.lamport_timestamp
        assert lamport is not None
        self.clock.observe(lamport)
        self.log.add(mid, lamport, message.sender_id, pending.retrieval_hint)
        references = [e.message_id for e in message.causal_history]
        if references:
            self.log.mark_referenced(references)
        journal = self._journal
        if journal is not None:
            journal.append(
                Logged(
                    mid,
                    lamport,
                    message.sender_id,
                    pending.retrieval_hint,
                    pending.data,
                    tuple(references),
                    False,
                )
            )
        if self._missing.pop(mid, None) is not None:
            self.stats["retrieved"] += 1
            if journal is not None:
                journal.append(MissingRemoved(mid))
        if mid in self._lost:
            self._lost.discard(mid)
            if journal is not None:
                journal.append(LostRemoved(mid))
        if self.repair:
            self.repair.cache(mid, message.sender_id, pending.data)
        self.stats["delivered"] += 1
        self._events.append(
            MessageDelivered(
                self.channel_id,
                mid,
                message.sender_id,
                lamport,
                message.content or b"",
                pending.retrieval_hint,
            )
        )
        for unblocked in self.incoming.resolve(mid):
            m = unblocked.message
            if journal is not None:
                journal.append(IncomingRemoved(m.message_id))
            heapq.heappush(ready, (m.lamport_timestamp or 0, m.message_id, unblocked))

    def _sweep(self, now: int) -> None:
        cfg = self.config
        # Outgoing buffer sweep (specs/sds.md, "Periodic Outgoing Buffer Sweep").
        for entry in self.outgoing.due(now):
            if cfg.max_resends is not None and entry.attempts >= cfg.max_resends:
                self.outgoing.remove(entry.message_id)
                if self._journal is not None:
                    self._journal.append(
                        OutgoingRemoved(entry.message_id, f"expired:{entry.attempts}")
                    )
                self.stats["send_expired"] += 1
                self._events.append(
                    MessageSendExpired(self.channel_id, entry.message_id, entry.attempts)
                )
                continue
            entry.attempts += 1
            interval = (
                cfg.resend_interval_ms
                if entry.state is OutgoingState.UNACKNOWLEDGED
                else cfg.possibly_acked_resend_interval_ms
            )
            entry.next_resend_at = now + interval
            if self._journal is not None:
                self._journal.append(outgoing_saved(entry))
            self._broadcast(entry.data, entry.message_id, MessageKind.CONTENT, now)
            self.stats["resent"] += 1
            self._events.append(MessageSent(self.channel_id, entry.message_id, entry.attempts))
        # Incoming buffer sweep (specs/sds.md, "Periodic Incoming Buffer Sweep"):
        # report what is still missing for retrieval; give up after the timeout.
        if self._missing:
            lost_after = cfg.lost_timeout_ms
            for mid, missing in list(self._missing.items()):
                if lost_after and now - missing.first_seen >= lost_after:
                    self._declare_lost(mid)
                elif now >= missing.next_report_at:
                    missing.next_report_at = now + cfg.retrieval_interval_ms
                    ref = missing.entry
                    self._events.append(
                        MessageMissing(self.channel_id, mid, ref.retrieval_hint, ref.sender_id)
                    )
                    if self.repair:
                        # Another participant's request for it removed ours (SDS-R
                        # receive rules); if the repair never reached us, the
                        # dependency is still unmet, so it goes back in the buffer.
                        self.repair.on_missing(ref, now)
        # SDS-R incoming repair request buffer sweep.
        if self.repair:
            for data in self.repair.due_responses(now):
                self._outbox.append(Datagram(self.channel_id, data, "", MessageKind.CONTENT))
                self.stats["repairs_sent"] += 1

    def _declare_lost(self, message_id: str) -> None:
        del self._missing[message_id]
        self._lost.add(message_id)
        journal = self._journal
        if journal is not None:
            journal += (MissingRemoved(message_id), LostAdded(message_id))
        if self.repair:
            self.repair.forget(message_id)
        self.stats["lost"] += 1
        self._events.append(MessageLost(self.channel_id, message_id))
        ready: list[tuple[int, str, PendingMessage | None]] = []
        for unblocked in self.incoming.resolve(message_id):
            m = unblocked.message
            if journal is not None:
                journal.append(IncomingRemoved(m.message_id))
            heapq.heappush(ready, (m.lamport_timestamp or 0, m.message_id, unblocked))
        while ready:
            _, _, pending = heapq.heappop(ready)
            assert pending is not None
            self._deliver_one(pending, ready)

    def _broadcast(self, data: bytes, message_id: str, kind: MessageKind, now: int) -> None:
        self._outbox.append(Datagram(self.channel_id, data, message_id, kind))
        self._last_activity = now
        self._last_own_broadcast = now
        self._sync_backoff = self._draw_sync_backoff()

    def _draw_sync_backoff(self) -> int:
        interval = self.config.sync_interval_ms
        return interval + int(self._rng.random() * interval) if interval else 0

    def _next_sync_at(self) -> int | None:
        if not self.config.sync_interval_ms:
            return None
        due = self._last_activity + self._sync_backoff
        # SDS-R: with repair requests due, sync on our own schedule even if others
        # were active ("SDS-R Periodic Sync Message").
        if self.repair and self.repair.has_eligible_requests(
            self._last_own_broadcast + self._sync_backoff
        ):
            due = min(due, self._last_own_broadcast + self._sync_backoff)
        return due

    def _reject(
        self, channel_id: str, reason: RejectReason, detail: str, sender_id: str | None
    ) -> None:
        self.stats[f"rejected.{reason.value}"] += 1
        self._events.append(MessageRejected(channel_id, reason, detail, sender_id))

    # -- inspection --------------------------------------------------------------------
    @property
    def lamport_timestamp(self) -> int:
        """The channel's current Lamport time."""
        return self.clock.value

    def missing(self) -> list[str]:
        """Ids of dependencies currently missing."""
        return list(self._missing)

    def missing_entries(self) -> list[tuple[HistoryEntry, int]]:
        """Each missing dependency's history entry and when it was first seen missing."""
        return [(m.entry, m.first_seen) for m in self._missing.values()]

    def missing_since(self, message_id: str) -> tuple[HistoryEntry, int] | None:
        """The history entry of a missing dependency and when it was first seen missing."""
        m = self._missing.get(message_id)
        return (m.entry, m.first_seen) if m is not None else None

    def restore_dependency_state(
        self, missing: Iterable[tuple[HistoryEntry, int]], lost: Iterable[str], now: int
    ) -> None:
        """Reinstate missing and lost dependencies saved with :meth:`missing_entries` and
        :meth:`lost` (snapshot restore, before re-receiving buffered messages).

        Missing ones keep their first-seen time, so the loss timeout is not reset,
        and are reported again at the next sweep so retrieval resumes at once.
        """
        self._lost.update(lost)
        for entry, first_seen in missing:
            self._missing[entry.message_id] = _Missing(entry, first_seen, now)
            if self.repair:
                self.repair.on_missing(entry, now)
        self._next_sweep_at = min(self._next_sweep_at, now)

    def lost(self) -> set[str]:
        """Ids declared irretrievably lost."""
        return set(self._lost)

    def outgoing_state(self, message_id: str) -> OutgoingState | None:
        """State of one of our messages; ``None`` once acknowledged (or unknown)."""
        entry = self.outgoing.get(message_id)
        return entry.state if entry else None
