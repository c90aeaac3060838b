"""Ingest over libp2p GossipSub: a publisher host dials the store node's host on loopback."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from sdk.sds.message import decode_message
from sdk.store.grpc import GrpcStoreClient
from store_node.config import parse_config
from store_node.node import StoreNode
from tests.store_node.store_node_helpers import sds_message, wait_for
from transports.base import topic_for_channel

pytestmark = pytest.mark.integration


async def test_store_node_archives_what_is_published_on_libp2p(tmp_path: Path) -> None:
    from transports import libp2p

    channel = f"store-test-{uuid.uuid4().hex[:8]}"
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel], "batch_interval_ms": 10},
            "transport": {"kind": "libp2p", "listen": ["/ip4/127.0.0.1/tcp/0"]},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    node = StoreNode(config)
    await node.start()
    try:
        addrs = node.transport.addrs  # type: ignore[union-attr]
        assert addrs and all("/ip4/127.0.0.1/" in a for a in addrs), addrs
        topic = topic_for_channel(channel)
        payloads = [sds_message(channel, i) for i in range(50)]
        async with libp2p.Libp2pTransport(bootstrap=addrs) as publisher:
            deadline = time.monotonic() + 20
            while not publisher.peers(topic):  # the node's subscription has propagated
                assert time.monotonic() < deadline, "store node never seen on the topic"
                await asyncio.sleep(0.1)
            for p in payloads:
                await publisher.publish(topic, p)
            m = node.metrics
            await wait_for(lambda: m.value("chorus_store_ingest_archived_total") == 50, timeout=30)
        async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
            ids = [decode_message(p).message_id for p in payloads]
            assert sorted(await client.get_messages(channel, ids)) == sorted(payloads)
    finally:
        await node.stop()
