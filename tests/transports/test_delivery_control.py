"""Acknowledgement after processing, bounded subscriptions, no-local and topic checks.

Against real Mosquitto: the machine's broker with unique topics, or a private one
where the test needs the broker to itself (sessions, a wildcard spy).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

import pytest

from sdk.testing.waiting import eventually, idle
from tests.conftest import PrivateMosquitto
from tests.transports.test_mqtt import PROTOCOLS, take, unique_topic
from transports.base import (
    Envelope,
    InvalidChannelId,
    InvalidTopic,
    QueueSubscription,
    Subscription,
    message_hash,
    topic_for_channel,
)
from transports.memory import MemoryNetwork
from transports.mqtt import MqttTransport


async def crash(transport: MqttTransport) -> None:
    """What a SIGKILL does to a client: the socket goes, no DISCONNECT, no more acks."""
    for task in (transport._supervisor, transport._misc_task):
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    transport._closed = True
    transport._teardown_socket()


async def round_trip(transport: MqttTransport) -> None:
    """A QoS 1 publish and its PUBACK on ``transport``'s connection: the broker has read
    every packet the client sent before it (one TCP stream, read in order)."""
    await transport.publish(topic_for_channel(f"sync-{uuid.uuid4().hex[:8]}"), b"sync")
    await transport.flush()


async def assert_next_is_a_fresh_message(
    broker: PrivateMosquitto, topic: str, sub: Subscription
) -> None:
    """Publish a new message to ``topic`` and check it is the next ``sub`` receives:
    anything the broker still had queued for ``sub`` would have come before it."""
    async with MqttTransport("127.0.0.1", broker.port) as sender:
        await sender.publish(topic, b"fresh")
        await sender.flush()
    (env,) = await envelopes(sub, 1)
    env.acknowledge()
    assert env.payload == b"fresh"


async def envelopes(sub: Subscription, n: int, timeout: float = 10.0) -> list[Envelope]:
    out: list[Envelope] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            out.append(await anext(sub))
    return out


# ---------------------------------------------------------------- QueueSubscription


def _env(i: int, size: int = 10, ack: Callable[[], None] | None = None) -> Envelope:
    payload = bytes([i % 256]) * size
    return Envelope("t", payload, message_hash("t", payload), ack)


async def test_queue_subscription_reports_full_and_wakes_the_producer() -> None:
    woken: list[int] = []
    sub = QueueSubscription("t", max_pending=4, on_room=lambda: woken.append(1))
    assert all(sub.deliver(_env(i)) for i in range(3))
    assert sub.deliver(_env(3)) is False and sub.full
    waiter = asyncio.create_task(sub.wait_for_room())
    await idle()
    assert not waiter.done()
    await anext(sub)  # 3 left: not yet half
    await idle()
    assert not waiter.done() and woken == []
    await anext(sub)  # 2 left: half
    await asyncio.wait_for(waiter, 1)
    assert woken == [1] and not sub.full


async def test_queue_subscription_bound_in_bytes() -> None:
    sub = QueueSubscription("t", max_pending_bytes=100)
    assert sub.deliver(_env(0, 60))
    assert sub.deliver(_env(1, 60)) is False
    assert sub.pending_bytes() == 120
    await anext(sub)
    assert sub.pending_bytes() == 60 and not sub.full


async def test_close_acknowledges_what_it_discards_and_end_keeps_order() -> None:
    acked: list[int] = []
    sub = QueueSubscription("t")
    for i in range(3):
        sub.deliver(_env(i, ack=lambda i=i: acked.append(i)))
    await sub.close()
    assert acked == [0, 1, 2]
    with pytest.raises(StopAsyncIteration):
        await anext(sub)
    other = QueueSubscription("t")
    other.deliver(_env(7))
    other.end()
    assert (await anext(other)).payload[0] == 7
    with pytest.raises(StopAsyncIteration):
        await anext(other)


async def test_memory_publish_waits_for_a_full_subscriber_when_asked_to() -> None:
    net = MemoryNetwork(max_pending=5, on_full="wait")
    a, b = net.transport("a"), net.transport("b")
    sub = await b.subscribe("t")
    for i in range(5):
        await a.publish("t", bytes([i]))
    blocked = asyncio.create_task(a.publish("t", b"late"))
    await idle()  # in-process: had it not waited, the publish would be done by now
    assert not blocked.done() and sub.pending() == 5
    got = [e.payload for e in await envelopes(sub, 3)]
    await asyncio.wait_for(blocked, 1)
    got += [e.payload for e in await envelopes(sub, 3)]
    assert got == [bytes([i]) for i in range(5)] + [b"late"]


async def test_a_full_memory_subscriber_loses_its_copies_and_stops_nobody() -> None:
    """Per subscriber: its own bound, its copies dropped and counted; others unaffected."""
    net = MemoryNetwork(max_pending=5)
    a, b, c = net.transport("a"), net.transport("b"), net.transport("c")
    slow, other = await b.subscribe("t"), await c.subscribe("t")
    for i in range(20):
        await asyncio.wait_for(a.publish("t", bytes([i])), 1)
        assert [e.payload for e in await envelopes(other, 1)] == [bytes([i])]
    await net.quiesce()
    assert slow.pending() == 5 and net.dropped_full == {"b": 15}
    assert [e.payload for e in await envelopes(slow, 5)] == [bytes([i]) for i in range(5)]


# ---------------------------------------------------------------- topic checks


@pytest.mark.parametrize("bad", ["a/+", "a/#", "a\x00b", "x\ny"])
async def test_bad_channel_ids_never_reach_the_broker(
    private_mosquitto: Callable[..., PrivateMosquitto], bad: str
) -> None:
    broker = private_mosquitto()
    async with (
        MqttTransport("127.0.0.1", broker.port) as spy,
        MqttTransport("127.0.0.1", broker.port) as t,
    ):
        seen = await spy.subscribe("#")
        for _ in range(2):  # refused every time: only accepted topics are remembered
            with pytest.raises(InvalidChannelId):
                await t.publish(topic_for_channel(bad), b"x")
        with pytest.raises(InvalidChannelId):
            await t.subscribe(topic_for_channel(bad))
        with pytest.raises(InvalidTopic):
            await t.publish("plain\x00topic", b"x")
        with pytest.raises(InvalidTopic):
            await t.publish("plain/+", b"x")
        # The transport is still healthy and the broker saw only these messages.
        await t.publish(topic_for_channel("fine"), b"ok")
        await t.publish(topic_for_channel("fine"), b"ok again")  # its check remembered
        assert [e.payload for e in await envelopes(seen, 2)] == [b"ok", b"ok again"]
        # A last message through the same ordered path: nothing was between.
        await t.publish(topic_for_channel("fine"), b"last")
        assert [e.payload for e in await envelopes(seen, 1)] == [b"last"]
        assert t.stats.connects == 1 and t.stats.connection_losses == 0


async def test_memory_transport_checks_channel_ids_too() -> None:
    t = MemoryNetwork().transport("a")
    with pytest.raises(InvalidChannelId):
        await t.subscribe(topic_for_channel("a/+"))
    with pytest.raises(InvalidChannelId):
        await t.publish(topic_for_channel("a\x00"), b"x")


# ---------------------------------------------------------------- manual acknowledgement


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unacknowledged_messages_come_back_after_a_crash(
    private_mosquitto: Callable[..., PrivateMosquitto], protocol: object
) -> None:
    broker = private_mosquitto("max_queued_messages 10000\n")
    topic = topic_for_channel(f"acks-{uuid.uuid4().hex[:8]}")
    kwargs: dict[str, object] = {
        "client_id": f"store-{uuid.uuid4().hex[:8]}",
        "persistent_session": True,
        "manual_ack": True,
        "protocol": protocol,
    }
    first = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await first.connect()
    sub = await first.subscribe(topic)
    async with MqttTransport("127.0.0.1", broker.port) as sender:
        for i in range(10):
            await sender.publish(topic, bytes([i]))
        await sender.flush()
    got = await envelopes(sub, 10)
    # Acknowledged out of order: PUBACKs still leave in arrival order.
    got[2].acknowledge()
    assert first.stats.acks_sent == 0
    got[0].acknowledge()
    assert first.stats.acks_sent == 1
    got[1].acknowledge()
    assert first.stats.acks_sent == 3
    got[4].acknowledge()
    await round_trip(first)  # the broker has read the PUBACKs sent before it
    await crash(first)
    again = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await again.connect()
    try:
        sub = await again.subscribe(topic)
        # 3 is the first unacknowledged one; 4 was acknowledged by the consumer but
        # its PUBACK had to wait for 3, so it comes back too (at-least-once).
        redelivered = [e.payload[0] for e in await envelopes(sub, 7)]
        assert redelivered == [3, 4, 5, 6, 7, 8, 9]
        await assert_next_is_a_fresh_message(broker, topic, sub)  # nothing more came back
    finally:
        await again.close()


async def test_without_manual_ack_a_crash_loses_what_was_received(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> None:
    """The failure the store node had: paho acknowledged on receipt."""
    broker = private_mosquitto()
    topic = topic_for_channel(f"acks-{uuid.uuid4().hex[:8]}")
    kwargs: dict[str, object] = {
        "client_id": f"store-{uuid.uuid4().hex[:8]}",
        "persistent_session": True,
    }
    first = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await first.connect()
    sub = await first.subscribe(topic)
    async with MqttTransport("127.0.0.1", broker.port) as sender:
        for i in range(10):
            await sender.publish(topic, bytes([i]))
        await sender.flush()
    await envelopes(sub, 10)
    await round_trip(first)  # the broker has read the PUBACKs paho sent on receipt
    await crash(first)
    async with MqttTransport("127.0.0.1", broker.port, **kwargs) as again:  # type: ignore[arg-type]
        sub = await again.subscribe(topic)
        await assert_next_is_a_fresh_message(broker, topic, sub)  # none of the 10 came back


async def test_acks_of_an_earlier_connection_are_dropped(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> None:
    broker = private_mosquitto()
    topic = topic_for_channel(f"gen-{uuid.uuid4().hex[:8]}")
    async with (
        MqttTransport(
            "127.0.0.1",
            broker.port,
            client_id=f"store-{uuid.uuid4().hex[:8]}",
            persistent_session=True,
            manual_ack=True,
            reconnect_max=0.2,
        ) as t,
        MqttTransport("127.0.0.1", broker.port) as sender,
    ):
        sub = await t.subscribe(topic)
        await sender.publish(topic, b"a")
        (old,) = await envelopes(sub, 1)
        broker.kill()
        broker.start()
        async with asyncio.timeout(10):
            while not (t.stats.connects == 2 and sender.stats.connects == 2):
                await asyncio.sleep(0.02)
        await sender.wait_ready()
        await t.wait_ready()
        old.acknowledge()  # its packet id belongs to the dead connection
        assert t.stats.acks_sent == 0
        await sender.publish(topic, b"b")
        (new,) = await envelopes(sub, 1)
        new.acknowledge()
        assert new.payload == b"b" and t.stats.acks_sent == 1


# ---------------------------------------------------------------- backpressure, no-local


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_full_subscription_stops_reading_and_loses_nothing(
    private_mosquitto: Callable[..., PrivateMosquitto], protocol: object
) -> None:
    broker = private_mosquitto("max_queued_messages 10000\nmax_inflight_messages 0\n")
    topic = unique_topic("bounded")
    async with (
        MqttTransport("127.0.0.1", broker.port, protocol=protocol, max_pending=50) as slow,  # type: ignore[arg-type]
        MqttTransport("127.0.0.1", broker.port) as sender,
    ):
        sub = await slow.subscribe(topic)
        for i in range(1000):
            await sender.publish(topic, i.to_bytes(2, "big"))
        await sender.flush()
        assert isinstance(sub, QueueSubscription)
        # Reading pauses at the bound (one packet of overshoot); the rest waits at the broker.
        assert await eventually(lambda: slow.stats.read_pauses >= 1)
        assert sub.pending() <= 51
        got = await take(sub, 1000, timeout=20)
        assert got == [i.to_bytes(2, "big") for i in range(1000)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_no_local_drops_own_publications(
    mosquitto: tuple[str, int], protocol: object
) -> None:
    host, port = mosquitto
    topic = unique_topic("nolocal")
    async with (
        MqttTransport(host, port, protocol=protocol, no_local=True) as me,  # type: ignore[arg-type]
        MqttTransport(host, port, protocol=protocol) as other,  # type: ignore[arg-type]
    ):
        mine = await me.subscribe(topic)
        theirs = await other.subscribe(topic)
        for i in range(20):
            await me.publish(topic, b"me%d" % i)
        await other.publish(topic, b"other")
        await me.flush()
        await other.flush()
        assert await take(mine, 1) == [b"other"]
        assert len(await take(theirs, 21)) == 21  # others still hear me
        await other.publish(topic, b"last")  # after all of mine: none of mine came first
        assert await take(mine, 1) == [b"last"]
        if protocol == "3.1.1":
            assert me.stats.own_dropped == 20


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_backlog_beyond_the_bound_neither_deadlocks_subscribe_nor_drops(
    private_mosquitto: Callable[..., PrivateMosquitto], protocol: object
) -> None:
    """A restarted store node: the broker floods its session's queue right after
    CONNACK, before subscribe()'s SUBACK, into a subscription bounded far lower."""
    broker = private_mosquitto("max_queued_messages 100000\nmax_inflight_messages 1000\n")
    topic = topic_for_channel(f"backlog-{uuid.uuid4().hex[:8]}")
    kwargs: dict[str, object] = {
        "client_id": f"store-{uuid.uuid4().hex[:8]}",
        "persistent_session": True,
        "manual_ack": True,
        "protocol": protocol,
        "max_pending": 100,
    }
    first = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await first.connect()
    await first.subscribe(topic)
    await crash(first)
    async with MqttTransport("127.0.0.1", broker.port) as sender:
        for i in range(3000):
            await sender.publish(topic, i.to_bytes(2, "big"))
        await sender.flush()
    again = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await again.connect()
    try:
        # Called while the backlog is still arriving: some of it before, some after.
        async with asyncio.timeout(10):
            sub = await again.subscribe(topic)
        got = []
        async with asyncio.timeout(30):
            while len(got) < 3000:
                env = await anext(sub)
                env.acknowledge()
                got.append(int.from_bytes(env.payload, "big"))
        assert sorted(got) == list(range(3000))
        assert again.stats.acks_sent == 3000
    finally:
        await again.close()


