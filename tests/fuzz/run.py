"""Long-run fuzzing: ``scripts/fuzz [--inputs N] [--only NAME ...]``.

Feeds every target of :mod:`tests.fuzz.targets` ``N`` inputs (default 1,000,000):
seeded mutations of its seed corpus (:func:`~tests.fuzz.targets.mutate`) and
some random byte strings. Per target it prints one JSON line (``name``,
``value`` = inputs per second, ``unit``, and the counts: inputs, accepted,
rejected with the typed error, failures with another exception, slow inputs
over ``--slow-ms``, the slowest input's milliseconds) and appends it to
``bench/results/fuzz.jsonl``; each failing input is saved under
``bench/results/fuzz-failures/<target>/`` for replay. Exit status 1 if any
target had a failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

from tests.fuzz.targets import all_targets, mutate


def fuzz(name_filter: list[str], inputs: int, seed: int, slow_ms: float, out: Path) -> int:
    """Run the targets; return the number of failures over all of them."""
    failures_total = 0
    for target in all_targets():
        if name_filter and target.name not in name_filter:
            continue
        rng = random.Random(f"{seed}:{target.name}")
        accepted = rejected = failures = slow = 0
        slowest = 0.0
        kinds: dict[str, int] = {}
        began = time.perf_counter()
        for _ in range(inputs):
            data = mutate(target.seeds, rng)
            t0 = time.perf_counter()
            try:
                target.run(data)
            except target.allowed:
                rejected += 1
            except Exception as exc:
                failures += 1
                kind = type(exc).__name__
                kinds[kind] = kinds.get(kind, 0) + 1
                folder = out / "fuzz-failures" / target.name
                folder.mkdir(parents=True, exist_ok=True)
                (folder / hashlib.sha256(data).hexdigest()[:16]).write_bytes(data)
            else:
                accepted += 1
            elapsed = (time.perf_counter() - t0) * 1000
            if elapsed > slow_ms:
                slow += 1
            slowest = max(slowest, elapsed)
        seconds = time.perf_counter() - began
        line = {
            "name": f"fuzz.{target.name}",
            "value": round(inputs / seconds),
            "unit": "inputs/s",
            "inputs": inputs,
            "accepted": accepted,
            "rejected": rejected,
            "failures": failures,
            "failure_kinds": kinds,
            "slow": slow,
            "slow_ms": slow_ms,
            "slowest_ms": round(slowest, 1),
            "seconds": round(seconds, 1),
            "seed": seed,
        }
        print(json.dumps(line), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "fuzz.jsonl").open("a") as f:
            f.write(json.dumps({"ts": time.time(), **line}) + "\n")
        cleanup = getattr(target.run, "cleanup", None)
        if cleanup is not None:
            cleanup()
        failures_total += failures
    return failures_total


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/fuzz``."""
    p = argparse.ArgumentParser(prog="scripts/fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=1_000_000, help="inputs per target")
    p.add_argument("--only", nargs="*", default=[], help="target names (default: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow-ms", type=float, default=500.0, help="count inputs slower than this")
    p.add_argument("--results", type=Path, default=Path("bench/results"))
    ns = p.parse_args(argv)
    return 1 if fuzz(ns.only, ns.inputs, ns.seed, ns.slow_ms, ns.results) else 0


if __name__ == "__main__":
    sys.exit(main())
