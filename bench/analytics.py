"""Benchmark: the analytics report on Spark against the same queries on DuckDB.

Usage::

    .venv/bin/python bench/analytics.py            # 10M-message synthetic archive
    .venv/bin/python bench/analytics.py --quick    # 1M messages

Generates a synthetic archive (reused across runs from ``--data``), runs the DuckDB baseline
(the same tables, same definitions, exact quantiles, over the same Parquet files) in a child
process, then the full Spark report (tables, no plots) in this one, checks that both agree on
the headline numbers, and prints one JSON object per figure, also appended to
``bench/results/analytics.jsonl``.

Peak memory is each process's ``VmHWM`` (peak resident set) from ``/proc``: the Spark figure
adds the driver JVM and this Python process; the DuckDB figure is its child process. Each
phase runs in its own process so one's peak does not hide in another's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "analytics.jsonl"


# --- memory ------------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def peak_rss_bytes(pid: int | None = None) -> int:
    """Peak RSS (VmHWM) of ``pid`` (default: this process), in bytes."""
    return _status_kib(pid or os.getpid(), "VmHWM") * 1024


def jvm_peak_rss_bytes() -> int:
    """Peak RSS of the Java processes this process started (the Spark driver JVM)."""
    total = 0
    for pid in _descendants(os.getpid()):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if exe.endswith("/java"):
            total += peak_rss_bytes(pid)
    return total


# --- DuckDB baseline ---------------------------------------------------------------------

#: The report's tables as DuckDB SQL, same definitions as ``store_node.analytics.jobs``.
#: Time buckets stay epoch milliseconds (no time-zone extension needed); quantile_cont is
#: exact with the same linear interpolation as Spark's percentile.
DUCKDB_SETUP = """
CREATE VIEW archive AS SELECT * FROM read_parquet('{src}/**/*.parquet', hive_partitioning=false);
CREATE TEMP TABLE sender_hours AS
  SELECT channel_id, sender_id, epoch_ms(first_arrival) // 3600000 * 3600000 AS hour,
         count(*) AS messages, sum(message_size) AS bytes, sum(arrival_count) AS copies,
         count(*) FILTER (WHERE arrival_count > 1) AS rebroadcast_messages,
         count(*) FILTER (WHERE kind <> 'ephemeral') AS causal_messages,
         sum(coalesce(len(causal_history), 0)) AS refs
  FROM archive GROUP BY ALL;
CREATE TEMP TABLE problems AS
  WITH refs AS (
    SELECT channel_id, message_id, sender_id, lamport_timestamp,
           unnest(causal_history) AS dependency_id FROM archive)
  SELECT r.*, d.message_id IS NOT NULL AS dependency_archived,
         d.lamport_timestamp AS dependency_lamport
  FROM refs r LEFT JOIN archive d
    ON d.channel_id = r.channel_id AND d.message_id = r.dependency_id
  WHERE d.message_id IS NULL OR r.lamport_timestamp <= d.lamport_timestamp;
