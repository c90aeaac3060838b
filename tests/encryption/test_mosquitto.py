"""An encrypted chat over a real Mosquitto: what the broker carries is ciphertext only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sdk.encryption import DecryptionFailed
from sdk.runtime import Node
from tests.conftest import PrivateMosquitto, require_module
from tests.encryption.helpers import Group
from tests.runtime.conftest import LARGE_QUEUES
from tests.runtime.helpers import FAST, Collector, eventually
from transports.base import topic_for_channel

require_module("paho.mqtt")

from transports.mqtt import MqttTransport  # noqa: E402 - after the check above

pytestmark = pytest.mark.integration


async def test_broker_traffic_holds_none_of_the_plaintexts(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> None:
    broker = private_mosquitto(LARGE_QUEUES)
    # A plain subscriber on the channel's topic: everything the broker relays.
    spy = MqttTransport.from_url(broker.url)
    await spy.connect()
    subscription = await spy.subscribe(topic_for_channel("room"))
    wire: list[bytes] = []

    async def capture() -> None:
        async for envelope in subscription:
            wire.append(envelope.payload)

    capturing = asyncio.create_task(capture())
    group = Group("room", ["alice", "bob", "carol"])
    names = ["alice", "bob", "carol"]
    transports = [MqttTransport.from_url(broker.url) for _ in names]
    for t in transports:
        await t.connect()
    nodes = [Node(t, n, config=FAST) for t, n in zip(transports, names, strict=True)]
    channels = [
        await node.join("room", encryption=group.handle(n))
        for node, n in zip(nodes, names, strict=True)
    ]
    collectors = [Collector(c) for c in channels]
    texts = [f"{n} says secret number {k}".encode() for n in names for k in range(5)]
    try:
        for k in range(5):
            for i, n in enumerate(names):
                await channels[i].send(f"{n} says secret number {k}".encode())
        assert await eventually(lambda: all(len(c.delivered) == 10 for c in collectors))
        for c in collectors:
            assert not any(isinstance(e, DecryptionFailed) for e in c.events)
        assert await eventually(lambda: len(wire) >= len(texts))
        relayed = b"".join(wire)
        for text in texts:
            assert text not in relayed
        for name in names:
            assert name.encode() not in relayed  # sender ids are sealed too
    finally:
        for c in collectors:
            await c.stop()
        for node in nodes:
            await node.close()
        capturing.cancel()
        for t in [*transports, spy]:
            await t.close()
