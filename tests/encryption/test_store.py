"""An encrypted chat with a real store node over a real Mosquitto: the store archives and
serves ciphertext it cannot read, an offline member catches up from it, and senders'
store confirmation works on sealed messages (``docs/encryption.md``)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk.encryption import DecryptionFailed
from sdk.runtime import Node, RuntimeOptions
from store_node.archive.base import SEALED
from store_node.config import parse_config
from store_node.node import StoreNode
from tests.conftest import PrivateMosquitto, require_module
from tests.encryption.helpers import Group
from tests.runtime.conftest import LARGE_QUEUES
from tests.runtime.helpers import QUIET, Collector, eventually
from transports.base import topic_for_channel

require_module("paho.mqtt")
require_module("grpc")

from sdk.store.grpc import GrpcStoreClient  # noqa: E402 - after the checks above
from transports.mqtt import MqttTransport  # noqa: E402

pytestmark = pytest.mark.integration

#: No resends, sync messages or SDS-R: what the offline member missed reaches it
#: only through the store (as in tests/runtime/catch_up_peer.py).
CONFIG = QUIET
OPTIONS = RuntimeOptions(
    store_timeout=5.0,
    catch_up_retry_min=0.2,
    catch_up_retry_max=1.0,
    store_confirm_interval=0.2,
)


async def test_an_offline_member_catches_up_from_a_store_that_holds_only_ciphertext(
    private_mosquitto: Callable[..., PrivateMosquitto], tmp_path: Path
) -> None:
    broker = private_mosquitto(LARGE_QUEUES)
    store = StoreNode(
        parse_config(
            {
                "archive": {"path": "archive.db"},
                "ingest": {"channels": ["room"], "batch_interval_ms": 5},
                "transport": {"kind": "mqtt", "host": "127.0.0.1", "port": broker.port},
                "grpc": {"listen": "127.0.0.1:0"},
                "metrics": {"listen": ""},
            },
            tmp_path,
        )
    )
    await store.start()
    grpc = f"127.0.0.1:{store.grpc_port}"
    spy = MqttTransport.from_url(broker.url)
    await spy.connect()
    subscription = await spy.subscribe(topic_for_channel("room"))
    wire: list[bytes] = []

    async def capture() -> None:
        async for envelope in subscription:
            wire.append(envelope.payload)

    capturing = asyncio.create_task(capture())
    group = Group("room", ["alice", "bob", "carol"])
    transports: list[MqttTransport] = []
    nodes: list[Node] = []

    async def member(name: str, **kw: object) -> Node:
        transport = MqttTransport.from_url(broker.url)
        await transport.connect()
        transports.append(transport)
        client = GrpcStoreClient(grpc, timeout=5.0)
        node = Node(transport, name, store=client, config=CONFIG, options=OPTIONS, **kw)  # type: ignore[arg-type]
        nodes.append(node)
        return node

    archived = "chorus_store_ingest_archived_total"
    texts = [f"{n} says secret number {k}".encode() for k in range(4) for n in ("alice", "bob")]
    try:
        carol = await member("carol", db=tmp_path / "carol.db")
        room = await carol.join("room", encryption=group.handle("carol"))
        await room.send(b"carol was here first")
        assert await eventually(lambda: store.metrics.value(archived) == 1)
        await carol.close()

        alice, bob = await member("alice"), await member("bob")
        a = await alice.join("room", encryption=group.handle("alice"))
        b = await bob.join("room", encryption=group.handle("bob"))
        for k in range(4):
            await a.send(f"alice says secret number {k}".encode())
            await b.send(f"bob says secret number {k}".encode())
        assert await eventually(lambda: store.metrics.value(archived) >= 1 + len(texts))
        # Store confirmation, by the envelopes' hashes: every message of each sender.
        assert await eventually(
            lambda: a.stats["store_confirmed"] == 4 and b.stats["store_confirmed"] == 4
        )
        assert a.stats["store_republished"] == b.stats["store_republished"] == 0

        # Carol comes back (a clean MQTT session: the broker kept nothing for her).
        carol = await member("carol", db=tmp_path / "carol.db")
        room = await carol.join("room", encryption=group.handle("carol"))
        collector = Collector(room)
        try:
            assert await eventually(
                lambda: sorted(d.content for d in collector.delivered) == sorted(texts),
                timeout=20,
            )
            assert not any(isinstance(e, DecryptionFailed) for e in collector.events)
        finally:
            await collector.stop()

        assert store.archive is not None
        stats = store.archive.stats()
        assert stats.message_count >= 1 + len(texts)  # and sync messages: all sealed alike
        assert await eventually(lambda: len(wire) >= 1 + len(texts))
    finally:
        for node in nodes:
            await node.close()
        capturing.cancel()
        for t in [*transports, spy]:
            await t.close()
        await store.stop()

    # Everything the broker relayed and the store archived: ciphertext only.
    database = tmp_path / "archive.db"
    with sqlite3.connect(database) as conn:
        kinds = {k for (k,) in conn.execute("SELECT DISTINCT kind FROM messages")}
        senders = {s for (s,) in conn.execute("SELECT DISTINCT sender_id FROM messages")}
    assert kinds == {SEALED} and senders == {""}
    on_disk = b"".join(p.read_bytes() for p in tmp_path.glob("archive.db*"))
    relayed = b"".join(wire)
    for text in [*texts, b"carol was here first"]:
        assert text not in on_disk and text not in relayed
    for name in (b"alice", b"bob", b"carol"):
        assert name not in on_disk and name not in relayed
