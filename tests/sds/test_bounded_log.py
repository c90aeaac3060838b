"""A core that keeps only a window of its local log in memory behaves as one that keeps it all.

The bounded core (``ChannelConfig.log_window``) asks its archive about older ids;
here the archive is fed from the core's journal, as the runtime's database is.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Set

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.sds import (
    COMPACT,
    ChannelConfig,
    Message,
    MessageChannel,
    MessageDelivered,
    RepairConfig,
    decode_message,
    encode_message,
)
from sdk.sds.bloom import BloomFilter
from sdk.sds.journal import Logged, LostAdded, LostRemoved
from sdk.sds.message import HistoryEntry
from sdk.sds.repair import ARCHIVE_READS_PER_T_MIN, RepairState, in_response_group
from tests.sds.helpers import T0, drain, make

CFG = ChannelConfig(sync_interval_ms=0, bloom=COMPACT, lost_timeout_ms=0, ack_sync_delay_ms=0)
WINDOW = 2


class JournalArchive:
    """What the runtime's database would hold: every journaled ``Logged`` message."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, bytes]] = {}
        self.lookups = 0

    def feed(self, channel: MessageChannel) -> None:
        for change in channel.drain_changes():
            if isinstance(change, Logged):
                self.rows[change.message_id] = (change.sender_id, change.data)

    def delivered(self, message_ids: Set[str]) -> set[str]:
        self.lookups += 1
        return {m for m in message_ids if m in self.rows}

    def message(self, message_id: str) -> tuple[str, bytes] | None:
        self.lookups += 1
        return self.rows.get(message_id)

    def evicted(self, message_ids: Iterable[str]) -> None:
        pass


def _bounded(
    config: ChannelConfig, name: str = "observer"
) -> tuple[MessageChannel, JournalArchive]:
    archive = JournalArchive()
    channel = MessageChannel(
        "room", name, T0, config, rng=random.Random(0), journal=True, archive=archive
    )
    return channel, archive


def _unbounded(config: ChannelConfig, name: str = "observer") -> MessageChannel:
    return MessageChannel("room", name, T0, _with(config, None), rng=random.Random(0))


def _with(config: ChannelConfig, window: int | None) -> ChannelConfig:
    fields = {f: getattr(config, f) for f in config.__dataclass_fields__}
    fields["log_window"] = window
    return ChannelConfig(**fields)


def _conversation(senders: int, script: list[int], rng: random.Random) -> list[bytes]:
    """Each step one participant sends; each other hears it or not (so branches
    grow side by side, and a late message depends on ones long left the window)."""
    chans = [make(f"p{i}", CFG) for i in range(senders)]
    wire: list[bytes] = []
    now = T0
    for step, who in enumerate(script):
        now += 7
        sender = chans[who % senders]
        sender.send(f"step {step}".encode(), now)
        for dg in sender.datagrams_to_send():
            wire.append(dg.data)
            for other in chans:
                if other is not sender and rng.random() < 0.5:
                    other.receive(dg.data, now)
    return wire


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    senders=st.integers(min_value=1, max_value=4),
    script=st.lists(st.integers(min_value=0, max_value=3), min_size=4, max_size=40),
    order_seed=st.integers(),
    loss=st.floats(min_value=0.0, max_value=0.5),
    duplicates=st.integers(min_value=0, max_value=10),
)
def test_a_bounded_log_delivers_the_same_messages_in_the_same_order(
    senders: int, script: list[int], order_seed: int, loss: float, duplicates: int
) -> None:
    rng = random.Random(order_seed)
    wire = _conversation(senders, script, rng)
    first = wire[:]
    rng.shuffle(first)
    lost = [d for d in first if rng.random() < loss]
    # The lost ones come back late (a resend, a repair, the store), after the window
    # has moved past what they depend on; then old duplicates (a resend whose
    # acknowledgement was lost).
    arrivals = [d for d in first if d not in lost] + lost + rng.choices(wire, k=duplicates)
    bounded, archive = _bounded(_with(CFG, WINDOW))
    unbounded = _unbounded(CFG)
    for k, data in enumerate(arrivals):
        now = T0 + 10_000 + k
        bounded.receive(data, now)
        unbounded.receive(data, now)
        archive.feed(bounded)
        assert len(bounded.log) <= WINDOW + 1 + len(bounded.log.heads())
    got = [e.message_id for e in drain(bounded) if isinstance(e, MessageDelivered)]
    want = [e.message_id for e in drain(unbounded) if isinstance(e, MessageDelivered)]
    assert got == want
    assert len(set(got)) == len(wire)  # everything, once
    assert bounded.missing() == unbounded.missing() == []


