"""Liveness of the SDS core on a manual clock (issue 20): acknowledgement without
false expiry, convergence after a participant is cut off, and large lossy groups.

Every scenario runs :class:`sdk.testing.simulation.GroupSimulation` with the library's
default :class:`~sdk.sds.ChannelConfig` (the point is that the defaults fit
together) unless a scenario names an override. Figures:

* ``false_expiries``: ``MessageSendExpired`` for messages every peer delivered
  (target 0 with no loss); ``resends``: resends by the core's outgoing sweep;
* ``converge_ms``: from the end of the outage (the cut-off participant
  reconnects and calls ``announce``) to every log holding every message; the
  target at 5 participants without a store is ``2 * outage + 5 s``, reported
  as ``ratio_to_target`` (<= 1 meets it);
* ``store_calls_per_gap``: store queries (by id and by time range) per
  dependency first reported missing;
* ``partition.*`` (issue 27): 5 participants without a store, everyone sending
  10 messages/s, three 3 s broker outages, then 2 of them split from the other 3
  for 6 s: ``converge_ms`` from the heal (target ``2 * partition + 5 s`` = 17 s),
  ``bytes_per_message`` (everything on the wire per content message sent),
  ``rebroadcasts_per_message`` (including chain answers), each with chain
  repair on and off (``chain``, the before and after in one run);
* ``syncs_per_message``: sync messages sent by everyone per content message
  sent (the cost of acknowledgement and gap syncs); ``rebroadcasts_per_message``
  (scale): rebroadcasts of missed messages and resends per content message sent.

Usage: ``python bench/liveness.py [--quick] [--only ack|outage|scale|partition]``
(outage: ``--groups``, ``--losses``, ``--outages``, ``--seeds N`` for seeds 1..N;
scale: ``--groups``, ``--messages``; partition: ``--losses``, ``--seeds``,
``--no-chain-baseline``); prints
JSON lines and appends them to ``bench/results/liveness.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Recorder
from sdk.sds import COMPACT, WAKU, BloomProfile, ChannelConfig
from sdk.testing.simulation import GroupSimulation, chat_through_outage, chat_through_partition
from transports.faults import FaultConfig

NET = {"delay_ms": 20, "jitter_ms": 30}


def ack_scenario(rec: Recorder, n: int, messages: int, profile: BloomProfile) -> None:
    """A fast sender, peers replying to every 10th message, no loss."""
    sim = GroupSimulation(
        n,
        config=ChannelConfig(bloom=profile),
        faults=FaultConfig(**NET),
        seed=n,
        with_store=False,
    )
    sender, *peers = sim.node_ids
    for i in range(messages):
        sim.send(sender, f"m{i}".encode())
        if i % 10 == 9:
            for peer in peers:
                sim.send(peer, f"re {i}".encode())
        sim.run_for(20)
    sim.run_for(15 * 60_000)
    delivered_by_all = {
        mid for mid in sim.records[sender].sent if all(mid in sim.nodes[p].log for p in peers)
    }
    false_expiries = len(set(sim.records[sender].expired) & delivered_by_all)
    resends = sum(c.stats["resent"] for c in sim.nodes.values())
    tags = {"participants": n, "messages": messages, "profile": profile.name}
    rec.record("ack.false_expiries", false_expiries, "messages", **tags, target=0)
    rec.record("ack.resends", resends, "messages", **tags)
    rec.record("ack.unacknowledged_at_end", len(sim.nodes[sender].outgoing), "messages", **tags)


def outage_scenario(
    rec: Recorder, n: int, outage_ms: int, loss: float, with_store: bool, seed: int = 1
) -> None:
    """Everyone chats (about 10 messages/s in all); one participant is cut off for
    ``outage_ms`` and reconnects; traffic stops 2 s after it is back."""
    sim = GroupSimulation(
        n,
        config=ChannelConfig(),
        faults=FaultConfig(loss=loss, **NET),
        seed=seed,
        with_store=with_store,
    )
    back_at = chat_through_outage(sim, sim.node_ids[0], outage_ms)
    limit = 900_000
    # Checked every 50 ms of simulated time (the default 500 ms would round a run up
    # by as much as 10 % of a 5 s target).
    converged = sim.run_until_quiet(limit, check=sim.converged, step_ms=50)
    took = sim.now - back_at
    gaps = sum(c.stats["missing"] for c in sim.nodes.values())
    tags = {
        "participants": n,
        "outage_ms": outage_ms,
        "loss": loss,
        "store": with_store,
        "seed": seed,
        "converged": converged,
    }
    target = 2 * outage_ms + 5_000
    rec.record(
        "outage.converge_ms",
        took if converged else float(limit),
        "ms",
        **tags,
        target_ms=target,
        ratio_to_target=round(took / target, 3) if converged else None,
    )
    rec.record("outage.store_calls_per_gap", sim.store_queries / max(1, gaps), "calls", **tags)
    rec.record(
        "outage.rebroadcasts",
        rebroadcasts(sim),
        "messages",
        **tags,
    )
    rec.record("outage.syncs_per_message", syncs_per_message(sim), "syncs", **tags)


def partition_scenario(
    rec: Recorder,
    loss: float,
    profile: BloomProfile,
    chain: bool,
    seed: int = 1,
    *,
    partition_ms: int = 6_000,
    kills: int = 3,
    rate: int = 10,
) -> None:
    """Issue 27: 5 participants, no store, everyone sending ``rate`` messages/s;
    ``kills`` times everyone is cut off for 3 s (a broker down), then 2 of them
    are split from the other 3 for ``partition_ms``; traffic stops 2 s after
    the heal. ``chain=False`` turns chain repair off on everyone (the core
    before it: ``chain_requests_per_sync=0``, ``chain_answer_max=0``)."""
    config = ChannelConfig(bloom=profile)
    if not chain:
        config = dataclasses.replace(config, chain_requests_per_sync=0, chain_answer_max=0)
    sim = GroupSimulation(
        5, config=config, faults=FaultConfig(loss=loss, **NET), seed=seed, with_store=False
    )
    healed_at = chat_through_partition(
        sim, sim.node_ids[3:], partition_ms, rate_per_participant=rate, kills=kills
    )
    limit = 120_000
    converged = sim.run_until_quiet(limit - (sim.now - healed_at), check=sim.converged, step_ms=50)
    took = sim.now - healed_at
    sent = len(sim.all_sent())
    tags = {
        "participants": 5,
        "partition_ms": partition_ms,
        "kills": kills,
        "rate": rate,
        "loss": loss,
        "profile": profile.name,
        "chain": chain,
        "seed": seed,
        "converged": converged,
    }
    target = 2 * partition_ms + 5_000
    rec.record(
        "partition.converge_ms",
        took if converged else float(limit),
        "ms",
        **tags,
        target_ms=target,
        ratio_to_target=round(took / target, 3) if converged else None,
        missing_at_end=sum(sent - len(c.log) for c in sim.nodes.values()),
    )
    rec.record(
        "partition.bytes_per_message", round(sim.bytes_on_wire / max(1, sent)), "bytes", **tags
    )
    rec.record(
        "partition.rebroadcasts_per_message",
        round(rebroadcasts(sim) / max(1, sent), 3),
        "messages",
        **tags,
    )
    rec.record("partition.syncs_per_message", syncs_per_message(sim), "syncs", **tags)


def rebroadcasts(sim: GroupSimulation) -> int:
    """Rebroadcasts of missed messages (by their senders, by backups and in chain
    answers) and resends."""
    return sum(
        c.stats["rebroadcast_missed"]
        + c.stats["rebroadcast_backup"]
        + c.stats["rebroadcast_chain"]
        + c.stats["resent"]
        for c in sim.nodes.values()
    )


def syncs_per_message(sim: GroupSimulation) -> float:
    """Sync messages sent by everyone per content message sent."""
    syncs = sum(c.stats["sync_sent"] for c in sim.nodes.values())
    return round(syncs / max(1, len(sim.all_sent())), 3)


def scale_scenario(
    rec: Recorder, n: int, loss: float, with_store: bool, messages: int, seed: int = 2
) -> None:
    """``n`` participants at ``loss``, with churn: every 10 s one participant is
    cut off for 5 s and reconnects."""
    sim = GroupSimulation(
        n,
        config=ChannelConfig(),
        faults=FaultConfig(loss=loss, **NET),
        seed=seed,
        with_store=with_store,
    )
    ids = sim.node_ids
    t0 = sim.now
    away: tuple[str, int] | None = None
    for i in range(messages):
        now_rel = sim.now - t0
        if away is None and now_rel % 10_000 < 100 and now_rel > 0:
            who = ids[(now_rel // 10_000) % n]
            sim.partition([who], [p for p in ids if p != who])
            away = (who, sim.now)
        elif away is not None and sim.now - away[1] >= 5_000:
            sim.heal()
            sim.reconnect(away[0], away_since=away[1])
            away = None
        sender = ids[sim.rng.randrange(n)]
        if away is None or sender != away[0]:
            sim.send(sender, f"m{i}".encode())
        sim.run_for(100)
    if away is not None:
        sim.heal()
        sim.reconnect(away[0], away_since=away[1])
    end = sim.now
    limit = 900_000
    converged = sim.run_until_quiet(limit, check=sim.converged)
    gaps = sum(c.stats["missing"] for c in sim.nodes.values())
    missing = sum(len(sim.all_sent()) - len(c.log) for c in sim.nodes.values())
    tags = {"participants": n, "loss": loss, "store": with_store, "messages": messages}
    rec.record(
        "scale.converge_ms",
        sim.now - end if converged else float(limit),
        "ms",
        **tags,
        converged=converged,
    )
    rec.record("scale.deliveries_missing", missing, "deliveries", **tags)
    rec.record("scale.store_calls_per_gap", sim.store_queries / max(1, gaps), "calls", **tags)
    rec.record("scale.syncs_per_message", syncs_per_message(sim), "syncs", **tags)
    rec.record(
        "scale.rebroadcasts_per_message",
        round(rebroadcasts(sim) / max(1, len(sim.all_sent())), 3),
        "messages",
        **tags,
    )
    rec.record(
        "scale.false_expiries",
        sum(len(r.expired) for r in sim.records.values()),
        "messages",
        **tags,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller runs")
    parser.add_argument("--only", choices=["ack", "outage", "scale", "partition"])
    parser.add_argument("--groups", type=int, nargs="*", help="outage: group sizes")
    parser.add_argument("--losses", type=float, nargs="*", help="outage: loss rates")
    parser.add_argument("--outages", type=int, nargs="*", help="outage: lengths (ms)")
    parser.add_argument("--seeds", type=int, default=1, help="outage: runs per case (seeds 1..N)")
    parser.add_argument("--messages", type=int, help="scale: messages per run")
    parser.add_argument(
        "--no-chain-baseline",
        dest="baseline",
        action="store_false",
        help="partition: skip the runs with chain repair off",
    )
    ns = parser.parse_args()
    rec = Recorder("liveness")
    began = time.perf_counter()
    if ns.only in (None, "ack"):
        for n, messages in ((2, 3_000), (3, 1_500), (5, 1_500)):
            for profile in (COMPACT, WAKU):
                ack_scenario(rec, n, messages // 5 if ns.quick else messages, profile)
    if ns.only in (None, "outage"):
        outages = ns.outages or (
            (200, 1_000, 10_000) if ns.quick else (200, 500, 1_000, 2_000, 5_000, 10_000)
        )
        groups = ns.groups or ((5,) if ns.quick else (2, 3, 5, 50))
        losses = ns.losses or ((0.0,) if ns.quick else (0.0, 0.1, 0.3))
        for n in groups:
            for outage in outages:
                for loss in losses:
                    for store in (False, True):
                        for seed in range(1, ns.seeds + 1):
                            outage_scenario(rec, n, outage, loss, store, seed)
    if ns.only in (None, "partition"):
        for loss in ns.losses or (0.0, 0.2):
            for profile in (WAKU, COMPACT):
                for chain in (True, False) if ns.baseline else (True,):
                    for seed in range(1, ns.seeds + 1):
                        partition_scenario(rec, loss, profile, chain, seed)
    if ns.only in (None, "scale"):
        runs = (
            ((50, 0.2, False, 200),)
            if ns.quick
            else (
                (50, 0.2, False, 400),
                (50, 0.2, True, 400),
                (200, 0.2, False, 400),
                (200, 0.2, True, 400),
            )
        )
        for n, loss, store, messages in runs:
            if ns.groups and n not in ns.groups:
                continue
            scale_scenario(rec, n, loss, store, ns.messages or messages)
    rec.record("wall_time", time.perf_counter() - began, "s", quick=ns.quick)


if __name__ == "__main__":
    main()
