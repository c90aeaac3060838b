"""``scripts/campaign``: the campaigns of ``tests/reliability`` from the command line.

``--target store`` (the default) kills the store node under MQTT load, per backend
(``store_campaign``); ``--target participants|broker|partition`` kills SDK
participants, kills the broker, or partitions a participant while participants send
(``participant_campaign``). Each run prints one JSON line and appends it to
``--results``; the exit status is 1 unless every run was clean.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from pathlib import Path
from typing import Literal, cast

from tests.reliability.harness import append_result
from tests.reliability.participant_campaign import ParticipantCampaignConfig, Target, run
from tests.reliability.store_campaign import CampaignConfig, run_campaign


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/campaign",
        description="kill -9, broker-restart and partition campaigns over a private Mosquitto",
    )
    p.add_argument(
        "--target",
        choices=["store", "participants", "broker", "partition"],
        default="store",
        help="store: kill the store node (default); participants: kill SDK participants; "
        "broker: kill Mosquitto; partition: cut a participant off the broker",
    )
    p.add_argument("--kills", type=int, default=10, help="kills, restarts or partitions")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="messages/s: in total for the store (500), per participant otherwise (20)",
    )
    p.add_argument("--up-min", type=float, default=2.0)
    p.add_argument("--up-max", type=float, default=5.0)
    p.add_argument(
        "--down", type=float, default=None, help="seconds down or partitioned (2; partition 6)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path("bench/results/campaign"))
    p.add_argument("--results", type=Path, default=Path("bench/results/campaign.jsonl"))
    store = p.add_argument_group("--target store")
    store.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    store.add_argument("--publishers", type=int, default=3)
    store.add_argument("--channels", type=int, default=2)
    p.add_argument("--protocol", choices=["5", "3.1.1"], default="5", help="MQTT version")
    store.add_argument(
        "--mode",
        choices=["durable", "persistent", "none"],
        default="durable",
        help="durable: the node's defaults; persistent: persistent session but ack on "
        "receipt; none: ack on receipt and clean session (before issue 17)",
    )
    participants = p.add_argument_group("--target participants|broker|partition")
    participants.add_argument("--participants", type=int, default=3)
    participants.add_argument("--size", type=int, default=200, help="bytes per message")
    participants.add_argument(
        "--no-store-confirm",
        dest="store_confirm",
        action="store_false",
        help="participants do not check that the store holds what they published "
        "(the runtime before; shows what a broker crash costs the archive)",
    )
    participants.add_argument(
        "--drain-timeout", type=float, default=300.0, help="longest wait at the end (s)"
    )
    return p.parse_args(argv)


def _store(ns: argparse.Namespace) -> bool:
    backends = ["sqlite", "postgresql"] if ns.backend == "both" else [ns.backend]
    clean = True
    for backend in backends:
        cfg = CampaignConfig(
            backend=cast(Literal["sqlite", "postgresql"], backend),
            kills=ns.kills,
            publishers=ns.publishers,
            channels=ns.channels,
            rate=500.0 if ns.rate is None else ns.rate,
            up_min=ns.up_min,
            up_max=ns.up_max,
            down=2.0 if ns.down is None else ns.down,
            protocol=5 if ns.protocol == "5" else "3.1.1",
            mode=ns.mode,
            seed=ns.seed,
            workdir=ns.workdir / f"{backend}-{uuid.uuid4().hex[:6]}",
        )
        report = asyncio.run(run_campaign(cfg))
        line = report.json()
        print(line, flush=True)
        append_result(ns.results, line)
        clean = clean and report.clean
    return clean


def main(argv: list[str] | None = None) -> int:
    """Run the chosen campaign; print and append its JSON lines. Exit 1 unless clean."""
    ns = _parse(argv)
    if ns.target == "store":
        return 0 if _store(ns) else 1
    target = cast(Target, ns.target)
    cfg = ParticipantCampaignConfig(
        target=target,
        faults=ns.kills,
        participants=ns.participants,
        rate=20.0 if ns.rate is None else ns.rate,
        size=ns.size,
        up_min=ns.up_min,
        up_max=ns.up_max,
        down=(6.0 if target == "partition" else 2.0) if ns.down is None else ns.down,
        seed=ns.seed,
        protocol=5 if ns.protocol == "5" else "3.1.1",
        store_confirm=ns.store_confirm,
        drain_timeout=ns.drain_timeout,
        workdir=ns.workdir / f"{target}-{uuid.uuid4().hex[:6]}",
    )
    return 0 if run(cfg, ns.results).clean else 1


if __name__ == "__main__":
    sys.exit(main())
