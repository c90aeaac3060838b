"""Benchmark of the document layer: materialization, signing, verification, ingest.

Figures (one JSON object per line, also appended to ``bench/results/documents.jsonl``):

* ``materialize.10k`` / ``materialize.100k``: operations materialized per second
  for one document of 10,000 and 100,000 operations with concurrent branches
  (up to four writers branch off the same view, write the same fields, and a
  later operation merges them), given in random order. ``materialize.scaling``
  is the 100k time over the 10k time (linear would be 10; the target is <= ~12);
  ``dict_baseline.scaling`` is the same ratio for merely indexing the ids and
  looking up every edge once, the platform's floor for any id-linked walk.
  The main figures take the operations in a causal order (how SDS delivers
  them and how the store keeps them); ``.shuffled`` in uniformly random order.
* ``store_apply.10k`` / ``store_apply.100k``: the same documents applied one
  operation at a time as the store does on arrival, the view current after each.
* ``sign``: Bamboo entries (with their CBOR operations) signed per second.
* ``verify``: entries decoded and verified per second (signature, payload hash).
* ``ingest``: entries per second through the SQLite store, every check included.

Times are CPU times (best of several runs): the machines this runs on are shared.

Usage: ``python bench/documents.py [--quick]`` (``--quick`` takes well under a minute).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from blake3 import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.documents import (
    Action,
    DocumentStore,
    KeyPair,
    Operation,
    OperationRecord,
    Schema,
    decode_entry,
    encode_operation,
    materialize,
    sign_entry,
)
from sdk.documents.store import _DocumentState

SCHEMA = Schema.application(
    "bench", ("0020" + "22" * 32,), "bench item", {"title": "str", "n": "int", "done": "bool"}
)


def branching_document(n: int, seed: int = 1) -> list[OperationRecord]:
    """A document of ``n`` operations in a causal arrival order.

    Rounds of 1-4 writers, each writing a chain of 1-3 operations that branch
    off the previous round's tips (so every round but single-writer ones ends in
    a merge). The writers' chains are interleaved the way a causal delivery
    (SDS) would hand them over.
    """
    rng = random.Random(seed)
    counter = 0

    def new_id() -> str:
        nonlocal counter
        counter += 1
        return "0020" + blake3(counter.to_bytes(8, "big")).hexdigest()

    root = new_id()
    fields0 = {"title": "t", "n": 0, "done": False}
    ops = [OperationRecord(root, root, Action.CREATE, SCHEMA.id, (), fields0)]
    tips: tuple[str, ...] = (root,)
    while len(ops) < n:
        chains = [[tips, rng.randint(1, 3)] for _ in range(rng.randint(1, 4))]
        heads: list[str] = []
        while chains and len(ops) < n:
            chain = chains[rng.randrange(len(chains))]
            op_id = new_id()
            fields = {"title": f"{len(ops)}"} if rng.random() < 0.7 else {"n": len(ops)}
            ops.append(OperationRecord(op_id, root, Action.UPDATE, SCHEMA.id, chain[0], fields))
            chain[0], chain[1] = (op_id,), chain[1] - 1
            if chain[1] == 0:
                chains.remove(chain)
                heads.append(op_id)
        heads += [c[0][0] for c in chains if c[0] != tips]
        tips = tuple(sorted(heads)) or tips
    return ops


def time_best(fn: Any, repeat: int) -> float:
    """Best CPU time of ``repeat`` runs of ``fn()``.

    CPU time (``process_time``), not wall time: the benchmark machines are
    shared, and a preempted run would otherwise count other processes' work.
    """
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def bench_materialize(rec: Recorder, repeat: int) -> None:
    """Materialization throughput and scaling, 10k vs 100k operations."""
    # Both documents exist before timing starts and runs alternate, so the two
    # sizes are measured under the same memory layout and machine load.
    documents = {n: branching_document(n) for n in (10_000, 100_000)}
    shuffled = {n: random.Random(2).sample(ops, len(ops)) for n, ops in documents.items()}
    for ops in documents.values():
        assert materialize(ops) == materialize(shuffled[len(ops)])
    best: dict[tuple[int, str], float] = {}
    for _ in range(repeat):
        for n, ops in documents.items():
            for order, given in (("causal", ops), ("shuffled", shuffled[n])):
                t = time_best(lambda given=given: materialize(given), 1)
                best[n, order] = min(best.get((n, order), t), t)
    for order in ("causal", "shuffled"):
        suffix = "" if order == "causal" else ".shuffled"
        for n, label in ((10_000, "10k"), (100_000, "100k")):
            merges = sum(1 for op in documents[n] if len(op.previous) > 1)
            t = best[n, order]
            rec.record(
                f"materialize.{label}{suffix}",
                n / t,
                "ops/s",
                ops=n,
                merges=merges,
                input_order=order,
                cpu_seconds=round(t, 4),
            )
        ratio = best[100_000, order] / best[10_000, order]
        rec.record(f"materialize.scaling{suffix}", ratio, "x", input_order=order, target="<= 12")
    # The platform's own factor: only build an id -> position dict and look up each
    # edge once (the least any id-linked graph walk must do). Where this exceeds 10,
    # the excess comes from caches and memory, not from the algorithm.
    base = {
        n: time_best(lambda ops=ops: _lookup_every_edge(ops), repeat)
        for n, ops in documents.items()
    }
    rec.record("dict_baseline.scaling", base[100_000] / base[10_000], "x", input_order="causal")
    # The store's path: operations applied one by one as they arrive, each view
    # current after every arrival (concurrent arrivals resume the walk at a checkpoint).
    for n, label in ((10_000, "10k"), (100_000, "100k")):
        ops = documents[n]
        t = time_best(lambda ops=ops: _apply_one_by_one(ops), max(1, repeat // 5))
        rec.record(f"store_apply.{label}", n / t, "ops/s", ops=n, cpu_seconds=round(t, 4))


def _apply_one_by_one(ops: list[OperationRecord]) -> None:
    state = _DocumentState(ops[0])
    for op in ops[1:]:
        state.add(op)


def _lookup_every_edge(ops: list[OperationRecord]) -> int:
    index = {op.id: i for i, op in enumerate(ops)}
    return sum(index[p] for op in ops for p in op.previous)


def bench_sign_verify_ingest(rec: Recorder, n: int, repeat: int) -> None:
    """Entries signed, verified and ingested per second."""
    key = KeyPair.from_private_key(b"\x05" * 32)
    payloads = [
        encode_operation(
            Operation(Action.CREATE, SCHEMA.id, None, {"title": f"item {i}", "n": i, "done": False})
        )
        for i in range(n)
    ]
    entries = [sign_entry(key, i, 1, payload) for i, payload in enumerate(payloads)]

    def sign_all() -> None:
        for i, payload in enumerate(payloads):
            sign_entry(key, i, 1, payload)

    def verify_all() -> None:
        for entry, payload in zip(entries, payloads, strict=True):
            decoded = decode_entry(entry.encoded)
            decoded.verify_payload(payload)
            decoded.verify_signature()

    def ingest_all() -> None:
        store = DocumentStore()
        store.add_schema(SCHEMA)
        for entry, payload in zip(entries, payloads, strict=True):
            store.ingest(entry.encoded, payload)

    for name, fn, extra in (
        ("sign", sign_all, {}),
        ("verify", verify_all, {}),
        ("ingest", ingest_all, {"store": "sqlite :memory:"}),
    ):
        t = time_best(fn, repeat)
        rec.record(name, n / t, "entries/s", entries=n, cpu_seconds=round(t, 4), **extra)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (< 60 s)")
    ns = parser.parse_args(argv)
    rec = Recorder("documents")
    bench_materialize(rec, repeat=5 if ns.quick else 15)
    bench_sign_verify_ingest(rec, 2_000 if ns.quick else 10_000, repeat=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
