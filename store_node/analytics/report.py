"""The channel-history report: run every job, write tables, plots and a summary.

``run_report(spark, input_dir, out_dir)`` is the Python entry point (the CLI and the
benchmark call it). It reads the archive twice (one grouping-sets aggregate, one causal-history
lookup; see ``jobs.py``), caches those two small results, derives every table from them, and
writes into ``out_dir``:

* ``tables/<name>.csv`` and ``tables/<name>.json`` (a JSON array of row objects, timestamps
  as ISO 8601 UTC) for each table in :data:`TABLES`;
* ``plots/*.png``; the volume plot picks its bucket width from the archive's span
  (minutes for an hour of data, days for a year: :func:`jobs.timeline_unit`);
* ``summary.txt`` (also returned and printed by the CLI) and ``report.json`` (the headline
  figures, the glossary and the file list);
* ``index.html``: one page with the summary, every plot and a link to every table.

With ``progress=`` a sink gets a line per phase and Spark's stage progress while it runs
(:mod:`store_node.analytics.progress`); the CLI prints them to stderr.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from pyspark.sql import functions as F

from store_node.archive.base import SEALED

from . import jobs, plots
from .errors import NotAnExport
from .progress import ProgressSink, ReportProgress
from .schema import KINDS

#: Every table the report writes, in the order the summary mentions them.
TABLES: tuple[str, ...] = (
    "channels",
    "channel_volume_hour",
    "channel_volume_day",
    "sender_volume_hour",
    "sender_volume_day",
    "hour_of_day",
    "busiest_hours",
    "delivery_delay",
    "rebroadcasts",
    "loss_by_channel",
    "loss_by_sender",
    "missing_messages",
    "causal_order_violations",
    "violations_by_channel",
    "message_sizes",
    "size_histogram",
    "volume_timeline",
)

#: How each table is sorted when written: (column, "ascending" | "descending") pairs.
SORT_KEYS: dict[str, list[tuple[str, str]]] = {
    "channels": [("messages", "descending"), ("channel_id", "ascending")],
    "channel_volume_hour": [("channel_id", "ascending"), ("bucket_start", "ascending")],
    "channel_volume_day": [("channel_id", "ascending"), ("bucket_start", "ascending")],
    "sender_volume_hour": [
        ("channel_id", "ascending"),
        ("sender_id", "ascending"),
        ("bucket_start", "ascending"),
    ],
    "sender_volume_day": [
        ("channel_id", "ascending"),
        ("sender_id", "ascending"),
        ("bucket_start", "ascending"),
    ],
    "hour_of_day": [("hour_of_day", "ascending")],
    "busiest_hours": [("messages", "descending"), ("hour", "ascending")],
    "delivery_delay": [("channel_id", "ascending")],
    "rebroadcasts": [("channel_id", "ascending")],
    "loss_by_channel": [("channel_id", "ascending")],
    "loss_by_sender": [("channel_id", "ascending"), ("sender_id", "ascending")],
    "missing_messages": [("channel_id", "ascending"), ("message_id", "ascending")],
    "causal_order_violations": [
        ("channel_id", "ascending"),
        ("message_id", "ascending"),
        ("dependency_id", "ascending"),
    ],
    "violations_by_channel": [("channel_id", "ascending")],
    "message_sizes": [("channel_id", "ascending")],
    "size_histogram": [("size_from", "ascending"), ("kind", "ascending")],
    "volume_timeline": [("channel_id", "ascending"), ("bucket_start", "ascending")],
}

#: Definitions written into report.json so a reader of the files needs nothing else.
GLOSSARY: dict[str, str] = {
    "time buckets": "UTC, by first_arrival (when the store first received the message)",
    "delivery delay": "first_arrival - lamport_timestamp in ms; ephemeral messages have none",
    "percentiles": "exact, linear interpolation between the two nearest ranks (numpy default)",
    "rebroadcasts": "arrival_count - 1 summed; fraction = rebroadcasts / copies received",
    "lost message": "id in an archived message's causal history, same channel, never archived",
    "loss_fraction": "missing / (archived content+sync messages + missing)",
    "loss_by_sender": "sender_id is the sender whose message referenced the missing id",
    "causal-order violation": "message and dependency both archived, message Lamport <= dep's",
    "messages_by_kind": (
        "content: what participants sent; sync and ephemeral: SDS's own sync messages and "
        "unreliable ones, counted apart in the headline (messages counts all three)"
    ),
}

#: Archives up to this many messages get the broadcast causal lookup: it holds ~40 bytes a
#: message, so ~2 GiB at the limit. Larger archives shuffle both sides instead.
BROADCAST_LIMIT = 50_000_000


@dataclass(frozen=True, slots=True)
class ReportResult:
    """What :func:`run_report` produced."""

    out_dir: Path
    #: Table name -> the table as written (Arrow; timestamps are UTC).
    tables: dict[str, pa.Table]
    #: Headline figures (also in report.json).
    totals: dict[str, Any]
    #: The text summary (also in summary.txt).
    summary: str
    files: tuple[Path, ...]
    #: Seconds per phase, for the benchmark.
    timings: dict[str, float] = field(default_factory=dict)

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The rows of table ``name`` as dicts (timestamps as aware UTC datetimes)."""
        rows: list[dict[str, Any]] = self.tables[name].to_pylist()
        return rows


