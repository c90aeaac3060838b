"""A seeded model of ``bench/sync.py``'s set reconciliation: the same keys, no stores.

``bench/sync.py`` builds document stores with fresh random keys, so its bytes
move by a few hundred between runs and a run takes minutes. This script builds
the same sets of reconciliation keys (``n`` logs, ``--per-author`` logs per
author at sequence number 1; ``d`` differences as the bench makes them: half on
each side, half new authors, half logs one entry ahead) from a seeded random
generator and reconciles them with the replication's ``Reconciler`` and message
encoding (a ``RoundContext`` per direction, as sessions use). It prints the
set-reconciliation messages' bytes on the wire (frames included; the
SyncRequest and SyncDone a session adds, about 90 bytes, are not), round trips
(rounds the responder sends) and bytes per message type, so changes to the
encoding or the thresholds can be compared exactly.

Figure: ``sync_model.rbsr_bytes`` (tags ``n``, ``d``, ``seed``, ``b``,
``threshold``, ``part_threshold``, ``per_author``, ``round_trips``,
``by_type``).

Usage: ``python bench/sync_model.py [--n N] [--d D ...] [--seeds S] [--branching B]
[--threshold T] [--part-threshold P] [--per-author A]`` (defaults: the bench's
n = 100k, d = 1 10 100 1000, 50 logs per author, ``SyncConfig``'s b, threshold
and part threshold; one seed).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.sync import rbsr
from sdk.sync.framing import encode_frame
from sdk.sync.messages import RangeSync, RoundContext, decode, encode, item_key, short_bound
from sdk.sync.session import SyncConfig


def key_sets(n: int, d: int, per_author: int, seed: int) -> tuple[set[bytes], set[bytes]]:
    """The two sides' keys: ``n`` shared logs, then ``d`` differences as the bench makes them."""
    rng = random.Random(seed)
    logs: list[tuple[bytes, int]] = []
    author = b""
    for i in range(n):
        if i % per_author == 0:
            author = rng.randbytes(32)
        logs.append((author, i % per_author))
    a = {item_key(author, log_id, 1) for author, log_id in logs}
    b = set(a)
    for i in range(d):
        side = a if i % 2 == 0 else b
        if (i // 2) % 2 == 0:
            side.add(item_key(rng.randbytes(32), 0, 1))
        else:
            author, log_id = logs[i]
            side.discard(item_key(author, log_id, 1))
            side.add(item_key(author, log_id, 2))
    return a, b


def reconcile(a: set[bytes], b: set[bytes], config: SyncConfig) -> tuple[int, int, Counter[str]]:
    """(bytes, round trips, bytes per message type) of reconciling ``a`` with ``b``."""
    sides = []
    for keys in (a, b):
        index = rbsr.RangeIndex()
        for key in sorted(keys):
            index.insert(key)
        sides.append(
            rbsr.Reconciler(
                index,
                branching=config.branching,
                threshold=config.threshold,
                part_threshold=config.part_threshold,
                shorten=short_bound,
            )
        )
    sent = [RoundContext(), RoundContext()]
    received = [RoundContext(), RoundContext()]
    by_type: Counter[str] = Counter()
    total = round_trips = 0
    turn = 0
    messages = sides[0].initiate()
    while messages:
        round_trips += turn == 1  # a round the responder sends closes a round trip
        reply: list[rbsr.RangeMessage] = []
        for message in messages:
            data = encode(RangeSync(1, message), sent[turn])
            size = len(encode_frame(data))
            total += size
            by_type[type(message).__name__] += size
            decoded = decode(data, received[1 - turn])
            assert isinstance(decoded, RangeSync)
            reply.extend(sides[1 - turn].receive(decoded.message))
        messages = reply
        turn = 1 - turn
    local, remote = sides[0].take_differences()
    assert set(local) == a - b and set(remote) == b - a, "reconciliation missed a difference"
    return total, round_trips, by_type


def main() -> None:
    defaults = SyncConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--branching", type=int, default=defaults.branching)
    parser.add_argument("--threshold", type=int, default=defaults.threshold)
    parser.add_argument("--part-threshold", type=int, default=defaults.part_threshold)
    parser.add_argument("--per-author", type=int, default=50)
    args = parser.parse_args()
    config = SyncConfig(
        branching=args.branching, threshold=args.threshold, part_threshold=args.part_threshold
    )
    rec = Recorder("sync_model")
    for d in args.d:
        for seed in range(args.seeds):
            a, b = key_sets(args.n, d, args.per_author, seed)
            total, round_trips, by_type = reconcile(a, b, config)
            rec.record("sync_model.rbsr_bytes", total, "bytes", n=args.n, d=d, seed=seed,
                       b=args.branching, threshold=args.threshold,
                       part_threshold=args.part_threshold, per_author=args.per_author,
                       round_trips=round_trips, by_type=dict(by_type))  # fmt: skip


if __name__ == "__main__":
    main()
