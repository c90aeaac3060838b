"""Store-to-store sync: bytes and round trips per missing message at n archived.

Node A's archive (SQLite or PostgreSQL) holds n synthetic messages (200-byte
payloads, one per 3 ms) and their persisted sync index; node B, the node that
was down, holds the same keys except d (an in-memory range index: B's storage
does not change what crosses the wire). B initiates a session with A over an
in-memory pipe; A loads the d messages from its archive and pushes them. The
d missing messages are either one contiguous stretch of time (``gap=contiguous``,
a node that was down) or scattered (``gap=random``).

Figures (JSON lines, appended to ``bench/results/store_sync.jsonl``):

* ``store_sync.bytes_per_missing``: protocol bytes both ways (everything but
  the SDS message bytes) divided by d; ``store_sync.bytes`` the total;
* ``store_sync.round_trips``: reconciliation rounds B sent;
* ``store_sync.index_build_keys_per_s``: indexing the archive from scratch;
* ``store_sync.fingerprint_us``: one range fingerprint on the reopened
  persisted index (random ranges, cold node cache).

Usage: ``python bench/store_sync.py [--quick] [--backend sqlite|postgresql]``
(quick: n = 100k; full: n = 1M).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from _common import Recorder, ensure_repo_on_path

ensure_repo_on_path()

from sdk.sync import rbsr
from store_node.archive.base import Archive, ArchiveRow
from store_node.store_sync.index import ArchiveIndex, sync_key
from store_node.store_sync.session import (
    ReconciliationParams,
    SessionStats,
    run_session,
)
from transports.base import message_hash, topic_for_channel
from transports.stream import memory_pipe

T = TypeVar("T")
BASE_MS = 1_760_000_000_000
DS = (0, 1, 10, 100, 1000)
CHANNEL = "bench"
PG_DSN = os.environ.get("CHORUS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


class _ArchiveSide:
    """Node A: its persisted index and archive; receives nothing here."""

    def __init__(self, index: ArchiveIndex) -> None:
        self.index = index

    def source(self) -> rbsr.RangeSource:
        assert self.index.index is not None
        return self.index.index

    async def call(self, fn: Callable[[], T]) -> T:
        return await self.index.call(fn)

    async def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        return await self.index.call(lambda: self.index.load(keys))

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        raise AssertionError("A lacks nothing in this benchmark")

    async def committed(self) -> None:
        return None


class _MemorySide:
    """Node B: a range index; counts what it receives."""

    def __init__(self, index: rbsr.RangeIndex) -> None:
        self.index = index
        self.received = 0

    def source(self) -> rbsr.RangeSource:
        return self.index

    async def call(self, fn: Callable[[], T]) -> T:
        return fn()

    async def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        raise AssertionError("B has nothing A lacks in this benchmark")

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        self.received += 1

    async def committed(self) -> None:
        return None


def _rows(n: int, seed: int) -> tuple[list[ArchiveRow], list[bytes]]:
    rng = random.Random(seed)
    topic = topic_for_channel(CHANNEL)
    rows, keys = [], []
    for i in range(n):
        data = rng.randbytes(200)
        digest = message_hash(topic, data)
        lamport = BASE_MS + 3 * i
        rows.append(
            ArchiveRow(
                channel_id=CHANNEL,
                message_id=digest.hex()[:32],
                sender_id="s",
                kind="content",
                lamport_timestamp=lamport,
                causal_history=(),
                content_size=150,
                message_size=200,
                first_arrival=lamport,
                last_arrival=lamport,
                arrival_count=1,
                transport_hash=digest,
                data=data,
            )
        )
        keys.append(sync_key(lamport, digest))
    return rows, keys


def _open(backend: str, folder: Path) -> Archive:
    if backend == "sqlite":
        from store_node.archive.sqlite import SqliteArchive

        archive: Archive = SqliteArchive(folder / "a.db")
    else:
        from store_node.archive.postgres import PostgresArchive

        archive = PostgresArchive(PG_DSN, schema=f"chorus_bench_{os.getpid()}")
    archive.migrate()
    return archive


async def _session(
    a: _ArchiveSide, b: _MemorySide, params: ReconciliationParams
) -> tuple[SessionStats, SessionStats]:
    left, right, _ = memory_pipe()
    sb, sa = await asyncio.gather(
        run_session(left, b, initiator=True, params=params),
        run_session(right, a, initiator=False, params=params),
    )
    return sb, sa


async def run(
    n: int, backend: str, params: ReconciliationParams, rec: Recorder, folder: Path
) -> None:
    archive = _open(backend, folder)
    tags = {"n": n, "backend": backend, "b": params.branching, "threshold": params.threshold}
    try:
        rows, keys = _rows(n, seed=1)
        for start in range(0, n, 50_000):
            archive.bulk_load(rows[start : start + 50_000])
        del rows
        index = ArchiveIndex(archive)
        started = time.perf_counter()
        await index.call(index.open)
        rec.record(
            "store_sync.index_build_keys_per_s",
            n / (time.perf_counter() - started),
            "keys/s",
            **tags,
        )
        await asyncio.to_thread(index.close)
        # Reopened: fingerprints now come from the persisted nodes.
        index = ArchiveIndex(archive)
        await index.call(index.open)
        rng = random.Random(2)
        bounds = [tuple(sorted(rng.sample(keys, 2))) for _ in range(1000)]
        assert index.index is not None
        ix = index.index
        started = time.perf_counter()
        await index.call(lambda: [ix.summary(lo, hi) for lo, hi in bounds])
        elapsed = time.perf_counter() - started
        rec.record("store_sync.fingerprint_us", elapsed / len(bounds) * 1e6, "us", **tags)

        ordered = sorted(keys)
        middle = len(ordered) // 2
        gaps = {
            "contiguous": ordered[middle : middle + max(DS)],
            "random": rng.sample(ordered[: middle - 1] + ordered[middle + max(DS) :], max(DS)),
        }
        missing_all = {k for g in gaps.values() for k in g}
        b_index = rbsr.RangeIndex(cache_nodes=1 << 20)
        for key in ordered:
            if key not in missing_all:
                b_index.insert(key)
        a_side = _ArchiveSide(index)
        for gap, missing in gaps.items():
            other = [k for k in missing_all if k not in set(missing)]
            b_index.update(inserts=other)
            for d in DS:
                present = missing[d:]
                b_index.update(inserts=present)
                b_side = _MemorySide(b_index)
                started = time.perf_counter()
                sb, _ = await _session(a_side, b_side, params)
                wall = time.perf_counter() - started
                b_index.update(removes=present)
                assert b_side.received == d, (b_side.received, d)
                overhead = sb.overhead_bytes
                t = {**tags, "d": d, "gap": gap}
                rec.record("store_sync.bytes", overhead, "bytes", **t)
                if d:
                    rec.record("store_sync.bytes_per_missing", overhead / d, "bytes", **t)
                rec.record("store_sync.round_trips", sb.rounds_sent, "round trips", **t)
                rec.record("store_sync.seconds", wall, "s", **t)
            b_index.update(removes=other)
        await asyncio.to_thread(index.close)
    finally:
        if backend == "postgresql":
            archive.drop_schema()  # type: ignore[attr-defined]
        archive.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 100k instead of 1M")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--n", type=int, default=None, help="override n")
    defaults = ReconciliationParams()
    parser.add_argument("--branching", type=int, default=defaults.branching)
    parser.add_argument("--threshold", type=int, default=defaults.threshold)
    ns = parser.parse_args()
    n = ns.n or (100_000 if ns.quick else 1_000_000)
    params = ReconciliationParams(branching=ns.branching, threshold=ns.threshold)
    rec = Recorder("store_sync")
    with tempfile.TemporaryDirectory(prefix="chorus-store-sync-") as folder:
        asyncio.run(run(n, ns.backend, params, rec, Path(folder)))


if __name__ == "__main__":
    main()
