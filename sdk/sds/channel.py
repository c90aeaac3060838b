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
in ``incoming``, SDS-R in ``repair``, the filter in ``bloom``, answering the
gaps peers' sync filters show in ``answering``; this module sequences them
as specs/sds.md's "Protocol Steps" do.

A peer's bad input never raises: it becomes :class:`MessageRejected` and a
count in :attr:`stats`, and leaves the channel's state untouched.

Dependency states
-----------------
Every id a causal history names is, for this participant, in one
:class:`DependencyState`: *missing* (named, never received), *held* (received,
waiting in the incoming buffer for its own dependencies), *delivered* (in the
local log) or *lost*. One method, :meth:`MessageChannel._move_dependency`,
makes every change and keeps the indexes (missing, lost, incoming buffer,
SDS-R requests) consistent, so the rule has one home: an id is missing only
while it has never been received; receiving it, even into the buffer, ends
that, cancels its repair requests, and it can then never be declared lost.
Only a missing id becomes lost, after ``lost_timeout_ms``.

A lost id that arrives later: specs/sds.md ("Periodic Incoming Buffer Sweep")
only says a participant MAY mark dependencies that stay unmet irretrievably
lost, and nothing about a late arrival. ``@waku/sds`` 0.0.8 keeps no lost set
at all (``message_channel.js`` ``sweepIncomingBuffer``, lines 215-225: the
waiting message is dropped and ``InMessageLost`` emitted), so a late copy is
processed like any message. Chorus delivers the waiting dependents when it
declares an id lost, and delivers the lost id itself if it arrives later and
its own dependencies are met: the application gets every message, the late
one after messages that named it.
"""

from __future__ import annotations

import heapq
import operator
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from sdk.sds.answering import GapAnswers
from sdk.sds.archive import LogArchive, MemoryArchive
from sdk.sds.bloom import Positions, RollingBloomFilter, contains
from sdk.sds.config import ChannelConfig
from sdk.sds.errors import (
    LocalProtocolError,
    MessageTooLarge,
    RejectReason,
    RemoteProtocolError,
)
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
    RetrieveRange,
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
    OutgoingSaved,
)
from sdk.sds.lamport import LamportClock
from sdk.sds.local_log import LocalLog
from sdk.sds.message import Datagram as Datagram  # its home; re-exported for callers
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
from sdk.sds.repair import (
    RepairState,
    chain_request,
    chain_since,
)


class DependencyState(Enum):
    """Where a referenced id stands for one participant (see "Dependency states" above)."""

    #: Named by a causal history, never received: retrieved, repaired, may become lost.
    MISSING = "missing"
    #: Received, waiting in the incoming buffer for its own dependencies.
    HELD = "held"
    #: In the local log.
    DELIVERED = "delivered"
    #: Missing for ``lost_timeout_ms``; dependents went ahead without it.
    LOST = "lost"


@dataclass(slots=True)
class _Missing:
    entry: HistoryEntry
    first_seen: int
    next_report_at: int
    reports: int = 1


#: Content ids received since our last broadcast that an acknowledgement sync covers.
_ACK_IDS = 8
#: Lamport times at or beyond this are rejected: the clock could not tick past them.
_MAX_LAMPORT = 1 << 63
#: Entries of our own log read back to find a sender's newest message for a
#: chain request's ``since`` (_chain_requests): bounds the scan.
_CHAIN_SCAN = 10_000
#: Acknowledgement delays of our recent messages that decide the early first resend.
_ACK_DELAYS = 4
#: A history entry's message id (``map`` over a long causal history runs in C).
_ENTRY_ID = operator.itemgetter(0)
#: A delivered message's causal-history ids as receive_message already has them: the
#: list, the same as a set, and whether every one is known to be logged.
_References = tuple[list[str], set[str], bool]


def _held_fields(pending: PendingMessage) -> tuple[Message, bytes, bytes | None, int]:
    """What :meth:`MessageChannel._deliver_one` takes of a message that waited."""
    return pending.message, pending.data, pending.retrieval_hint, pending.received_at


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
        archive: LogArchive | None = None,
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be a non-empty string")
        self.channel_id = channel_id
        self.participant_id = participant_id
        self.config = config or ChannelConfig()
        cfg = self.config
        self.clock = LamportClock(now)
        #: Where the local log's entries older than ``config.log_window`` are looked
        #: up (``sdk.sds.archive``); by default their ids are kept in memory.
        self.archive: LogArchive = archive if archive is not None else MemoryArchive()
        self.log = LocalLog(
            with_sender=cfg.repair is not None,
            window=cfg.log_window,
            archive=self.archive,
            max_heads=cfg.max_heads,
        )
        self.bloom = RollingBloomFilter(cfg.bloom)
        self.outgoing = OutgoingBuffer(cfg.ack_false_positive_target, cfg.bloom)
        self.incoming = IncomingBuffer()
        self.repair = (
            RepairState(cfg.repair, participant_id, cfg.bloom, self.archive) if cfg.repair else None
        )
        #: Counters: ``received``, ``delivered``, ``duplicates``, ``rejected.<reason>``, ...
        self.stats: Counter[str] = Counter()
        self._rng = rng or random.Random()
        self._events: deque[Event] = events if events is not None else deque()
        self._outbox: list[Datagram] = outbox if outbox is not None else []
        self._missing: dict[str, _Missing] = {}
        # Ids declared lost, oldest first (at most ``max_lost``: _forget_lost).
        self._lost: dict[str, None] = {}
        # Peers heard from (content or sync), by when; how many within
        # ``peer_window_ms``, recounted at each sweep (see sdk/sds/outgoing.py).
        self._peers: dict[str, int] = {}
        self._active_peers = 0
        # Gap retrieval by time range (RetrieveRange): when we last heard the
        # channel, the window asked for last, and a window waiting for the sweep.
        self._last_heard: int | None = None
        self._range_asked_to = 0
        self._range_asked_at: int | None = None
        self._range_wanted_from: int | None = None
        # Acknowledgement sync: when it is due, the newest ids it acknowledges
        # (with their filter positions) and the peers that acknowledged them first.
        self._ack_due: int | None = None
        self._ack_ids: deque[tuple[str, Positions]] = deque(maxlen=_ACK_IDS)
        self._ack_seen_by: set[str] = set()
        self._last_sync_at: int | None = None
        # When the set of missing dependencies first grew since our last sync, and
        # sync messages sent since: with a gap, syncs go out d, 2d, 4d, ... apart
        # (_next_sync_at).
        self._gap_since = now
        self._gap_syncs = 0
        # When fresh content last went out or arrived, and whether the newest gap
        # was found in a quiet channel (its first sync then goes out promptly,
        # and it is asked for again sooner: _next_sync_at, _reask_pause).
        self._last_content_at = now
        self._gap_prompt = False
        #: What we rebroadcast to close the gaps peers' syncs show (sdk/sds/answering.py).
        self.answers = GapAnswers(
            channel_id,
            participant_id,
            cfg,
            self.log,
            self.archive,
            self.repair,
            self._peers,
            self._outbox,
            self.stats,
        )
        # How long our latest messages took to be acknowledged (see _first_resend_at).
        self._ack_delays: deque[int] = deque(maxlen=_ACK_DELAYS)
        self._ack_needed = cfg.bloom.acknowledgement_threshold(cfg.ack_false_positive_target)
        # (declared at, id) of lost ids whose SDS-R requests still go out.
        self._still_asking: deque[tuple[int, str]] = deque()
        # The time of the input being processed (for what deep helpers record).
        self._now = now
        self._ephemeral_nonce = 0
        self._next_sweep_at = now + cfg.sweep_interval_ms
        self._last_activity = now
        self._last_own_broadcast = now
        self._sync_backoff = self._draw_sync_backoff()
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
        if (
            self.outgoing
            or self._missing
            or (self.repair and self.repair.pending)
            or self._range_wanted_from is not None
        ):
            times.append(self._next_sweep_at)
        sync_at = self._next_sync_at()
        if sync_at is not None:
            times.append(sync_at)
        if self._ack_due is not None:
            times.append(self._ack_due)
        return min(times) if times else None

    # -- inputs: local -----------------------------------------------------------------
    def send(
        self,
        content: bytes,
        now: int,
        *,
        max_size: int | None = None,
        retrieval_hint: Callable[[bytes], bytes] | None = None,
    ) -> str:
        """Broadcast ``content`` reliably; return its message id (specs/sds.md, "Send Message").

        The message is queued in :meth:`datagrams_to_send`, entered in the local
        log and kept in the outgoing buffer until acknowledged. Raises
        :class:`MessageTooLarge` (nothing is sent, logged or buffered, and the
        Lamport clock stays) when the encoded message is over
        ``limits.max_message_size`` or ``max_size`` (the transport's limit).
        ``retrieval_hint``, given the encoded message, returns how the
        transport will name it (e.g. the hash of topic and bytes): the message
        is logged with that hint, as :meth:`set_retrieval_hint` right after
        would, without a second change to the log and the journal.
        """
        if not content:
            raise LocalProtocolError("content must be non-empty (empty content is a sync message)")
        clock_before = self.clock.value
        lamport = self.clock.tick(now)
        history, history_ids, encoded_history = self.log.causal_history_encoded(
            self.config.causal_history_size, self._rng
        )
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
            self._repair_requests(now),
            encoded_history,
        )
        limit = self._size_limit(max_size)
        if len(data) > limit:
            self.clock.value = clock_before
            raise MessageTooLarge(len(data), limit)
        hint = retrieval_hint(data) if retrieval_hint is not None else None
        self.log.add(message_id, lamport, self.participant_id, hint)
        # The history came from the log: every id in it is logged.
        self.log.mark_referenced(history_ids, all_logged=True)
        self._last_content_at = now  # the channel is not quiet (_reask_pause)
        if self.repair:
            self.repair.cache(message_id, self.participant_id, data, now)
        # Hashed once: the recent-own record below needs it anyway, and a filter
        # review of the outgoing entry would otherwise hash it again.
        positions = self.config.bloom.positions(message_id)
        entry = OutgoingEntry(
            message_id, data, positions, next_resend_at=self._first_resend_at(now)
        )
        self.outgoing.add(entry)
        if self._journal is not None:
            self._journal += (
                Logged(
                    message_id,
                    lamport,
                    self.participant_id,
                    hint,
                    data,
                    tuple(history_ids),
                    True,
                    now,
                ),
                OutgoingSaved.of(entry),
            )
        self._broadcast(data, message_id, MessageKind.CONTENT, now)
        self.answers.on_sent(message_id, data, positions, now)
        self._events.append(MessageSent(self.channel_id, message_id, 0))
        self.stats["sent"] += 1
        return message_id

    def send_ephemeral(self, content: bytes, now: int, *, max_size: int | None = None) -> str:
        """Broadcast ``content`` once, without ordering or acknowledgement (specs/sds.md,
        "Ephemeral Messages"); return its message id. Raises :class:`MessageTooLarge`
        as :meth:`send` does."""
        if not content:
            raise LocalProtocolError("ephemeral content must be non-empty")
        message_id = compute_ephemeral_id(
            self.channel_id, self.participant_id, (now << 16) + self._ephemeral_nonce + 1, content
        )
        data = encode_message(
            Message(self.participant_id, message_id, self.channel_id, content=content)
        )
        limit = self._size_limit(max_size)
        if len(data) > limit:
            raise MessageTooLarge(len(data), limit)
        self._ephemeral_nonce += 1
        self._outbox.append(Datagram(self.channel_id, data, message_id, MessageKind.EPHEMERAL))
        self.stats["ephemeral_sent"] += 1
        return message_id

    def _size_limit(self, max_size: int | None) -> int:
        limit = self.config.limits.max_message_size
        return limit if max_size is None else min(limit, max_size)

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
        self._now = now
        if now >= self._next_sweep_at:
            self._sweep(now)
            # Stay on the sweep grid whenever we are called, so deadlines that
            # fall on it are met exactly.
            interval = self.config.sweep_interval_ms
            self._next_sweep_at += ((now - self._next_sweep_at) // interval + 1) * interval
        sync_at = self._next_sync_at()
        if (sync_at is not None and now >= sync_at) or (
            self._ack_due is not None and now >= self._ack_due
        ):
            self.send_sync(now)

    def announce(self, now: int, *, away_since: int | None = None) -> str | None:
        """Tell the channel this participant is (back): call after a restart or reconnect.

        Sends a sync message now, unless one went out within the last sweep
        interval: its filter acknowledges what we hold, its causal history
        lets peers find what they lack, and pending SDS-R requests ride on it.
        With ``away_since`` (when we stopped hearing the channel) it also
        emits a :class:`RetrieveRange` for that window. Returns the sync
        message's id, or ``None`` when none was sent.
        """
        if away_since is not None:
            self._request_range(away_since, now, at_once=True, whole=True)
        last = self._last_sync_at
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
            self.channel_id, self.participant_id, lamport, b"", list(map(_ENTRY_ID, history))
        )
        message = Message(
            sender_id=self.participant_id,
            message_id=message_id,
            channel_id=self.channel_id,
            lamport_timestamp=lamport,
            causal_history=history,
            bloom_filter=self.bloom.to_bytes(),
            repair_request=self._repair_requests(now, sync=True),
        )
        # Not buffered, not logged, not in filters or histories: sync messages only
        # carry state.
        self._broadcast(encode_message(message), message_id, MessageKind.SYNC, now)
        self._last_sync_at = now
        if self._missing:
            self._gap_syncs += 1
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
        self._now = now
        if message.channel_id != self.channel_id:
            self.stats["foreign_channel"] += 1
            self._reject(
                self.channel_id,
                RejectReason.FOREIGN_CHANNEL,
                f"channel_id {message.channel_id[:64]!r} is not this channel",
                message.sender_id,
            )
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
        if lamport >= _MAX_LAMPORT:
            # Beyond any clock: ticking past it would overflow the wire's uint64.
            self._reject(
                self.channel_id,
                RejectReason.LAMPORT_DRIFT,
                f"lamport_timestamp {lamport} is at or beyond 2**63",
                message.sender_id,
            )
            return
        if lamport > now + self.config.max_lamport_drift_ms:
            # Accepted, but our clock does not follow it (see _deliver_one):
            # rejecting would cut us off from every peer that adopted it, as
            # @waku/sds does (message_channel.js, line 527), and partition a
            # mixed channel for good (docs/interop.md).
            self.stats["lamport_ahead"] += 1
        message_id = message.message_id
        is_content = kind is MessageKind.CONTENT
        replaced = False
        history_ids = list(map(_ENTRY_ID, message.causal_history))
        # Built once per message: the unmet check, the acknowledgement review and
        # delivery all look ids up in it (200 of them with a long history).
        history_set = set(history_ids)
        if is_content:
            unmet = self._unmet(history_set)
            if self.log.has(message_id, lamport) or (message_id in self.incoming and unmet):
                self.stats["duplicates"] += 1
                positions = self.config.bloom.positions(message_id)  # hashed once here
                if not self.bloom.has_positions(positions):
                    # A resend: the sender still lacks our acknowledgement, and the
                    # id may have rolled out of our filter since we first got it.
                    self.bloom.insert(message_id, positions)
                    if self._journal is not None:
                        self._journal.append(FilterInserted(message_id))
                if self.repair:
                    self.repair.on_message_seen(message_id)
                    if message_id in self.log:
                        self.answers.note_answered(message_id, now)
                if self._active_peers <= self._ack_needed:
                    # Every peer's filter is needed: our acknowledgement of
                    # it may have been lost (see _first_resend_at).
                    self._schedule_acknowledgement(message.sender_id, now, message_id, positions)
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
                # It leaves the buffer when this copy is delivered (_move_dependency).
                self.incoming.discard(message_id)
                replaced = True
                self.stats["buffered_replaced"] += 1
            elif unmet and (full := self._incoming_full(message.sender_id, len(data))):
                self._reject(
                    self.channel_id, RejectReason.INCOMING_BUFFER_FULL, full, message.sender_id
                )
                return
        else:
            unmet = self._unmet(history_set)

        self._last_activity = now
        heard_before = self._last_heard
        self._last_heard = now
        sender = message.sender_id
        if sender not in self._peers:
            self._active_peers += 1
        self._peers[sender] = now
        bloom_filter = message.bloom_filter
        if bloom_filter is not None:
            if len(bloom_filter) != self.config.bloom.size_bytes:
                self._profile_mismatch(sender, len(bloom_filter))
            elif self.repair:
                self.repair.on_peer_filter(sender, bloom_filter, now)
        self._review_acks(message, history_ids, history_set)
        if self._ack_due is not None and message.bloom_filter is not None:
            self._note_peer_acknowledgement(sender, message.bloom_filter)
        if self.repair:
            self.repair.on_message_seen(message_id)
            chains: list[tuple[HistoryEntry, int]] | None = None
            for entry in message.repair_request:
                self.repair.on_repair_request(entry, now)
                if entry.retrieval_hint is not None and (since := chain_since(entry)) is not None:
                    if chains is None:
                        chains = []
                    chains.append((entry, since))
            if chains is not None:
                self.answers.answer_chains(sender, chains, message.bloom_filter, now)
        if unmet:
            revealed = False
            had_gap = bool(self._missing)
            for entry in message.causal_history:
                if entry.message_id in unmet:
                    revealed |= self._report_missing(entry, now)
            if revealed:
                if not had_gap or self._gap_syncs:
                    self._gap_since = now  # not again before that sync goes out
                    quiet = self.config.ack_sync_delay_ms or self.config.sweep_interval_ms
                    self._gap_prompt = now - self._last_content_at >= quiet
                self._gap_syncs = 0
                self._request_range(heard_before, now)
                # Our filter shows the senders what we lack (sdk/sds/answering.py).
                self._schedule_acknowledgement(None, now, None)
        if not is_content:
            self.stats["sync_received"] += 1
            if message.bloom_filter is not None:
                self.answers.on_sync(sender, message.bloom_filter, lamport, now)
            return
        if lamport >= now - (self.config.ack_sync_delay_ms or self.config.sweep_interval_ms):
            # Fresh content: the channel is not quiet (_next_sync_at). A resend,
            # rebroadcast or repair of an older message does not count.
            self._last_content_at = now
        positions = self.config.bloom.positions(message_id)  # hashed once for both uses
        self.bloom.insert(message_id, positions)
        if self._journal is not None:
            self._journal.append(FilterInserted(message_id))
        self._schedule_acknowledgement(sender, now, message_id, positions)
        if unmet:
            self.incoming.add(PendingMessage(message, data, retrieval_hint, now, set(unmet)))
            self._move_dependency(message_id, DependencyState.HELD, now)
            self.stats["buffered"] += 1
        else:
            # Nothing unmet and nothing lost: every referenced id is in the log.
            references = (history_ids, history_set, not self._lost)
            self._deliver(message, data, retrieval_hint, held=replaced, references=references)

    # -- internals ---------------------------------------------------------------------
    def _unmet(self, history_ids: set[str]) -> set[str]:
        if not history_ids:
            return set()
        # Ids known missing or lost are not in the log: only the rest may need the
        # archive's answer (a database read once the window has evicted anything).
        missing, lost = self._missing, self._lost
        if not (missing or lost):
            return self.log.not_logged(history_ids)
        log = self.log
        absent = {mid for mid in history_ids if mid in missing and mid not in log}
        rest = {mid for mid in history_ids if mid not in missing and mid not in lost}
        return self.log.not_logged(rest) | absent if rest else absent

    def _review_acks(self, message: Message, history_ids: list[str], history_set: set[str]) -> None:
        # specs/sds.md, "Review ACK Status".
        outgoing = self.outgoing
        if not len(outgoing):
            return
        channel = self.channel_id
        events = self._events
        journal = self._journal
        for mid in outgoing.acknowledge_history(history_ids, history_set):
            self._note_ack_delay(mid)
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
        acked, possibly = outgoing.review_filter(
            bloom_filter, message.sender_id, self._active_peers
        )
        for mid in acked:
            self._note_ack_delay(mid)
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
                journal.append(OutgoingSaved.of(possibly_entry))

    def _note_ack_delay(self, message_id: str) -> None:
        sent_at = self.answers.sent_at(message_id)
        if sent_at is not None:
            self._ack_delays.append(self._now - sent_at)

    def _first_resend_at(self, now: int) -> int:
        """When a message sent now is first resent if still unacknowledged.

        In a group small enough that every peer's filter is needed (a 2- or
        3-person channel), nobody else names a lost last message as a head:
        it waited for ``resend_interval_ms`` (30 s). Peers running Chorus
        acknowledge within ``2 * ack_sync_delay_ms`` (an acknowledgement sync),
        so while our last ``_ACK_DELAYS`` messages were all acknowledged that
        fast, the first resend comes as soon as that acknowledgement is
        overdue. ``@waku/sds`` peers send no acknowledgement sync (their next
        sync comes 0-15 s after a message: js-waku
        ``packages/sdk/src/reliable_channel/reliable_channel.ts``,
        ``restartSync(0.5)``), so their slow acknowledgements keep the 30 s
        resend and they are not sent every message twice.
        """
        cfg = self.config
        delay = cfg.ack_sync_delay_ms
        overdue = 2 * delay + 2 * cfg.in_flight_ms
        if (
            delay
            and cfg.sync_interval_ms
            and 0 < self._active_peers <= self._ack_needed
            and len(self._ack_delays) == _ACK_DELAYS
            and max(self._ack_delays) <= overdue
            and overdue < cfg.resend_interval_ms
        ):
            return now + overdue
        return now + cfg.resend_interval_ms

    def _profile_mismatch(self, sender_id: str, size: int) -> None:
        self.stats["filter_size_mismatch"] += 1
        if sender_id not in self._mismatched_peers and len(self._mismatched_peers) < 1_024:
            self._mismatched_peers.add(sender_id)
            expected = self.config.bloom.size_bytes
            self._events.append(BloomProfileMismatch(self.channel_id, sender_id, size, expected))

    def _report_missing(self, entry: HistoryEntry, now: int) -> bool:
        return self._move_dependency(entry.message_id, DependencyState.MISSING, now, entry)

    def _incoming_full(self, sender: str, size: int) -> str:
        """Why holding ``size`` more bytes from ``sender`` would break a bound, or ``""``."""
        cfg, incoming = self.config, self.incoming
        if len(incoming) >= cfg.max_incoming_buffer:
            return f"{len(incoming)} messages already wait for dependencies"
        if incoming.bytes_held + size > cfg.max_incoming_bytes:
            return f"{incoming.bytes_held} bytes already wait for dependencies"
        held = incoming.bytes_from(sender)
        if held + size > cfg.max_incoming_bytes_per_sender:
            return f"{held} bytes from this sender already wait for dependencies"
        return ""

    def _request_range(
        self, since: int | None, now: int, *, at_once: bool = False, whole: bool = False
    ) -> None:
        """Ask for the channel's messages from a margin before ``since`` to now.

        A window found from a gap reaches back at most ``lost_timeout_ms``;
        ``whole`` (the caller's own window away, :meth:`announce`) is not cut:
        the caller bounds it (the runtime by ``catch_up_max_window``).
        Deduplicated: what an earlier window within ``retrieval_interval_ms``
        covered is not asked for again. At most one window per sweep interval
        goes out at once; later ones merge and go out at the next sweep.
        """
        cfg = self.config
        if not cfg.range_margin_ms:
            return
        start = (now if since is None else since) - cfg.range_margin_ms
        if cfg.lost_timeout_ms and not whole:
            start = max(start, now - cfg.lost_timeout_ms)
        asked_at = self._range_asked_at
        if asked_at is not None and now - asked_at < cfg.retrieval_interval_ms:
            start = max(start, self._range_asked_to)
        if start > now:
            return
        if not at_once and asked_at is not None and now - asked_at < cfg.sweep_interval_ms:
            wanted = self._range_wanted_from
            self._range_wanted_from = start if wanted is None else min(wanted, start)
            return
        self._range_wanted_from = None
        self._range_asked_to = now + 1
        self._range_asked_at = now
        self.stats["range_requests"] += 1
        self._events.append(RetrieveRange(self.channel_id, start, now + 1))

    def _repair_requests(self, now: int, *, sync: bool = False) -> tuple[HistoryEntry, ...]:
        """The ``repair_request`` entries of a message we send now: a sync sent with
        dependencies missing leads with chain requests (:meth:`_chain_requests`), then
        the SDS-R requests that are due, ``max_requests_per_message`` in all."""
        repair = self.repair
        if repair is None:
            return ()
        if not (sync and self._missing and self.config.chain_requests_per_sync):
            return repair.take_requests(now)
        limit = repair.config.max_requests_per_message
        chain = self._chain_requests(now, limit)
        asked = {entry.message_id for entry in chain}
        plain = repair.take_requests(now, limit - len(chain))
        return (*chain, *(entry for entry in plain if entry.message_id not in asked))

    def _chain_requests(self, now: int, limit: int) -> list[HistoryEntry]:
        """Chain requests for up to ``chain_requests_per_sync`` missing ids, one per
        sender (the one tried rotates from sync to sync, so an id nobody holds does
        not shadow the others), each asking its holder for everything logged after
        the sender's newest message we have, up to the id itself (docs/sds.md,
        "Chain repair"). A gap left by a partition is then filled in one answer,
        not one causal-history level per round: the missing id names only the
        newest messages of the chain, and each one repaired would name the next.
        Without the sender (SDS-R off, or a peer that omits it) there is nobody
        to rank the answers by, so none is asked for."""
        count = min(self.config.chain_requests_per_sync, limit)
        if count <= 0:
            return []
        missing = list(self._missing.values())
        start = self._gap_syncs % len(missing)
        picked: dict[str, HistoryEntry] = {}
        for m in missing[start:] + missing[:start]:
            sender = m.entry.sender_id
            if sender is None or sender in picked or sender == self.participant_id:
                continue
            picked[sender] = m.entry
            if len(picked) >= count:
                break
        out = []
        floor = now - self.config.lost_timeout_ms if self.config.lost_timeout_ms else 0
        for sender, entry in picked.items():
            # The newest message of that sender's we logged before the messages that
            # wait for the id: its later ones that arrived after the gap are no sign
            # that we have the chain.
            before = self.incoming.earliest_waiting(entry.message_id)
            newest, scanned_to = self.log.newest_from(sender, before, _CHAIN_SCAN)
            if newest is not None:
                since = newest
            elif scanned_to is not None:
                since = scanned_to - 1  # as far back as we looked
            else:
                since = floor  # nothing of that sender's: as far back as a gap reaches
            out.append(chain_request(entry, max(since, floor)))
        self.stats["chain_requests"] += len(out)
        return out

    def _schedule_acknowledgement(
        self,
        sender: str | None,
        now: int,
        message_id: str | None,
        positions: Positions | None = None,
    ) -> None:
        delay = self.config.ack_sync_delay_ms
        if not delay or not self.config.sync_interval_ms:
            return
        if sender is not None and message_id is not None:
            if positions is None:
                positions = self.config.bloom.positions(message_id)
            self._ack_ids.append((sender, positions))
        if self._ack_due is None:
            # Drawn per occasion so that the peers who got the same message do
            # not all answer at once; at most one per ``delay`` after our last sync.
            due = now + delay + int(self._rng.random() * delay)
            if self._last_sync_at is not None:
                due = max(due, self._last_sync_at + delay)
            self._ack_due = due
            self._ack_seen_by.clear()

    def _note_peer_acknowledgement(self, peer: str, bloom_filter: bytes) -> None:
        # Enough other peers' filters already hold what we would acknowledge:
        # the senders have their evidence (sdk/sds/outgoing.py), ours is not needed.
        # One more than that evidence goes out: these syncs also name a burst's
        # last messages as heads, the only way a participant that lost one
        # learns of it once the channel is quiet (with two, both were lost 9 %
        # of the time at 30 % loss; issue 20, docs/sds.md). In a group no larger
        # than that, every peer's filter is needed. With a gap, ours is never
        # redundant: it shows senders what we lack.
        profile = self.config.bloom
        needed = self._ack_needed
        if self._missing or self._active_peers <= needed or len(bloom_filter) != profile.size_bytes:
            return
        # A peer's own messages are not in its filter: they prove nothing either way.
        relevant = [pos for sender, pos in self._ack_ids if sender != peer]
        if relevant and all(contains(bloom_filter, pos) for pos in relevant):
            self._ack_seen_by.add(peer)
            if len(self._ack_seen_by) > needed:
                self._ack_due = None
                self._ack_ids.clear()
                self.stats["ack_sync_suppressed"] += 1

    def _move_dependency(
        self,
        mid: str,
        to: DependencyState,
        now: int,
        entry: HistoryEntry | None = None,
        *,
        held: bool = False,
    ) -> bool:
        """The one place an id changes :class:`DependencyState`; returns whether it did.

        The caller has already updated the log or the incoming buffer for
        ``HELD`` and ``DELIVERED`` (``held``: the delivered message came out
        of the incoming buffer); this keeps the missing and lost indexes and
        the SDS-R requests in step with them, and records each durable change
        in the journal (missing, lost, incoming buffer). Safe to call for any
        id in any state: a change the rule forbids is refused, never raised.
        """
        missing = self._missing
        journal = self._journal
        if to is DependencyState.MISSING:
            assert entry is not None
            known = missing.get(mid)
            if known is not None:
                if entry.retrieval_hint is not None and known.entry.retrieval_hint is None:
                    known.entry = entry
                    if journal is not None:
                        journal.append(MissingSaved(entry, known.first_seen))
                return False
            if mid in self.log or mid in self.incoming or mid in self._lost:
                return False  # received (or given up on): never missing again
            if len(missing) >= self.config.max_missing:
                self.stats["missing_untracked"] += 1
                return False
            missing[mid] = _Missing(entry, now, now + self.config.retrieval_interval_ms)
            if journal is not None:
                journal.append(MissingSaved(entry, now))
            self.stats["missing"] += 1
            self._events.append(
                MessageMissing(self.channel_id, mid, entry.retrieval_hint, entry.sender_id)
            )
            if self.repair:
                self.repair.on_missing(entry, now)
            return True
        if to is DependencyState.LOST:
            if missing.pop(mid, None) is None:
                return False  # received meanwhile: held or delivered ids are never lost
            self._lost[mid] = None
            if journal is not None:
                journal += (MissingRemoved(mid), LostAdded(mid))
            self._forget_lost()
            if self.repair:
                # Peers are still asked (SDS-R) for another lost_timeout_ms: a late
                # copy is still delivered, and some peers answer only when asked.
                self._still_asking.append((now, mid))
            self.stats["lost"] += 1
            self._events.append(MessageLost(self.channel_id, mid))
            return True
        # HELD or DELIVERED: it has arrived.
        if journal is not None:
            if to is DependencyState.HELD:
                pending = self.incoming.get(mid)
                assert pending is not None
                journal.append(
                    IncomingAdded(mid, pending.data, pending.retrieval_hint, pending.received_at)
                )
            elif held:
                journal.append(IncomingRemoved(mid))
        if missing.pop(mid, None) is not None:
            self.stats["retrieved"] += 1
            if journal is not None:
                journal.append(MissingRemoved(mid))
        if mid in self._lost:
            del self._lost[mid]
            if journal is not None:
                journal.append(LostRemoved(mid))
        if self.repair:
            self.repair.on_message_seen(mid)
        return True

    def _deliver(
        self,
        message: Message,
        data: bytes,
        retrieval_hint: bytes | None,
        *,
        held: bool = False,
        references: _References | None = None,
    ) -> None:
        # specs/sds.md, "Deliver Message"; then everything this unblocks, in
        # (lamport, id) order so delivery order is deterministic. ``held``: an
        # earlier copy waited in the incoming buffer (replaced by this one).
        ready: list[tuple[int, str, PendingMessage | None]] = []
        self._deliver_one(message, data, retrieval_hint, 0, ready, held=held, references=references)
        while ready:
            _, _, pending = heapq.heappop(ready)
            assert pending is not None
            self._deliver_one(*_held_fields(pending), ready, held=True)

    def _deliver_one(
        self,
        message: Message,
        data: bytes,
        retrieval_hint: bytes | None,
        received_at: int,
        ready: list[tuple[int, str, PendingMessage | None]],
        *,
        held: bool,
        references: _References | None = None,
    ) -> None:
        # One message (its fields, not a PendingMessage: most are delivered at once).
        mid = message.message_id
        lamport = message.lamport_timestamp
        assert lamport is not None
        # A peer's clock far ahead moves ours only up to the drift bound.
        self.clock.observe(min(lamport, self._now + self.config.max_lamport_drift_ms))
        self.log.add(mid, lamport, message.sender_id, retrieval_hint)
        if references is None:
            ids = list(map(_ENTRY_ID, message.causal_history))
            if ids:
                self.log.mark_referenced(ids)
        else:
            ids, id_set, all_logged = references
            if ids:
                self.log.mark_referenced(id_set, all_logged=all_logged)
        if self._journal is not None:
            self._journal.append(
                Logged(
                    mid,
                    lamport,
                    message.sender_id,
                    retrieval_hint,
                    data,
                    tuple(ids),
                    False,
                    self._now,
                )
            )
        if held or self._missing or self._lost:
            self._move_dependency(mid, DependencyState.DELIVERED, received_at, held=held)
        if self.repair:
            self.repair.cache(mid, message.sender_id, data, self._now)
        self.stats["delivered"] += 1
        self._events.append(
            MessageDelivered(
                self.channel_id,
                mid,
                message.sender_id,
                lamport,
                message.content or b"",
                retrieval_hint,
            )
        )
        for unblocked in self.incoming.resolve(mid):
            m = unblocked.message
            heapq.heappush(ready, (m.lamport_timestamp or 0, m.message_id, unblocked))

    def _sweep(self, now: int) -> None:
        cfg = self.config
        if self._peers:
            horizon = now - cfg.peer_window_ms
            # Pruned in place: the gap answers read the same map.
            peers = self._peers
            for p in [p for p, t in peers.items() if t < horizon]:
                del peers[p]
            self._active_peers = len(peers)
        self.answers.sweep(now)
        # Outgoing buffer sweep (specs/sds.md, "Periodic Outgoing Buffer Sweep").
        for entry in self.outgoing.due(now):
            if cfg.max_resends is not None and entry.attempts >= cfg.max_resends:
                self.outgoing.remove(entry.message_id)
                if entry.filter_hits:
                    # Some peer has it and references it as a head, so the others
                    # find and fetch it: never report it as failed.
                    if self._journal is not None:
                        self._journal.append(OutgoingRemoved(entry.message_id, "acknowledged"))
                    self.stats["acknowledged"] += 1
                    self._events.append(MessageAcknowledged(self.channel_id, entry.message_id))
                    continue
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
                self._journal.append(OutgoingSaved.of(entry))
            # A resend carries no new state (nor our repair requests): it must not
            # hold back the sync message, or participants that all resend to
            # each other never send the requests that would unblock them.
            self._outbox.append(
                Datagram(self.channel_id, entry.data, entry.message_id, MessageKind.CONTENT)
            )
            self.stats["resent"] += 1
            self._events.append(MessageSent(self.channel_id, entry.message_id, entry.attempts))
        # Incoming buffer sweep (specs/sds.md, "Periodic Incoming Buffer Sweep"):
        # report what is still missing for retrieval; give up after the timeout.
        if self._missing:
            lost_after = cfg.lost_timeout_ms
            # A snapshot: declaring one id lost can deliver others that were missing.
            for mid, missing in list(self._missing.items()):
                if self._missing.get(mid) is not missing:
                    continue  # arrived earlier in this sweep
                if lost_after and now - missing.first_seen >= lost_after:
                    self._declare_lost(mid, now)
                elif now >= missing.next_report_at:
                    # Backoff: one retrieval per id in flight, each wait twice the last.
                    wait = cfg.retrieval_interval_ms << min(missing.reports, 16)
                    cap = max(cfg.retrieval_interval_ms, cfg.lost_timeout_ms // 4)
                    missing.reports += 1
                    missing.next_report_at = now + min(wait, cap)
                    ref = missing.entry
                    self._events.append(
                        MessageMissing(self.channel_id, mid, ref.retrieval_hint, ref.sender_id)
                    )
                    if self.repair:
                        # Another participant's request for it removed ours (SDS-R
                        # receive rules); if the repair never reached us, the
                        # dependency is still unmet, so it goes back in the buffer.
                        self.repair.on_missing(ref, now)
        if self._range_wanted_from is not None:
            self._request_range(self._range_wanted_from + cfg.range_margin_ms, now, at_once=True)
        # SDS-R incoming repair request buffer sweep.
        if self.repair:
            self.repair.sweep(now)
            asking = self._still_asking
            while asking and now - asking[0][0] >= cfg.lost_timeout_ms:
                self.repair.forget(asking.popleft()[1])
            for data in self.repair.due_responses(now):
                self._outbox.append(Datagram(self.channel_id, data, "", MessageKind.CONTENT))
                self.stats["repairs_sent"] += 1

    def _declare_lost(self, message_id: str, now: int) -> None:
        if not self._move_dependency(message_id, DependencyState.LOST, now):
            return
        ready: list[tuple[int, str, PendingMessage | None]] = []
        for unblocked in self.incoming.resolve(message_id):
            m = unblocked.message
            heapq.heappush(ready, (m.lamport_timestamp or 0, m.message_id, unblocked))
        while ready:
            _, _, pending = heapq.heappop(ready)
            assert pending is not None
            self._deliver_one(*_held_fields(pending), ready, held=True)

    def _broadcast(self, data: bytes, message_id: str, kind: MessageKind, now: int) -> None:
        self._outbox.append(Datagram(self.channel_id, data, message_id, kind))
        self._ack_due = None  # our filter goes out with this message
        self._ack_ids.clear()
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
        # were active ("SDS-R Periodic Sync Message"). So with a gap: our filter
        # shows the senders what we lack (sdk/sds/answering.py).
        if self._missing or (
            self.repair
            and self.repair.has_eligible_requests(self._last_own_broadcast + self._sync_backoff)
        ):
            due = min(due, self._last_own_broadcast + self._sync_backoff)
        if self._missing:
            # With a gap, our filter is the request: each sync shows the senders
            # what we lack and they rebroadcast it at once (sdk/sds/answering.py). Under
            # loss the sync or the answer is lost (each with the loss rate), so
            # we ask again a short pause later instead of after a sync period or
            # an SDS-R round (30-120 s): d apart for the first ``gap_syncs_per_step``
            # syncs, then twice as long every ``gap_syncs_per_step`` more, up to the
            # sync interval. The schedule starts over when a new id goes missing.
            # A gap found in a quiet channel (no content for d: a burst's lost
            # last message, named by the syncs after it) is asked for
            # ``in_flight_ms`` later (a reordered copy may still arrive; senders
            # ignore younger gaps anyway), not d. Not while content flows: in a
            # large lossy group ids go missing all the time, and a prompt sync
            # per discovery made 14.0 syncs per message at 200 participants,
            # 20 % loss (9.6 before; docs/sds.md). Still at most one sync per d
            # while content flows; once the channel is quiet, one per
            # ``reask_quiet_ms`` (_reask_pause).
            first = self.config.ack_sync_delay_ms or self.config.sweep_interval_ms
            last = self._last_sync_at
            if self._gap_syncs == 0 and self._gap_prompt:
                prompt = self._gap_since + self.config.in_flight_ms
                if last is not None:
                    prompt = max(prompt, last + self._reask_pause(last, first))
                return min(due, prompt)
            since = self._gap_since if last is None else max(last, self._gap_since)
            # The pause doubles every ``gap_syncs_per_step`` * d of asking (8 syncs
            # at d), however short the pauses in a quiet channel were.
            asked = (since - self._gap_since) // (self.config.gap_syncs_per_step * first)
            step = min((asked + 1).bit_length() - 1, 16)
            pause = min(first << step, self.config.sync_interval_ms)
            if step == 0:
                pause = min(pause, self._reask_pause(since, first))
            due = min(due, since + pause)
        return due

    def _reask_pause(self, since: int, first: int) -> int:
        """The pause after ``since`` before a gap is asked for again: d while
        content flows, ``reask_quiet_ms`` once the channel has been quiet for d
        (no fresh content, ours or a peer's). Each round closes a gap with
        ``(1 - loss)^2``; after the traffic stops nothing else is in flight,
        so asking every round trip, not every second, closes the last gaps
        3 times as fast, and the rounds needed (about ``1 / (1 - loss)^2``)
        are the same. Not while content flows: in a large lossy group ids go
        missing all the time and every participant would sync 3 times as often."""
        return min(first, max(self.config.reask_quiet_ms, self._last_content_at + first - since))

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
        self._lost.update(dict.fromkeys(lost))
        self._forget_lost()
        for entry, first_seen in missing:
            self._missing[entry.message_id] = _Missing(entry, first_seen, now)
            if self.repair:
                self.repair.on_missing(entry, now)
        self._next_sweep_at = min(self._next_sweep_at, now)

    def _forget_lost(self) -> None:
        """Keep the newest ``max_lost`` lost ids; the journal forgets the rest too."""
        lost = self._lost
        journal = self._journal
        while len(lost) > self.config.max_lost:
            mid = next(iter(lost))
            del lost[mid]
            self.log.forget_references((mid,))
            if journal is not None:
                journal.append(LostRemoved(mid))
            self.stats["lost_forgotten"] += 1

    def lost(self) -> set[str]:
        """Ids declared irretrievably lost."""
        return set(self._lost)

    def outgoing_state(self, message_id: str) -> OutgoingState | None:
        """State of one of our messages; ``None`` once acknowledged (or unknown)."""
        entry = self.outgoing.get(message_id)
        return entry.state if entry else None
