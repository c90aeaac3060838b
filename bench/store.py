"""Benchmark of the store node: ingest throughput and query latency.

Figures (JSON lines via ``bench._common.Recorder``, appended to
``bench/results/store.jsonl``):

* ``store_ingest_<backend>``: messages/s through the real ingest path
  (:class:`store_node.ingest.Ingest`: queue, decode + bound checks, merge,
  batched ``INSERT ... ON CONFLICT``), from the first submit to the end of the
  shutdown flush; ``store_raw_insert_<backend>``: the same rows, already
  decoded, in one plain bulk insert (SQLite ``executemany``, PostgreSQL
  ``COPY``) in the same run; ``store_ingest_ratio_<backend>`` = ingest / raw;
  ``store_missing_observe_cpu_us_<backend>``: the part of ingest's CPU per message
  that judges causal histories (:mod:`store_node.missing`), a 3-id history each.
* ``store_lookup100_archive_p50/p99``: a 100-id lookup with data through
  :meth:`Archive.find` on a SQLite archive of ``--archive-size`` messages
  (default 1M); ``store_lookup100_grpc_p50/p99``: the same through
  :class:`sdk.store.grpc.GrpcStoreClient` against the gRPC service
  over loopback (client and server in one process and event loop).
* ``store_page100_archive_*`` / ``store_page100_grpc_*``: a 100-message page
  of one channel from a random start time, forward, with data.

The big archive is built once by bulk insert and cached under
``$TMPDIR/chorus-bench/`` (delete it to rebuild). ``--quick`` (< 60 s) uses
20k ingest messages and a 100k archive.

Usage: ``python bench/store.py [--quick] [--archive-size N] [--no-postgres]
[--only ingest] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Recorder
from sdk.sds.message import HistoryEntry, Message, encode_message
from sdk.sds.message_id import compute_message_id
from store_node.archive.base import Archive, ArchiveRow, Criteria
from store_node.archive.sqlite import SqliteArchive
from store_node.ingest import Ingest, row_from_envelope
from store_node.missing import MissingReferences
from transports.base import Envelope, message_hash, topic_for_channel

PG_DSN = os.environ.get("CHORUS_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BASE_MS = 1_760_000_000_000
CHANNELS = 100
CONTENT = b"x" * 100
#: The node's default ([ingest] batch_size).
BATCH_SIZE = 1000


def message_id(channel: str, n: int) -> str:
    """Id of synthetic message ``n`` of ``channel`` (recomputable without storing it).

    Computed without the causal history, so any id can be recomputed on its own;
    the store never verifies ids, so that is fine for a benchmark.
    """
    return compute_message_id(channel, f"s{n % 7}", BASE_MS + n, CONTENT + str(n).encode())


def payload(channel: str, n: int) -> bytes:
    """Synthetic content message ``n`` of ``channel`` with a 3-entry causal history."""
    history = tuple(
        HistoryEntry(message_id(channel, k), message_hash(topic_for_channel(channel), b"%d" % k))
        for k in range(max(0, n - 3), n)
    )
    return encode_message(
        Message(
            sender_id=f"s{n % 7}",
            message_id=message_id(channel, n),
            channel_id=channel,
            lamport_timestamp=BASE_MS + n,
            causal_history=history,
            content=CONTENT + str(n).encode(),
        )
    )


def envelopes(count: int, channels: int = 4) -> list[Envelope]:
    """``count`` envelopes spread round-robin over ``channels`` channels."""
    out = []
    for i in range(count):
        channel = f"ch{i % channels}"
        data = payload(channel, i // channels)
        topic = topic_for_channel(channel)
        out.append(Envelope(topic, data, message_hash(topic, data)))
    return out


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 of ``samples`` (seconds) in milliseconds."""
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49] * 1000, q[98] * 1000


# -- ingest ---------------------------------------------------------------------------