"""

DUCKDB_TABLES: dict[str, str] = {
    "channels": """SELECT channel_id, count(DISTINCT sender_id) participants,
        sum(messages) messages, sum(bytes) bytes,
        min(hour) first_hour, max(hour) last_hour FROM sender_hours GROUP BY ALL""",
    "channel_volume_hour": """SELECT channel_id, hour bucket_start, sum(messages) messages,
        sum(bytes) bytes, count(DISTINCT sender_id) active_participants
        FROM sender_hours GROUP BY ALL""",
    "channel_volume_day": """SELECT channel_id, hour // 86400000 * 86400000 bucket_start,
        sum(messages) messages, sum(bytes) bytes, count(DISTINCT sender_id) active_participants
        FROM sender_hours GROUP BY ALL""",
    "sender_volume_hour": """SELECT channel_id, sender_id, hour bucket_start, messages, bytes
        FROM sender_hours""",
    "sender_volume_day": """SELECT channel_id, sender_id, hour // 86400000 * 86400000
        bucket_start, sum(messages) messages, sum(bytes) bytes FROM sender_hours GROUP BY ALL""",
    "hour_of_day": """SELECT hour % 86400000 // 3600000 hour_of_day, sum(messages) messages,
        sum(bytes) bytes FROM sender_hours GROUP BY ALL""",
    "busiest_hours": """SELECT hour, sum(messages) messages, sum(bytes) bytes,
        count(DISTINCT channel_id) channels, count(DISTINCT (channel_id, sender_id)) senders
        FROM sender_hours GROUP BY ALL ORDER BY messages DESC, hour LIMIT 10""",
    "delivery_delay": """SELECT channel_id, count(*) messages, min(d) delay_min_ms,
        avg(d) delay_mean_ms, quantile_cont(d, [0.5, 0.95, 0.99]) pcts, max(d) delay_max_ms
        FROM (SELECT channel_id, epoch_ms(first_arrival) - lamport_timestamp d FROM archive
              WHERE lamport_timestamp IS NOT NULL) GROUP BY ALL""",
    "rebroadcasts": """SELECT channel_id, sum(messages) messages, sum(copies) copies,
        sum(copies) - sum(messages) rebroadcasts, sum(rebroadcast_messages) rebroadcast_messages,
        (sum(copies) - sum(messages)) / sum(copies) rebroadcast_fraction
        FROM sender_hours GROUP BY ALL""",
    "loss_by_channel": """WITH m AS (SELECT channel_id, count(*) missing_references,
          count(DISTINCT dependency_id) missing_messages FROM problems
          WHERE NOT dependency_archived GROUP BY ALL),
        b AS (SELECT channel_id, sum(causal_messages) archived_messages, sum(refs) refs
          FROM sender_hours GROUP BY ALL)
        SELECT b.channel_id, archived_messages, refs, coalesce(missing_references, 0)
          missing_references, coalesce(missing_messages, 0) missing_messages,
          coalesce(missing_messages, 0) / (archived_messages + coalesce(missing_messages, 0))
          loss_fraction FROM b LEFT JOIN m USING (channel_id)""",
    "loss_by_sender": """WITH m AS (SELECT channel_id, sender_id, count(*) missing_references,
          count(DISTINCT dependency_id) missing_messages FROM problems
          WHERE NOT dependency_archived GROUP BY ALL),
        b AS (SELECT channel_id, sender_id, sum(refs) refs FROM sender_hours GROUP BY ALL)
        SELECT * FROM b JOIN m USING (channel_id, sender_id)""",
    "missing_messages": """SELECT channel_id, dependency_id message_id, count(*) refs,
        count(DISTINCT sender_id) referencing_senders,
        arg_min(sender_id, (lamport_timestamp, sender_id)) first_referencing_sender
        FROM problems WHERE NOT dependency_archived GROUP BY ALL""",
    "causal_order_violations": """SELECT channel_id, message_id, sender_id, lamport_timestamp,
        dependency_id, dependency_lamport, dependency_lamport - lamport_timestamp lag_ms
        FROM problems WHERE dependency_archived""",
    "violations_by_channel": """SELECT channel_id, count(*) violating_pairs,
        count(DISTINCT message_id) violating_messages,
        max(dependency_lamport - lamport_timestamp) max_lag_ms
        FROM problems WHERE dependency_archived GROUP BY ALL""",
    "message_sizes": """SELECT channel_id, count(*) messages, min(message_size) size_min,
        avg(message_size) size_mean, quantile_cont(message_size, [0.5, 0.95, 0.99]) pcts,
        max(message_size) size_max FROM archive GROUP BY ALL""",
    "size_histogram": """SELECT CASE WHEN message_size < 1 THEN 0
          ELSE (2 ** floor(log2(message_size)))::BIGINT END size_from, kind,
        count(*) messages, sum(message_size) bytes FROM archive GROUP BY ALL""",
    "overall_delay": """SELECT count(*) messages,
        quantile_cont(epoch_ms(first_arrival) - lamport_timestamp, [0.5, 0.95, 0.99]) pcts
        FROM archive WHERE lamport_timestamp IS NOT NULL""",
    "overall_size": """SELECT quantile_cont(message_size, [0.5, 0.95, 0.99]) pcts
        FROM archive""",
}


def run_duckdb(src: str, out: str, threads: int) -> dict[str, Any]:
    """The baseline: every table computed, fetched as Arrow and written as the report does."""
    import duckdb

    from store_node.analytics.report import _write_table

    t0 = time.perf_counter()
    con = duckdb.connect(config={"threads": threads})
    con.execute(DUCKDB_SETUP.format(src=src))
    Path(out).mkdir(parents=True, exist_ok=True)
    fetched = {}
    for name, sql in DUCKDB_TABLES.items():
        if "pcts" in sql:  # one exact quantile pass per group, spread into columns
            sql = f"SELECT * EXCLUDE (pcts), pcts[1] p50, pcts[2] p95, pcts[3] p99 FROM ({sql})"
        arrow = con.sql(sql).to_arrow_table()
        fetched[name] = arrow
        _write_table(Path(out), name, arrow)
    seconds = time.perf_counter() - t0
    delay = fetched["overall_delay"].to_pylist()[0]
    loss = fetched["loss_by_channel"].to_pylist()
    reb = fetched["rebroadcasts"].to_pylist()
    return {
        "seconds": seconds,
        "peak_rss": peak_rss_bytes(),
        "check": {
            "messages": sum(r["messages"] for r in fetched["channels"].to_pylist()),
            "delay_pcts": [delay["p50"], delay["p95"], delay["p99"]],
            "size_pcts": [fetched["overall_size"].to_pylist()[0][p] for p in ("p50", "p95", "p99")],
            "missing_messages": sum(r["missing_messages"] for r in loss),
            "missing_references": sum(r["missing_references"] for r in loss),
            "violating_pairs": fetched["causal_order_violations"].num_rows,
            "rebroadcasts": sum(r["rebroadcasts"] for r in reb),
        },
    }


# --- Spark -------------------------------------------------------------------------------


def run_spark(src: str, out: str) -> dict[str, Any]:
    """Session start-up, then the full report (tables and summary; plots are matplotlib)."""
    from store_node.analytics.report import run_report
    from store_node.analytics.session import build_session

    t0 = time.perf_counter()
    spark = build_session()
    started = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = run_report(spark, src, out, make_plots=False)
    seconds = time.perf_counter() - t1
    conf = {
        k: v
        for k, v in spark.sparkContext.getConf().getAll()
        if k.startswith(("spark.sql", "spark.driver.memory"))
    }
    jvm = jvm_peak_rss_bytes()
    spark.stop()
    t = result.totals
    return {
        "startup_seconds": started,
        "seconds": seconds,
        "phases": {k: round(v, 2) for k, v in result.timings.items()},
        "jvm_peak_rss": jvm,
        "python_peak_rss": peak_rss_bytes(),
        "conf": conf,
        "check": {
            "messages": t["messages"],
            "delay_pcts": [t["delivery_delay"][f"delay_{p}_ms"] for p in ("p50", "p95", "p99")],
            "size_pcts": [t["message_sizes"][f"size_{p}"] for p in ("p50", "p95", "p99")],
            "missing_messages": t["loss"]["missing_messages"],
            "missing_references": t["loss"]["missing_references"],
            "violating_pairs": t["causal_order_violations"]["violating_pairs"],
            "rebroadcasts": t["rebroadcasts"]["rebroadcasts"],
        },
    }


# --- orchestration -------------------------------------------------------------------------


def _child(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one phase in a fresh Python so its peak memory is its own."""
    cmd = [
        sys.executable,
        __file__,
        "--phase",
        phase,
        "--messages",
        str(args.messages),
        "--data",
        str(args.data),
        "--threads",
        str(args.threads),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{phase} phase failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _json_default(value: Any) -> Any:
    from store_node.analytics.report import _json_default as report_default

    return report_default(value)


def _phase(args: argparse.Namespace) -> None:
    if args.phase == "synth":
        from store_node.analytics.synthetic import SynthConfig, generate

        shutil.rmtree(args.data, ignore_errors=True)
        t0 = time.perf_counter()
        stats = generate(str(args.data), SynthConfig(messages=args.messages))
        seconds = time.perf_counter() - t0
        info = {
            "seconds": seconds,
            "rows": stats.rows,
            "files": stats.files,
            "bytes": stats.bytes_on_disk,
            "channels": stats.channels,
            "peak_rss": peak_rss_bytes(),
        }
        (Path(args.data) / "_SYNTH.json").write_text(json.dumps(info))
        print(json.dumps(info))
    elif args.phase == "duckdb":
        result = run_duckdb(str(args.data), str(args.data) + "-duckdb", args.threads)
        print(json.dumps(result, default=_json_default))


def _agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for key, x in a.items():
        y = b[key]
        if isinstance(x, list):
            if any(abs(p - q) > 1e-6 * max(1.0, abs(p)) for p, q in zip(x, y, strict=True)):
                return False
        elif x != y:
            return False
    return True


def main() -> int:
    """Run the benchmark; print and append the JSON lines."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1M messages instead of 10M")
    p.add_argument("--messages", type=int, default=None)
    p.add_argument("--data", type=Path, default=None, help="archive folder (reused if present)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="DuckDB threads")
    p.add_argument("--phase", choices=("synth", "duckdb"), help=argparse.SUPPRESS)
    args = p.parse_args()
    args.messages = args.messages or (1_000_000 if args.quick else 10_000_000)
    args.data = args.data or Path(f"/tmp/chorus-analytics-bench-{args.messages}")
    if args.phase:
        _phase(args)
        return 0

    marker = args.data / "_SYNTH.json"
    if marker.exists() and json.loads(marker.read_text())["rows"] == args.messages:
        synth, generated = json.loads(marker.read_text()), False
    else:
        synth, generated = _child("synth", args), True
    duck = _child("duckdb", args)
    spark = run_spark(str(args.data), str(args.data) + "-spark")

    base = {
        "bench": "analytics",
        "messages": args.messages,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(),
        "python_version": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0],
    }
    lines = []
    if generated:
        lines += [
            {"name": "synth_seconds", "value": round(synth["seconds"], 2), "unit": "s"},
            {
                "name": "synth_rows_per_second",
                "value": round(synth["rows"] / synth["seconds"]),
                "unit": "rows/s",
            },
        ]
    lines += [
        {
            "name": "archive_bytes",
            "value": synth["bytes"],
            "unit": "B",
            "files": synth["files"],
            "channels": synth["channels"],
        },
        {
            "name": "duckdb_seconds",
            "value": round(duck["seconds"], 2),
            "unit": "s",
            "threads": args.threads,
        },
        {"name": "spark_startup_seconds", "value": round(spark["startup_seconds"], 2), "unit": "s"},
        {
            "name": "spark_report_seconds",
            "value": round(spark["seconds"], 2),
            "unit": "s",
            "phases": spark["phases"],
        },
        {
            "name": "spark_duckdb_ratio",
            "value": round(spark["seconds"] / duck["seconds"], 2),
            "unit": "x",
            "target": 4.0,
            "note": "report time, JVM start-up excluded",
        },
        {
            "name": "spark_duckdb_ratio_with_startup",
            "value": round((spark["seconds"] + spark["startup_seconds"]) / duck["seconds"], 2),
            "unit": "x",
        },
        {
            "name": "spark_peak_rss_bytes",
            "value": spark["jvm_peak_rss"] + spark["python_peak_rss"],
            "unit": "B",
            "jvm": spark["jvm_peak_rss"],
            "python": spark["python_peak_rss"],
            "driver_memory": spark["conf"].get("spark.driver.memory"),
        },
        {"name": "duckdb_peak_rss_bytes", "value": duck["peak_rss"], "unit": "B"},
        {
            "name": "results_agree",
            "value": int(_agree(spark["check"], duck["check"])),
            "unit": "bool",
            "spark": spark["check"],
            "duckdb": duck["check"],
        },
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        for line in lines:
            text = json.dumps({**line, **base})
            print(text)
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
