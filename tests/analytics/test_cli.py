"""The CLI end to end on a small synthetic archive, the synthetic generator, and Java checks."""

from __future__ import annotations

import csv
import json
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from store_node.analytics import cli
from store_node.analytics.schema import ARROW_SCHEMA, decode_channel, encode_channel
from store_node.analytics.session import JAVA_HINT
from store_node.analytics.synthetic import SynthConfig, generate
from tests.conftest import require_module


def test_channel_encoding_round_trips() -> None:
    for ch in ("0042", "café ☕/x", "a b+c%d", "general", "~._-"):
        enc = encode_channel(ch)
        assert "/" not in enc and " " not in enc
        assert decode_channel(enc) == ch
    assert encode_channel("~._-AZaz09") == "~._-AZaz09"  # RFC 3986 unreserved kept


def test_synthetic_archive_has_the_export_layout(tmp_path: Path) -> None:
    stats = generate(str(tmp_path), SynthConfig(messages=2_000, channels=8, days=2, seed=1))
    files = sorted(tmp_path.glob("channel=*/date=*/part-*.parquet"))
    assert len(files) == stats.files > 0
    assert stats.rows == 2_000
    total = 0
    for f in files:
        table = pq.read_table(f, partitioning=None)
        assert table.schema.equals(ARROW_SCHEMA, check_metadata=False)
        channel = decode_channel(f.parent.parent.name.removeprefix("channel="))
        assert set(table.column("channel_id").to_pylist()) == {channel}
        days = {t.strftime("%Y-%m-%d") for t in table.column("first_arrival").to_pylist()}
        assert days == {f.parent.name.removeprefix("date=")}
        eph = np.array(table.column("kind").to_pylist()) == "ephemeral"
        lam = table.column("lamport_timestamp").is_null().to_numpy(zero_copy_only=False)
        assert (eph == lam).all()  # null Lamport time exactly for ephemeral messages
        total += table.num_rows
    assert total == 2_000
    assert stats.missing_messages > 0 and stats.rebroadcasts > 0 and stats.violating_pairs > 0


def test_synth_refuses_to_mix_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["synth", "--out", str(tmp_path), "--messages", "300", "--channels", "2"]
    assert cli.main(args) == 0
    assert cli.main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main([*args, "--overwrite"]) == 0


def test_report_without_java_says_what_to_install(
    hand_archive: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cli.main(["report", "--input", str(hand_archive), "--out", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err
    assert "openjdk-17-jre-headless" in err and "Java 17" in err
    assert JAVA_HINT in err


def test_report_with_old_java_says_what_to_install(
    hand_archive: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    java = tmp_path / "jdk8" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"1.8.0_392\"' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    assert cli.main(["report", "--input", str(hand_archive), "--out", str(tmp_path / "r")]) == 3
    assert "found Java 8" in capsys.readouterr().err


def test_report_on_a_missing_folder_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", "--input", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.integration
def test_report_end_to_end_on_a_synthetic_archive(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export, out = tmp_path / "export", tmp_path / "report"
    stats = generate(str(export), SynthConfig(messages=3_000, channels=6, days=2, seed=3))
    assert cli.main(["report", "--input", str(export), "--out", str(out), "--top", "4"]) == 0
    printed = capsys.readouterr().out
    assert "Chorus archive report" in printed
    # The headline counts content apart from SDS's own sync and ephemeral messages; all of
    # them together are the 3,000 rows written.
    counted = re.search(
        r"([\d,]+) content messages \(plus ([\d,]+) sync/ephemeral: ([\d,]+) sync, "
        r"([\d,]+) ephemeral\)",
        printed,
    )
    assert counted is not None, printed
    content, other, sync, ephemeral = (int(g.replace(",", "")) for g in counted.groups())
    assert content + other == 3_000 and sync + ephemeral == other
    assert ephemeral == stats.ephemeral

    for name in (
        "channels",
        "delivery_delay",
        "loss_by_channel",
        "causal_order_violations",
        "sender_volume_hour",
        "size_histogram",
    ):
        assert (out / "tables" / f"{name}.csv").stat().st_size > 0
        assert isinstance(json.loads((out / "tables" / f"{name}.json").read_text()), list)
    for png in (
        "volume_over_time",
        "delay_percentiles",
        "message_sizes",
        "hour_of_day",
        "reliability",
    ):
        assert (out / "plots" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "summary.txt").read_text().startswith("Chorus archive report")

    totals = json.loads((out / "report.json").read_text())["totals"]
    assert totals["messages"] == stats.rows == 3_000
    assert totals["channels"] == 6
    assert totals["senders"] == stats.senders
    assert totals["loss"]["missing_messages"] == stats.missing_messages
    assert totals["loss"]["missing_references"] == stats.missing_references
    assert totals["rebroadcasts"]["rebroadcasts"] == stats.rebroadcasts
    assert totals["rebroadcasts"]["copies"] == stats.copies
    assert totals["causal_order_violations"]["violating_pairs"] == stats.violating_pairs
    assert totals["causal_order_violations"]["violating_messages"] == stats.violating_messages
    d = totals["delivery_delay"]
    assert [d["delay_p50_ms"], d["delay_p95_ms"], d["delay_p99_ms"]] == pytest.approx(
        stats.delay_percentiles(), rel=1e-12
    )
    assert d["messages"] == stats.rows - stats.ephemeral

    with (out / "tables" / "loss_by_channel.csv").open() as f:
        loss = list(csv.DictReader(f))
    assert sum(int(r["missing_messages"]) for r in loss) == stats.missing_messages
    # The CLI reused the caller's session and left it running.
    assert spark.range(1).count() == 1


def test_cluster_storage_uris_are_left_to_spark(tmp_path: Path) -> None:
    require_module("pyspark")
    from store_node.analytics.errors import NotAnExport
    from store_node.analytics.report import check_input

    assert check_input("hdfs://namenode/exports/chorus") == "hdfs://namenode/exports/chorus"
    (tmp_path / "channel=x" / "date=2026-01-01").mkdir(parents=True)
    with pytest.raises(NotAnExport, match=r"no \.parquet files"):
        check_input(f"file://{tmp_path}")  # file:// is local: checked


@pytest.mark.integration
def test_report_on_ephemeral_only_archive(spark: Any, tmp_path: Path) -> None:
    from store_node.analytics.report import run_report

    from .conftest import HAND_ROWS, write_export

    eph = [r for r in HAND_ROWS if r["kind"] == "ephemeral"]
    export = write_export(tmp_path / "export", eph)
    result = run_report(spark, export, tmp_path / "report", make_plots=False)
    assert result.totals["messages"] == 1
    assert result.totals["delivery_delay"] == {}  # no Lamport time, no delay
    assert result.totals["loss"]["missing_messages"] == 0
    assert "delivery delay" not in result.summary
    assert result.rows("channels")[0]["channel_id"] == "0042"