async def _ingest(archive: Archive, envs: list[Envelope]) -> float:
    ingest = Ingest(archive, batch_size=BATCH_SIZE, batch_interval=0.05, queue_size=20_000)
    await ingest.start()
    started = time.perf_counter()
    for i, env in enumerate(envs):
        await ingest.submit(env)
        if i % 256 == 255:
            # A transport's reader yields to the loop between network reads; without
            # this the producer would run to completion before the writer starts.
            await asyncio.sleep(0)
    await ingest.stop()
    elapsed = time.perf_counter() - started
    assert archive.count() == len(envs), "ingest lost messages"
    return elapsed


def bench_ingest(rec: Recorder, backend: str, make: Callable[[], Archive], count: int) -> None:
    """Ingest path vs raw bulk insert of the same rows, same run, fresh archives."""
    envs = envelopes(count)
    rows = []
    for i, env in enumerate(envs):
        row = row_from_envelope(env, BASE_MS + i)
        assert isinstance(row, ArchiveRow)
        rows.append(row)
    archive = make()
    try:
        cpu = time.process_time()
        ingest_s = asyncio.run(_ingest(archive, envs))
        ingest_cpu = time.process_time() - cpu
    finally:
        _dispose(archive)
    archive = make()
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        archive.bulk_load(rows)
        raw_s = time.perf_counter() - started
        raw_cpu = time.process_time() - cpu
    finally:
        _dispose(archive)
    ingest_rate, raw_rate = count / ingest_s, count / raw_s
    rec.record(
        f"store_ingest_{backend}", ingest_rate, "msgs/s", messages=count, batch_size=BATCH_SIZE
    )
    rec.record(f"store_raw_insert_{backend}", raw_rate, "msgs/s", messages=count)
    rec.record(f"store_ingest_ratio_{backend}", ingest_rate / raw_rate, "x", target=0.5)
    # This process's CPU seconds (all threads; the database server's excluded): steadier
    # than wall time on a shared machine, and it shows what ingest adds (decoding).
    rec.record(f"store_ingest_cpu_us_{backend}", ingest_cpu / count * 1e6, "us/msg")
    rec.record(f"store_raw_insert_cpu_us_{backend}", raw_cpu / count * 1e6, "us/msg")
    # Of the ingest path: judging the rows' causal histories (store_node.missing), in
    # batches of BATCH_SIZE, every reference answered from the recent window.
    archive = make()
    try:
        tracker = MissingReferences(archive)
        cpu = time.process_time()
        for start in range(0, count, BATCH_SIZE):
            tracker.observe(rows[start : start + BATCH_SIZE])
        observe_cpu = time.process_time() - cpu
    finally:
        _dispose(archive)
    rec.record(f"store_missing_observe_cpu_us_{backend}", observe_cpu / count * 1e6, "us/msg")


def _dispose(archive: Archive) -> None:
    drop = getattr(archive, "drop_schema", None)
    if drop is not None:
        drop()
    else:
        archive.close()


# -- the big archive --------------------------------------------------------------------


def _archive_rows(size: int) -> Iterator[list[ArchiveRow]]:
    per_channel = size // CHANNELS
    batch: list[ArchiveRow] = []
    for n in range(per_channel):
        for c in range(CHANNELS):
            channel = f"ch{c}"
            data = payload(channel, n)
            arrival = BASE_MS + (n * CHANNELS + c) * 10
            batch.append(
                ArchiveRow(
                    channel_id=channel,
                    message_id=message_id(channel, n),
                    sender_id=f"s{n % 7}",
                    kind="content",
                    lamport_timestamp=BASE_MS + n,
                    causal_history=tuple(message_id(channel, k) for k in range(max(0, n - 3), n)),
                    content_size=len(CONTENT) + len(str(n)),
                    message_size=len(data),
                    first_arrival=arrival,
                    last_arrival=arrival,
                    arrival_count=1,
                    transport_hash=message_hash(topic_for_channel(channel), data),
                    data=data,
                )
            )
            if len(batch) >= 50_000:
                yield batch
                batch = []
    if batch:
        yield batch


