"""Issue 19.4: an export of 90-byte CJK and 256-byte ASCII channel ids reads back in Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store_node.analytics.jobs import read_archive
from store_node.archive.sqlite import SqliteArchive
from store_node.export import export_archive
from tests.store_node.store_node_helpers import BASE_MS, archive_row

CHANNELS = ("中" * 30, "x" * 256, "plain")


def test_long_channel_ids_read_back_in_spark(spark: Any, tmp_path: Path) -> None:
    archive = SqliteArchive(tmp_path / "a.db")
    archive.migrate()
    archive.write_batch(
        [archive_row(c, i, arrival=BASE_MS + i) for c in CHANNELS for i in range(4)]
    )
    export_archive(archive, tmp_path / "export", progress=False)
    archive.close()
    df = read_archive(spark, str(tmp_path / "export"))
    counts = {r["channel_id"]: r["count"] for r in df.groupBy("channel_id").count().collect()}
    assert counts == {c: 4 for c in CHANNELS}
