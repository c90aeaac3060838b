"""PNG plots of a report's tables (matplotlib, Agg backend: no display needed).

Each function takes table rows as the report collected them (lists of dicts) and writes one
file, so plots can be redrawn from the JSON tables without Spark.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: servers and CI have no display

import matplotlib.dates as mdates  # after the backend is chosen
import matplotlib.pyplot as plt

Rows = Sequence[dict[str, Any]]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def volume_over_time(rows: Rows, top: Sequence[str], path: Path, unit: str = "hour") -> Path:
    """Messages per ``unit`` bucket: the whole archive and each of the ``top`` channels.

    Readable at any span: the report picks ``unit`` from the archive's span (minutes for an
    hour of data, days for a year), dates are labelled by matplotlib's concise formatter
    (``09:15`` within a day, ``Mar`` within a year), and sparse series get markers so that
    even a single bucket shows as a point rather than an empty frame.
    """
    total: dict[Any, int] = defaultdict(int)
    per: dict[str, dict[Any, int]] = defaultdict(dict)
    for r in rows:
        total[r["bucket_start"]] += r["messages"]
        if r["channel_id"] in top:
            per[r["channel_id"]][r["bucket_start"]] = r["messages"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = sorted(total)
    marker = "o" if len(xs) <= 60 else None
    ax.plot(
        xs,
        [total[x] for x in xs],
        color="black",
        linewidth=1.2,
        marker=marker,
        markersize=3,
        label="all channels",
    )
    for ch in top:
        pts = sorted(per[ch].items())
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            linewidth=0.8,
            marker=marker,
            markersize=2,
            label=_short(ch),
        )
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    if len(xs) == 1:  # one bucket: give it a frame of one bucket each side
        width = _UNIT_WIDTH.get(unit, timedelta(hours=1))
        ax.set_xlim(xs[0] - width, xs[0] + width)
    ax.set_ylim(bottom=0)
    ax.set_title(f"Messages per {unit} (UTC, by first arrival at the store)")
    ax.set_ylabel(f"messages per {unit}")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


_UNIT_WIDTH = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "week": timedelta(weeks=1),
}


def _short(label: str, limit: int = 40) -> str:
    """A legend label: long channel ids (up to 256 bytes) would push the plot off the page."""
    return label if len(label) <= limit else label[: limit - 1] + "…"


def delay_percentiles(rows: Rows, top: Sequence[str], path: Path) -> Path:
    """Exact p50/p95/p99 delivery delay of the ``top`` channels (log scale)."""
    by = {r["channel_id"]: r for r in rows}
    chans = [c for c in top if c in by]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.27
    for i, (name, color) in enumerate((("p50", "C0"), ("p95", "C1"), ("p99", "C3"))):
        vals = [max(by[c][f"delay_{name}_ms"], 1.0) for c in chans]
        ax.bar(
            [j + (i - 1) * width for j in range(len(chans))], vals, width, label=name, color=color
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(chans)), chans, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("delay (ms, log scale)")
    ax.set_title("Delivery delay: first arrival at the store minus Lamport time")
    ax.legend()
    return _save(fig, path)


def size_histogram(rows: Rows, path: Path) -> Path:
    """Messages per power-of-two size bucket, stacked by kind."""
    buckets = sorted({r["size_from"] for r in rows})
    kinds = sorted({r["kind"] for r in rows})
    counts = {(r["size_from"], r["kind"]): r["messages"] for r in rows}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = [0] * len(buckets)
    for kind in kinds:
        vals = [counts.get((b, kind), 0) for b in buckets]
        ax.bar(range(len(buckets)), vals, bottom=bottom, label=kind)
        bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(buckets)), [_bytes(b) for b in buckets], rotation=45, fontsize=8)
    ax.set_xlabel("message size from (bytes, power-of-two buckets)")
    ax.set_ylabel("messages")
    ax.set_title("Message size distribution")
    ax.legend()
    return _save(fig, path)


def hour_of_day(rows: Rows, path: Path) -> Path:
    """Messages by UTC hour of day."""
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([r["hour_of_day"] for r in rows], [r["messages"] for r in rows], color="C2")
    ax.set_xticks(range(0, 24, 2))
    ax.set_xlabel("hour of day (UTC)")
    ax.set_ylabel("messages")
    ax.set_title("Busiest hours of the day")
    return _save(fig, path)


def reliability(loss: Rows, rebroadcast: Rows, top: Sequence[str], path: Path) -> Path:
    """Per ``top`` channel: share of messages lost and share of traffic that was rebroadcast."""
    lost = {r["channel_id"]: r["loss_fraction"] for r in loss}
    again = {r["channel_id"]: r["rebroadcast_fraction"] for r in rebroadcast}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(top))
    ax.bar(
        [x - 0.2 for x in xs],
        [100 * lost.get(c, 0.0) for c in top],
        0.4,
        label="lost (never archived, % of messages)",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [100 * again.get(c, 0.0) for c in top],
        0.4,
        label="rebroadcast (% of copies received)",
    )
    ax.set_xticks(list(xs), list(top), rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("%")
    ax.set_title("Loss and rebroadcasts as the archive sees them")
    ax.legend()
    return _save(fig, path)


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)