def check_input(input_dir: str | os.PathLike[str]) -> str:
    """The input location if it looks like an export, else :class:`NotAnExport`.

    A local folder must exist and hold at least one Parquet file. A URI with a scheme
    (``hdfs://``, ``s3a://``, ...) is a cluster's storage that only Spark can list, and is
    passed through unchecked.
    """
    text = os.fspath(input_dir)
    if "://" in text and not text.startswith("file://"):
        return text
    path = Path(text.removeprefix("file://"))
    if not path.is_dir():
        raise NotAnExport(f"{path}: no such folder (expected an archive export)")
    for _root, _dirs, files in os.walk(path):
        if any(f.endswith(".parquet") for f in files):
            return str(path)
    raise NotAnExport(f"{path}: no .parquet files (expected channel=*/date=*/part-*.parquet)")


def run_report(
    spark: Any,
    input_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    top_channels: int = 10,
    make_plots: bool = True,
    progress: ProgressSink | None = None,
) -> ReportResult:
    """Run every job over the export in ``input_dir`` and write the report to ``out_dir``."""
    if progress is None:
        return _run_report(spark, input_dir, out_dir, top_channels, make_plots, None)
    with ReportProgress(spark, progress) as tracker:
        return _run_report(spark, input_dir, out_dir, top_channels, make_plots, tracker)