@pytest.mark.parametrize("manual_ack", [True, False])
async def test_subscribing_channel_by_channel_into_a_backlog_does_not_deadlock(
    private_mosquitto: Callable[..., PrivateMosquitto], manual_ack: bool
) -> None:
    """What hung the third start of a store node in the long campaign: the first
    subscription filled up and paused reading, the second one filled from the
    session's backlog before its SUBACK, and its fullness kept reading paused."""
    broker = private_mosquitto("max_queued_messages 100000\nmax_inflight_messages 1000\n")
    topics = [topic_for_channel(f"two-{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
    kwargs: dict[str, object] = {
        "client_id": f"store-{uuid.uuid4().hex[:8]}",
        "persistent_session": True,
        "manual_ack": manual_ack,
        "max_pending": 100,
    }
    first = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await first.connect()
    for topic in topics:
        await first.subscribe(topic)
    await crash(first)
    async with MqttTransport("127.0.0.1", broker.port) as sender:
        for i in range(4000):
            await sender.publish(topics[i % 2], i.to_bytes(2, "big"))
        await sender.flush()
    again = MqttTransport("127.0.0.1", broker.port, **kwargs)  # type: ignore[arg-type]
    await again.connect()
    got: list[int] = []

    async def consume(sub: Subscription) -> None:
        async for env in sub:
            env.acknowledge()
            got.append(int.from_bytes(env.payload, "big"))

    consumers = []
    try:
        for topic in topics:
            async with asyncio.timeout(10):
                sub = await again.subscribe(topic)
            consumers.append(asyncio.create_task(consume(sub)))
        async with asyncio.timeout(30):
            while len(got) < (4000 if manual_ack else 1):
                await asyncio.sleep(0.05)
        if manual_ack:
            assert sorted(got) == list(range(4000))
    finally:
        await again.close()
        for task in consumers:
            task.cancel()
