"""The asyncio runtime over the in-process memory transport."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from sdk.runtime import (
    ChannelClosed,
    Delivery,
    MessageRejected,
    Node,
    PublishFailed,
    ReliableChannel,
    RuntimeOptions,
    SendExpired,
    SendFailed,
    SyncState,
    SyncStatusChanged,
)
from sdk.sds.snapshot import export_snapshot
from sdk.store.client import InMemoryStore
from sdk.testing.waiting import idle
from tests.runtime.helpers import FAST, ArchivingTransport, Collector, converged, eventually
from transports.base import PayloadTooLarge, Subscription, Transport, TransportError
from transports.faults import FaultConfig
from transports.memory import MemoryNetwork


async def test_group_converges_under_loss_duplication_and_reordering() -> None:
    net = MemoryNetwork(FaultConfig(loss=0.25, duplication=0.1, delay_ms=2, jitter_ms=30), seed=11)
    names = [f"p{i}" for i in range(4)]
    # A store node that archived everything, as deployed (SDS-R alone can stall:
    # see docs/runtime.md, "Known limits").
    store = InMemoryStore()
    nodes = [
        Node(
            ArchivingTransport(net.transport(n), store),
            n,
            config=FAST,
            store=store,
            options=RuntimeOptions(store_timeout=0.2),
        )
        for n in names
    ]
    channels = [await node.join("room") for node in nodes]
    collectors = [Collector(c) for c in channels]
    sent: dict[str, set[str]] = {n: set() for n in names}

    async def chat(i: int) -> None:
        for k in range(12):
            handle = await channels[i].send(f"{names[i]} says {k}".encode())
            sent[names[i]].add(handle.message_id)
            await asyncio.sleep(0.01 * ((i + k) % 3))

    await asyncio.gather(*(chat(i) for i in range(4)))
    assert await eventually(lambda: converged(channels, 48), timeout=30)
    # Logs change when a message is received, events follow at the turn's flush.
    assert await eventually(lambda: all(len(c.delivered) >= 36 for c in collectors), timeout=5)
    for name, col in zip(names, collectors, strict=True):
        ids = [e.message_id for e in col.delivered]
        assert len(ids) == len(set(ids)), "a message was delivered twice"
        others = set().union(*(s for n, s in sent.items() if n != name))
        assert set(ids) == others
        # Causal order: each delivery's seq grows with its position.
        assert [e.seq for e in col.delivered] == sorted(e.seq for e in col.delivered)
    assert net.dropped > 0
    for col in collectors:
        await col.stop()
    for node in nodes:
        await node.close()


async def test_send_then_await_acknowledgement() -> None:
    net = MemoryNetwork()
    a = Node(net.transport("a"), "a", config=FAST)
    b = Node(net.transport("b"), "b", config=FAST)
    ca, cb = await a.join("room"), await b.join("room")
    handle = await ca.send(b"hello")
    assert ca.core.outgoing.get(handle.message_id) is not None
    # b acknowledges with the causal history of its next message (or its sync message).
    await cb.send(b"hi back")
    await handle.acknowledged(timeout=5)
    assert ca.core.outgoing.get(handle.message_id) is None
    await ca.wait_acknowledged(handle.message_id, timeout=0.1)  # already: returns at once
    await a.close()
    await b.close()


async def test_acknowledgement_by_sync_message_alone() -> None:
    net = MemoryNetwork()
    a = Node(net.transport("a"), "a", config=FAST)
    b = Node(net.transport("b"), "b", config=FAST)
    ca = await a.join("room")
    await b.join("room")
    handle = await ca.send(b"anyone?")
    await handle.acknowledged(timeout=5)
    await a.close()
    await b.close()


async def test_unacknowledged_message_expires() -> None:
    net = MemoryNetwork()
    config = dataclasses.replace(FAST, max_resends=2, resend_interval_ms=100)
    a = Node(net.transport("a"), "a", config=config)
    ca = await a.join("room")
    handle = await ca.send(b"into the void")
    with pytest.raises(SendExpired):
        await handle.acknowledged(timeout=5)
    with pytest.raises(SendExpired):
        await ca.wait_acknowledged(handle.message_id)
    await a.close()


async def test_events_stream_sync_status_and_ephemeral() -> None:
    net = MemoryNetwork()
    a = Node(net.transport("a"), "a", config=FAST)
    b = Node(net.transport("b"), "b", config=FAST)
    ca, cb = await a.join("room"), await b.join("room")
    await ca.send(b"one")
    await ca.send_ephemeral(b"typing...")
    seen = []
    async for event in cb.events():
        seen.append(type(event).__name__)
        if isinstance(event, Delivery):
            assert event.content == b"one" and event.sender_id == "a" and event.seq == 1
        if "EphemeralReceived" in seen and "Delivery" in seen:
            break
    assert cb.sync_status.state is SyncState.SYNCED and cb.sync_status.received == 1
    await a.close()
    await b.close()
    with pytest.raises(ChannelClosed):
        await cb.send(b"after close")


async def test_missing_messages_are_fetched_from_the_store_before_repair() -> None:
    store = InMemoryStore()
    net = MemoryNetwork()
    # Slow resends and repair, so only the store can fill the gap quickly.
    config = dataclasses.replace(
        FAST,
        resend_interval_ms=60_000,
        possibly_acked_resend_interval_ms=60_000,
        sync_interval_ms=60_000,
        repair=dataclasses.replace(FAST.repair, t_min_ms=30_000, t_max_ms=60_000),
    )
    options = RuntimeOptions(store_timeout=0.5)
    a = Node(ArchivingTransport(net.transport("a"), store), "a", config=config)
    b = Node(net.transport("b"), "b", config=config, store=store, options=options)
    ca, cb = await a.join("room"), await b.join("room")
    statuses: list[SyncState] = []

    async def watch() -> None:
        async for event in cb.events():
            if isinstance(event, SyncStatusChanged):
                statuses.append(event.status.state)

    watcher = asyncio.create_task(watch())
    net.partition([["a"], ["b"]])
    for k in range(5):
        await ca.send(f"while b was away {k}".encode())
    net.heal()
    await ca.send(b"b is back")
    assert await eventually(lambda: converged([ca, cb], 6), timeout=10)
    # By id (MessageMissing with a hint) or by the time range around the gap,
    # whichever asks first: both are the store, neither is repair.
    stats = dict(cb.stats)
    assert stats.get("store_queries", 0) + stats.get("catch_up_queries", 0) >= 1, stats
    assert stats.get("store_retrieved", 0) + stats.get("catch_up_retrieved", 0) >= 1, stats
    assert cb.stats["repairs_sent"] == 0 and ca.stats["resent"] == 0
    assert cb.sync_status.state is SyncState.SYNCED
    assert SyncState.SYNCING in statuses and statuses[-1] is SyncState.SYNCED
    watcher.cancel()
    await a.close()
    await b.close()


async def test_repair_must_not_race_the_store() -> None:
    net = MemoryNetwork()
    with pytest.raises(ValueError, match="t_min_ms"):
        Node(net.transport("a"), "a", config=FAST, store=InMemoryStore())


async def test_garbage_on_the_topic_changes_nothing_but_a_counter(tmp_path: Path) -> None:
    net = MemoryNetwork()
    a = Node(net.transport("a"), "a", config=FAST, db=tmp_path / "a.db")
    b = Node(net.transport("b"), "b", config=FAST)
    ca, cb = await a.join("room"), await b.join("room")
    collector = Collector(ca)
    await cb.send(b"real message")
    assert await eventually(lambda: converged([ca, cb], 1) and len(collector.delivered) == 1)
    await idle()  # its commit and events are done
    before = export_snapshot(ca.core)
    stats_before = ca.stats
    commits_before = a.persistence.commits if a.persistence else 0
    seen_before = len(collector.events)
    attacker = net.transport("mallory")
    for junk in (b"\x00\xff garbage", b"", b"\x0a\x05hello", bytes(range(256)) * 4):
        await attacker.publish(ca.topic, junk)
    assert await eventually(lambda: (ca.stats - stats_before)["rejected"] == 4)
    await idle()  # a commit or event the junk caused would be done now
    after = export_snapshot(ca.core)
    assert (after.log, after.outgoing, after.incoming, after.missing, after.bloom_recent) == (
        before.log,
        before.outgoing,
        before.incoming,
        before.missing,
        before.bloom_recent,
    )
    diff = ca.stats - stats_before
    assert set(diff) <= {"rejected", "received"} | {k for k in diff if k.startswith("rejected.")}
    assert diff["rejected"] == 4
    assert a.persistence is not None and a.persistence.commits == commits_before
    assert all(isinstance(e, MessageRejected) for e in collector.events[seen_before:])
    await collector.stop()
    await a.close()
    await b.close()


class _FailingTransport(Transport):
    """Publishing fails with a chosen error; subscriptions come from a memory node."""

    def __init__(self, inner: Transport, error: Exception, max_payload: int | None = None) -> None:
        self.inner = inner
        self.error = error
        self.max_payload_size = max_payload

    async def publish(self, topic: str, payload: bytes) -> bytes:
        raise self.error

    async def subscribe(self, topic: str) -> Subscription:
        return await self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


async def test_transport_errors_are_surfaced() -> None:
    net = MemoryNetwork()
    a = Node(_FailingTransport(net.transport("a"), TransportError("broker down")), "a", config=FAST)
    ca = await a.join("room")
    collector = Collector(ca)
    handle = await ca.send(b"hello")
    assert await eventually(lambda: any(isinstance(e, PublishFailed) for e in collector.events))
    failed = next(e for e in collector.events if isinstance(e, PublishFailed))
    assert failed.recoverable and failed.message_id == handle.message_id
    assert "broker down" in failed.error
    # Recoverable: still buffered, will be resent.
    assert ca.core.outgoing.get(handle.message_id) is not None
    await collector.stop()
    await a.close()


async def test_payload_over_the_transport_limit() -> None:
    net = MemoryNetwork()
    a = Node(_FailingTransport(net.transport("a"), PayloadTooLarge(5000, 4000)), "a", config=FAST)
    ca = await a.join("room")
    handle = await ca.send(b"fits the estimate but the transport says no")
    with pytest.raises(SendFailed):
        await handle.acknowledged(timeout=5)
    assert ca.core.outgoing.get(handle.message_id) is None
    small = Node(net.transport("s"), "s", config=FAST)
    small.transport.max_payload_size = 1_000
    cs = await small.join("room")
    with pytest.raises(PayloadTooLarge):
        await cs.send(b"x" * 2_000)
    await a.close()
    await small.close()


class _SlowTransport(Transport):
    def __init__(self, inner: Transport, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.max_payload_size = None

    async def publish(self, topic: str, payload: bytes) -> bytes:
        await asyncio.sleep(self.delay)
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        return await self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


async def test_send_queue_applies_backpressure() -> None:
    net = MemoryNetwork()
    options = RuntimeOptions(max_pending_publishes=3)
    a = Node(_SlowTransport(net.transport("a"), 0.02), "a", config=FAST, options=options)
    ca = await a.join("room")
    peak = 0

    async def sender() -> None:
        for k in range(12):
            await ca.send(f"m{k}".encode())

    async def monitor() -> None:
        nonlocal peak
        while True:
            peak = max(peak, a._publish_queue.qsize())
            await asyncio.sleep(0.002)

    mon = asyncio.create_task(monitor())
    await asyncio.wait_for(sender(), 10)
    mon.cancel()
    # The application's sends never queue more than the limit (+ the sweep's own datagrams).
    assert peak <= 4
    await a.close()


def _armed_timers(owners: list[object]) -> int:
    """Live timers on the running loop whose callback belongs to one of ``owners``.

    Reads CPython's ``BaseEventLoop._scheduled`` (every ``call_at``/``call_later``
    handle not yet run), so a timer armed by a channel itself is counted too.
    """
    loop = asyncio.get_running_loop()
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return sum(
        1
        for handle in scheduled
        if not handle.cancelled()
        and any(
            x is owner
            for owner in owners
            for x in (getattr(handle._callback, "__self__", None), *handle._args)  # type: ignore[attr-defined]
        )
    )


async def test_many_channels_share_one_timer() -> None:
    net = MemoryNetwork()
    a = Node(net.transport("a"), "a", config=FAST)
    b = Node(net.transport("b"), "b", config=FAST)
    rooms_a = [await a.join(f"room{i}") for i in range(5)]
    rooms_b = [await b.join(f"room{i}") for i in range(5)]
    for i, room in enumerate(rooms_a):
        await room.send(f"to room {i}".encode())
    assert await eventually(lambda: all(len(rb.core.log) == 1 for rb in rooms_b), timeout=5)
    for i, rb in enumerate(rooms_b):
        assert rb.core.log.ids() == rooms_a[i].core.log.ids()
    assert all(room.core.get_timer() is not None for room in rooms_a)  # five deadlines
    assert _armed_timers([a, *rooms_a, *(r.core for r in rooms_a)]) == 1  # one for all of them
    assert await a.join("room0") is rooms_a[0]
    await rooms_a[0].close()
    assert "room0" not in a.channels
    await a.close()
    await b.close()


async def test_restart_from_the_database_resumes_without_repeats(tmp_path: Path) -> None:
    net = MemoryNetwork()
    b = Node(net.transport("b"), "b", config=FAST)
    cb = await b.join("room")
    a = Node(net.transport("a"), "a", config=FAST, db=tmp_path / "a.db")
    ca = await a.join("room")
    mine = await ca.send(b"from a before")
    for k in range(3):
        await cb.send(f"b{k}".encode())
    assert await eventually(lambda: len(ca.core.log) == 4)
    processed = [e async for e in _take(ca, 3)]
    await a.close()
    for k in range(3, 5):
        await cb.send(f"b{k}".encode())  # a is away; b resends until acknowledged
    a2 = Node(net.transport("a2"), db=tmp_path / "a.db", config=FAST)
    assert a2.participant_id == "a"  # taken from the database
    ca2 = await a2.join("room")
    assert ca2.core.log.get(mine.message_id) is not None
    assert ca2.core.outgoing.get(mine.message_id) is not None or ca2.core.log.get(mine.message_id)
    assert await eventually(lambda: len(ca2.core.log) == 6, timeout=10)
    resumed = [e async for e in _take(ca2, 2, after_seq=processed[-1].seq)]
    assert [e.content for e in processed + resumed] == [f"b{k}".encode() for k in range(5)]
    history = ca2.history()
    assert [r.seq for r in history] == list(range(1, 7))
    assert len({r.message_id for r in history}) == 6
    await a2.close()
    await b.close()


async def _take(channel: ReliableChannel, n: int, after_seq: int | None = None):  # type: ignore[no-untyped-def]
    got = 0
    async for event in channel.events(after_seq=after_seq):
        if isinstance(event, Delivery):
            yield event
            got += 1
            if got == n:
                return
