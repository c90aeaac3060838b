"""The embedded amqtt broker with the MQTT transport (MQTT 3.1.1)."""

from __future__ import annotations

import asyncio

import pytest

from transports.base import TransportError
from transports.embedded_broker import embedded_broker
from transports.mqtt import MqttTransport


async def test_round_trip_through_embedded_broker() -> None:
    async with embedded_broker() as url:
        assert url.startswith("mqtt://127.0.0.1:") and url.endswith("?protocol=3.1.1")
        async with (
            MqttTransport.from_url(url) as a,
            MqttTransport.from_url(url, protocol="3.1.1") as b,
        ):
            sub = await b.subscribe("chorus/sds/v1/demo")
            for i in range(100):
                await a.publish("chorus/sds/v1/demo", i.to_bytes(2, "big"))
            got = []
            async with asyncio.timeout(10):
                async for env in sub:
                    got.append(int.from_bytes(env.payload, "big"))
                    if len(got) == 100:
                        break
            assert got == list(range(100))
            await a.flush()


async def test_broker_shutdown_under_a_connected_client() -> None:
    async with embedded_broker() as url:
        t = MqttTransport.from_url(url, protocol="3.1.1", reconnect_min=0.05)
        await t.connect()
        await t.subscribe("chorus/sds/v1/x")
    for _ in range(100):
        if not t.connected:
            break
        await asyncio.sleep(0.02)
    assert not t.connected
    await asyncio.wait_for(t.close(), 5)


async def test_mqtt5_against_amqtt_fails_with_a_hint() -> None:
    async with embedded_broker() as url:
        t = MqttTransport.from_url(url.split("?")[0], connect_timeout=1)
        with pytest.raises(TransportError, match=r"protocol='3\.1\.1'"):
            await t.connect()
        await t.close()