def big_archive(size: int) -> SqliteArchive:
    """The cached SQLite archive of ``size`` messages (built by bulk insert on first use)."""
    folder = Path(tempfile.gettempdir()) / "chorus-bench"
    folder.mkdir(exist_ok=True)
    # Keyed by schema version and by the generator's first id, so a change of either
    # (e.g. the SDK's message-id rule) builds a fresh archive instead of querying ids
    # that no longer exist.
    tag = f"v{SqliteArchive.migrations[-1][0]}-{message_id('ch0', 0)[:8]}"
    path = folder / f"store-{size}-{tag}.db"
    if not path.exists():
        partial = path.with_suffix(".partial")
        for leftover in folder.glob(partial.name + "*"):
            leftover.unlink()
        started = time.perf_counter()
        archive = SqliteArchive(partial)
        archive.migrate()
        for batch in _archive_rows(size):
            archive.bulk_load(batch)
        archive.close()
        os.replace(partial, path)
        for leftover in folder.glob(partial.name + "-*"):
            leftover.unlink()
        print(f"built {path} in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    archive = SqliteArchive(path)
    archive.migrate()
    return archive


def _lookup_criteria(rng: random.Random, per_channel: int) -> Criteria:
    channel = f"ch{rng.randrange(CHANNELS)}"
    ids = tuple(message_id(channel, n) for n in rng.sample(range(per_channel), 100))
    return Criteria(channel_id=channel, message_ids=ids)


def _page_criteria(rng: random.Random, per_channel: int) -> Criteria:
    c = rng.randrange(CHANNELS)
    n = rng.randrange(per_channel - 100)
    return Criteria(channel_id=f"ch{c}", time_start=BASE_MS + (n * CHANNELS + c) * 10)


def bench_queries(rec: Recorder, archive: Archive, size: int, iterations: int) -> None:
    """Lookup and page latency through ``archive`` (of ``size`` messages) and over gRPC."""
    per_channel = size // CHANNELS
    rng = random.Random(1)
    lookups = [_lookup_criteria(rng, per_channel) for _ in range(iterations)]
    pages = [_page_criteria(rng, per_channel) for _ in range(iterations)]
    common = {
        "archive_messages": archive.count(),
        "backend": archive.backend,
        "iterations": iterations,
    }
    for name, cases in (("lookup100", lookups), ("page100", pages)):
        samples, cpu = [], []
        for criteria in cases:
            started, started_cpu = time.perf_counter(), time.thread_time()
            page = archive.find(
                criteria, after=None, forward=True, limit=100, max_bytes=3 << 20, include_data=True
            )
            samples.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
            assert len(page.messages) == 100, len(page.messages)
        p50, p99 = percentiles(samples)
        suffix = "" if archive.backend == "sqlite" else f"_{archive.backend}"
        rec.record(f"store_{name}_archive{suffix}_p50", p50, "ms", **common)
        rec.record(f"store_{name}_archive{suffix}_p99", p99, "ms", **common, target_ms=5.0)
        # The same queries in this thread's CPU time: what the query costs, without the
        # time the OS scheduler gave other processes (the wall p99 on a shared machine).
        # Waits on disk or on the PostgreSQL server are excluded too.
        c50, c99 = percentiles(cpu)
        rec.record(f"store_{name}_archive{suffix}_cpu_p50", c50, "ms", **common)
        rec.record(f"store_{name}_archive{suffix}_cpu_p99", c99, "ms", **common)
    asyncio.run(_grpc_queries(rec, archive, lookups, pages, common))


async def _grpc_queries(
    rec: Recorder,
    archive: Archive,
    lookups: list[Criteria],
    pages: list[Criteria],
    common: dict[str, object],
) -> None:
    from sdk.store.grpc import GrpcStoreClient
    from store_node.config import GrpcConfig
    from store_node.cursor import CursorCodec
    from store_node.service import StoreService, start_server

    service = StoreService(archive, GrpcConfig(), CursorCodec(os.urandom(32)))
    server, port = await start_server(service, "127.0.0.1:0")
    try:
        async with GrpcStoreClient(f"127.0.0.1:{port}") as client:
            for c in lookups[:20]:  # warm up the channel and the reader threads
                await client.get_messages(c.channel_id or "", c.message_ids)
            samples = []
            for c in lookups:
                started = time.perf_counter()
                got = await client.get_messages(c.channel_id or "", c.message_ids)
                samples.append(time.perf_counter() - started)
                assert len(got) == 100
            p50, p99 = percentiles(samples)
            sfx = "" if archive.backend == "sqlite" else f"_{archive.backend}"
            rec.record(f"store_lookup100_grpc{sfx}_p50", p50, "ms", **common)
            rec.record(f"store_lookup100_grpc{sfx}_p99", p99, "ms", **common, target_ms=5.0)
            samples = []
            for c in pages:
                started = time.perf_counter()
                page = await client.query(
                    c.channel_id, time_start=c.time_start, forward=True, page_size=100
                )
                samples.append(time.perf_counter() - started)
                assert len(page.messages) == 100
            p50, p99 = percentiles(samples)
            rec.record(f"store_page100_grpc{sfx}_p50", p50, "ms", **common)
            rec.record(f"store_page100_grpc{sfx}_p99", p99, "ms", **common)
    finally:
        await server.stop(None)
        service.close()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--archive-size", type=int, default=None)
    parser.add_argument("--ingest-messages", type=int, default=None)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument(
        "--postgres-queries",
        action="store_true",
        help="also build the big archive in a PostgreSQL schema (dropped after) and query it",
    )
    parser.add_argument(
        "--only", choices=("ingest",), default=None, help="just the ingest figures (no archive)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="ingest runs per backend (each with its own ratio)"
    )
    ns = parser.parse_args(argv)
    ingest_n = ns.ingest_messages or (20_000 if ns.quick else 100_000)
    size = ns.archive_size or (100_000 if ns.quick else 1_000_000)
    rec = Recorder("store")
    tmp = Path(tempfile.mkdtemp(prefix="chorus-bench-store-"))

    def sqlite() -> Archive:
        a = SqliteArchive(tmp / f"{uuid.uuid4().hex}.db")
        a.migrate()
        return a

    for _ in range(ns.repeat):
        bench_ingest(rec, "sqlite", sqlite, ingest_n)
    if not ns.no_postgres:
        try:
            import psycopg

            psycopg.connect(PG_DSN, connect_timeout=3).close()
        except Exception as exc:
            print(f"skipping PostgreSQL: {exc}", file=sys.stderr)
        else:
            from store_node.archive.postgres import PostgresArchive

            def postgres() -> Archive:
                a = PostgresArchive(PG_DSN, schema=f"chorus_bench_{uuid.uuid4().hex[:10]}")
                a.migrate()
                return a

            for _ in range(ns.repeat):
                bench_ingest(rec, "postgresql", postgres, ingest_n)
    if ns.only == "ingest":
        return 0
    iterations = 300 if ns.quick else 1000
    archive = big_archive(size)
    try:
        bench_queries(rec, archive, size, iterations)
    finally:
        archive.close()
    if ns.postgres_queries:
        from store_node.archive.postgres import PostgresArchive

        pg = PostgresArchive(PG_DSN, schema=f"chorus_bench_{uuid.uuid4().hex[:10]}")
        try:
            pg.migrate()
            started = time.perf_counter()
            for batch in _archive_rows(size):
                pg.bulk_load(batch)
            # Fresh tables have no statistics until autovacuum runs; give the planner some.
            pg._writer_conn().execute("ANALYZE messages")
            print(
                f"built PostgreSQL archive in {time.perf_counter() - started:.0f}s", file=sys.stderr
            )
            bench_queries(rec, pg, size, iterations)
        finally:
            pg.drop_schema()
    return 0


if __name__ == "__main__":
    sys.exit(main())
