"""Catch-up from the store by time (restart, reconnect, on request), the announcement
after a restart, persisted send outcomes, the bounded event queue, and channel-id and
publish failures that must stay local to one channel."""

from __future__ import annotations

import asyncio
import dataclasses
import types
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk.runtime import (
    BloomProfileMismatch,
    Delivery,
    Node,
    PublishFailed,
    RuntimeOptions,
    SendExpired,
    SendFailed,
)
from sdk.sds import WAKU
from sdk.store.client import InMemoryStore
from sdk.testing.waiting import idle
from tests.runtime.conftest import Broker
from tests.runtime.helpers import FAST, QUIET, ArchivingTransport, Collector, eventually
from tests.runtime.tcp_proxy import TcpProxy
from transports.base import InvalidChannelId, Subscription, Transport, topic_for_channel
from transports.memory import MemoryNetwork
from transports.mqtt import MqttTransport


def _delivered_contents(collector: Collector) -> list[bytes]:
    return [e.content for e in collector.delivered]


async def test_restart_catches_up_from_the_store_with_the_sender_gone(tmp_path: Path) -> None:
    net = MemoryNetwork()
    store = InMemoryStore()
    alice = Node(ArchivingTransport(net.transport("alice"), store), "alice", config=QUIET)
    bob_db = tmp_path / "bob.db"
    bob = Node(net.transport("bob"), "bob", db=bob_db, store=store, config=QUIET)
    a_room, b_room = await alice.join("room"), await bob.join("room")
    b_events = Collector(b_room)
    await a_room.send(b"before")
    assert await eventually(lambda: len(b_events.delivered) == 1, timeout=5)
    await b_events.stop()
    await bob.close()
    await bob.transport.close()

    away = [(await a_room.send(f"while bob was away {k}".encode())).message_id for k in range(5)]
    await alice.close()  # alice is gone too: nobody but the store can tell bob
    await alice.transport.close()

    bob = Node(net.transport("bob"), db=bob_db, store=store, config=QUIET)
    b_room = await bob.join("room")
    b_events = Collector(b_room)
    assert b_room.core.stats["sync_sent"] == 1  # announced itself on restart
    assert await eventually(lambda: len(b_events.delivered) == 5, timeout=5), b_room.stats
    assert [e.message_id for e in b_events.delivered] == away
    assert b_room.stats["catch_up_queries"] == 1
    assert b_room.stats["catch_up_retrieved"] == 6  # the overlap brings "before" again
    assert b_room.stats["duplicates"] == 1
    await b_events.stop()
    await bob.close()


async def test_catch_up_on_request_fetches_the_window_asked_for() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()
    store.archive("room", "old", b"not even SDS", arrived_at=1_000)
    alice = Node(ArchivingTransport(net.transport("alice"), store), "alice", config=QUIET)
    a_room = await alice.join("room")
    for k in range(3):
        await a_room.send(f"history {k}".encode())
    # A newcomer without a database: nothing to restore, so nothing fetched at join ...
    carol = Node(net.transport("carol"), "carol", store=store, config=QUIET)
    c_room = await carol.join("room")
    assert c_room.stats["catch_up_queries"] == 0
    # ... until it asks: everything from t=2 s (epoch) on, the garbage at t=1 s excluded.
    assert await c_room.catch_up(since=2.0) == 3
    assert len(c_room.core.log) == 3
    assert c_room.stats["rejected"] == 0
    no_store = Node(net.transport("dave"), "dave", config=QUIET)
    d_room = await no_store.join("room")
    with pytest.raises(ValueError, match="needs a store"):
        await d_room.catch_up()
    for node in (alice, carol, no_store):
        await node.close()


async def test_first_join_history_fetches_recent_messages() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()
    alice = Node(ArchivingTransport(net.transport("alice"), store), "alice", config=QUIET)
    a_room = await alice.join("room")
    sent = [(await a_room.send(f"m{k}".encode())).message_id for k in range(4)]
    carol = Node(
        net.transport("carol"),
        "carol",
        store=store,
        config=QUIET,
        options=RuntimeOptions(first_join_history=3600),
    )
    c_room = await carol.join("room")
    assert await eventually(lambda: c_room.core.log.ids() == a_room.core.log.ids(), timeout=5)
    assert set(c_room.core.log.ids()) == set(sent)
    await alice.close()
    await carol.close()


