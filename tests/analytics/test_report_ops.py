"""Issue 16.5: progress while a report runs, an HTML index, plots readable for an hour and a year.

The volume plot of an archive spanning one hour used to be an empty frame (one hourly point);
now the report picks the bucket width from the span, and these tests pin the number of
buckets plotted for an hour and for a year of data.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from store_node.analytics.jobs import timeline_unit
from store_node.analytics.report import TABLES, run_report
from tests.analytics.conftest import _row, write_export

START = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


@pytest.mark.parametrize(
    ("span", "unit"),
    [
        (timedelta(0), "minute"),
        (timedelta(hours=1), "minute"),
        (timedelta(hours=5), "minute"),
        (timedelta(days=2), "hour"),
        (timedelta(days=20), "hour"),
        (timedelta(days=365), "day"),
        (timedelta(days=3 * 365), "week"),
    ],
)
def test_timeline_unit_follows_the_span(span: timedelta, unit: str) -> None:
    assert timeline_unit(START, START + span) == unit
    assert timeline_unit(None, None) == "hour"


def _archive(tmp_path: Path, step: timedelta, count: int) -> Path:
    rows = []
    for i in range(count):
        t = _ms(START + i * step)
        rows.append(_row(f"m{i}", "busy" if i % 3 else "quiet", f"s{i % 4}", t - 50, t, 120))
    return write_export(tmp_path / "export", rows)


@pytest.mark.parametrize(
    ("step", "count", "unit", "buckets"),
    [
        (timedelta(seconds=30), 120, "minute", 60),  # one hour of data
        (timedelta(hours=12), 730, "day", 366),  # one year of data (from noon: 366 dates)
    ],
)
def test_report_plots_one_hour_and_one_year_readably_with_progress_and_index(
    spark: Any, tmp_path: Path, step: timedelta, count: int, unit: str, buckets: int
) -> None:
    export = _archive(tmp_path, step, count)
    lines: list[str] = []
    result = run_report(spark, export, tmp_path / "report", top_channels=2, progress=lines.append)
    assert result.totals["timeline_unit"] == unit
    timeline = result.rows("volume_timeline")
    per_bucket: dict[Any, int] = {}
    for r in timeline:
        per_bucket[r["bucket_start"]] = per_bucket.get(r["bucket_start"], 0) + r["messages"]
    assert len(per_bucket) == buckets
    assert sum(per_bucket.values()) == count
    png = result.out_dir / "plots" / "volume_over_time.png"
    assert png.read_bytes()[:4] == b"\x89PNG"

    # Progress: a line per phase, each table counted, then done.
    text = "\n".join(lines)
    for phase in ("scan", "causal", f"tables {len(TABLES)}/{len(TABLES)}", "plots", "done"):
        assert phase in text, (phase, text)
    assert all(re.match(r"\[report +\d+\.\ds\] ", line) for line in lines)

    index = (result.out_dir / "index.html").read_text()
    assert index.startswith("<!doctype html>")
    assert '<img src="plots/volume_over_time.png"' in index
    for name in TABLES:
        assert f'href="tables/{name}.csv"' in index and f'href="tables/{name}.json"' in index
        assert (result.out_dir / "tables" / f"{name}.csv").exists()
    assert "index.html" in (result.out_dir / "report.json").read_text()
