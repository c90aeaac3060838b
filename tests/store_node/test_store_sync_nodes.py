"""Two real store nodes over real Mosquitto: one is down while messages are published,
restarts, and heals its gap from the other through ``[store_sync]``.

The restarting node uses a clean MQTT session, so the broker keeps nothing for it
while it is down: whatever it gets back can only come from its peer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk.sds.message import decode_message
from store_node.archive.base import Archive, Criteria
from store_node.config import parse_config
from store_node.node import StoreNode
from tests.conftest import require_service
from tests.store_node.store_node_helpers import new_schema, postgres_dsn, sds_message, wait_for
from transports.base import topic_for_channel

pytestmark = pytest.mark.integration


def _ids(archive: Archive, channel: str) -> list[str]:
    page = archive.find(
        Criteria(channel_id=channel),
        after=None,
        forward=True,
        limit=100_000,
        max_bytes=1 << 30,
        include_data=False,
    )
    return [m.message_id for m in page.messages]


@pytest.fixture(params=["sqlite", "postgresql"])
def restarting_archive(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The ``[archive]`` of the node that goes down, on each backend."""
    if request.param == "sqlite":
        yield {"path": "b.db"}
        return
    from store_node.archive.postgres import PostgresArchive

    dsn, schema = postgres_dsn(), new_schema()
    yield {"backend": "postgresql", "dsn": dsn, "schema": schema}
    PostgresArchive(dsn, schema=schema).drop_schema()


async def test_a_node_that_was_down_heals_its_gap_from_its_peer(
    tmp_path: Path, restarting_archive: dict[str, Any]
) -> None:
    require_service("Mosquitto", 1883)
    from transports import mqtt

    channel = f"store-sync-{uuid.uuid4().hex[:8]}"  # parallel runs share the broker
    mqtt_options = {"kind": "mqtt", "host": "127.0.0.1", "port": 1883, "session_expiry": 5}

    def config(archive: dict[str, Any], store_sync: dict[str, Any], **transport: Any) -> Any:
        return parse_config(
            {
                "archive": archive,
                "ingest": {"channels": [channel], "batch_interval_ms": 10},
                "transport": {**mqtt_options, **transport},
                "grpc": {"listen": "127.0.0.1:0"},
                "metrics": {"listen": ""},
                "store_sync": store_sync,
            },
            tmp_path,
        )

    a = StoreNode(config({"path": "a.db"}, {"listen": "127.0.0.1:0"}))
    await a.start()
    assert a.store_sync is not None and a.archive is not None
    peer = f"127.0.0.1:{a.store_sync.port}"
    b_config = config(
        restarting_archive,
        {"peers": [peer], "interval_s": 3600},
        persistent_session=False,
        client_id=f"chorus-test-b-{uuid.uuid4().hex[:8]}",
    )
    b = StoreNode(b_config)
    await b.start()
    topic = topic_for_channel(channel)
    first = [sds_message(channel, i) for i in range(100)]
    gap = [sds_message(channel, i) for i in range(100, 250)]
    try:
        async with mqtt.MqttTransport("127.0.0.1", 1883) as publisher:
            for payload in first:
                await publisher.publish(topic, payload)
            await publisher.flush()
            archived = "chorus_store_ingest_archived_total"
            await wait_for(lambda: a.metrics.value(archived) == 100, timeout=30)
            await wait_for(lambda: b.metrics.value(archived) == 100, timeout=30)
            await b.stop()
            for payload in gap:
                await publisher.publish(topic, payload)
            await publisher.flush()
            await wait_for(lambda: a.metrics.value(archived) == 250, timeout=30)

        b = StoreNode(b_config)
        await b.start()
        assert b.store_sync is not None and b.archive is not None
        await wait_for(lambda: peer in b.store_sync.last, timeout=60)  # type: ignore[union-attr]
        stats = b.store_sync.last[peer]
        assert stats.messages_received == 150 and stats.messages_sent == 0
        expected = sorted(decode_message(p).message_id for p in first + gap)
        # Committed before the session ended: 0 missing, 0 duplicates on both nodes.
        assert sorted(_ids(b.archive, channel)) == expected
        assert sorted(_ids(a.archive, channel)) == expected
        assert b.archive.stats().total_arrivals == 250
        assert a.archive.stats().total_arrivals == 250
        # A second session finds nothing to do in one round trip.
        again = await b.store_sync.sync_with(peer)
        assert again.rounds_sent == 1 and again.messages_received == again.messages_sent == 0
    finally:
        await b.stop()
        await a.stop()