@pytest.mark.integration
async def test_reconnect_announces_and_catches_up_over_mosquitto(
    private_broker: Callable[[], Broker],
) -> None:
    broker = private_broker()
    proxy = TcpProxy(broker.port)
    await proxy.start()
    channel = f"catch-up-{uuid.uuid4().hex[:8]}"
    store = InMemoryStore()
    a_mqtt = MqttTransport("127.0.0.1", broker.port)
    b_mqtt = MqttTransport("127.0.0.1", proxy.port, reconnect_min=0.05, reconnect_max=0.2)
    await a_mqtt.connect()
    await b_mqtt.connect()
    options = RuntimeOptions(connection_check_interval=0.05, store_timeout=2.0)
    alice = Node(ArchivingTransport(a_mqtt, store), "alice", config=QUIET)
    bob = Node(b_mqtt, "bob", store=store, config=QUIET, options=options)
    try:
        a_room, b_room = await alice.join(channel), await bob.join(channel)
        b_events = Collector(b_room)
        await a_room.send(b"before the cut")
        assert await eventually(lambda: len(b_events.delivered) == 1, timeout=10)

        proxy.cut()
        assert await eventually(lambda: not b_mqtt.connected, timeout=10)
        away = [(await a_room.send(f"cut off {k}".encode())).message_id for k in range(5)]
        syncs_before = b_room.core.stats["sync_sent"]
        proxy.restore()

        assert await eventually(lambda: len(b_events.delivered) == 6, timeout=20), b_room.stats
        assert [e.message_id for e in b_events.delivered[1:]] == away
        assert b_room.stats["reconnects"] >= 1
        assert b_room.stats["catch_up_retrieved"] >= 5
        assert b_room.core.stats["sync_sent"] > syncs_before  # announced after the reconnect
        await b_events.stop()
    finally:
        await alice.close()
        await bob.close()
        await a_mqtt.close()
        await b_mqtt.close()
        await proxy.close()