REPAIR = _with(
    ChannelConfig(
        sync_interval_ms=0,
        bloom=COMPACT,
        lost_timeout_ms=0,
        ack_sync_delay_ms=0,
        repair=RepairConfig(t_min_ms=10, t_max_ms=20, cache_size=1, cache_retention_ms=1),
    ),
    WINDOW,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(min_value=6, max_value=30), pick=st.integers(min_value=0))
def test_a_repair_request_for_a_message_older_than_the_window_is_answered(
    count: int, pick: int
) -> None:
    """Beyond the window and the SDS-R cache, the bytes come from the archive."""
    peer = make("peer", CFG)
    answering, archive = _bounded(REPAIR, "answering")
    wire = []
    now = T0
    for k in range(count):
        now += 100
        peer.send(f"m{k}".encode(), now)
        for dg in peer.datagrams_to_send():
            wire.append(dg.data)
            answering.receive(dg.data, now)
            archive.feed(answering)
    original = wire[pick % (count - WINDOW - 2)]
    old = decode_message(original)
    assert old.message_id not in answering.log  # left the window
    assert answering.repair is not None and answering.repair.cached(old.message_id) is None
    ask = Message(
        "asker",
        "asker-sync",
        "room",
        lamport_timestamp=now + 1,
        bloom_filter=None,
        repair_request=(HistoryEntry(old.message_id, None, "peer"),),
    )
    now += 1
    answering.receive(encode_message(ask), now)
    answering.datagrams_to_send()
    sent: list[bytes] = []
    for _ in range(30):  # sweeps are 1 s apart
        now += 100
        answering.handle_timer(now)
        sent += [d.data for d in answering.datagrams_to_send()]
    assert original in sent  # rebroadcast as it was sent
    assert archive.lookups >= 1


def test_the_repair_cache_stays_bounded_when_more_arrives_between_sweeps_than_a_filter_holds() -> (
    None
):
    """``compact`` filters hold 128-256 ids: with 1,000 messages between two sweeps,
    peers' delivery marks must move as their filters arrive, or every message stays
    cached until ``cache_retention_ms`` (an hour) or ``cache_max_bytes``."""
    config = ChannelConfig(bloom=COMPACT, repair=RepairConfig(cache_size=500))
    a = MessageChannel("room", "a", T0, config, rng=random.Random(1))
    b = MessageChannel("room", "b", T0, config, rng=random.Random(2))
    now = T0
    for k in range(6_000):
        now += 1  # 1,000 messages a second; a sweep every 1,000 ms
        src, dst = (a, b) if k % 2 else (b, a)
        src.send(b"x" * 100, now)
        for d in src.datagrams_to_send():
            dst.receive(d.data, now)
        if k % 1_000 == 999:
            for ch in (a, b):
                ch.handle_timer(now)
            for d in a.datagrams_to_send():
                b.receive(d.data, now)
            for d in b.datagrams_to_send():
                a.receive(d.data, now)
    assert a.repair is not None and b.repair is not None
    # What is held back is what the peer's newest filter has not shown yet.
    assert len(a.repair.cached_items()) <= 500 + COMPACT.capacity
    assert len(b.repair.cached_items()) <= 500 + COMPACT.capacity


