"""Chorus against the reference ``@waku/sds``: the same workload, both implementations, one run.

Workload: ``participants`` members of one channel; ``messages`` content messages
(``content_size`` bytes each) sent round-robin, each broadcast at once, without
loss, to every other member, which decodes and processes it (and drains its
events). Each implementation runs it in-process on a manual clock advancing
1 ms per message: Chorus here, the reference in ``node tests/interop/harness/bench.mjs``
(no stdin round trips), each after a short warm-up.

Reported per (participants, causal history) pair, for the reference, Chorus with
the ``waku`` filter profile and Chorus with the ``compact`` one:

* ``deliveries_per_s``: deliveries (messages * (participants - 1)) over the wall
  time of the whole workload, sending included;
* ``bytes_per_message``: mean encoded SDS message size (content included);
* ``deliveries_per_cpu_s``: the same over the process's CPU time, steadier than
  wall time on a shared machine;
* ``speedup`` / ``speedup_cpu``: Chorus over the reference, by wall and by CPU
  time (target ≥ 10);
* ``bytes_ratio``: Chorus bytes per message over the reference's (compact target ≤ 0.05).

Each figure is one JSON line on stdout, appended to ``bench/results/compare_waku.jsonl``.
``--quick`` runs fewer messages (under 90 s on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._common import Recorder
from sdk.sds import (
    COMPACT,
    WAKU,
    BloomProfile,
    ChannelConfig,
    MessageChannel,
    MessageDelivered,
)
from tests.interop.jsharness import ensure_harness, node_missing_reason

T0 = 1_700_000_000_000
CONTENT_SIZE = 64
#: (participants, causal history) -> messages (full run, quick run): the issue's grid.
#: Cheap configurations send more messages so each timed run lasts long enough to
#: measure on a shared machine; both implementations always run the same count.
GRID: dict[tuple[int, int], tuple[int, int]] = {
    (2, 2): (3_000, 1_000),
    (10, 2): (1_000, 300),
    (2, 200): (1_000, 300),
    (10, 200): (1_000, 300),
}


def payload(i: int, sender: str, size: int) -> bytes:
    """The same bytes the node script sends for message ``i``."""
    return f"{sender} message {i} ".ljust(size, "x")[:size].encode()


def run_chorus(
    participants: int, causal_history: int, messages: int, profile: BloomProfile, warmup: int
) -> dict[str, float]:
    """The workload on Chorus ``MessageChannel``s; returns deliveries, seconds, bytes."""

    def run(channel_id: str, count: int) -> dict[str, float]:
        config = ChannelConfig(
            causal_history_size=causal_history,
            bloom=profile,
            verify_message_ids=False,
            sync_interval_ms=0,
        )
        now = T0
        members = [
            MessageChannel(channel_id, f"p{p}", now, config, rng=random.Random(p))
            for p in range(participants)
        ]
        delivered = 0
        sent_bytes = 0
        cpu_start = time.process_time()
        start = time.perf_counter()
        for i in range(count):
            now += 1
            sender = members[i % participants]
            sender.send(payload(i, sender.participant_id, CONTENT_SIZE), now)
            while sender.next_event() is not None:
                pass
            for datagram in sender.datagrams_to_send():
                sent_bytes += len(datagram.data)
                for member in members:
                    if member is sender:
                        continue
                    member.receive(datagram.data, now)
                    while (event := member.next_event()) is not None:
                        if isinstance(event, MessageDelivered):
                            delivered += 1
        seconds = time.perf_counter() - start
        return {
            "deliveries": delivered,
            "seconds": seconds,
            "cpu_seconds": time.process_time() - cpu_start,
            "bytes_per_message": sent_bytes / count,
        }

    run("warmup", min(warmup, messages))
    result = run("bench", messages)
    expected = messages * (participants - 1)
    if result["deliveries"] != expected:
        raise RuntimeError(f"expected {expected} deliveries, got {result['deliveries']}")
    return result


def run_reference(
    folder: Path, participants: int, causal_history: int, messages: int, warmup: int
) -> dict[str, float]:
    """The workload on ``@waku/sds`` in one node process."""
    params = {
        "participants": participants,
        "causal_history": causal_history,
        "messages": messages,
        "content_size": CONTENT_SIZE,
        "warmup": warmup,
    }
    proc = subprocess.run(
        ["node", str(folder / "bench.mjs"), json.dumps(params)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node bench.mjs failed: {proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (< 90 s)")
    parser.add_argument("--messages", type=int, help="messages for every configuration")
    parser.add_argument(
        "--history", type=int, help="only the configurations with this causal history size"
    )
    args = parser.parse_args(argv)

    reason = node_missing_reason()
    if reason is not None:
        print(f"compare_waku: {reason}", file=sys.stderr)
        return 2
    folder = ensure_harness()
    version = json.loads((folder / "node_modules" / "@waku" / "sds" / "package.json").read_text())[
        "version"
    ]
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    recorder = Recorder("compare_waku")
    warmup = 30 if args.quick else 100
    run_info = {
        "quick": args.quick,
        "content_size": CONTENT_SIZE,
        "waku_sds": version,
        "node": node,
        "cpus": os.cpu_count(),
    }

    for (participants, history), (full, quick) in GRID.items():
        if args.history is not None and history != args.history:
            continue
        messages = args.messages or (quick if args.quick else full)
        shape = {
            "participants": participants,
            "causal_history": history,
            "messages": messages,
            **run_info,
        }
        results = {
            "waku-sds": run_reference(folder, participants, history, messages, warmup),
            "chorus-waku": run_chorus(participants, history, messages, WAKU, warmup),
            "chorus-compact": run_chorus(participants, history, messages, COMPACT, warmup),
        }
        for impl, r in results.items():
            recorder.record(
                "compare_waku.deliveries_per_s",
                r["deliveries"] / r["seconds"],
                "deliveries/s",
                impl=impl,
                **shape,
            )
            recorder.record(
                "compare_waku.deliveries_per_cpu_s",
                r["deliveries"] / r["cpu_seconds"],
                "deliveries/cpu-s",
                impl=impl,
                **shape,
            )
            recorder.record(
                "compare_waku.bytes_per_message",
                r["bytes_per_message"],
                "bytes",
                impl=impl,
                **shape,
            )
        ref = results["waku-sds"]
        ref_rate = ref["deliveries"] / ref["seconds"]
        for impl in ("chorus-waku", "chorus-compact"):
            r = results[impl]
            recorder.record(
                "compare_waku.speedup",
                r["deliveries"] / r["seconds"] / ref_rate,
                "x",
                impl=impl,
                target=10,
                **shape,
            )
            recorder.record(
                "compare_waku.speedup_cpu",
                (r["deliveries"] / r["cpu_seconds"]) / (ref["deliveries"] / ref["cpu_seconds"]),
                "x",
                impl=impl,
                target=10,
                **shape,
            )
            recorder.record(
                "compare_waku.bytes_ratio",
                r["bytes_per_message"] / ref["bytes_per_message"],
                "ratio",
                impl=impl,
                target=0.05 if impl == "chorus-compact" else None,
                **shape,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
