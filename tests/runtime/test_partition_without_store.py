"""Issue 27 item 5 over a real Mosquitto: a group without a store recovers from a
partition. Five participants send throughout; two of them lose their link to the
broker (their own :class:`~tests.runtime.tcp_proxy.TcpProxy` cut) for 3 s while the
other three go on; after the heal only the peers can fill the gap. The long
version (6 s, 0 and 20 % loss, broker outages first) is ``bench/liveness.py
--only partition``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from sdk.runtime import Node, ReliableChannel, RuntimeOptions
from sdk.sds import COMPACT, ChannelConfig
from tests.conftest import require_module
from tests.runtime.conftest import Broker
from tests.runtime.helpers import converged, eventually
from tests.runtime.tcp_proxy import TcpProxy

require_module("paho.mqtt")

from transports.mqtt import MqttTransport  # noqa: E402 - after the check above

pytestmark = pytest.mark.integration

#: The library's liveness defaults with the compact filter, which shows only a
#: participant's newest 128-256 ids: far fewer than a partition leaves it lacking.
CONFIG = ChannelConfig(bloom=COMPACT)


async def _partition_and_heal(
    private_broker: Callable[[], Broker], config: ChannelConfig, wait: float
) -> tuple[list[ReliableChannel], int, float | None, list[Node], list[MqttTransport]]:
    broker = private_broker()
    proxies = [TcpProxy(broker.port) for _ in range(5)]
    transports: list[MqttTransport] = []
    nodes: list[Node] = []
    for proxy in proxies:
        await proxy.start()
        transport = MqttTransport.from_url(
            f"mqtt://127.0.0.1:{proxy.port}", keepalive=3, reconnect_min=0.05, reconnect_max=0.5
        )
        await transport.connect()
        transports.append(transport)
    for i, transport in enumerate(transports):
        # No store: what a participant misses only its peers can give it.
        nodes.append(
            Node(
                transport,
                f"p{i}",
                config=config,
                options=RuntimeOptions(connection_check_interval=0.1),
            )
        )
    channels = [await node.join("room") for node in nodes]
    stop = asyncio.Event()
    sent = 0

    async def chat(i: int) -> None:
        nonlocal sent
        while not stop.is_set():
            await channels[i].send(f"p{i} {sent}".encode())
            sent += 1
            await asyncio.sleep(0.1)

    chatting = [asyncio.create_task(chat(i)) for i in range(5)]
    await asyncio.sleep(1.5)
    for proxy in proxies[3:]:
        proxy.cut()
    cut_at = sent
    await asyncio.sleep(3)
    for proxy in proxies[3:]:
        proxy.restore()
    healed = time.monotonic()
    await asyncio.sleep(1)
    stop.set()
    await asyncio.gather(*chatting)
    assert sent - cut_at > 100  # the partition came under load
    took: float | None = None
    if await eventually(lambda: converged(channels, sent), timeout=wait, step=0.1):
        took = time.monotonic() - healed
    for proxy in proxies:
        await proxy.close()
    return channels, sent, took, nodes, transports


async def _close(nodes: list[Node], transports: list[MqttTransport]) -> None:
    for node in nodes:
        await node.close()
    for transport in transports:
        await transport.close()


async def test_a_partition_of_two_of_five_heals_without_a_store(
    private_broker: Callable[[], Broker],
) -> None:
    channels, sent, took, nodes, transports = await _partition_and_heal(
        private_broker, CONFIG, wait=60
    )
    try:
        print(f"converged {took} s after the heal, {sent} messages")
        assert took is not None, [(len(c.core.log), len(c.core.incoming)) for c in channels]
        assert sum(c.core.stats["rebroadcast_chain"] for c in channels) > 0
        assert all(not c.core.missing() for c in channels)
    finally:
        await _close(nodes, transports)