def test_own_messages_the_cache_dropped_are_offered_from_the_archive() -> None:
    """A peer's sync lacking our messages gets them again even when the SDS-R cache
    no longer holds them (its byte cap dropped them): the bytes come from the
    archive, at most ``offer_archive_reads`` lookups per sync."""
    cfg = ChannelConfig(
        bloom=COMPACT,
        sync_interval_ms=30_000,
        repair=RepairConfig(cache_max_bytes=1),
        offer_archive_reads=4,
    )
    alice, archive = _bounded(cfg, "alice")
    sent = [alice.send(f"m{i}".encode(), T0 + i) for i in range(10)]
    archive.feed(alice)
    alice.datagrams_to_send()
    assert alice.repair is not None and all(alice.repair.cached(m) is None for m in sent)

    def bob_sync(at: int, holds: list[str]) -> list[bytes]:
        bloom = BloomFilter(COMPACT)
        for mid in holds:
            bloom.insert(mid)
        sync = Message("bob", f"s{at}", "room", at, (), bloom.to_bytes())
        archive.lookups = 0
        alice.receive(encode_message(sync), at)
        return [d.data for d in alice.datagrams_to_send() if d.message_id in sent]

    first = bob_sync(T0 + 60_000, [])
    assert first == [archive.rows[m][1] for m in sent[:4]]
    assert archive.lookups == 4
    # Bob got those; his next sync shows it, and the next four go out.
    second = bob_sync(T0 + 61_000, sent[:4])
    assert second == [archive.rows[m][1] for m in sent[4:8]]
    assert alice.stats["offered_from_archive"] == 8


def test_a_backup_answer_comes_from_the_archive_when_the_cache_dropped_it() -> None:
    """Carol saw Alice's message answered (a duplicate arrived), yet Bob's sync
    still lacks it: Carol, first after the sender in response order, sends it
    again, from the archive since her cache's byte cap dropped it."""
    cfg = ChannelConfig(
        bloom=COMPACT, sync_interval_ms=30_000, repair=RepairConfig(cache_max_bytes=1)
    )
    alice = make("alice", cfg)
    carol, archive = _bounded(cfg, "carol")
    mid = alice.send(b"hello", T0)
    (data,) = [d.data for d in alice.datagrams_to_send()]
    carol.receive(data, T0 + 10)
    archive.feed(carol)
    carol.receive(data, T0 + 100)  # somebody answered a gap with it
    carol.datagrams_to_send()
    assert carol.repair is not None and carol.repair.cached(mid) is None
    sync = Message("bob", "s1", "room", T0 + 1_000, (), bytes(COMPACT.size_bytes))
    carol.receive(encode_message(sync), T0 + 1_000)
    assert data in [d.data for d in carol.datagrams_to_send()]
    assert carol.stats["rebroadcast_backup"] == 1


def test_peers_heard_once_are_not_remembered_for_good() -> None:
    """Each peer's sync is checked against our recent messages at most so often; when
    it was last checked is kept only while that matters, so a stream of peer ids
    (or a sender changing its id) does not grow the channel's memory."""
    cfg = ChannelConfig(bloom=COMPACT, sync_interval_ms=30_000, repair=RepairConfig())
    alice = make("alice", cfg)
    alice.send(b"hello", T0)
    alice.datagrams_to_send()
    now = T0 + 60_000
    for i in range(200):
        sync = Message(f"peer{i}", f"s{i}", "room", now, (), bytes(COMPACT.size_bytes))
        alice.receive(encode_message(sync), now)
    assert len(alice.answers._peer_checked) == 200 and len(alice.answers._peer_checked_log) == 200
    later = now + cfg.sync_interval_ms + cfg.sweep_interval_ms
    alice.handle_timer(later)
    assert alice.answers._peer_checked == {} and alice.answers._peer_checked_log == {}


