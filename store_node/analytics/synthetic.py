"""A synthetic archive export with a realistic shape, for benchmarks, demos and tests.

Shape, and why:

* channel sizes follow a Zipf law (a few busy rooms, a long tail of quiet ones), senders
  within a channel too;
* sends cluster in a daily cycle (peak around 15:00 UTC) so "busiest hours" has an answer;
* each sender's clock is skewed a little, and Lamport times follow SDS (§Lamport timestamp:
  ``max(now, last + 1)`` per channel), so delays measured against the store's clock can be
  slightly negative, as they are in the field;
* network delay is lognormal with a Pareto tail (2% of messages), so p99 is far from p50 and
  approximate quantiles would visibly miss;
* each content or sync message's causal history names the channel's previous ``history``
  messages; a ``loss`` share of them is never written, so references to them are the loss
  the archive sees; ``violations`` of the messages get a Lamport time at or below their
  latest dependency's; ``rebroadcast`` of them arrive more than once;
* ``ephemeral`` messages have no Lamport time and no causal history, and nothing references
  them (SDS §Ephemeral messages).

Everything is vectorized per channel with numpy and written with pyarrow, one file per
(channel, date) partition (split past ``max_rows_per_file``), which writes 10M rows in a few
minutes. :class:`SynthStats` carries the ground truth the report must reproduce.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .schema import ARROW_SCHEMA, encode_channel

_HEX = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")
_DAY_MS = 86_400_000
_HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """What to generate. ``messages`` is the number of rows written (archived messages)."""

    messages: int = 100_000
    #: Number of channels; ``None`` picks 4..200 from ``messages``.
    channels: int | None = None
    days: int = 7
    start: datetime = datetime(2026, 1, 5, tzinfo=UTC)
    seed: int = 0
    #: Causal-history length of each content/sync message.
    history: int = 3
    #: Zipf exponent of channel sizes.
    zipf: float = 1.1
    #: Share of content/sync messages never archived (but referenced by later ones).
    loss: float = 0.005
    #: Share of messages archived more than once.
    rebroadcast: float = 0.08
    #: Share of content/sync messages whose Lamport time is not above their dependency's.
    violations: float = 0.001
    ephemeral: float = 0.02
    sync: float = 0.05
    #: Bytes of the compact-profile bloom filter every non-ephemeral message carries.
    bloom_bytes: int = 1_200
    max_rows_per_file: int = 1_000_000

    def channel_count(self) -> int:
        """The number of channels to generate."""
        if self.channels is not None:
            return max(1, self.channels)
        return int(min(200, max(4, self.messages // 20_000)))


@dataclass(slots=True)
class SynthStats:
    """Ground truth of a generated archive, to check a report against."""

    rows: int = 0
    files: int = 0
    channels: int = 0
    senders: int = 0
    ephemeral: int = 0
    #: Distinct ids referenced by archived messages but never archived.
    missing_messages: int = 0
    #: Causal-history entries (of archived messages) naming a never-archived id.
    missing_references: int = 0
    references: int = 0
    copies: int = 0
    rebroadcasts: int = 0
    violating_pairs: int = 0
    violating_messages: int = 0
    bytes_on_disk: int = 0
    #: Every measured delivery delay (ms), for exact percentile checks.
    delays_ms: list[np.ndarray] = field(default_factory=list, repr=False)

    def delay_percentiles(self, qs: tuple[float, ...] = (50, 95, 99)) -> list[float]:
        """Exact percentiles of all delays, numpy's linear method (the report's definition)."""
        return [float(x) for x in np.percentile(np.concatenate(self.delays_ms), qs)]


def channel_name(i: int) -> str:
    """The id of the ``i``-th synthetic channel; some need percent-encoding on purpose."""
    if i == 0:
        return "general"
    if i % 7 == 3:
        return f"{i:04d}"  # looks like a number: must stay a string
    if i % 11 == 5:
        return f"café ☕/{i}"  # space, non-ASCII and '/' in a folder name
    return f"room-{i}"


def _hex_ids(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` random 64-hex-digit ids, the shape of SHA-256 message ids."""
    raw = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
    return _one_chunk(pa.array(_HEX[raw].view("S64").ravel(), type=pa.binary()).cast(pa.string()))


