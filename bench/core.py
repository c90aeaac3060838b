"""Benchmark of the SDS core (no network, no I/O): deliveries per second and
bytes on the wire per message.

Workloads, each for both bloom profiles:

* ``throughput``: ``n`` participants (2 and 10) take turns sending; every
  message is encoded once and received by the ``n - 1`` others, which deliver
  it. Causal history 2 and 200. Reported as deliveries per second (for 2
  participants this equals messages per second) and messages per second.
* ``overhead``: SDS bytes per message beyond the content, on the wire.
* ``simulation``: the lossy 10-participant simulation of the test suite
  (30% loss, 5% duplication, reordering, a healed partition, a store), to
  compare the profiles' total SDS overhead at the same delivery outcome.

Usage: ``python bench/core.py [--quick]``; prints JSON lines and appends them
to ``bench/results/core.jsonl``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Recorder
from sdk.sds import (
    COMPACT,
    WAKU,
    BloomProfile,
    ChannelConfig,
    MessageChannel,
    RepairConfig,
)
from sdk.testing.simulation import GroupSimulation
from transports.faults import FaultConfig

#: Reference figures for @waku/sds measured on this kind of machine (issue #2).
REFERENCE_MSGS_PER_S_2P = 1_300
REFERENCE_DELIVERIES_PER_S_10P = 3_000
CONTENT = b"x" * 64


def throughput(
    profile: BloomProfile, participants: int, history: int, messages: int
) -> dict[str, float]:
    """Run the round-robin workload; return timing and byte figures."""
    config = ChannelConfig(
        bloom=profile, causal_history_size=history, sync_interval_ms=0, repair=RepairConfig()
    )
    now = 1_700_000_000_000
    chans = [
        MessageChannel("bench", f"p{i}", now, config, rng=random.Random(i))
        for i in range(participants)
    ]
    wire_bytes = 0
    deliveries = 0
    # CPU time of this process: on a shared 2-core machine wall time mostly
    # measures the neighbours. Wall time is reported alongside.
    start = time.process_time()
    wall = time.perf_counter()
    for i in range(messages):
        now += 1
        sender = chans[i % participants]
        sender.send(CONTENT, now)
        for dg in sender.datagrams_to_send():
            wire_bytes += len(dg.data)
            for other in chans:
                if other is not sender:
                    other.receive(dg.data, now)
        # Drain events as an application would.
        for ch in chans:
            events = ch._events
            deliveries += sum(1 for e in events if type(e).__name__ == "MessageDelivered")
            events.clear()
    elapsed = time.process_time() - start
    wall = time.perf_counter() - wall
    expected = messages * (participants - 1)
    if deliveries != expected:
        raise SystemExit(f"benchmark broken: {deliveries} deliveries, expected {expected}")
    return {
        "seconds": elapsed,
        "wall_seconds": wall,
        "deliveries_per_s": deliveries / elapsed,
        "messages_per_s": messages / elapsed,
        "overhead_bytes": wire_bytes / messages - len(CONTENT),
    }


def simulation(profile: BloomProfile, messages: int) -> dict[str, float]:
    """The lossy simulation; SDS overhead per content message sent, all traffic included."""
    config = ChannelConfig(
        bloom=profile,
        resend_interval_ms=2_000,
        possibly_acked_resend_interval_ms=4_000,
        sweep_interval_ms=200,
        sync_interval_ms=2_000,
        retrieval_interval_ms=1_000,
        lost_timeout_ms=0,
        max_resends=None,
        repair=RepairConfig(t_min_ms=3_000, t_max_ms=10_000),
    )
    sim = GroupSimulation(10, config=config, faults=FaultConfig(0.3, 0.05, 20, 80), seed=2026)
    ids = sim.node_ids
    content_bytes = 0
    for i in range(messages):
        if i == messages * 3 // 10:
            sim.partition(ids[:5], ids[5:])
        if i == messages // 2:
            sim.heal()
        payload = f"message {i}".encode().ljust(64, b".")
        content_bytes += len(payload)
        sim.send(ids[sim.rng.randrange(10)], payload)
        sim.run_for(20)
    converged = sim.run_until_quiet(600_000)
    delivered = sum(len(r.delivered) for r in sim.records.values())
    # Content bytes on the wire include resends; count them from the datagrams.
    return {
        "converged": float(converged),
        "delivered": float(delivered),
        "datagrams": float(sim.datagrams),
        "overhead_per_message": (sim.bytes_on_wire - content_bytes) / messages,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (< 60 s)")
    ns = parser.parse_args(argv)
    rec = Recorder("core")
    scale = 1 if ns.quick else 4
    for profile in (WAKU, COMPACT):
        for participants in (2, 10):
            for history in (2, 200):
                messages = (3_000 if participants == 2 else 1_000) * scale
                if history == 200:
                    messages //= 2
                r = throughput(profile, participants, history, messages)
                tags = {"profile": profile.name, "participants": participants, "history": history}
                rec.record(
                    "core.deliveries_per_s",
                    r["deliveries_per_s"],
                    "deliveries/s",
                    cpu_seconds=round(r["seconds"], 3),
                    wall_seconds=round(r["wall_seconds"], 3),
                    **tags,
                )
                rec.record("core.messages_per_s", r["messages_per_s"], "messages/s", **tags)
                rec.record("core.overhead_bytes", r["overhead_bytes"], "bytes/message", **tags)
                if history == 2:
                    ref = (
                        REFERENCE_MSGS_PER_S_2P
                        if participants == 2
                        else REFERENCE_DELIVERIES_PER_S_10P
                    )
                    value = r["messages_per_s"] if participants == 2 else r["deliveries_per_s"]
                    rec.record(
                        "core.ratio_to_reference",
                        value / ref,
                        "x",
                        reference=ref,
                        target=10,
                        **tags,
                    )
    sims = {}
    for profile in (WAKU, COMPACT):
        s = simulation(profile, 500 if ns.quick else 2_000)
        sims[profile.name] = s
        rec.record(
            "core.sim_overhead_per_message",
            s["overhead_per_message"],
            "bytes/message",
            profile=profile.name,
            converged=bool(s["converged"]),
            delivered=int(s["delivered"]),
            datagrams=int(s["datagrams"]),
        )
    rec.record(
        "core.compact_to_waku_overhead",
        sims["compact"]["overhead_per_message"] / sims["waku"]["overhead_per_message"],
        "ratio",
        target=0.05,
        same_delivery=sims["compact"]["delivered"] == sims["waku"]["delivered"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
