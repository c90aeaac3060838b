"""Fixtures for the analytics tests: one hand-built archive (the Spark session is shared,
in ``tests/conftest.py``).

The hand-built archive is small enough to compute every answer by hand; the expected values
in ``test_jobs.py`` are derived in comments there from the rows below.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from store_node.analytics.schema import ARROW_SCHEMA, encode_channel

#: 2026-01-05 10:00:00 UTC in epoch ms: the hand archive's reference time.
T0 = int(datetime(2026, 1, 5, 10, tzinfo=UTC).timestamp() * 1000)
HOUR = 3_600_000
DAY = 24 * HOUR
#: A numeric-looking channel (must stay "0042") and one that needs percent-encoding.
CH_A = "0042"
CH_B = "café ☕/x"


def _row(
    mid: str,
    channel: str,
    sender: str,
    lamport: int | None,
    arrival: int,
    size: int,
    count: int = 1,
    history: tuple[str, ...] = (),
    kind: str = "content",
) -> dict[str, Any]:
    return {
        "message_id": mid,
        "channel_id": channel,
        "sender_id": sender,
        "kind": kind,
        "lamport_timestamp": lamport,
        "causal_history": list(history),
        "content_size": max(0, size - 40),
        "message_size": size,
        "first_arrival": arrival,
        "last_arrival": arrival + (count - 1) * 1000,
        "arrival_count": count,
        "transport_hash": bytes(32),
    }


#: (message, channel, sender, Lamport, first arrival, size, arrivals, causal history, kind)
HAND_ROWS: list[dict[str, Any]] = [
    _row("a", CH_A, "alice", T0, T0 + 100, 100),
    _row("b", CH_A, "bob", T0 + 1000, T0 + 1200, 200, count=3, history=("a",)),
    _row("c", CH_A, "alice", T0 + 2000, T0 + 2050, 300, history=("b", "x")),
    # d's Lamport time is below its dependency c's: a causal-order violation (lag 1500 ms).
    _row("d", CH_A, "carol", T0 + 500, T0 + HOUR + 10, 400, count=2, history=("c", "x", "y")),
    _row("e", CH_A, "bob", None, T0 + HOUR + 1800_000, 50, kind="ephemeral"),
    _row(
        "f", CH_A, "bob", T0 + DAY - HOUR, T0 + DAY - HOUR + 300, 150, history=("d",), kind="sync"
    ),
    # "a" is archived, but in the other channel: here it is missing.
    _row("g", CH_B, "dave", T0, T0 + 10, 1000, history=("a",)),
    _row("h", CH_B, "dave", T0 + 20, T0 + 30, 1024, history=("g",)),
]


def write_export(root: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` in the export layout: channel=<encoded>/date=<UTC date>/part-0.parquet."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        day = datetime.fromtimestamp(r["first_arrival"] / 1000, tz=UTC).strftime("%Y-%m-%d")
        groups.setdefault((r["channel_id"], day), []).append(r)
    for (channel, day), group in groups.items():
        folder = root / f"channel={encode_channel(channel)}" / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        cols = {f.name: [r[f.name] for r in group] for f in ARROW_SCHEMA}
        arrays = {
            name: pa.array(values, type=pa.int64()).cast(ARROW_SCHEMA.field(name).type)
            if name in ("first_arrival", "last_arrival")
            else pa.array(values, type=ARROW_SCHEMA.field(name).type)
            for name, values in cols.items()
        }
        pq.write_table(pa.table(arrays, schema=ARROW_SCHEMA), folder / "part-0.parquet")
    return root


@pytest.fixture(scope="session")
def hand_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hand-built archive on disk."""
    return write_export(tmp_path_factory.mktemp("hand-archive"), HAND_ROWS)