def _one_chunk(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """pyarrow hands back a ChunkedArray for large results; ListArray wants one Array."""
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _send_times(rng: np.random.Generator, n: int, cfg: SynthConfig) -> np.ndarray:
    """Sorted send times (epoch ms) over ``cfg.days`` with a daily cycle peaking at 15:00."""
    hours = np.arange(24)
    weight = 1.0 + 0.8 * np.cos(2 * np.pi * (hours - 15) / 24)
    hour = rng.choice(24, size=n, p=weight / weight.sum())
    day = rng.integers(0, cfg.days, size=n)
    start_ms = int(cfg.start.timestamp() * 1000)
    t = start_ms + day * _DAY_MS + hour * _HOUR_MS + rng.integers(0, _HOUR_MS, size=n)
    return np.sort(t)


def _delays(rng: np.random.Generator, n: int) -> np.ndarray:
    """Network delay (ms): lognormal body (median 60 ms) with a 2% Pareto tail from 0.5 s."""
    d = rng.lognormal(np.log(60.0), 0.9, size=n)
    tail = rng.random(n) < 0.02
    d[tail] += (rng.pareto(1.3, size=int(tail.sum())) + 1.0) * 500.0
    return d.astype(np.int64)


def _arrivals(
    rng: np.random.Generator, n: int, first: np.ndarray, cfg: SynthConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Arrival counts (1 + rebroadcasts) and last-arrival times."""
    repeat = rng.random(n) < cfg.rebroadcast
    count = 1 + repeat * (1 + rng.poisson(0.7, size=n))
    last = first + repeat * rng.exponential(5_000.0, size=n).astype(np.int64)
    return count.astype(np.int32), last


def _sizes(rng: np.random.Generator, n: int, median: float) -> np.ndarray:
    return np.clip(rng.lognormal(np.log(median), 1.1, size=n), 1, 150_000).astype(np.int32)


def _ts(ms: np.ndarray) -> pa.Array:
    return pa.array(ms, type=pa.int64()).cast(pa.timestamp("ms", tz="UTC"))


def generate(out_dir: str, cfg: SynthConfig | None = None) -> SynthStats:
    """Write a synthetic archive export under ``out_dir``; return its ground truth.

    ``out_dir`` must not hold another export (files would mix); it is created if missing.
    """
    cfg = cfg or SynthConfig()
    rng = np.random.default_rng(cfg.seed)
    n_channels = cfg.channel_count()
    ranks = np.arange(1, n_channels + 1, dtype=np.float64)
    share = ranks**-cfg.zipf
    rows_per_channel = rng.multinomial(cfg.messages, share / share.sum())
    pool = max(50, cfg.messages // 2_000)
    stats = SynthStats(channels=n_channels)
    senders_seen: set[int] = set()
    os.makedirs(out_dir, exist_ok=True)
    for c, rows in enumerate(rows_per_channel):
        if rows == 0:
            continue
        n_senders = int(min(pool, max(2, 3 + np.sqrt(rows) / 4)))
        members = rng.choice(pool, size=n_senders, replace=False)
        senders_seen.update(int(m) for m in members)
        table = _channel_table(rng, channel_name(c), int(rows), members, cfg, stats)
        _write_partitions(out_dir, channel_name(c), table, cfg, stats)
    stats.senders = len(senders_seen)
    return stats


def _channel_table(
    rng: np.random.Generator,
    channel: str,
    rows: int,
    members: np.ndarray,
    cfg: SynthConfig,
    stats: SynthStats,
) -> pa.Table:
    """All archived rows of one channel (causal chain minus lost, plus ephemeral)."""
    n_eph = int(rng.binomial(rows, cfg.ephemeral))
    kept = rows - n_eph
    n_lost = int(rng.binomial(kept, cfg.loss))
    m = kept + n_lost  # messages sent on the causal chain
    sender_w = np.arange(1, len(members) + 1, dtype=np.float64) ** -1.0
    sender_w /= sender_w.sum()
    sender_ids = np.array([f"user-{k:06d}" for k in members])
    skew = rng.normal(0.0, 30.0, size=len(members)).astype(np.int64)

    # The causal chain, in send order.
    who = rng.choice(len(members), size=m, p=sender_w)
    sent = _send_times(rng, m, cfg)
    lam = sent + skew[who]
    idx = np.arange(m, dtype=np.int64)
    lam = np.maximum.accumulate(lam - idx) + idx  # strictly increasing, SDS Lamport rule
    bad = np.flatnonzero(rng.random(m) < cfg.violations)
    bad = bad[bad > 0]
    lam[bad] = lam[bad - 1] - rng.integers(0, 2_000, size=len(bad))
    first = sent + _delays(rng, m)
    lost = np.zeros(m, dtype=bool)
    lost[rng.choice(m, size=n_lost, replace=False)] = True
    ids = _hex_ids(rng, m)

    # History: previous `history` chain messages, most recent first.
    h = cfg.history
    dep = idx[:, None] - np.arange(1, h + 1)[None, :]
    valid = dep >= 0
    keep = ~lost
    dep_keep, valid_keep = dep[keep], valid[keep]
    values = dep_keep[valid_keep]
    offsets = np.concatenate([[0], np.cumsum(valid_keep.sum(axis=1))]).astype(np.int32)
    history = pa.ListArray.from_arrays(pa.array(offsets), _one_chunk(ids.take(pa.array(values))))

    # Ground truth for what the archive shows.
    stats.references += len(values)
    dep_lost = lost[values]
    stats.missing_references += int(dep_lost.sum())
    stats.missing_messages += len(np.unique(values[dep_lost]))
    owner = np.repeat(idx[keep], valid_keep.sum(axis=1))
    violating = ~dep_lost & (lam[owner] <= lam[values])
    stats.violating_pairs += int(violating.sum())
    stats.violating_messages += len(np.unique(owner[violating]))

    kind = np.where(rng.random(m) < cfg.sync, "sync", "content")[keep]
    content = np.where(kind == "sync", 0, _sizes(rng, kept, 180.0)).astype(np.int32)
    hist_len = valid_keep.sum(axis=1)
    overhead = 90 + len(channel.encode()) + 11 + 68 * hist_len + cfg.bloom_bytes
    count, last = _arrivals(rng, kept, first[keep], cfg)
    chain = {
        "message_id": ids.filter(pa.array(keep)),
        "sender_id": pa.array(sender_ids[who[keep]]),
        "kind": pa.array(kind),
        "lamport_timestamp": pa.array(lam[keep], type=pa.int64()),
        "causal_history": history,
        "content_size": pa.array(content),
        "message_size": pa.array((content + overhead).astype(np.int32)),
        "first_arrival": _ts(first[keep]),
        "last_arrival": _ts(last),
        "arrival_count": pa.array(count),
    }
    stats.delays_ms.append(first[keep] - lam[keep])

    # Ephemeral messages: outside the chain, no Lamport time, no history.
    e_who = rng.choice(len(members), size=n_eph, p=sender_w)
    e_first = _send_times(rng, n_eph, cfg) + _delays(rng, n_eph)
    e_content = _sizes(rng, n_eph, 40.0)
    e_count, e_last = _arrivals(rng, n_eph, e_first, cfg)
    eph = {
        "message_id": _hex_ids(rng, n_eph),
        "sender_id": pa.array(sender_ids[e_who], type=pa.string()),
        "kind": pa.array(np.full(n_eph, "ephemeral"), type=pa.string()),
        "lamport_timestamp": pa.nulls(n_eph, type=pa.int64()),
        "causal_history": pa.array([[]] * n_eph, type=pa.list_(pa.string())),
        "content_size": pa.array(e_content),
        "message_size": pa.array((e_content + 90 + len(channel.encode())).astype(np.int32)),
        "first_arrival": _ts(e_first),
        "last_arrival": _ts(e_last),
        "arrival_count": pa.array(e_count),
    }
    stats.ephemeral += n_eph
    stats.copies += int(count.sum()) + int(e_count.sum())
    stats.rebroadcasts += int((count - 1).sum()) + int((e_count - 1).sum())

    def table(cols: dict[str, pa.Array], n: int) -> pa.Table:
        cols = dict(cols)
        cols["channel_id"] = pa.array([channel] * n, type=pa.string())
        hashes = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
        cols["transport_hash"] = pa.array(list(hashes.view("S32").ravel()), type=pa.binary())
        return pa.table({f.name: cols[f.name] for f in ARROW_SCHEMA}, schema=ARROW_SCHEMA)

    both = pa.concat_tables([table(chain, kept), table(eph, n_eph)])
    return both.sort_by("first_arrival")


def _write_partitions(
    out_dir: str, channel: str, table: pa.Table, cfg: SynthConfig, stats: SynthStats
) -> None:
    """One file per (channel, date of first arrival), split past ``max_rows_per_file``."""
    ms = table.column("first_arrival").cast(pa.int64()).to_numpy()
    day = ms // _DAY_MS
    bounds = np.flatnonzero(np.diff(day)) + 1  # table is sorted by first_arrival
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(ms)]])
    for s, e in zip(starts, ends, strict=True):
        date = datetime.fromtimestamp(int(day[s]) * 86_400, tz=UTC).strftime("%Y-%m-%d")
        folder = os.path.join(out_dir, f"channel={encode_channel(channel)}", f"date={date}")
        os.makedirs(folder, exist_ok=True)
        for part, lo in enumerate(range(int(s), int(e), cfg.max_rows_per_file)):
            hi = min(int(e), lo + cfg.max_rows_per_file)
            path = os.path.join(folder, f"part-{part}.parquet")
            pq.write_table(table.slice(lo, hi - lo), path, compression="snappy")
            stats.files += 1
            stats.bytes_on_disk += os.path.getsize(path)
        stats.rows += int(e - s)