class _BlinkingTransport:
    """A memory transport whose connection can drop and come back between two of the
    runtime's connection checks: ``connected`` never reads False, only the count of
    connects (as ``MqttTransport.stats.connects``) shows the reconnect."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self.connected = True
        self.stats = types.SimpleNamespace(connects=1)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


async def test_a_reconnect_shorter_than_one_connection_check_still_catches_up() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()
    alice = Node(ArchivingTransport(net.transport("alice"), store), "alice", config=QUIET)
    bob_transport = _BlinkingTransport(net.transport("bob"))
    options = RuntimeOptions(connection_check_interval=0.05)
    bob = Node(bob_transport, "bob", store=store, config=QUIET, options=options)  # type: ignore[arg-type]
    try:
        a_room, b_room = await alice.join("room"), await bob.join("room")
        b_events = Collector(b_room)
        net.partition([["alice"], ["bob"]])
        away = [(await a_room.send(f"cut off {k}".encode())).message_id for k in range(5)]
        net.heal()
        bob_transport.stats.connects += 1  # down and up again within one check

        assert await eventually(lambda: len(b_events.delivered) == 5, timeout=10), b_room.stats
        assert [e.message_id for e in b_events.delivered] == away
        assert b_room.stats["reconnects"] == 1
        await b_events.stop()
    finally:
        await alice.close()
        await bob.close()


async def test_expiry_of_a_send_survives_a_restart(tmp_path: Path) -> None:
    net = MemoryNetwork()
    config = dataclasses.replace(FAST, max_resends=1, resend_interval_ms=50)
    db = tmp_path / "lonely.db"
    node = Node(net.transport("lonely"), "lonely", db=db, config=config)
    room = await node.join("room")
    handle = await room.send(b"anyone?")  # nobody will ever acknowledge it
    with pytest.raises(SendExpired):
        await handle.acknowledged(timeout=10)
    await node.close()
    await node.transport.close()

    node = Node(net.transport("lonely"), db=db, config=config)
    room = await node.join("room")
    with pytest.raises(SendExpired) as info:
        await room.wait_acknowledged(handle.message_id, timeout=1)
    assert info.value.attempts == 1
    await node.close()


async def _flood(sender_room: object, count: int) -> list[str]:
    ids = []
    for k in range(count):
        ids.append((await sender_room.send(f"flood {k}".encode())).message_id)  # type: ignore[attr-defined]
    return ids


@pytest.mark.parametrize("with_db", [True, False], ids=["spill-to-db", "backpressure"])
async def test_deliveries_held_for_an_app_that_does_not_read_are_bounded(
    tmp_path: Path, with_db: bool
) -> None:
    net = MemoryNetwork()
    limit, batch = 20, 8
    alice = Node(net.transport("alice"), "alice", config=QUIET)
    bob = Node(
        net.transport("bob"),
        "bob",
        db=tmp_path / "bob.db" if with_db else None,
        config=QUIET,
        options=RuntimeOptions(event_queue_limit=limit, receive_batch=batch),
    )
    a_room, b_room = await alice.join("room"), await bob.join("room")
    sent = await _flood(a_room, 300)
    await net.quiesce()
    if with_db:
        assert await eventually(lambda: len(b_room.core.log) == 300)
    else:
        assert await eventually(lambda: b_room.stats["reader_paused"] > 0)
    await idle()
    held = b_room._queue.qsize()
    # Deliveries of one turn may go past the limit before the reader pauses.
    assert held <= limit + batch + 1, held
    if with_db:
        assert len(b_room.core.log) == 300  # everything delivered and committed
        assert b_room.stats["deliveries_spilled"] > 0
    else:
        assert len(b_room.core.log) < 300  # the reader stopped: the transport holds the rest
        assert b_room.stats["reader_paused"] > 0

    received: list[Delivery] = []

    async def read() -> None:
        async for event in b_room.events():
            if isinstance(event, Delivery):
                received.append(event)
                if len(received) == len(sent):
                    return

    await asyncio.wait_for(read(), 20)
    assert [e.message_id for e in received] == sent
    assert [e.seq for e in received] == sorted({e.seq for e in received})
    assert [e.content for e in received[:2]] == [b"flood 0", b"flood 1"]
    await alice.close()
    await bob.close()


class _RefusingTransport(Transport):
    """Passes through ``inner`` but raises a plain ``ValueError`` (as paho does for a
    topic it cannot publish to) when publishing to ``refused``."""

    def __init__(self, inner: Transport, refused: str) -> None:
        self.inner = inner
        self.refused = refused
        self.max_payload_size = inner.max_payload_size

    async def publish(self, topic: str, payload: bytes) -> bytes:
        if topic == self.refused:
            raise ValueError("Publish topic cannot contain wildcards.")
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        return await self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


async def test_bad_channel_ids_are_refused_and_a_failing_publish_stays_in_its_channel() -> None:
    net = MemoryNetwork()
    config = dataclasses.replace(FAST, repair=None)
    node = Node(
        _RefusingTransport(net.transport("a"), topic_for_channel("broken")), "a", config=config
    )
    peer = Node(net.transport("b"), "b", config=config)
    for bad in ("a/+", "a/#", "a\x00b", ""):
        with pytest.raises(InvalidChannelId):
            await node.join(bad)
    assert node.channels == {}

    broken, fine = await node.join("broken"), await node.join("fine")
    peer_fine = await peer.join("fine")
    broken_events = Collector(broken)
    handle = await broken.send(b"this one cannot go out")
    with pytest.raises(SendFailed):
        await handle.acknowledged(timeout=5)
    assert await eventually(
        lambda: any(isinstance(e, PublishFailed) for e in broken_events.events), timeout=5
    )
    peer_events = Collector(peer_fine)
    for k in range(20):
        await fine.send(f"still fine {k}".encode())
    assert await eventually(lambda: len(peer_events.delivered) == 20, timeout=10)
    assert node._publish_queue.qsize() == 0  # no slot leaked
    node.check_running()  # the node did not fail
    await broken_events.stop()
    await peer_events.stop()
    await node.close()
    await peer.close()


async def test_a_peer_on_another_bloom_profile_is_reported_once_as_an_event() -> None:
    net = MemoryNetwork()
    waku = dataclasses.replace(QUIET, bloom=WAKU)
    alice = Node(net.transport("alice"), "alice", config=QUIET)  # compact
    bob = Node(net.transport("bob"), "bob", config=waku)
    a_room, b_room = await alice.join("room"), await bob.join("room")
    a_events = Collector(a_room)
    for k in range(3):
        await b_room.send(f"from the waku side {k}".encode())
    assert await eventually(lambda: len(a_events.delivered) == 3, timeout=5)
    mismatches = [e for e in a_events.events if isinstance(e, BloomProfileMismatch)]
    assert mismatches == [
        BloomProfileMismatch("room", "bob", WAKU.size_bytes, QUIET.bloom.size_bytes)
    ]
    assert a_room.stats["filter_size_mismatch"] == 3
    await a_events.stop()
    await alice.close()
    await bob.close()
