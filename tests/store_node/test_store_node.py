"""Node-level behaviour: retention policy, health, structured logs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

from sdk.store.grpc import GrpcStoreClient
from store_node.archive import open_archive
from store_node.config import NodeConfig, RetentionConfig
from store_node.log import JsonFormatter
from store_node.node import StoreNode
from tests.store_node.store_node_helpers import FeedTransport, archive_row, node_config, sds_message
from transports.base import topic_for_channel


async def test_retention_by_age_and_size_and_health_count(tmp_path: Path) -> None:
    base = node_config(tmp_path)
    assert isinstance(base, NodeConfig)
    now = int(time.time() * 1000)
    day = 86_400_000
    config = dataclasses.replace(
        base, retention=RetentionConfig(max_age_days=10, max_bytes=None, interval_s=3600)
    )
    node = StoreNode(config, transport=FeedTransport())
    await node.start()
    try:
        assert node.archive is not None
        old = [archive_row("c", i, arrival=now - 20 * day + i) for i in range(30)]
        fresh = [archive_row("c", 100 + i, arrival=now - day + i) for i in range(40)]
        node.archive.write_batch(old + fresh)
        node.run_retention()
        assert node.archive.count() == 40
        assert node.metrics.value("chorus_store_retention_deleted_total", reason="age") == 30
        async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
            assert (await client.health()).message_count == 40
        one = fresh[0].message_size
        node.config = dataclasses.replace(
            config, retention=RetentionConfig(max_bytes=10 * one, interval_s=3600)
        )
        node.run_retention()
        assert node.archive.count() <= 10
        assert node.archive.stats().total_message_bytes <= 10 * one
    finally:
        await node.stop()


async def test_stop_archives_what_the_subscriptions_still_hold(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    assert isinstance(config, NodeConfig)
    transport = FeedTransport()
    node = StoreNode(config, transport=transport)
    await node.start()
    # Published without yielding: every envelope is still queued in the subscription
    # (not yet read by ingest) when the shutdown begins.
    for i in range(300):
        await transport.publish(topic_for_channel("c"), sds_message("c", i))
    await node.stop()
    with open_archive(config.archive) as archive:
        assert archive.count() == 300


async def test_stop_waits_for_a_retention_pass_before_closing_the_archive(
    tmp_path: Path,
) -> None:
    node = StoreNode(node_config(tmp_path), transport=FeedTransport())
    entered, release = threading.Event(), threading.Event()
    events: list[str] = []
    real_retention = node.run_retention

    def slow_retention() -> None:
        entered.set()
        release.wait(10)
        real_retention()  # reads the archive, as the housekeeping thread does
        events.append("retention done")

    node.run_retention = slow_retention  # type: ignore[method-assign]
    await node.start()
    assert node.archive is not None
    real_close = node.archive.close
    node.archive.close = lambda: (events.append("archive closed"), real_close())[1]  # type: ignore[method-assign]
    assert await asyncio.to_thread(entered.wait, 10)
    stopping = asyncio.ensure_future(node.stop())
    await asyncio.sleep(0.2)  # stop() has cancelled the housekeeping task by now
    release.set()
    await stopping
    assert events == ["retention done", "archive closed"]


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "store_node.ingest", "levelname": "ERROR", "msg": "batch %s", "args": ("x",)}
    )
    record.rows = 500
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "batch x" and line["rows"] == 500 and line["level"] == "error"
    assert line["logger"] == "store_node.ingest" and line["ts"].endswith("+00:00")