def _run_report(
    spark: Any,
    input_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    top_channels: int,
    make_plots: bool,
    tracker: ReportProgress | None,
) -> ReportResult:
    def phase(name: str) -> None:
        if tracker is not None:
            tracker.phase(name)

    src = check_input(input_dir)
    out = Path(out_dir)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    archive = jobs.read_archive(spark, src)

    phase("scan: one pass over the export")
    with _timed(timings, "scan"):
        summaries = jobs.archive_summaries(archive, cache=True)
        sender_hours, delays, sizes = summaries.sender_hours, summaries.delays, summaries.sizes
        total, first_hour, last_hour = summaries.sender_hours.agg(
            F.sum("messages"), F.min("hour"), F.max("hour")
        ).collect()[0]
        total = total or 0
    unit = jobs.timeline_unit(first_hour, last_hour)
    phase("causal: causal-history lookup")
    with _timed(timings, "causal"):
        broadcast = total <= BROADCAST_LIMIT
        problems = jobs.causal_problems(archive, broadcast=broadcast).cache()
        problems.count()
    violations = jobs.causal_order_violations(problems)
    frames: dict[str, Callable[[], Any]] = {
        "channels": lambda: jobs.participants(sender_hours),
        "channel_volume_hour": lambda: jobs.channel_volume(sender_hours, "hour"),
        "channel_volume_day": lambda: jobs.channel_volume(sender_hours, "day"),
        "sender_volume_hour": lambda: jobs.sender_volume(sender_hours, "hour"),
        "sender_volume_day": lambda: jobs.sender_volume(sender_hours, "day"),
        "hour_of_day": lambda: jobs.hour_of_day(sender_hours),
        "busiest_hours": lambda: jobs.busiest_hours(sender_hours),
        "delivery_delay": lambda: jobs.delivery_delay(delays),
        "rebroadcasts": lambda: jobs.rebroadcasts(sender_hours),
        "loss_by_channel": lambda: jobs.loss_by_channel(sender_hours, problems),
        "loss_by_sender": lambda: jobs.loss_by_sender(sender_hours, problems),
        "missing_messages": lambda: jobs.missing_messages(problems),
        "causal_order_violations": lambda: violations,
        "violations_by_channel": lambda: jobs.violations_by_channel(violations),
        "message_sizes": lambda: jobs.message_sizes(sizes),
        "size_histogram": lambda: jobs.size_histogram(sizes),
        "volume_timeline": lambda: jobs.volume_timeline(archive, sender_hours, unit),
    }
    tables: dict[str, pa.Table] = {}
    files: list[Path] = []

    done: list[str] = []

    def collect(name: str) -> tuple[str, pa.Table, list[Path]]:
        arrow = frames[name]().toArrow().sort_by(SORT_KEYS[name])
        written = _write_table(out / "tables", name, arrow)
        done.append(name)
        phase(f"tables {len(done)}/{len(TABLES)}: {name}")
        return name, arrow, written

    # The tables are small queries over cached frames, where Spark's per-query planning and
    # code generation dominate; running a few at once keeps the cores busy meanwhile.
    with _timed(timings, "tables"), ThreadPoolExecutor(max_workers=4) as pool:
        overall_delay = pool.submit(_one, jobs.delivery_delay(delays, by=()))
        overall_size = pool.submit(_one, jobs.message_sizes(sizes, by=()))
        for name, arrow, written in pool.map(collect, TABLES):
            tables[name] = arrow
            files += written
        overall = {
            "delivery_delay": overall_delay.result(),
            "message_sizes": overall_size.result(),
        }
    summaries.combined.unpersist()
    problems.unpersist()
    totals = _totals(tables, overall)
    totals["timeline_unit"] = unit
    plot_files: list[Path] = []
    if make_plots:
        phase("plots")
        with _timed(timings, "plots"):
            plot_files = _plots(out / "plots", tables, top_channels, unit)
        files += plot_files
    summary = render_summary(src, totals)
    (out / "summary.txt").write_text(summary + "\n")
    files.append(out / "summary.txt")
    index = out / "index.html"
    report = {"input": src, "totals": totals, "glossary": GLOSSARY}
    report["files"] = [str(f.relative_to(out)) for f in [*files, out / "report.json", index]]
    (out / "report.json").write_text(json.dumps(report, indent=2, default=_json_default))
    files.append(out / "report.json")
    index.write_text(render_index(src, summary, tables, plot_files, out))
    files.append(index)
    return ReportResult(out, tables, totals, summary, tuple(files), timings)


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = time.perf_counter() - t0


def _one(df: Any) -> dict[str, Any]:
    """The single row of an overall aggregate; empty when no message was measured.

    A global aggregate over no rows still yields one row, of nulls.
    """
    rows = df.toArrow().to_pylist()
    return dict(rows[0]) if rows and rows[0].get("messages") else {}


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Decimal):  # Spark decimals, DuckDB's HUGEINT sums
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _write_table(folder: Path, name: str, arrow: pa.Table) -> list[Path]:
    """``<name>.csv`` and ``<name>.json`` (an array of row objects) from one Arrow table."""
    csv_path, json_path = folder / f"{name}.csv", folder / f"{name}.json"
    pacsv.write_csv(arrow, csv_path)
    # Timestamps become ISO 8601 strings in Arrow, vectorized: a Python datetime per value
    # and a json default() call per value cost seconds on the hourly tables.
    for i, f in enumerate(arrow.schema):
        if pa.types.is_timestamp(f.type):
            iso = pc.strftime(arrow.column(i), format="%Y-%m-%dT%H:%M:%SZ")
            arrow = arrow.set_column(i, f.name, iso)
    with json_path.open("w") as fh:
        json.dump(arrow.to_pylist(), fh, default=_json_default)
    return [csv_path, json_path]


