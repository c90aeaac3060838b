"""Replication message codec speed: a catch-up's Entry messages, and a reconciliation round.

A catch-up sends one Entry message per entry, so
:func:`sdk.sync.messages.encode_entry` (the store side writes each Entry message with
it; the figure is still named ``entry_encode``) and :func:`~sdk.sync.messages.decode`
of ``[2, session_id, entry, operation]`` are on its path; set reconciliation sends
Payload and Fingerprint messages through the general decoder. Entries and operations
are random bytes of typical sizes (an entry about 170 bytes, an operation 60 to 600),
seeded, so runs compare.

Figures (CPU microseconds per message, the best of ``--repeat`` passes):
``sync_codec.entry_encode``, ``sync_codec.entry_decode``, ``sync_codec.range_encode``,
``sync_codec.range_decode`` (tags ``messages``).

Usage: ``python bench/sync_codec.py [--messages N] [--repeat R]`` (defaults 20,000 and 7).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.sync import rbsr
from sdk.sync.messages import (
    EntryMessage,
    RangeSync,
    RoundContext,
    decode,
    encode,
    encode_entry,
    item_key,
)


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest of ``repeat`` timed calls of ``run``: CPU seconds of this process, which
    other processes on a loaded machine inflate less than wall time."""
    best = float("inf")
    for _ in range(repeat):
        began = time.process_time()
        run()
        best = min(best, time.process_time() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    ns = parser.parse_args()
    rng = random.Random(7)
    n = ns.messages
    entries = [
        EntryMessage(3, rng.randbytes(rng.randint(150, 190)), rng.randbytes(rng.randint(60, 600)))
        for _ in range(n)
    ]
    frames = [encode(m) for m in entries]
    authors = [rng.randbytes(32) for _ in range(max(1, n // 50))]
    keys = sorted(item_key(rng.choice(authors), rng.randint(0, 40), 1) for _ in range(n))
    ranges: list[RangeSync] = []
    for i, key in enumerate(keys):
        if i % 10 == 9:
            ranges.append(RangeSync(3, rbsr.Fingerprint(rng.randbytes(16), key)))
        else:
            ranges.append(
                RangeSync(3, rbsr.Payload(key, i % 10 == 8, key if i % 10 == 8 else None))
            )
    ranges.append(RangeSync(3, rbsr.Terminal()))

    def encode_ranges() -> list[bytes]:
        context = RoundContext()
        return [encode(m, context) for m in ranges]

    range_frames = encode_ranges()

    def decode_ranges() -> None:
        context = RoundContext()
        for data in range_frames:
            decode(data, context)

    assert [decode(f) for f in frames] == entries
    rec = Recorder("sync_codec")
    per = 1e6 / n
    figures = {
        "entry_encode": lambda: [encode_entry(m.session_id, m.entry, m.operation) for m in entries],
        "entry_decode": lambda: [decode(f) for f in frames],
        "range_encode": encode_ranges,
        "range_decode": decode_ranges,
    }
    for name, run in figures.items():
        rec.record(f"sync_codec.{name}", best_of(ns.repeat, run) * per, "us", messages=n)


if __name__ == "__main__":
    main()
