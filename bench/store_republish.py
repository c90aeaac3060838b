"""How many messages a sender publishes again toward a store that never archives them
(``ReliableChannel._confirm``, issue 27): with the per-message backoff and the
per-interval budget (``RuntimeOptions.store_confirm_max_interval``,
``store_republish_limit``), and with both disabled (what the check did before: every
unconfirmed message again every interval).

In process (memory transport, :class:`~sdk.store.InMemoryStore` that archives the
channel but receives nothing), intervals scaled down from the default 5 s.

Usage: ``python bench/store_republish.py [--messages 200] [--interval 0.1] [--seconds 5]``;
prints JSON lines and appends them to ``bench/results/store_republish.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Recorder
from sdk.runtime import Node, RuntimeOptions
from sdk.sds import COMPACT, ChannelConfig
from sdk.store.client import InMemoryStore
from transports.memory import MemoryNetwork

#: No SDS resends or syncs: only the store check publishes.
CONFIG = ChannelConfig(
    bloom=COMPACT,
    resend_interval_ms=600_000,
    possibly_acked_resend_interval_ms=600_000,
    sync_interval_ms=0,
    repair=None,
)


async def run(messages: int, seconds: float, options: RuntimeOptions) -> dict[str, int]:
    """Send ``messages``, let the check run ``seconds``; return the channel's counters."""
    net = MemoryNetwork()
    node = Node(
        net.transport("alice"), "alice", store=InMemoryStore(), config=CONFIG, options=options
    )
    room = await node.join("room")
    for k in range(messages):
        await room.send(f"m{k}".encode())
    await asyncio.sleep(seconds)
    stats = dict(room.stats)
    await node.close()
    return stats


def main() -> None:
    """Run both variants and record them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=5.0)
    ns = parser.parse_args()
    recorder = Recorder("store_republish")
    bounded = RuntimeOptions(store_timeout=0.25, store_confirm_interval=ns.interval)
    unbounded = dataclasses.replace(
        bounded, store_confirm_max_interval=ns.interval, store_republish_limit=10**9
    )
    for variant, options in (("backoff_and_budget", bounded), ("every_interval", unbounded)):
        stats = asyncio.run(run(ns.messages, ns.seconds, options))
        recorder.record(
            "store_republished",
            stats.get("store_republished", 0),
            "messages",
            variant=variant,
            messages=ns.messages,
            interval_s=ns.interval,
            seconds=ns.seconds,
            deferred=stats.get("store_republish_deferred", 0),
        )


if __name__ == "__main__":
    main()