def _totals(tables: dict[str, pa.Table], overall: dict[str, Any]) -> dict[str, Any]:
    """The headline figures: archive size, delay, loss, rebroadcasts, violations, sizes, peaks."""
    channels = tables["channels"].to_pylist()
    loss = tables["loss_by_channel"].to_pylist()
    archived = sum(r["archived_messages"] for r in loss)
    missing = sum(r["missing_messages"] for r in loss)
    hours = tables["hour_of_day"].to_pylist()
    busiest = tables["busiest_hours"].to_pylist()
    violations = tables["causal_order_violations"]
    violating = violations.group_by(["channel_id", "message_id"]).aggregate([])
    senders = tables["sender_volume_day"].column("sender_id")
    return {
        "messages": sum(r["messages"] for r in channels),
        "messages_by_kind": messages_by_kind(tables["size_histogram"]),
        "channels": len(channels),
        "senders": pc.count_distinct(
            pc.filter(senders, pc.not_equal(senders, jobs.HIDDEN_SENDER))
        ).as_py(),
        "first_hour": min((r["first_hour"] for r in channels), default=None),
        "last_hour": max((r["last_hour"] for r in channels), default=None),
        "busiest_channel": channels[0] if channels else None,
        "delivery_delay": overall["delivery_delay"],
        "message_sizes": overall["message_sizes"],
        "rebroadcasts": _overall_rebroadcasts(tables["rebroadcasts"].to_pylist()),
        "loss": {
            "archived_messages": archived,
            "missing_messages": missing,
            "missing_references": sum(r["missing_references"] for r in loss),
            "loss_fraction": missing / (archived + missing) if archived + missing else 0.0,
        },
        "causal_order_violations": {
            "violating_pairs": violations.num_rows,
            "violating_messages": violating.num_rows,
        },
        "busiest_hour": busiest[0] if busiest else None,
        "peak_hour_of_day": max(hours, key=lambda r: r["messages"]) if hours else None,
    }


def messages_by_kind(size_histogram: pa.Table) -> dict[str, int]:
    """Messages per SDS kind (``content``, ``sync``, ``ephemeral``), from the
    ``size_histogram`` table (every message is in exactly one of its buckets)."""
    out = dict.fromkeys(KINDS, 0)
    for row in size_histogram.group_by("kind").aggregate([("messages", "sum")]).to_pylist():
        out[row["kind"]] = out.get(row["kind"], 0) + int(row["messages_sum"])
    return out


def _overall_rebroadcasts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-channel rebroadcast counts added up (they are plain sums)."""
    keys = ("messages", "copies", "rebroadcasts", "rebroadcast_messages")
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in keys}
    out["rebroadcast_fraction"] = out["rebroadcasts"] / out["copies"] if out["copies"] else 0.0
    return out


def _plots(folder: Path, arrow: dict[str, pa.Table], top: int, unit: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    names = (
        "channels",
        "volume_timeline",
        "delivery_delay",
        "size_histogram",
        "hour_of_day",
        "loss_by_channel",
        "rebroadcasts",
    )
    tables = {name: arrow[name].to_pylist() for name in names}
    biggest = [r["channel_id"] for r in tables["channels"][:top]]
    return [
        plots.volume_over_time(
            tables["volume_timeline"], biggest[:5], folder / "volume_over_time.png", unit
        ),
        plots.delay_percentiles(
            tables["delivery_delay"], biggest, folder / "delay_percentiles.png"
        ),
        plots.size_histogram(tables["size_histogram"], folder / "message_sizes.png"),
        plots.hour_of_day(tables["hour_of_day"], folder / "hour_of_day.png"),
        plots.reliability(
            tables["loss_by_channel"], tables["rebroadcasts"], biggest, folder / "reliability.png"
        ),
    ]


def _n(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def _when(t: Any) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC") if isinstance(t, datetime) else "-"


def render_summary(source: str, totals: dict[str, Any]) -> str:
    """The short text summary of a report's headline figures."""
    d, s, r = totals["delivery_delay"], totals["message_sizes"], totals["rebroadcasts"]
    loss, v = totals["loss"], totals["causal_order_violations"]
    kinds = totals.get("messages_by_kind")
    if kinds:
        # What participants sent first: SDS's own sync (and ephemeral) messages are not chat.
        sync, ephemeral = kinds.get("sync", 0), kinds.get("ephemeral", 0)
        count = (
            f"{_n(kinds.get('content', 0))} content messages (plus {_n(sync + ephemeral)} "
            f"sync/ephemeral: {_n(sync)} sync, {_n(ephemeral)} ephemeral)"
        )
        if kinds.get(SEALED):
            count += f" and {_n(kinds[SEALED])} sealed messages"
    else:
        count = f"{_n(totals['messages'])} messages"
    lines = [
        f"Chorus archive report: {source}",
        f"  {count} in {_n(totals['channels'])} channels from "
        f"{_n(totals['senders'])} senders, {_when(totals['first_hour'])} to "
        f"{_when(totals['last_hour'])} (hours of first arrival)",
    ]
    if totals["busiest_channel"]:
        b = totals["busiest_channel"]
        lines.append(
            f"  busiest channel: {b['channel_id']} ({_n(b['messages'])} messages, "
            f"{_n(b['participants'])} participants)"
        )
    if d:
        lines.append(
            f"  delivery delay (ms, exact): p50 {_n(d['delay_p50_ms'])}, p95 "
            f"{_n(d['delay_p95_ms'])}, p99 {_n(d['delay_p99_ms'])}, max {_n(d['delay_max_ms'])}"
            f" over {_n(d['messages'])} messages with a Lamport time"
        )
    if r:
        lines.append(
            f"  rebroadcasts: {_n(r['rebroadcasts'])} extra copies, "
            f"{100 * r['rebroadcast_fraction']:.2f}% of {_n(r['copies'])} copies received"
        )
    sealed = (kinds or {}).get(SEALED, 0)
    if sealed:
        lines.append(
            f"  {_n(sealed)} sealed messages (encrypted channels, no keys given): counted in "
            "volume, sizes, timing and rebroadcasts; their senders, kinds and causal "
            "history are not visible, so senders, loss and causal order cover clear "
            "messages only (export with --keys for the full report)"
        )
    lines.append(
        f"  loss: {_n(loss['missing_messages'])} messages referenced but never archived "
        f"({100 * loss['loss_fraction']:.2f}%), {_n(loss['missing_references'])} references"
    )
    lines.append(
        f"  causal-order violations: {_n(v['violating_pairs'])} pairs in "
        f"{_n(v['violating_messages'])} messages"
    )
    if s:
        lines.append(
            f"  message size (bytes): p50 {_n(s['size_p50'])}, p95 {_n(s['size_p95'])}, "
            f"p99 {_n(s['size_p99'])}, max {_n(s['size_max'])}"
        )
    if totals["busiest_hour"]:
        h, p = totals["busiest_hour"], totals["peak_hour_of_day"]
        lines.append(
            f"  busiest hour: {_when(h['hour'])} ({_n(h['messages'])} messages); "
            f"busiest hour of day: {p['hour_of_day']:02d}:00 UTC"
        )
    return "\n".join(lines)