def test_only_the_newest_max_lost_lost_ids_are_remembered() -> None:
    """Each message referencing ids nobody has adds lost ids once the loss timeout
    passes; the channel keeps the newest ``max_lost`` and journals the rest away."""
    cfg = ChannelConfig(
        bloom=COMPACT, sync_interval_ms=0, lost_timeout_ms=60_000, repair=None, max_lost=3
    )
    bob = MessageChannel("room", "bob", T0, cfg, rng=random.Random(0), journal=True)
    for i in range(5):
        ghost = HistoryEntry(f"{i:064x}")
        message = Message("mallory", f"{i + 100:064x}", "room", T0 + i, (ghost,), None, b"x")
        bob.receive(encode_message(message), T0 + i)
        bob.handle_timer(T0 + 1_000 * (i + 1) + cfg.lost_timeout_ms)
    assert bob.lost() == {f"{i:064x}" for i in (2, 3, 4)}
    changes = bob.drain_changes()
    added = [c.message_id for c in changes if isinstance(c, LostAdded)]
    removed = [c.message_id for c in changes if isinstance(c, LostRemoved)]
    assert added == [f"{i:064x}" for i in range(5)] and removed == added[:2]


def test_messages_nobody_references_keep_at_most_max_heads_in_memory() -> None:
    """Heads older than the window stay in memory until referenced; a peer sending
    messages nobody references gets at most ``max_heads`` of them kept."""
    cfg = _with(CFG, WINDOW)
    cfg = ChannelConfig(
        **{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "max_heads": 3}
    )
    bob, archive = _bounded(cfg, "bob")
    ids = [f"{i + 1:064x}" for i in range(8)]
    for i, mid in enumerate(ids):
        bob.receive(encode_message(Message("mallory", mid, "room", T0 + i, (), None, b"x")), T0 + i)
    assert bob.log.heads() == ids[-3:]
    assert len(bob.log) == 3  # the window (2) and one older head
    archive.feed(bob)
    # What stopped being a head and left memory is still known as delivered.
    assert bob.log.has(ids[0], T0) and ids[0] not in bob.log


class _CountingArchive:
    """Message bytes by id; counts the reads."""

    def __init__(self, rows: dict[str, tuple[str, bytes]]) -> None:
        self.rows = rows
        self.reads = 0

    def delivered(self, message_ids: Set[str]) -> set[str]:
        return {m for m in message_ids if m in self.rows}

    def message(self, message_id: str) -> tuple[str, bytes] | None:
        self.reads += 1
        return self.rows.get(message_id)

    def evicted(self, message_ids: Iterable[str]) -> None:
        pass


def test_repair_requests_for_ids_the_archive_lacks_read_it_once_and_within_a_budget() -> None:
    """Each uncached request was one archive read (a database read on the loop), even
    for ids this node never logged, asked again every T_min by every requester."""
    archive = _CountingArchive({"old": ("bob", b"old bytes")})
    state = RepairState(RepairConfig(), "me", archive=archive)
    t_min = state.config.t_min_ms
    for k in range(10):  # repeated by its requester, and by others
        state.on_repair_request(HistoryEntry("never", None, "bob"), T0 + k * t_min)
    assert archive.reads == 1 and not state.is_responding("never")
    # It arrives (late): a request reads again, and is answered.
    archive.rows["never"] = ("bob", b"late")
    state.on_message_seen("never")
    now = T0 + 20 * t_min
    state.on_repair_request(HistoryEntry("never", None, "bob"), now)
    assert archive.reads == 2 and state.is_responding("never")
    # Made-up ids at wire speed: a bounded number of reads per T_min.
    for k in range(1_000):
        state.on_repair_request(HistoryEntry(f"made-up-{k}", None, "bob"), now)
    assert archive.reads == 2 + ARCHIVE_READS_PER_T_MIN - 1  # "never" used one of them
    state.on_repair_request(HistoryEntry("old", None, "bob"), now)
    assert not state.is_responding("old")  # beyond the budget: asked again later
    state.on_repair_request(HistoryEntry("old", None, "bob"), now + t_min)
    assert state.is_responding("old")


def test_a_repair_request_of_another_response_group_reads_nothing() -> None:
    config = RepairConfig(num_response_groups=8)
    other = next(
        f"id-{k}" for k in range(100) if not in_response_group(config, "me", "bob", f"id-{k}")
    )
    archive = _CountingArchive({other: ("bob", b"bytes")})
    state = RepairState(config, "me", archive=archive)
    state.on_repair_request(HistoryEntry(other, None, "bob"), T0)
    assert archive.reads == 0 and not state.is_responding(other)
