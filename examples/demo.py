"""Demo: a group chat of several participants over a lossy simulated network.

Every participant sends a few lines; the network drops 30% of copies,
duplicates 5%, reorders, and partitions the group for a while. A stand-in
store node answers retrieval of missing messages. At the end every participant
prints how many messages it delivered and the demo checks that all local logs
are identical. Run with ``scripts/demo`` (or ``python -m examples.demo``).
"""

from __future__ import annotations

import argparse
import sys

from sdk.sds import COMPACT, WAKU, ChannelConfig, RepairConfig
from sdk.simulation import GroupSimulation
from transports.faults import FaultConfig

LINES = [
    "hi all",
    "anyone up for lunch?",
    "the build is green again",
    "ship it",
    "who broke the coffee machine",
    "meeting moved to 3pm",
]


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit status 0 when every participant converged."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=5)
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--loss", type=float, default=0.3)
    parser.add_argument("--profile", choices=["waku", "compact"], default="compact")
    parser.add_argument("--seed", type=int, default=7)
    ns = parser.parse_args(argv)

    config = ChannelConfig(
        bloom=COMPACT if ns.profile == "compact" else WAKU,
        resend_interval_ms=2_000,
        possibly_acked_resend_interval_ms=4_000,
        sweep_interval_ms=200,
        sync_interval_ms=2_000,
        retrieval_interval_ms=1_000,
        repair=RepairConfig(t_min_ms=3_000, t_max_ms=10_000),
    )
    sim = GroupSimulation(
        ns.participants,
        config=config,
        faults=FaultConfig(loss=ns.loss, duplication=0.05, delay_ms=30, jitter_ms=120),
        seed=ns.seed,
        channel_id="demo-room",
    )
    names = sim.node_ids
    half = len(names) // 2
    print(
        f"{ns.participants} participants, {ns.messages} messages, {ns.loss:.0%} loss, "
        f"5% duplication, reordering, '{ns.profile}' bloom profile"
    )
    for i in range(ns.messages):
        if i == ns.messages // 3:
            print(f"-- partition: {names[:half]} | {names[half:]}")
            sim.partition(names[:half], names[half:])
        if i == 2 * ns.messages // 3:
            print("-- partition healed")
            sim.heal()
        sender = names[sim.rng.randrange(len(names))]
        text = f"{LINES[i % len(LINES)]} (#{i})"
        sim.send(sender, text.encode())
        sim.run_for(100)
    done = sim.run_until_quiet(600_000)

    for name in names:
        rec = sim.records[name]
        last = rec.delivered[-1].content.decode() if rec.delivered else "-"
        print(
            f"{name}: sent {len(rec.sent):3d}, delivered {len(rec.delivered):3d}, "
            f"acknowledged {len(rec.acknowledged):3d}; last delivered: {last!r}"
        )
    logs = {tuple(c.log.ids()) for c in sim.nodes.values()}
    net = sim.network
    print(
        f"network: {net.published} broadcasts, {net.dropped} copies dropped, "
        f"{sim.store_queries} store lookups; {sim.bytes_on_wire / max(1, sim.datagrams):.0f} "
        f"bytes per datagram"
    )
    if done and len(logs) == 1:
        count = len(sim.all_sent())
        print(f"CONVERGED: all {len(names)} logs hold the same {count} messages in the same order")
        return 0
    print("NOT CONVERGED", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