#: Captions of the plots on the index page, by file name.
PLOT_CAPTIONS: dict[str, str] = {
    "volume_over_time.png": "Messages over time: all channels and the busiest ones",
    "delay_percentiles.png": "Delivery delay percentiles per channel (exact)",
    "message_sizes.png": "Message sizes by kind",
    "hour_of_day.png": "Messages by hour of day (UTC)",
    "reliability.png": "Loss and rebroadcasts per channel",
}


def render_index(
    source: str, summary: str, tables: dict[str, pa.Table], plot_files: list[Path], out: Path
) -> str:
    """``index.html``: the summary, every plot and every table's files, on one static page."""
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Chorus archive report: {e(source)}</title>",
        "<style>body{font-family:sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem}"
        "img{max-width:100%;border:1px solid #ddd}pre{background:#f6f6f6;padding:1rem;"
        "overflow-x:auto}td,th{padding:.2rem .8rem;text-align:left}</style></head><body>",
        f"<h1>Chorus archive report</h1><p>Input: <code>{e(source)}</code></p>",
        f"<h2>Summary</h2><pre>{e(summary)}</pre>",
    ]
    if plot_files:
        parts.append("<h2>Plots</h2>")
        for path in plot_files:
            rel = path.relative_to(out).as_posix()
            caption = PLOT_CAPTIONS.get(path.name, path.stem)
            parts.append(
                f'<figure><img src="{e(rel)}" alt="{e(caption)}">'
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
    parts.append("<h2>Tables</h2><table><tr><th>table</th><th>rows</th><th>files</th></tr>")
    for name in TABLES:
        rows = tables[name].num_rows if name in tables else 0
        parts.append(
            f"<tr><td>{e(name)}</td><td>{rows:,}</td>"
            f'<td><a href="tables/{e(name)}.csv">CSV</a> '
            f'<a href="tables/{e(name)}.json">JSON</a></td></tr>'
        )
    parts.append("</table><h2>Definitions</h2><dl>")
    for term, meaning in GLOSSARY.items():
        parts.append(f"<dt>{e(term)}</dt><dd>{e(meaning)}</dd>")
    parts.append('</dl><p><a href="report.json">report.json</a></p></body></html>')
    return "\n".join(parts) + "\n"
