"""Parquet export exactly per docs/archive-export.md."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store_node.archive.base import Archive
from store_node.errors import ConfigError
from store_node.export import EXPORT_SCHEMA, channel_folder, export_archive, utc_date
from tests.store_node.store_node_helpers import BASE_MS, archive_row

DAY = 86_400_000


def test_schema_is_the_documented_one() -> None:
    expected = [
        ("message_id", pa.string()),
        ("channel_id", pa.string()),
        ("sender_id", pa.string()),
        ("kind", pa.string()),
        ("lamport_timestamp", pa.int64()),
        ("causal_history", pa.list_(pa.string())),
        ("content_size", pa.int32()),
        ("message_size", pa.int32()),
        ("first_arrival", pa.timestamp("ms", tz="UTC")),
        ("last_arrival", pa.timestamp("ms", tz="UTC")),
        ("arrival_count", pa.int32()),
        ("transport_hash", pa.binary()),
    ]
    assert [(f.name, f.type) for f in EXPORT_SCHEMA] == expected
    nullable = {f.name for f in EXPORT_SCHEMA if f.nullable}
    assert nullable == {"lamport_timestamp", "transport_hash"}


def test_partition_names() -> None:
    assert channel_folder("0042") == "channel=0042"
    assert channel_folder("a/b c=é~_.-") == "channel=a%2Fb%20c%3D%C3%A9~_.-"
    assert utc_date(0) == "1970-01-01"
    assert utc_date(DAY - 1) == "1970-01-01"
    assert utc_date(DAY) == "1970-01-02"


def test_export_partitions_rows_and_reads_back(archive: Archive, tmp_path: Path) -> None:
    day0 = (BASE_MS // DAY) * DAY
    rows = [archive_row("0042", i, arrival=day0 + i * 3_600_000) for i in range(40)]
    rows += [archive_row("a/b c", i, arrival=day0 + 5, history=("p", "q")) for i in range(5)]
    rows += [archive_row("eph", i, arrival=day0 + 7, ephemeral=True) for i in range(3)]
    archive.write_batch(rows)
    archive.write_batch([archive_row("0042", 0, arrival=day0 + 99)])  # a rebroadcast
    out = tmp_path / "export"
    summary = export_archive(archive, out, progress=False)
    assert summary.rows == 48
    folders = sorted(str(p.parent.relative_to(out)) for p in out.rglob("*.parquet"))
    assert folders == sorted(
        [
            *(f"channel=0042/date={utc_date(day0 + d * DAY)}" for d in range(2)),
            f"channel=a%2Fb%20c/date={utc_date(day0)}",
            f"channel=eph/date={utc_date(day0)}",
        ]
    )
    for path in out.rglob("*.parquet"):
        assert pq.read_schema(path).remove_metadata() == EXPORT_SCHEMA
    # How analytics reads it: explicit string partition types, never inferred.
    partitioning = ds.partitioning(
        pa.schema([("channel", pa.string()), ("date", pa.string())]), flavor="hive"
    )
    table = ds.dataset(out, format="parquet", partitioning=partitioning).to_table()
    assert table.num_rows == 48
    # pyarrow percent-decodes hive segments: the partition value is the channel id.
    assert set(table.column("channel").to_pylist()) == {"0042", "a/b c", "eph"}
    by_id = {r["message_id"]: r for r in table.to_pylist()}
    first = by_id[rows[0].message_id]
    assert first["arrival_count"] == 2
    assert first["first_arrival"].timestamp() * 1000 == day0
    assert first["last_arrival"].timestamp() * 1000 == day0 + 99
    assert first["transport_hash"] == rows[0].transport_hash
    assert first["lamport_timestamp"] == rows[0].lamport_timestamp
    assert by_id[rows[40].message_id]["causal_history"] == ["p", "q"]
    eph = by_id[rows[45].message_id]
    assert eph["kind"] == "ephemeral" and eph["lamport_timestamp"] is None


def test_export_rolls_files_and_refuses_to_clobber(archive: Archive, tmp_path: Path) -> None:
    archive.write_batch([archive_row("c", i, arrival=BASE_MS) for i in range(3000)])
    out = tmp_path / "export"
    import store_node.export as export

    old = export.ROW_GROUP_ROWS
    export.ROW_GROUP_ROWS = 500
    try:
        summary = export_archive(archive, out, max_file_bytes=100_000, progress=False)
    finally:
        export.ROW_GROUP_ROWS = old
    assert len(summary.files) > 1
    assert [f.name for f in sorted(summary.files)][:2] == ["part-0.parquet", "part-1.parquet"]
    assert sum(pq.read_metadata(f).num_rows for f in summary.files) == 3000
    with pytest.raises(ConfigError):
        export_archive(archive, out, progress=False)
    again = export_archive(archive, out, overwrite=True, progress=False)
    assert again.rows == 3000
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


# -- issue 19.4: any valid channel id exports ------------------------------------------------

LONG_CHANNELS = ("中" * 30, "x" * 256, "ü" * 128, "a/" * 128)


def test_long_channel_ids_get_short_unique_folder_names() -> None:
    from store_node.analytics.schema import decode_channel

    names = [channel_folder(c) for c in LONG_CHANNELS]
    assert all(len(n.encode()) <= 200 for n in names), names
    assert len(set(names)) == len(names)
    for name in names:
        segment = name.removeprefix("channel=")
        assert decode_channel(segment) is None, "a shortened name is not decoded"
        assert "%" not in segment[-33:] and segment[-33] == "+"
    assert channel_folder("中" * 30).startswith("channel=%E4%B8%AD")
    # Ids that fit are still plain percent-encoding, exactly as before.
    assert channel_folder("中" * 10) == "channel=" + "%E4%B8%AD" * 10


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=256), min_size=2, max_size=2, unique=True))
def test_any_valid_channel_ids_get_distinct_folder_names(ids: list[str]) -> None:
    from store_node.analytics.schema import decode_channel
    from transports.base import InvalidChannelId, validate_channel_id

    valid = []
    for channel in ids:
        with contextlib.suppress(InvalidChannelId):
            valid.append(validate_channel_id(channel))
    names = [channel_folder(c) for c in valid]
    assert len(set(names)) == len(names)
    for channel, name in zip(valid, names, strict=True):
        assert len(name.encode()) <= 200 and "/" not in name
        decoded = decode_channel(name.removeprefix("channel="))
        assert decoded in (None, channel)


def test_long_channel_ids_export_and_read_back(archive: Archive, tmp_path: Path) -> None:
    rows = [archive_row(c, i, arrival=BASE_MS + i) for c in LONG_CHANNELS for i in range(3)]
    archive.write_batch(rows)
    summary = export_archive(archive, tmp_path / "out", progress=False)
    assert summary.rows == len(rows)
    folders = {f.parent.parent.name for f in summary.files}
    assert folders == {channel_folder(c) for c in LONG_CHANNELS}
    table = ds.dataset(tmp_path / "out", format="parquet", partitioning="hive").to_table()
    got = sorted(table.column("channel_id").to_pylist())
    assert got == sorted(r.channel_id for r in rows)
