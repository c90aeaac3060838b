"""The libp2p GossipSub transport: three hosts on loopback, bridged into asyncio."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair

from sdk.testing.waiting import eventually
from tests.transports.conftest import free_port
from transports.base import PayloadTooLarge, Subscription, TransportClosed, TransportError
from transports.libp2p import Libp2pTransport

TOPIC = "chorus/sds/v1/p2p-test"


async def collect(sub: Subscription, n: int, timeout: float = 20.0) -> list[bytes]:
    """The next ``n`` payloads on ``sub``; TimeoutError if they do not all come."""
    out: list[bytes] = []
    async with asyncio.timeout(timeout):
        async for env in sub:
            out.append(env.payload)
            if len(out) == n:
                break
    return out


@pytest.fixture
async def trio_hosts() -> AsyncIterator[list[Libp2pTransport]]:
    """Three hosts on 127.0.0.1: b and c dial a, so c reaches b only through a."""
    a = Libp2pTransport()
    await a.start()
    boot = [a.addrs[0]]
    b = Libp2pTransport(bootstrap=boot)
    c = Libp2pTransport(bootstrap=boot)
    await b.start()
    await c.start()
    try:
        yield [a, b, c]
    finally:
        for t in (c, b, a):
            await t.close()


async def test_three_hosts_burst_faster_than_ten_per_second(
    trio_hosts: list[Libp2pTransport],
) -> None:
    a, b, c = trio_hosts
    for t in trio_hosts:
        assert all(addr.startswith("/ip4/127.0.0.1/") for addr in t.addrs)
    subs = [await t.subscribe(TOPIC) for t in trio_hosts]
    await a.wait_for_peers(TOPIC, 2)
    await b.wait_for_peers(TOPIC, 1)
    await c.wait_for_peers(TOPIC, 1)

    # Everyone hears one message from each host (own messages included).
    for t in trio_hosts:
        await t.publish(TOPIC, f"hello from {t.peer_id}".encode())
    for sub in subs:
        assert len(set(await collect(sub, 3))) == 3

    # A burst of 100 from c, far above py-libp2p's default 10 msg/s limit;
    # b gets it relayed by a.
    burst = [b"burst-%03d" % i for i in range(100)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    for payload in burst:
        await c.publish(TOPIC, payload)
    assert loop.time() - start < 5, "publishing is paced far above 10/s"
    for sub in subs:
        assert sorted(await collect(sub, 100)) == burst
    assert c.stats.published == 101


async def test_default_spam_limit_drops_a_burst() -> None:
    """Why the adapter raises the limit: with py-libp2p's 10/s, a burst is cut short."""
    async with (
        Libp2pTransport(spam_limit=10, publish_rate=10_000) as a,
        Libp2pTransport(bootstrap=[a.addrs[0]], spam_limit=10) as b,
    ):
        sub = await b.subscribe(TOPIC)
        await a.subscribe(TOPIC)
        await a.wait_for_peers(TOPIC, 1)
        for i in range(40):
            await a.publish(TOPIC, bytes([i]))
        # Then a marker, again until one passes the limit: what is left of the burst
        # arrives before it (one stream from a to b, in order).
        got: list[bytes] = []

        async def marker_arrived() -> bool:
            await a.publish(TOPIC, b"marker")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    async for env in sub:
                        if env.payload == b"marker":
                            return True
                        got.append(env.payload)
            return False

        assert await eventually(marker_arrived)
        assert len(got) <= 20


async def test_limits_lifecycle_and_unsubscribe() -> None:
    t = Libp2pTransport()
    with pytest.raises(TransportError, match="not running"):
        await t.publish(TOPIC, b"x")
    async with t:
        assert t.max_payload_size is not None
        with pytest.raises(PayloadTooLarge):
            await t.publish(TOPIC, b"x" * (t.max_payload_size + 1))
        with pytest.raises(ValueError):
            await t.connect("/ip4/127.0.0.1/tcp/1")  # no /p2p/ peer id
        first = await t.subscribe(TOPIC)
        second = await t.subscribe(TOPIC)
        await t.publish(TOPIC, b"one")
        assert await collect(first, 1) == [b"one"]
        assert await collect(second, 1) == [b"one"]
        await first.close()
        await t.publish(TOPIC, b"two")
        assert await collect(second, 1) == [b"two"]
        await second.close()
        third = await t.subscribe(TOPIC)
        await t.publish(TOPIC, b"three")
        assert await collect(third, 1) == [b"three"]
    assert [e async for e in third] == []
    with pytest.raises(TransportClosed):
        await t.publish(TOPIC, b"x")


async def test_restarted_bootstrap_peer_is_redialled() -> None:
    port = free_port()
    key = create_new_key_pair()
    listen = [f"/ip4/127.0.0.1/tcp/{port}"]
    a = Libp2pTransport(listen=listen, key_pair=key)
    await a.start()
    boot = a.addrs[0]
    async with Libp2pTransport(bootstrap=[boot], redial_interval=0.2) as b:
        await b.subscribe(TOPIC)
        await a.subscribe(TOPIC)
        await a.wait_for_peers(TOPIC, 1)
        await a.close()

        again = Libp2pTransport(listen=listen, key_pair=key)
        async with again:
            assert again.addrs[0] == boot, "same port and peer id"
            sub = await again.subscribe(TOPIC)
            await b.wait_for_peers(TOPIC, 1, timeout=15)
            await b.publish(TOPIC, b"after restart")
            assert await collect(sub, 1) == [b"after restart"]


async def test_a_subscriber_that_stops_reading_holds_bounded_memory() -> None:
    """Bounded subscriptions (issue 17.5): the pump waits for room instead of queueing
    without bound; past the trio channel GossipSub drops, as it does by design."""
    async with (
        Libp2pTransport() as a,
        Libp2pTransport(bootstrap=[a.addrs[0]], max_pending=20) as b,
    ):
        sub = await b.subscribe(TOPIC)
        await a.subscribe(TOPIC)
        await a.wait_for_peers(TOPIC, 1)
        for i in range(200):
            await a.publish(TOPIC, i.to_bytes(2, "big"))
        from transports.base import QueueSubscription

        assert isinstance(sub, QueueSubscription)
        assert await eventually(lambda: b.stats.read_pauses >= 1)
        assert sub.pending() <= 21
        # Reading again drains what was held and lets the pump go on.
        assert len(await collect(sub, 20)) == 20
