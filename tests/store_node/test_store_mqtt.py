"""Ingest from real Mosquitto on 127.0.0.1:1883 through the configured MQTT transport."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sdk.sds.message import decode_message
from sdk.store.grpc import GrpcStoreClient
from store_node.config import parse_config
from store_node.node import StoreNode
from tests.conftest import require_service
from tests.store_node.store_node_helpers import sds_message, wait_for
from transports.base import topic_for_channel

pytestmark = pytest.mark.integration


async def test_store_node_archives_what_is_published_on_mqtt(tmp_path: Path) -> None:
    require_service("Mosquitto", 1883)
    from transports import mqtt

    channel = f"store-test-{uuid.uuid4().hex[:8]}"  # parallel runs share the broker
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel], "batch_interval_ms": 10},
            # The node's durable defaults (manual ack, persistent session); a short
            # expiry so no session outlives the test on the shared broker.
            "transport": {"kind": "mqtt", "host": "127.0.0.1", "port": 1883, "session_expiry": 5},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    node = StoreNode(config)
    await node.start()
    try:
        payloads = [sds_message(channel, i) for i in range(200)]
        async with mqtt.MqttTransport("127.0.0.1", 1883) as publisher:
            topic = topic_for_channel(channel)
            hints = [await publisher.publish(topic, p) for p in payloads]
            await publisher.publish(topic, b"\x00not sds")
            await publisher.publish(topic, payloads[0])  # a rebroadcast
            await publisher.flush()
        m = node.metrics
        await wait_for(lambda: m.value("chorus_store_ingest_archived_total") == 200, timeout=20)
        await wait_for(lambda: m.value("chorus_store_ingest_duplicates_total") == 1)
        await wait_for(lambda: m.value("chorus_store_ingest_rejected_total", reason="decode") == 1)
        async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
            ids = [decode_message(p).message_id for p in payloads[:50]]
            assert sorted(await client.get_messages(channel, ids)) == sorted(payloads[:50])
            # The hint the publisher got back finds the message in the store.
            assert await client.get_messages(channel, [], [hints[123]]) == [payloads[123]]
    finally:
        await node.stop()
