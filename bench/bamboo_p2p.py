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
  CPU cost of both sides together.
* ``bamboo_p2p.full_sync_ratio``: that rate over the rate of raw reading the same
  entries and payloads from the sending store in the same run (target >= 0.5).
  ``bamboo_p2p.full_sync_ratio_vs_verify`` compares with reading *and verifying*
  them locally (signature and payload hash), the floor any verifying sync pays.
* ``bamboo_p2p.live_latency_p50`` / ``_p99``: CPU milliseconds from appending an
  entry on one side to having it verified and stored on the other over an open
  (live) range, in memory (no network).

Usage: ``python bench/bamboo_p2p.py [--quick] [--n N]`` (quick: n = 100,000; else 1,000,000).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.documents.hashing import yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import EndpointConfig, MemoryLogStore
from sdk.sync.bamboo_p2p.pair import EndpointPair

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


def full_sync(server: MemoryLogStore, n: int, rec: Recorder) -> None:
    phone = MemoryLogStore()
    pair = EndpointPair.create(server, phone, EndpointConfig(), EndpointConfig())
    pair.exchange()
    pair.b.propose(LOG, 1, end=n)
    pair.a_events = pair.b_events = []
    t0 = time.process_time()
    while pair.exchange(1 << 20):
        pair.a_events.clear()
        pair.b_events.clear()
    sync_s = time.process_time() - t0
    assert pair.error is None, pair.error
    assert len(phone.payload_sequence_numbers(LOG)) == n
    rate = n / sync_s

    t0 = time.process_time()
    total = 0
    for seq in range(1, n + 1):
        entry = server.entry(LOG, seq)
        payload = server.payload(LOG, seq)
        assert entry is not None and payload is not None
        total += len(entry.encoded) + len(payload)
    raw_s = time.process_time() - t0

    t0 = time.process_time()
    for seq in range(1, n + 1):
        entry = server.entry(LOG, seq)
        payload = server.payload(LOG, seq)
        assert entry is not None and payload is not None
        entry.verify_signature()
        if yasmf_hash(payload) != entry.payload_hash:
            raise AssertionError("payload")
    verify_s = time.process_time() - t0

    rec.record("bamboo_p2p.full_sync_entries_per_s", rate, "entries/s", n=n)
    rec.record(
        "bamboo_p2p.full_sync_ratio",
        rate / (n / raw_s),
        "ratio",
        n=n,
        baseline="raw read from the store",
        baseline_entries_per_s=round(n / raw_s),
        target=0.5,
    )
    rec.record(
        "bamboo_p2p.full_sync_ratio_vs_verify",
        rate / (n / verify_s),
        "ratio",
        n=n,
        baseline="read and verify (signature, payload hash)",
        baseline_entries_per_s=round(n / verify_s),
    )
    wire = pair.a.stats.bytes_sent + pair.b.stats.bytes_sent
    rec.record("bamboo_p2p.full_sync_bytes_per_entry", wire / n, "bytes", n=n)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 100,000")
    parser.add_argument("--n", type=int, default=None, help="log length (overrides --quick)")
    args = parser.parse_args()
    n = args.n or (100_000 if args.quick else 1_000_000)
    rec = Recorder("bamboo_p2p")
    t0 = time.perf_counter()
    server = build_log(n)
    print(f"# built a log of {n} entries in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    sparse(server, n, rec)
    full_sync(server, n, rec)
    live(rec, n)


if __name__ == "__main__":
    main()
