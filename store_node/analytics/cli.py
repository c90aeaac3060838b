"""``store-node analytics``: the analyst's command line.

::

    store-node analytics report --input EXPORT_DIR --out REPORT_DIR [--master URL] [--no-progress]
    store-node analytics synth --out EXPORT_DIR --messages N [--channels C] [--seed S] ...

Also runnable as ``python -m store_node.analytics``. Exit status: 0 done, 2 bad input or
usage, 3 no usable Java runtime (the message says what to install).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from .errors import AnalyticsError, JavaNotFoundError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="store-node analytics",
        description="Channel-history analytics on Spark over a store-node archive export.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="tables (JSON, CSV), PNG plots and a text summary")
    r.add_argument("--input", required=True, help="archive export folder (channel=*/date=*/)")
    r.add_argument("--out", required=True, help="folder for the report (created)")
    r.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default: local[*], bound to 127.0.0.1, UI off)",
    )
    r.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting, repeatable (e.g. spark.driver.memory=8g)",
    )
    r.add_argument("--top", type=int, default=10, help="channels shown in plots (default 10)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument(
        "--no-progress", action="store_true", help="no progress lines on stderr while it runs"
    )

    s = sub.add_parser("synth", help="write a synthetic archive export (benchmarks, demos)")
    s.add_argument("--out", required=True, help="folder to write the export into")
    s.add_argument("--messages", type=int, required=True, help="rows (archived messages)")
    s.add_argument("--channels", type=int, default=None, help="default: 4..200 by size")
    s.add_argument("--days", type=int, default=7)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--history", type=int, default=3, help="causal-history length")
    s.add_argument("--loss", type=float, default=0.005, help="share never archived")
    s.add_argument("--rebroadcast", type=float, default=0.08, help="share archived twice+")
    s.add_argument("--violations", type=float, default=0.001, help="share out of causal order")
    s.add_argument(
        "--overwrite", action="store_true", help="replace channel=* folders already in --out"
    )
    return p


def _conf(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise AnalyticsError(f"--conf wants KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _active_session_exists() -> bool:
    """Whether this process already runs a SparkSession (without starting one)."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is not None


def _report(args: argparse.Namespace) -> int:
    from .progress import stderr_sink
    from .report import check_input, run_report
    from .session import build_session

    check_input(args.input)  # fail on a bad folder before paying for a JVM
    extra = _conf(args.conf)
    had_session = _active_session_exists()
    spark = build_session(args.master, extra_conf=extra)
    try:
        result = run_report(
            spark,
            args.input,
            args.out,
            top_channels=args.top,
            make_plots=not args.no_plots,
            progress=None if args.no_progress else stderr_sink(),
        )
    finally:
        # A caller that already had a session (a notebook, the tests) keeps it running.
        if not had_session:
            spark.stop()
    print(result.summary)
    print(f"report written to {result.out_dir} ({len(result.files)} files)")
    print(f"open {result.out_dir / 'index.html'} for the plots and tables")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from .synthetic import SynthConfig, generate

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise AnalyticsError(f"{out} is not empty; pass --overwrite to replace an export")
        for child in out.glob("channel=*"):
            shutil.rmtree(child)
    cfg = SynthConfig(
        messages=args.messages,
        channels=args.channels,
        days=args.days,
        seed=args.seed,
        history=args.history,
        loss=args.loss,
        rebroadcast=args.rebroadcast,
        violations=args.violations,
    )
    t0 = time.perf_counter()
    stats = generate(str(out), cfg)
    took = time.perf_counter() - t0
    print(
        f"wrote {stats.rows:,} messages in {stats.channels} channels, {stats.files} files, "
        f"{stats.bytes_on_disk / 2**20:,.1f} MiB to {out} in {took:.1f}s"
    )
    print(
        f"ground truth: {stats.missing_messages:,} lost messages "
        f"({stats.missing_references:,} references), {stats.rebroadcasts:,} rebroadcasts, "
        f"{stats.violating_pairs:,} causal-order violations"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the analytics CLI with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":
            return _report(args)
        return _synth(args)
    except JavaNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except AnalyticsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
