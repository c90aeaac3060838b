"""Sealed envelopes in the store node (``docs/encryption.md``, "Working with the store node"):
archived without a key, keyed by the transport hash and the envelope's timestamp, served
by hash and by time, deduplicated, and carried by store-to-store sync."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from sdk.encryption import read_header
from store_node.archive.base import SEALED, Archive, ArchiveRow, Criteria
from store_node.config import parse_config
from store_node.ingest import (
    SEALED_FUTURE_TOLERANCE_MS,
    TIMESTAMP_OUT_OF_RANGE,
    Ingest,
    row_from_envelope,
)
from store_node.node import StoreNode
from store_node.store_sync.index import ArchiveIndex
from store_node.store_sync.service import ArchiveSide
from store_node.store_sync.session import run_session
from tests.conftest import require_service
from tests.encryption.helpers import Group, sds
from tests.store_node.store_node_helpers import BASE_MS, envelope, wait_for
from transports.base import topic_for_channel
from transports.stream import memory_pipe


def _sealed(n: int, at: int = BASE_MS) -> bytes:
    group = Group("c", ["alice", "bob"])
    handle = group.handle("alice")
    handle._clock = lambda: at  # the envelope's timestamp
    return handle.encrypt(sds("alice", f"m{n}", "c", f"secret {n}".encode()))


def _row(n: int, at: int = BASE_MS) -> ArchiveRow:
    row = row_from_envelope(envelope("c", _sealed(n, at)), at + 5)
    assert isinstance(row, ArchiveRow), row
    return row


def test_a_sealed_envelope_is_keyed_by_what_is_outside_the_seal() -> None:
    payload = _sealed(1, BASE_MS + 7)
    env = envelope("c", payload)
    row = row_from_envelope(env, BASE_MS + 100)
    assert isinstance(row, ArchiveRow), row
    assert row.kind == SEALED and row.channel_id == "c" and row.sender_id == ""
    assert row.transport_hash == env.retrieval_hint
    assert row.message_id == env.retrieval_hint.hex()
    assert row.lamport_timestamp == read_header(payload, 1 << 20).timestamp == BASE_MS + 7
    assert row.causal_history == () and row.data == payload
    assert row.message_size == len(payload) and row.first_arrival == BASE_MS + 100
    # The timestamp a peer can claim is bounded like the Lamport time.
    ahead = _sealed(2, BASE_MS + SEALED_FUTURE_TOLERANCE_MS + 1)
    assert row_from_envelope(envelope("c", ahead), BASE_MS) == TIMESTAMP_OUT_OF_RANGE
    # Not an envelope: as before.
    assert row_from_envelope(envelope("c", payload[:40]), BASE_MS) == "decode"
    assert row_from_envelope(envelope("c", b"\x02" + payload[1:]), BASE_MS) == "decode"


async def test_sealed_messages_are_archived_deduplicated_and_served(archive: Archive) -> None:
    ingest = Ingest(archive, batch_interval=0.001)
    await ingest.start()
    payloads = [_sealed(i, BASE_MS + i) for i in range(5)]
    try:
        for payload in payloads + payloads[:2]:  # two resent: same envelope, same hash
            await ingest.submit(envelope("c", payload))
    finally:
        await ingest.stop()
    assert ingest.metrics.value("chorus_store_ingest_archived_total") == 5
    assert archive.stats().total_arrivals == 7
    assert ingest.missing.count == 0

    def find(criteria: Criteria) -> list[bytes | None]:
        page = archive.find(
            criteria, after=None, forward=True, limit=100, max_bytes=1 << 20, include_data=True
        )
        return [m.data for m in page.messages]

    by_time = find(Criteria(channel_id="c", time_start=BASE_MS))
    assert sorted(by_time) == sorted(payloads)  # type: ignore[type-var]
    wanted = envelope("c", payloads[3]).retrieval_hint
    assert find(Criteria(message_hashes=(wanted,))) == [payloads[3]]
    assert find(Criteria(channel_id="c", message_ids=(wanted.hex(),))) == [payloads[3]]
    exported = [r for batch in archive.iter_export() for r in batch]
    assert {r.kind for r in exported} == {SEALED} and {r.sender_id for r in exported} == {""}


async def test_store_sync_carries_sealed_messages(archive: Archive, tmp_path: Path) -> None:
    from store_node.archive.sqlite import SqliteArchive

    other = SqliteArchive(tmp_path / "other.db")
    other.migrate()
    rows = [_row(i, BASE_MS + i) for i in range(30)]
    archive.write_batch(rows)
    other.write_batch([r for i, r in enumerate(rows) if i % 3])
    sides = []
    for a in (archive, other):
        index = ArchiveIndex(a)
        await index.call(index.open)
        ingest = Ingest(a, batch_interval=0.005)
        await ingest.start()
        sides.append((index, ingest))
    try:
        left, right, _ = memory_pipe()
        sa, sb = await asyncio.gather(
            run_session(left, ArchiveSide(*sides[0]), initiator=True),
            run_session(right, ArchiveSide(*sides[1]), initiator=False),
        )
        assert (sa.messages_received, sb.messages_received) == (0, 10)
        page = other.find(
            Criteria(channel_id="c"),
            after=None,
            forward=True,
            limit=100,
            max_bytes=1 << 20,
            include_data=True,
        )
        assert sorted(m.data for m in page.messages) == sorted(r.data for r in rows)  # type: ignore[type-var]
    finally:
        for index, ingest in sides:
            await ingest.stop()
            await asyncio.to_thread(index.close)
        other.close()


@pytest.mark.integration
async def test_a_node_that_was_down_heals_its_sealed_gap_from_its_peer(tmp_path: Path) -> None:
    """Two real nodes over Mosquitto (as tests/store_node/test_store_sync_nodes.py, with
    sealed envelopes): the one that was down gets what it missed through ``[store_sync]``."""
    require_service("Mosquitto", 1883)
    from transports import mqtt

    channel = f"sealed-sync-{uuid.uuid4().hex[:8]}"
    mqtt_options = {"kind": "mqtt", "host": "127.0.0.1", "port": 1883, "session_expiry": 5}

    def config(path: str, store_sync: dict[str, Any], **transport: Any) -> Any:
        return parse_config(
            {
                "archive": {"path": path},
                "ingest": {"channels": [channel], "batch_interval_ms": 10},
                "transport": {**mqtt_options, **transport},
                "grpc": {"listen": "127.0.0.1:0"},
                "metrics": {"listen": ""},
                "store_sync": store_sync,
            },
            tmp_path,
        )

    group = Group(channel, ["alice", "bob"])
    handle = group.handle("alice")
    sealed = [
        handle.encrypt(sds("alice", f"m{i}", channel, f"secret {i}".encode())) for i in range(30)
    ]
    a = StoreNode(config("a.db", {"listen": "127.0.0.1:0"}))
    await a.start()
    assert a.store_sync is not None and a.archive is not None
    peer = f"127.0.0.1:{a.store_sync.port}"
    b_config = config(
        "b.db",
        {"peers": [peer], "interval_s": 3600},
        persistent_session=False,
        client_id=f"chorus-test-b-{uuid.uuid4().hex[:8]}",
    )
    b = StoreNode(b_config)
    await b.start()
    archived = "chorus_store_ingest_archived_total"
    try:
        async with mqtt.MqttTransport("127.0.0.1", 1883) as publisher:
            for payload in sealed[:10]:
                await publisher.publish(topic_for_channel(channel), payload)
            await publisher.flush()
            await wait_for(lambda: a.metrics.value(archived) == 10, timeout=30)
            await wait_for(lambda: b.metrics.value(archived) == 10, timeout=30)
            await b.stop()
            for payload in sealed[10:]:
                await publisher.publish(topic_for_channel(channel), payload)
            await publisher.flush()
            await wait_for(lambda: a.metrics.value(archived) == 30, timeout=30)
        b = StoreNode(b_config)
        await b.start()
        assert b.store_sync is not None and b.archive is not None
        await wait_for(lambda: peer in b.store_sync.last, timeout=60)  # type: ignore[union-attr]
        assert b.store_sync.last[peer].messages_received == 20
        page = b.archive.find(
            Criteria(channel_id=channel),
            after=None,
            forward=True,
            limit=100,
            max_bytes=1 << 20,
            include_data=True,
        )
        assert sorted(m.data for m in page.messages) == sorted(sealed)  # type: ignore[type-var]
    finally:
        await b.stop()
        await a.stop()
