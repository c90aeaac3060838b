"""The runtime over real transports: Mosquitto (with a broker restart), amqtt, libp2p."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sdk.runtime import Node, ReliableChannel, RuntimeOptions
from sdk.runtime.lossy import LossyTransport
from sdk.store.client import InMemoryStore
from tests.conftest import require_module
from tests.runtime.conftest import Broker
from tests.runtime.helpers import FAST, ArchivingTransport, converged, eventually
from transports.base import Transport, topic_for_channel
from transports.faults import FaultConfig, FaultInjector

require_module("paho.mqtt")

from transports.mqtt import MqttTransport  # noqa: E402 - after the check above

pytestmark = pytest.mark.integration


async def _group(
    transports: list[Transport], faults: FaultInjector, store: InMemoryStore
) -> tuple[list[Node], list[ReliableChannel]]:
    nodes = []
    for i, t in enumerate(transports):
        # The store node archives what reaches the broker; loss is injected below the SDK.
        lossy = LossyTransport(ArchivingTransport(t, store), faults, f"p{i}")
        nodes.append(
            Node(
                lossy,
                f"p{i}",
                config=FAST,
                store=store,
                options=RuntimeOptions(store_timeout=0.25),
            )
        )
    channels = [await node.join("room") for node in nodes]
    return nodes, channels


async def _chat(channels: list[ReliableChannel], per_sender: int, pause: float) -> None:
    async def one(i: int) -> None:
        for k in range(per_sender):
            await channels[i].send(f"p{i} message {k}".encode())
            await asyncio.sleep(pause)

    await asyncio.gather(*(one(i) for i in range(len(channels))))


async def test_five_participants_over_mosquitto_survive_loss_and_a_broker_restart(
    private_broker: Callable[[], Broker],
) -> None:
    broker = private_broker()
    store = InMemoryStore()
    faults = FaultInjector(FaultConfig(loss=0.2, duplication=0.05), seed=5)
    mqtt = [MqttTransport.from_url(broker.url, reconnect_max=0.5) for _ in range(5)]
    for t in mqtt:
        await t.connect()
    nodes, channels = await _group(list(mqtt), faults, store)
    chat = asyncio.create_task(_chat(channels, per_sender=20, pause=0.03))
    assert await eventually(lambda: all(len(c.core.log) >= 5 for c in channels))
    assert not chat.done()
    broker.kill()  # mid-stream
    assert await eventually(lambda: all(t.stats.connection_losses >= 1 for t in mqtt))
    broker.start()
    await chat
    assert await eventually(lambda: converged(channels, 100), timeout=60), [
        len(c.core.log) for c in channels
    ]
    assert all(t.stats.connection_losses >= 1 for t in mqtt)
    for node in nodes:
        await node.close()
    for t in mqtt:
        await t.close()


async def test_three_participants_over_the_embedded_amqtt_broker() -> None:
    # No broker restart here: amqtt's shutdown with QoS 1 traffic in flight
    # occasionally never returns (seen in about 1 run in 5), so the restart case is
    # covered against Mosquitto above.
    require_module("amqtt")
    from transports.embedded_broker import embedded_broker

    async with embedded_broker() as url:
        store = InMemoryStore()
        faults = FaultInjector(FaultConfig(loss=0.2), seed=2)
        mqtt = [MqttTransport.from_url(url, protocol="3.1.1") for _ in range(3)]
        for t in mqtt:
            await t.connect()
        nodes, channels = await _group(list(mqtt), faults, store)
        await _chat(channels, per_sender=10, pause=0.02)
        assert await eventually(lambda: converged(channels, 30), timeout=30)
        for node in nodes:
            await node.close()
        for t in mqtt:
            await t.close()


async def test_three_libp2p_hosts_converge_through_a_burst() -> None:
    require_module("libp2p")
    from transports.libp2p import Libp2pTransport

    a = Libp2pTransport()
    await a.start()
    b = Libp2pTransport(bootstrap=[a.addrs[0]])
    c = Libp2pTransport(bootstrap=[a.addrs[0]])
    await b.start()
    await c.start()
    hosts = [a, b, c]
    try:
        nodes = [Node(h, f"h{i}", config=FAST) for i, h in enumerate(hosts)]
        channels = [await n.join("room") for n in nodes]
        topic = topic_for_channel("room")
        await a.wait_for_peers(topic, 2)
        await b.wait_for_peers(topic, 1)
        await c.wait_for_peers(topic, 1)
        # 90 messages at once (their rate is measured in bench/transport.py, not asserted here).
        await _chat(channels, per_sender=30, pause=0)
        assert await eventually(lambda: converged(channels, 90), timeout=60), [
            len(ch.core.log) for ch in channels
        ]
        for n in nodes:
            await n.close()
    finally:
        for h in (c, b, a):
            await h.close()
