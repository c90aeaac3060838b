"""Export and restore the durable state of a :class:`~sdk.sds.MessageChannel`.

A snapshot is what a participant must keep across a restart to lose nothing it
sent or delivered and deliver nothing twice (specs/sds.md, "Participant state"):

* the Lamport clock;
* the local log (ids, Lamport times, senders, retrieval hints) with its heads,
  so causal histories after a restart still reference unreferenced messages: the
  entries in memory (``ChannelConfig.log_window`` and the older heads) and the
  floor below which the channel's archive has the rest (``log_floor``);
* the outgoing buffer (encoded messages, resend schedule, acknowledgement state);
* the incoming buffer (encoded messages waiting for dependencies);
* missing dependencies (with when they went missing, so the loss timeout is
  not reset) and those declared lost;
* the ids the bloom filter carries over a rollover;
* the SDS-R cache of messages we may be asked to rebroadcast.

Transient state is not kept: SDS-R request/response timers (re-derived for
the restored missing entries; pending responses are someone else's job after
a restart), the sync backoff and statistics.

Pure: no I/O, no clock. :mod:`sdk.runtime.persistence` writes the same records to
SQLite incrementally; this module turns them back into a channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdk.sds.bloom import RollingBloomFilter
from sdk.sds.channel import MessageChannel
from sdk.sds.errors import LocalProtocolError, RemoteProtocolError
from sdk.sds.message import HistoryEntry, decode_message
from sdk.sds.outgoing import OutgoingEntry
from sdk.sds.outgoing import OutgoingRecord as OutgoingRecord  # its home; re-exported


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One local-log entry."""

    message_id: str
    lamport_timestamp: int
    sender_id: str
    retrieval_hint: bytes | None = None


@dataclass(frozen=True, slots=True)
class IncomingRecord:
    """One incoming-buffer entry: a received message waiting for dependencies."""

    message_id: str
    data: bytes
    retrieval_hint: bytes | None
    received_at: int


@dataclass(frozen=True, slots=True)
class MissingRecord:
    """A dependency known to be missing since ``first_seen``."""

    entry: HistoryEntry
    first_seen: int


@dataclass(frozen=True, slots=True)
class CacheRecord:
    """A message held in the SDS-R cache."""

    message_id: str
    sender_id: str
    data: bytes


@dataclass(slots=True)
class ChannelSnapshot:
    """Everything durable about one participant's view of one channel."""

    channel_id: str
    participant_id: str
    lamport_timestamp: int
    log: list[LogRecord] = field(default_factory=list)
    #: The greatest key ``(lamport_timestamp, message_id)`` of the log not in ``log``
    #: (older entries are the channel's archive's); ``None``: ``log`` is the whole log.
    log_floor: tuple[int, str] | None = None
    heads: list[str] = field(default_factory=list)
    referenced: list[str] = field(default_factory=list)
    outgoing: list[OutgoingRecord] = field(default_factory=list)
    incoming: list[IncomingRecord] = field(default_factory=list)
    missing: list[MissingRecord] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    bloom_recent: list[str] = field(default_factory=list)
    repair_cache: list[CacheRecord] = field(default_factory=list)


def export_snapshot(channel: MessageChannel) -> ChannelSnapshot:
    """The durable state of ``channel`` (a copy; the channel is not changed)."""
    log = channel.log
    records = []
    for _, mid in log:
        entry = log.get(mid)
        assert entry is not None
        records.append(
            LogRecord(
                mid, entry.lamport_timestamp, entry.sender_id, entry.history_entry.retrieval_hint
            )
        )
    return ChannelSnapshot(
        channel_id=channel.channel_id,
        participant_id=channel.participant_id,
        lamport_timestamp=channel.lamport_timestamp,
        log=records,
        log_floor=log.floor,
        heads=log.heads(),
        referenced=log.referenced_unlogged(),
        outgoing=[OutgoingRecord.of(e) for e in channel.outgoing],
        incoming=[
            IncomingRecord(p.message.message_id, p.data, p.retrieval_hint, p.received_at)
            for p in channel.incoming.pending()
        ],
        missing=[MissingRecord(e, t) for e, t in channel.missing_entries()],
        lost=sorted(channel.lost()),
        bloom_recent=list(channel.bloom.recent()),
        repair_cache=[CacheRecord(*item) for item in channel.repair.cached_items()]
        if channel.repair
        else [],
    )


def restore_snapshot(
    channel: MessageChannel, snapshot: ChannelSnapshot, now: int, *, resend_now: bool = True
) -> None:
    """Load ``snapshot`` into ``channel``, a fresh channel of the same id and participant.

    With ``resend_now`` every restored outgoing message is due at the next
    sweep: it may have been persisted but never published before the restart.
    Buffered incoming messages are received again, so any that became
    deliverable are delivered now (their :class:`~sdk.sds.MessageDelivered`
    events are queued like any other); peers' bad bytes in a snapshot are
    dropped and counted. Raises :class:`LocalProtocolError` when the channel is
    not fresh or belongs to another channel or participant.
    """
    if channel.channel_id != snapshot.channel_id:
        raise LocalProtocolError(
            f"snapshot of channel {snapshot.channel_id!r} cannot restore {channel.channel_id!r}"
        )
    if channel.participant_id != snapshot.participant_id:
        raise LocalProtocolError(
            f"snapshot of participant {snapshot.participant_id!r} cannot restore "
            f"{channel.participant_id!r}; use the participant id the state was saved with"
        )
    if len(channel.log) or len(channel.outgoing) or len(channel.incoming):
        raise LocalProtocolError("restore_snapshot needs a fresh channel")
    cfg = channel.config
    channel.clock.observe(snapshot.lamport_timestamp)
    log = channel.log
    for rec in snapshot.log:
        log.add(rec.message_id, rec.lamport_timestamp, rec.sender_id, rec.retrieval_hint)
    log.restore_references(snapshot.heads, snapshot.referenced)
    if snapshot.log_floor is not None:
        log.restore_floor(snapshot.log_floor)
    if channel.repair:
        for item in snapshot.repair_cache:
            channel.repair.cache(item.message_id, item.sender_id, item.data)
    for out in snapshot.outgoing:
        channel.outgoing.add(
            OutgoingEntry(
                out.message_id,
                out.data,
                cfg.bloom.positions(out.message_id),
                next_resend_at=min(out.next_resend_at, now) if resend_now else out.next_resend_at,
                attempts=out.attempts,
                state=out.state,
                filter_hits=set(out.filter_hits),
                # The filters' fill is not kept: assume each hit came from a
                # filter at capacity, the least evidence it can have been.
                false_ack=cfg.bloom.error_rate ** len(out.filter_hits),
            )
        )
    channel.restore_dependency_state(
        ((m.entry, m.first_seen) for m in snapshot.missing), snapshot.lost, now
    )
    for inc in snapshot.incoming:
        try:
            message = decode_message(inc.data, cfg.limits)
        except RemoteProtocolError:
            channel.stats["restore_dropped"] += 1
            continue
        channel.receive_message(message, inc.data, now, inc.retrieval_hint)
    # Last: re-receiving the incoming buffer inserted those ids into the filter again.
    channel.bloom = RollingBloomFilter(cfg.bloom, snapshot.bloom_recent)
