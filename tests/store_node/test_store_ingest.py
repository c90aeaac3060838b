"""Ingest: batching, bad input counted and skipped, backpressure, flush, retries."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from sdk.sds.message import HistoryEntry, Message, encode_message
from sdk.testing.waiting import eventually, idle
from store_node.archive.base import Archive, ArchiveRow, WriteResult
from store_node.archive.sqlite import SqliteArchive
from store_node.ingest import BACKLOG_FACTOR, Ingest, channel_for_topic, row_from_envelope
from tests.store_node.store_node_helpers import (
    BASE_MS,
    FeedTransport,
    envelope,
    sds_message,
    wait_for,
)
from transports.base import Envelope, topic_for_channel


@pytest.fixture
def sqlite_archive(tmp_path: Path) -> SqliteArchive:
    archive = SqliteArchive(tmp_path / "a.db")
    archive.migrate()
    return archive


def test_row_from_envelope_rejects_with_reasons() -> None:
    good = sds_message("c", 1, history=("h1", "h2"))
    row = row_from_envelope(envelope("c", good), BASE_MS)
    assert isinstance(row, ArchiveRow)
    assert row.causal_history == ("h1", "h2") and row.kind == "content"
    assert row.message_size == len(good)
    assert row_from_envelope(envelope("c", b"\xff\x01garbage"), BASE_MS) == "decode"
    assert row_from_envelope(envelope("other", good), BASE_MS) == "channel_mismatch"
    huge = encode_message(Message("s", "m", "c", 1, content=b"x" * 300_000))
    assert row_from_envelope(envelope("c", huge), BASE_MS) == "too_large"
    far = encode_message(Message("s", "m", "c", 2**63, content=b"x"))
    assert row_from_envelope(envelope("c", far), BASE_MS) == "lamport_out_of_range"
    neither = encode_message(Message("s", "m", "c"))
    assert row_from_envelope(envelope("c", neither), BASE_MS) == "invalid_kind"
    nested = encode_message(
        Message("s", "m", "c", 1, causal_history=(HistoryEntry(""),), content=b"x")
    )
    assert row_from_envelope(envelope("c", nested), BASE_MS) == "missing_id"
    # A foreign topic carries no channel to check against.
    foreign = Envelope("elsewhere", good, b"h")
    assert isinstance(row_from_envelope(foreign, BASE_MS), ArchiveRow)
    assert channel_for_topic(topic_for_channel("x/y")) == "x/y"


def test_row_from_envelope_builds_the_whole_row() -> None:
    # Every field, for each kind, against a row built the plain dataclass way.
    cases = {
        "content": Message("s", "m1", "c", 7, (HistoryEntry("h1"),), b"\x01", b"body"),
        "sync": Message("s", "m2", "c", 8, bloom_filter=b"\x00" * 8),
        "ephemeral": Message("s", "m3", "c", content=b"once"),
    }
    for kind, message in cases.items():
        data = encode_message(message)
        env = Envelope(topic_for_channel("c"), data, b"hash")
        row = row_from_envelope(env, BASE_MS)
        assert row == ArchiveRow(
            channel_id="c",
            message_id=message.message_id,
            sender_id="s",
            kind=kind,
            lamport_timestamp=message.lamport_timestamp,
            causal_history=tuple(e.message_id for e in message.causal_history),
            content_size=len(message.content or b""),
            message_size=len(data),
            first_arrival=BASE_MS,
            last_arrival=BASE_MS,
            arrival_count=1,
            transport_hash=b"hash",
            data=data,
        )
        assert isinstance(row, ArchiveRow) and hash(row) == hash(dataclasses.replace(row))
        with pytest.raises(dataclasses.FrozenInstanceError):
            row.arrival_count = 2  # type: ignore[misc]
    # No retrieval hint: no transport hash.
    row = row_from_envelope(Envelope(topic_for_channel("c"), data, b""), BASE_MS)
    assert isinstance(row, ArchiveRow) and row.transport_hash is None


async def test_batches_bad_input_and_duplicates(sqlite_archive: SqliteArchive) -> None:
    ingest = Ingest(sqlite_archive, batch_size=64, batch_interval=0.01)
    await ingest.start()
    transport = FeedTransport()
    ingest.attach(await transport.subscribe(topic_for_channel("c")))
    payloads = [sds_message("c", i) for i in range(500)]
    topic = topic_for_channel("c")
    for i, p in enumerate(payloads):
        await transport.publish(topic, p)
        if i % 50 == 0:
            await transport.publish(topic, b"\x0a\xff garbage")  # never crashes ingest
        if i % 10 == 0:
            await transport.publish(topic, p)  # rebroadcast
    m = ingest.metrics
    await wait_for(lambda: m.value("chorus_store_ingest_archived_total") == 500)
    await wait_for(lambda: m.value("chorus_store_ingest_duplicates_total") == 50)
    await ingest.stop()
    assert m.value("chorus_store_ingest_rejected_total", reason="decode") == 10
    assert m.value("chorus_store_ingest_received_total") == 560
    assert sqlite_archive.count() == 500
    assert sqlite_archive.stats().total_arrivals == 550
    # All published at once: a backlog, so batches grow up to BACKLOG_FACTOR x 64.
    assert m.value("chorus_store_batch_rows_count") >= 560 / (BACKLOG_FACTOR * 64)
    assert sqlite_archive.check_integrity() == []


async def test_ephemeral_can_be_skipped(sqlite_archive: SqliteArchive) -> None:
    ingest = Ingest(sqlite_archive, batch_interval=0.0, archive_ephemeral=False)
    await ingest.start()
    await ingest.submit(envelope("c", sds_message("c", 1, ephemeral=True)))
    await ingest.submit(envelope("c", sds_message("c", 2)))
    await ingest.stop()
    assert sqlite_archive.count() == 1
    assert ingest.metrics.value("chorus_store_ingest_skipped_total", reason="ephemeral") == 1


async def test_stop_flushes_everything_received(sqlite_archive: SqliteArchive) -> None:
    # A batch interval far longer than the test: only the shutdown flush writes.
    ingest = Ingest(sqlite_archive, batch_size=10_000, batch_interval=3600)
    await ingest.start()
    for i in range(300):
        await ingest.submit(envelope("c", sds_message("c", i)))
    await idle()  # a writer that did not wait for the interval would have taken them
    assert ingest.pending == 300 and sqlite_archive.count() == 0
    await ingest.stop()
    assert sqlite_archive.count() == 300


class _GatedArchive(SqliteArchive):
    """Blocks writes until released; fails the first ``failures`` writes."""

    def __init__(self, path: Path, failures: int = 0) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.failures = failures

    def write_batch(self, rows: Sequence[ArchiveRow]) -> WriteResult:
        self.entered.set()
        self.gate.wait(10)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("database hiccup")
        return super().write_batch(rows)


async def test_backpressure_bounds_the_queue(tmp_path: Path) -> None:
    archive = _GatedArchive(tmp_path / "g.db")
    archive.migrate()
    ingest = Ingest(archive, batch_size=5, batch_interval=0.0, queue_size=8)
    await ingest.start()
    transport = FeedTransport()
    sub = await transport.subscribe(topic_for_channel("c"))
    ingest.attach(sub)
    for i in range(100):
        await transport.publish(topic_for_channel("c"), sds_message("c", i))
    assert await eventually(archive.entered.is_set)
    assert await eventually(lambda: ingest.pending == 8)
    await idle()  # a reader that is not parked would go on taking from the subscription
    # One batch is committing, one is decoded and waiting (each at most batch_size plus
    # the queue it drained), the queue is full and the reader is parked on put():
    # everything else is still in the subscription, not in ingest's memory.
    assert ingest.pending == 8
    assert sub.queue.qsize() >= 100 - 8 - 2 * (5 + 8) - 1
    archive.gate.set()
    await wait_for(lambda: ingest.metrics.value("chorus_store_ingest_archived_total") == 100)
    await ingest.stop()
    assert archive.count() == 100


async def test_backpressure_by_bytes(tmp_path: Path) -> None:
    archive = _GatedArchive(tmp_path / "b.db")
    archive.migrate()
    payloads = [sds_message("c", i, content=bytes(1000)) for i in range(40)]
    size = len(payloads[0])
    ingest = Ingest(archive, batch_size=2, batch_interval=0.0, queue_bytes=5 * size)
    await ingest.start()
    transport = FeedTransport()
    sub = await transport.subscribe(topic_for_channel("c"))
    ingest.attach(sub)
    for p in payloads:
        await transport.publish(topic_for_channel("c"), p)
    assert await eventually(archive.entered.is_set)
    assert await eventually(lambda: ingest.pending == 5)
    await idle()  # a reader that is not parked would go on taking from the subscription
    assert ingest.pending == 5
    archive.gate.set()
    await wait_for(lambda: ingest.metrics.value("chorus_store_ingest_archived_total") == 40)
    await ingest.stop()


async def test_failed_writes_are_retried(tmp_path: Path) -> None:
    archive = _GatedArchive(tmp_path / "f.db", failures=2)
    archive.gate.set()
    archive.migrate()
    ingest = Ingest(archive, batch_interval=0.0)
    await ingest.start()
    await ingest.submit(envelope("c", sds_message("c", 1)))
    await wait_for(lambda: ingest.metrics.value("chorus_store_ingest_archived_total") == 1)
    await ingest.stop()
    assert ingest.metrics.value("chorus_store_ingest_write_errors_total") == 2
    assert archive.count() == 1


async def test_ingest_on_both_backends(archive: Archive) -> None:
    ingest = Ingest(archive, batch_size=50, batch_interval=0.005)
    await ingest.start()
    for i in range(200):
        await ingest.submit(envelope("c", sds_message("c", i % 150)))
    await ingest.stop()
    assert archive.count() == 150
    assert archive.stats().total_arrivals == 200
    assert archive.check_integrity() == []


async def test_ingest_survives_a_dropped_postgresql_connection(pg_schema: tuple[str, str]) -> None:
    import psycopg

    from store_node.archive.postgres import PostgresArchive

    dsn, schema = pg_schema
    archive = PostgresArchive(dsn, schema=schema)
    archive.migrate()
    ingest = Ingest(archive, batch_size=50, batch_interval=0.005)
    await ingest.start()
    for i in range(100):
        await ingest.submit(envelope("c", sds_message("c", i)))
    await wait_for(lambda: ingest.metrics.value("chorus_store_ingest_archived_total") == 100)
    # The server drops the writer's session (restart, failover, idle timeout...).
    pid = archive._writer_conn().info.backend_pid
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    for i in range(100, 200):
        await ingest.submit(envelope("c", sds_message("c", i)))
    await wait_for(lambda: ingest.metrics.value("chorus_store_ingest_archived_total") == 200)
    await ingest.stop()
    assert ingest.metrics.value("chorus_store_ingest_write_errors_total") >= 1
    assert archive.count() == 200 and archive.check_integrity() == []
    archive.close()
