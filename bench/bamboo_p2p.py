"""Benchmark of Bamboo point-to-point between two in-memory endpoints.

Figures (JSON lines, also appended to ``bench/results/bamboo_p2p.jsonl``; tag ``n``):

* ``bamboo_p2p.sparse_entries``: entries a phone stores after a sparse sync of the
  newest entry of an ``n``-entry log (proposal ``start = end = n``, lower certpool
  info 1: the lower certificate pool of ``n`` and ``n`` itself). Target: at most
  ``2 * ceil(log2 n)`` (given as ``target``).
* ``bamboo_p2p.sparse_bytes``: bytes on the wire for it, both directions, setup included.
* ``bamboo_p2p.full_sync_entries_per_s``: entries (metadata and payload) per CPU
  second for a full range sync ``1..n``, every entry verified (signature, links,
  payload hash) and stored; both endpoints run in this process, so this is the
  CPU cost of both sides together. Tag ``store``: ``memory`` (dictionaries on both
  sides) or ``sqlite`` (:class:`SqliteLogStore` on both sides, the server's file
  opened cold, the receiver committing after every batch as the driver does).
* ``bamboo_p2p.full_sync_ratio``: that rate over the rate of raw reading the same
  entries and payloads from the sending store (``entry()`` and ``payload()``; for
  ``sqlite`` from a freshly opened file), same run, same ``store`` tag (target >= 0.5).
  ``bamboo_p2p.full_sync_ratio_vs_verify`` compares with reading *and verifying*
  them (signature and payload hash), the floor any verifying sync pays.
* ``bamboo_p2p.verify_us_per_entry``: CPU microseconds of one ed25519 signature
  check (tag ``library``), the per-entry floor.
* ``bamboo_p2p.tcp_full_sync_entries_per_s``: wall-clock entries/s of the same full
  sync over TCP loopback between two processes (``python -m sdk.sync.bamboo_p2p
  serve`` on the SQLite file, the client here with a SQLite store);
  ``bamboo_p2p.tcp_sparse_ms``: wall-clock milliseconds of the sparse newest-entry
  sync over TCP, connection set-up included. Wall clock on a shared machine: noisy;
  the tag ``receiver_cpu_entries_per_s`` is the receiving process's CPU rate.
* ``bamboo_p2p.tcp_live_latency_p50`` / ``_p99``: wall milliseconds from appending an
  entry to having it stored on the other side of an open range over TCP loopback (both
  drivers in this process).
* ``bamboo_p2p.live_latency_p50`` / ``_p99``: CPU milliseconds from appending an
  entry on one side to having it verified and stored on the other over an open
  (live) range, in memory (no network).

Usage: ``python bench/bamboo_p2p.py [--quick] [--n N] [--no-tcp]`` (quick: n = 100,000;
else 1,000,000).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nacl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import Recorder
from sdk.documents.hashing import yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    Endpoint,
    EndpointConfig,
    LogStore,
    MemoryLogStore,
    Role,
    SqliteLogStore,
    append_entry,
)
from sdk.sync.bamboo_p2p.driver import BambooConnection, replicate_range, serve_bamboo
from sdk.sync.bamboo_p2p.pair import EndpointPair
from transports.stream import TcpStream, connect_tcp, serve_tcp

KEY = KeyPair.from_private_key(bytes(range(32)))
LOG = (KEY.public_key, 0)


def build_log(n: int) -> MemoryLogStore:
    store = MemoryLogStore()
    for i in range(n):
        store.append(KEY, 0, b"entry %08d of the benchmark log" % i)
    return store


def sparse(server: MemoryLogStore, n: int, rec: Recorder) -> None:
    phone = MemoryLogStore()
    pair = EndpointPair.create(server, phone)
    pair.exchange()
    pair.b.propose(LOG, n, end=n)
    pair.run()
    assert pair.error is None, pair.error
    entries = len(phone.sequence_numbers(LOG))
    wire = pair.a.stats.bytes_sent + pair.b.stats.bytes_sent
    target = 2 * math.ceil(math.log2(n))
    rec.record("bamboo_p2p.sparse_entries", entries, "entries", n=n, target=target)
    rec.record("bamboo_p2p.sparse_bytes", wire, "bytes", n=n)


def persist(memory: MemoryLogStore, path: Path, n: int) -> None:
    """Copy the log into a SQLite log store at ``path`` (one transaction)."""
    store = SqliteLogStore(str(path))
    for seq in range(1, n + 1):
        entry = memory.entry(LOG, seq)
        assert entry is not None
        store.put_entry(entry)
        store.put_payload(LOG, seq, memory.payload(LOG, seq) or b"")
    store.close()


def sync_all(server: LogStore, phone: LogStore, n: int) -> tuple[float, EndpointPair]:
    """CPU seconds to sync ``1..n`` from ``server`` into ``phone`` (both endpoints here)."""
    pair = EndpointPair.create(server, phone, EndpointConfig(), EndpointConfig())
    pair.exchange()
    pair.b.propose(LOG, 1, end=n)
    t0 = time.process_time()
    while pair.exchange(1 << 20):
        # What the driver does after each batch: commit, then report.
        phone.flush()
        pair.a_events.clear()
        pair.b_events.clear()
    phone.flush()
    elapsed = time.process_time() - t0
    assert pair.error is None, pair.error
    return elapsed, pair


def read_all(store: LogStore, n: int, *, verify: bool = False) -> float:
    """CPU seconds to read (and optionally verify) entries and payloads ``1..n``."""
    t0 = time.process_time()
    for seq in range(1, n + 1):
        entry = store.entry(LOG, seq)
        payload = store.payload(LOG, seq)
        assert entry is not None and payload is not None
        if verify:
            entry.verify_signature()
            if yasmf_hash(payload) != entry.payload_hash:
                raise AssertionError("payload")
    return time.process_time() - t0


def full_sync(server: MemoryLogStore, n: int, rec: Recorder, folder: Path) -> None:
    # In memory: both stores are dictionaries.
    phone = MemoryLogStore()
    sync_s, pair = sync_all(server, phone, n)
    assert len(phone.payload_sequence_numbers(LOG)) == n
    rate = n / sync_s
    raw_s = read_all(server, n)
    verify_s = read_all(server, n, verify=True)
    _record_full_sync(
        rec, n, "memory", rate, raw_s, verify_s, "raw read from the store", "read and verify"
    )
    wire = pair.a.stats.bytes_sent + pair.b.stats.bytes_sent
    rec.record("bamboo_p2p.full_sync_bytes_per_entry", wire / n, "bytes", n=n)

    # Persistent: SQLite on both sides, the server's file opened cold.
    persist(server, folder / "server.db", n)
    served = SqliteLogStore(str(folder / "server.db"))
    stored = SqliteLogStore(str(folder / "phone.db"))
    sync_s, _ = sync_all(served, stored, n)
    assert len(stored.payload_sequence_numbers(LOG)) == n
    rate = n / sync_s
    served.close()
    raw_s = read_all(SqliteLogStore(str(folder / "server.db")), n)
    verify_s = read_all(SqliteLogStore(str(folder / "server.db")), n, verify=True)
    _record_full_sync(
        rec,
        n,
        "sqlite",
        rate,
        raw_s,
        verify_s,
        "raw read from the store (entry() and payload() on a freshly opened file)",
        "read from the store and verify",
    )


def _record_full_sync(
    rec: Recorder,
    n: int,
    store: str,
    rate: float,
    raw_s: float,
    verify_s: float,
    raw_what: str,
    verify_what: str,
) -> None:
    """The full-sync rate and its two ratios: to raw reads (the target) and to
    reading and verifying (signature, payload hash)."""
    rec.record("bamboo_p2p.full_sync_entries_per_s", rate, "entries/s", n=n, store=store)
    rec.record(
        "bamboo_p2p.full_sync_ratio",
        rate / (n / raw_s),
        "ratio",
        n=n,
        store=store,
        baseline=raw_what,
        baseline_entries_per_s=round(n / raw_s),
        target=0.5,
    )
    rec.record(
        "bamboo_p2p.full_sync_ratio_vs_verify",
        rate / (n / verify_s),
        "ratio",
        n=n,
        store=store,
        baseline=f"{verify_what} (signature, payload hash)",
        baseline_entries_per_s=round(n / verify_s),
    )


def signature_cost(server: MemoryLogStore, n: int, rec: Recorder) -> None:
    """The floor: one ed25519 verification per entry (PyNaCl, i.e. libsodium)."""
    entries = [server.entry(LOG, seq) for seq in range(1, min(n, 20_000) + 1)]
    t0 = time.process_time()
    for entry in entries:
        assert entry is not None
        entry.verify_signature()
    per_entry = (time.process_time() - t0) / len(entries)
    rec.record(
        "bamboo_p2p.verify_us_per_entry",
        per_entry * 1e6,
        "us",
        n=len(entries),
        library=f"PyNaCl {nacl.__version__} (bundled libsodium, crypto_sign_open)",
    )


async def _tcp(folder: Path, n: int, rec: Recorder) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen(
        [sys.executable, "-m", "sdk.sync.bamboo_p2p", "serve", "--db", str(folder / "server.db")],
        stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = await asyncio.to_thread(server.stdout.readline)
        host, _, port = line.split()[1].rpartition(":")
        phone = SqliteLogStore(str(folder / "tcp-phone.db"))
        t0, cpu0 = time.perf_counter(), time.process_time()
        outcome = await replicate_range(phone, await connect_tcp(host, int(port)), LOG, 1, end=n)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        assert outcome.complete and len(phone.payload_sequence_numbers(LOG)) == n
        rec.record(
            "bamboo_p2p.tcp_full_sync_entries_per_s",
            n / wall,
            "entries/s",
            n=n,
            store="sqlite",
            network="tcp loopback, two processes",
            clock="wall",
            receiver_cpu_entries_per_s=round(n / cpu),
        )
        sparse_phone = SqliteLogStore(":memory:")
        t0 = time.perf_counter()
        outcome = await replicate_range(
            sparse_phone, await connect_tcp(host, int(port)), LOG, n, end=n
        )
        wall = time.perf_counter() - t0
        assert outcome.complete
        rec.record(
            "bamboo_p2p.tcp_sparse_ms",
            wall * 1000,
            "ms",
            n=n,
            entries=len(sparse_phone.sequence_numbers(LOG)),
            network="tcp loopback, two processes",
            clock="wall (connect included)",
        )
    finally:
        server.terminate()
        server.wait(10)


def live(rec: Recorder, n: int, samples: int = 500) -> None:
    server, phone = build_log(10), MemoryLogStore()
    pair = EndpointPair.create(server, phone)
    pair.exchange()
    pair.b.propose(LOG, 1)
    pair.run()
    latencies = []
    for i in range(samples):
        t0 = time.process_time()
        entry = server.append(KEY, 0, b"live %d" % i)
        while phone.payload(LOG, entry.seq_num) is None:
            pair.exchange()
        latencies.append((time.process_time() - t0) * 1000)
        pair.a_events.clear()
        pair.b_events.clear()
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    rec.record("bamboo_p2p.live_latency_p50", p50, "ms", n=n, samples=samples, network="none")
    rec.record("bamboo_p2p.live_latency_p99", p99, "ms", n=n, samples=samples, network="none")


async def _live_tcp(rec: Recorder, n: int, samples: int = 200) -> None:
    """Append on one side, stored on the other, over a real TCP connection (one process,
    both drivers on one event loop: the wall clock includes the sockets and the loop)."""
    server_store, phone_store = build_log(10), MemoryLogStore()
    arrived = asyncio.Event()
    phone_store.add_listener(arrived.set)

    async def handle(stream: TcpStream) -> None:
        await serve_bamboo(server_store, stream)

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    connection = BambooConnection(
        Endpoint(Role.PROACTIVE, phone_store), await connect_tcp("127.0.0.1", port)
    )
    latencies = []
    async with connection:
        await connection.propose(LOG, 1)
        while phone_store.payload(LOG, 10) is None:
            arrived.clear()
            await arrived.wait()
        for i in range(samples):
            t0 = time.perf_counter()
            entry = append_entry(server_store, KEY, 0, b"live %d" % i)
            while phone_store.payload(LOG, entry.seq_num) is None:
                arrived.clear()
                await arrived.wait()
            latencies.append((time.perf_counter() - t0) * 1000)
    server.close()
    await server.wait_closed()
    latencies.sort()
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        rec.record(
            f"bamboo_p2p.tcp_live_latency_{name}",
            latencies[min(len(latencies) - 1, int(len(latencies) * q))],
            "ms",
            n=n,
            samples=samples,
            network="tcp loopback, one process",
            clock="wall",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 100,000")
    parser.add_argument("--n", type=int, default=None, help="log length (overrides --quick)")
    parser.add_argument("--no-tcp", action="store_true", help="skip the two-process TCP sync")
    args = parser.parse_args()
    n = args.n or (100_000 if args.quick else 1_000_000)
    rec = Recorder("bamboo_p2p")
    t0 = time.perf_counter()
    server = build_log(n)
    print(f"# built a log of {n} entries in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    sparse(server, n, rec)
    signature_cost(server, n, rec)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        full_sync(server, n, rec, folder)
        if not args.no_tcp:
            asyncio.run(_tcp(folder, n, rec))
    live(rec, n)
    if not args.no_tcp:
        asyncio.run(_live_tcp(rec, n))


if __name__ == "__main__":
    main()
