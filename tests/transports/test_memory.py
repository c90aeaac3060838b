"""Semantics of the asyncio memory transport: delivery, seeded faults, partitions."""

from __future__ import annotations

import asyncio

import pytest

from transports.base import PayloadTooLarge, Subscription, TransportClosed, message_hash
from transports.faults import FaultConfig, FaultInjector
from transports.memory import MemoryNetwork

TOPIC = "chorus/sds/v1/test"


async def drain(sub: Subscription) -> list[bytes]:
    """Everything queued on ``sub`` right now."""
    out: list[bytes] = []
    while True:
        try:
            env = await asyncio.wait_for(sub.__anext__(), 0.01)
        except (TimeoutError, StopAsyncIteration):
            return out
        out.append(env.payload)


async def test_everyone_including_sender_receives() -> None:
    net = MemoryNetwork()
    a, b, c = (net.transport(n) for n in "abc")
    subs = [await t.subscribe(TOPIC) for t in (a, b, c)]
    other = await c.subscribe("chorus/sds/v1/other")
    hint = await a.publish(TOPIC, b"hello")
    assert hint == message_hash(TOPIC, b"hello")
    await net.quiesce()
    for sub in subs:
        env = await sub.__anext__()
        assert (env.topic, env.payload, env.retrieval_hint) == (TOPIC, b"hello", hint)
    assert await drain(other) == []


async def test_order_preserved_without_jitter() -> None:
    net = MemoryNetwork(FaultConfig(delay_ms=1))
    a, b = net.transport("a"), net.transport("b")
    sub = await b.subscribe(TOPIC)
    for i in range(50):
        await a.publish(TOPIC, bytes([i]))
    await net.quiesce()
    assert await drain(sub) == [bytes([i]) for i in range(50)]


async def run_faulty(seed: int) -> list[bytes]:
    net = MemoryNetwork(FaultConfig(loss=0.2, duplication=0.2, jitter_ms=5), seed=seed)
    a, b = net.transport("a"), net.transport("b")
    sub = await b.subscribe(TOPIC)
    for i in range(200):
        await a.publish(TOPIC, i.to_bytes(2, "big"))
    await net.quiesce()
    return await drain(sub)


async def test_seeded_faults_are_reproducible() -> None:
    first = await run_faulty(7)
    second = await run_faulty(7)
    # Loss and duplication decisions are identical; arrival order under jitter
    # follows real timers, so compare as multisets.
    assert sorted(first) == sorted(second)
    received = set(first)
    assert 120 < len(received) < 190, "about 20% loss"
    assert len(first) > len(received), "some duplicates"
    assert first != sorted(first), "jitter reorders"
    assert sorted(await run_faulty(8)) != sorted(first)


async def test_partition_and_heal() -> None:
    net = MemoryNetwork()
    a, b, c = (net.transport(n) for n in "abc")
    sa, sb, sc = [await t.subscribe(TOPIC) for t in (a, b, c)]
    net.partition([["a"], ["b", "c"]])
    await a.publish(TOPIC, b"from a")
    await b.publish(TOPIC, b"from b")
    await net.quiesce()
    assert await drain(sa) == [b"from a"]
    assert await drain(sb) == [b"from b"]
    assert await drain(sc) == [b"from b"]
    assert net.dropped == 3
    net.heal()
    await a.publish(TOPIC, b"healed")
    await net.quiesce()
    for sub in (sa, sb, sc):
        assert await drain(sub) == [b"healed"]


async def test_shared_injector_and_delay() -> None:
    injector = FaultInjector(FaultConfig(delay_ms=30), seed=1)
    net = MemoryNetwork(injector)
    a, b = net.transport("a"), net.transport("b")
    sub = await b.subscribe(TOPIC)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await a.publish(TOPIC, b"x")
    env = await sub.__anext__()
    assert env.payload == b"x"
    assert loop.time() - start >= 0.025


async def test_close_and_limits() -> None:
    net = MemoryNetwork(max_payload_size=10)
    a, b = net.transport("a"), net.transport("b")
    with pytest.raises(ValueError):
        net.transport("a")
    with pytest.raises(PayloadTooLarge) as err:
        await a.publish(TOPIC, b"x" * 11)
    assert err.value.limit == 10
    sub = await b.subscribe(TOPIC)
    await a.publish(TOPIC, b"queued")
    await net.quiesce()
    await b.close()
    # Already-queued envelopes are still iterated, then iteration ends.
    assert [e.payload async for e in sub] == [b"queued"]
    with pytest.raises(TransportClosed):
        await b.publish(TOPIC, b"x")
    with pytest.raises(TransportClosed):
        await b.subscribe(TOPIC)
    await b.close()  # idempotent


async def test_closed_subscription_stops_receiving() -> None:
    net = MemoryNetwork(FaultConfig(delay_ms=5))
    a, b = net.transport("a"), net.transport("b")
    sub = await b.subscribe(TOPIC)
    keep = await b.subscribe(TOPIC)
    await a.publish(TOPIC, b"late")
    await sub.close()
    await net.quiesce()
    assert [e async for e in sub] == []
    assert await drain(keep) == [b"late"]
