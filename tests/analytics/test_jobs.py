"""Each job against answers computed by hand from ``conftest.HAND_ROWS``.

Channel 0042 holds a..f, channel "café ☕/x" holds g, h. The comments give the arithmetic.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import require_module

from .conftest import CH_A, CH_B, DAY, HOUR, T0

pytestmark = pytest.mark.integration

jobs = require_module("store_node.analytics.jobs")


def rows(df: Any, *keys: str) -> list[dict[str, Any]]:
    """Rows as dicts, sorted by ``keys`` (jobs return rows in no particular order).

    Through Arrow, as the report reads them: timestamps come back as aware UTC datetimes,
    whatever the local time zone of the test run.
    """
    out: list[dict[str, Any]] = df.toArrow().to_pylist()
    return sorted(out, key=lambda r: tuple(r[k] for k in keys))


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@pytest.fixture(scope="module")
def archive(spark: Any, hand_archive: Path) -> Any:
    return jobs.read_archive(spark, str(hand_archive)).cache()


@pytest.fixture(scope="module")
def sender_hours(archive: Any) -> Any:
    return jobs.sender_hour_volume(archive).cache()


@pytest.fixture(scope="module")
def problems(archive: Any) -> Any:
    return jobs.causal_problems(archive).cache()


def test_partition_column_stays_a_string_and_channel_id_is_decoded(archive: Any) -> None:
    pairs = {
        (r["channel"], r["channel_id"]) for r in archive.select("channel", "channel_id").collect()
    }
    assert (CH_A, CH_A) in pairs  # "0042", not 42
    assert {cid for _, cid in pairs} == {CH_A, CH_B}
    assert archive.count() == 8


def test_channel_volume_by_hour_and_day(sender_hours: Any) -> None:
    hourly = rows(jobs.channel_volume(sender_hours, "hour"), "channel_id", "bucket_start")
    assert [
        (r["channel_id"], r["bucket_start"], r["messages"], r["bytes"], r["active_participants"])
        for r in hourly
    ] == [
        (CH_A, at(T0), 3, 600, 2),  # a, b, c by alice, bob
        (CH_A, at(T0 + HOUR), 2, 450, 2),  # d (carol), e (bob)
        (CH_A, at(T0 + DAY - HOUR), 1, 150, 1),  # f
        (CH_B, at(T0), 2, 2024, 1),  # g, h by dave
    ]
    daily = rows(jobs.channel_volume(sender_hours, "day"), "channel_id", "bucket_start")
    day0 = at(T0 - 10 * HOUR)
    assert [
        (r["channel_id"], r["bucket_start"], r["messages"], r["active_participants"]) for r in daily
    ] == [
        (CH_A, day0, 5, 3),
        (CH_A, at(T0 + 14 * HOUR), 1, 1),
        (CH_B, day0, 2, 1),
    ]


def test_sender_volume_and_participants(sender_hours: Any) -> None:
    daily = rows(jobs.sender_volume(sender_hours, "day"), "channel_id", "sender_id", "bucket_start")
    assert [(r["channel_id"], r["sender_id"], r["messages"], r["bytes"]) for r in daily] == [
        (CH_A, "alice", 2, 400),
        (CH_A, "bob", 2, 250),  # b (200) + e (50) on the first day
        (CH_A, "bob", 1, 150),  # f the next day
        (CH_A, "carol", 1, 400),
        (CH_B, "dave", 2, 2024),
    ]
    assert len(rows(jobs.sender_volume(sender_hours, "hour"), "channel_id")) == 6
    part = {r["channel_id"]: r for r in rows(jobs.participants(sender_hours), "channel_id")}
    assert part[CH_A]["participants"] == 3 and part[CH_A]["messages"] == 6
    assert (part[CH_A]["first_hour"], part[CH_A]["last_hour"]) == (at(T0), at(T0 + DAY - HOUR))
    assert part[CH_B]["participants"] == 1 and part[CH_B]["messages"] == 2
    with pytest.raises(ValueError):
        jobs.channel_volume(sender_hours, "week")  # type: ignore[arg-type]


def test_busiest_hours_and_hour_of_day(sender_hours: Any) -> None:
    hod = {r["hour_of_day"]: r["messages"] for r in jobs.hour_of_day(sender_hours).collect()}
    assert hod == {10: 5, 11: 2, 9: 1}
    top = jobs.busiest_hours(sender_hours, top=2).toArrow().to_pylist()
    assert [(r["hour"], r["messages"], r["channels"], r["senders"]) for r in top] == [
        (at(T0), 5, 2, 3),  # alice, bob in 0042 and dave in café
        (at(T0 + HOUR), 2, 1, 2),
    ]


def test_delivery_delay_percentiles_are_exact(archive: Any) -> None:
    delays = jobs.delay_counts(archive)
    per = {r["channel_id"]: r for r in rows(jobs.delivery_delay(delays), "channel_id")}
    # 0042, ephemeral e left out: a 100, b 200, c 50, d HOUR+10-500 = 3_599_510, f 300.
    # Sorted [50, 100, 200, 300, 3_599_510]; rank = q * (n - 1), linear in between:
    # p50 -> rank 2 = 200; p95 -> rank 3.8 = 300 + 0.8 * 3_599_210 = 2_879_668;
    # p99 -> rank 3.96 = 300 + 0.96 * 3_599_210 = 3_455_541.6.
    a = per[CH_A]
    assert a["messages"] == 5
    assert (a["delay_min_ms"], a["delay_max_ms"]) == (50, 3_599_510)
    assert a["delay_mean_ms"] == pytest.approx((50 + 100 + 200 + 300 + 3_599_510) / 5)
    assert a["delay_p50_ms"] == 200
    assert a["delay_p95_ms"] == pytest.approx(2_879_668)
    assert a["delay_p99_ms"] == pytest.approx(3_455_541.6)
    assert per[CH_B]["delay_p50_ms"] == per[CH_B]["delay_p99_ms"] == 10
    overall = jobs.delivery_delay(delays, by=()).collect()[0]
    # All seven: [10, 10, 50, 100, 200, 300, 3_599_510]; p50 rank 3 = 100;
    # p95 rank 5.7 = 300 + 0.7 * 3_599_210 = 2_519_747; p99 rank 5.94 = 3_383_557.4.
    assert overall["messages"] == 7
    assert overall["delay_p50_ms"] == 100
    assert overall["delay_p95_ms"] == pytest.approx(2_519_747)
    assert overall["delay_p99_ms"] == pytest.approx(3_383_557.4)


def test_percentile_matches_numpy_on_a_heavy_tail(spark: Any) -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(4, 1, 5000), (rng.pareto(1.2, 100) + 1) * 1000]).astype(
        np.int64
    )
    uniq, counts = np.unique(values, return_counts=True)
    df = spark.createDataFrame(
        [("c", int(v), int(n)) for v, n in zip(uniq, counts, strict=True)],
        "channel_id string, delay_ms long, messages long",
    )
    got = jobs.delivery_delay(df, by=()).collect()[0]
    want = np.percentile(values, [50, 95, 99])
    assert [got["delay_p50_ms"], got["delay_p95_ms"], got["delay_p99_ms"]] == pytest.approx(
        want, rel=1e-12
    )


def test_rebroadcasts(sender_hours: Any) -> None:
    per = {r["channel_id"]: r for r in rows(jobs.rebroadcasts(sender_hours), "channel_id")}
    # 0042 copies 1 + 3 + 1 + 2 + 1 + 1 = 9 for 6 messages: 3 rebroadcasts, by b and d.
    a = per[CH_A]
    assert (a["messages"], a["copies"], a["rebroadcasts"], a["rebroadcast_messages"]) == (
        6,
        9,
        3,
        2,
    )
    assert a["rebroadcast_fraction"] == pytest.approx(3 / 9)
    assert per[CH_B]["rebroadcasts"] == 0 and per[CH_B]["rebroadcast_fraction"] == 0
    overall = jobs.rebroadcasts(sender_hours, by=()).collect()[0]
    assert (overall["copies"], overall["rebroadcasts"]) == (11, 3)


def test_loss_by_channel(sender_hours: Any, problems: Any) -> None:
    per = {
        r["channel_id"]: r for r in rows(jobs.loss_by_channel(sender_hours, problems), "channel_id")
    }
    # 0042: references b[a] c[b,x] d[c,x,y] f[d] = 7; missing c->x, d->x, d->y = 3 refs,
    # ids {x, y}; archived content+sync a b c d f = 5; loss 2 / (5 + 2).
    a = per[CH_A]
    assert (
        a["archived_messages"],
        a["references"],
        a["missing_references"],
        a["missing_messages"],
    ) == (5, 7, 3, 2)
    assert a["loss_fraction"] == pytest.approx(2 / 7)
    # café: g[a] (a is archived only in 0042), h[g]: 1 missing of 2 references; 1 / (2 + 1).
    b = per[CH_B]
    assert (b["references"], b["missing_references"], b["missing_messages"]) == (2, 1, 1)
    assert b["loss_fraction"] == pytest.approx(1 / 3)


def test_loss_by_sender_and_missing_messages(sender_hours: Any, problems: Any) -> None:
    by_sender = rows(jobs.loss_by_sender(sender_hours, problems), "channel_id", "sender_id")
    assert [
        (
            r["channel_id"],
            r["sender_id"],
            r["references"],
            r["missing_references"],
            r["missing_messages"],
        )
        for r in by_sender
    ] == [
        (CH_A, "alice", 2, 1, 1),  # c -> x
        (CH_A, "carol", 3, 2, 2),  # d -> x, y
        (CH_B, "dave", 2, 1, 1),  # g -> a
    ]  # bob referenced only archived ids: not listed
    missing = rows(jobs.missing_messages(problems), "channel_id", "message_id")
    assert [
        (
            r["channel_id"],
            r["message_id"],
            r["references"],
            r["referencing_senders"],
            r["first_referencing_sender"],
        )
        for r in missing
    ] == [
        (CH_A, "x", 2, 2, "carol"),  # d (Lamport T0+500) is earlier than c (T0+2000)
        (CH_A, "y", 1, 1, "carol"),
        (CH_B, "a", 1, 1, "dave"),
    ]


def test_causal_order_violations(problems: Any) -> None:
    v = rows(jobs.causal_order_violations(problems), "channel_id", "message_id")
    assert [
        (r["channel_id"], r["message_id"], r["sender_id"], r["dependency_id"], r["lag_ms"])
        for r in v
    ] == [(CH_A, "d", "carol", "c", 1500)]
    per = rows(jobs.violations_by_channel(jobs.causal_order_violations(problems)), "channel_id")
    assert [
        (r["channel_id"], r["violating_pairs"], r["violating_messages"], r["max_lag_ms"])
        for r in per
    ] == [(CH_A, 1, 1, 1500)]


def test_causal_problems_without_broadcast_agree(archive: Any, problems: Any) -> None:
    shuffled = jobs.causal_problems(archive, broadcast=False)
    key = ("channel_id", "message_id", "dependency_id")
    assert rows(shuffled, *key) == rows(problems, *key)


def test_message_sizes_and_histogram(archive: Any) -> None:
    sizes = jobs.size_counts(archive)
    per = {r["channel_id"]: r for r in rows(jobs.message_sizes(sizes), "channel_id")}
    # 0042 sizes sorted [50, 100, 150, 200, 300, 400]: p50 rank 2.5 = 175,
    # p95 rank 4.75 = 375, p99 rank 4.95 = 395; mean 1200 / 6.
    a = per[CH_A]
    assert (a["messages"], a["size_min"], a["size_max"]) == (6, 50, 400)
    assert (a["size_p50"], a["size_p95"], a["size_p99"]) == pytest.approx((175, 375, 395))
    assert a["size_mean"] == pytest.approx(200)
    hist = rows(jobs.size_histogram(sizes), "size_from", "kind")
    assert [(r["size_from"], r["size_to"], r["kind"], r["messages"], r["bytes"]) for r in hist] == [
        (32, 64, "ephemeral", 1, 50),
        (64, 128, "content", 1, 100),
        (128, 256, "content", 1, 200),
        (128, 256, "sync", 1, 150),
        (256, 512, "content", 2, 700),
        (512, 1024, "content", 1, 1000),
        (1024, 2048, "content", 1, 1024),  # exactly 1024 opens the next bucket
    ]


def test_one_pass_summaries_equal_the_separate_jobs(archive: Any) -> None:
    s = jobs.archive_summaries(archive, cache=True)
    try:
        assert rows(s.sender_hours, "channel_id", "sender_id", "hour") == rows(
            jobs.sender_hour_volume(archive), "channel_id", "sender_id", "hour"
        )
        assert rows(s.delays, "channel_id", "delay_ms") == rows(
            jobs.delay_counts(archive), "channel_id", "delay_ms"
        )
        assert rows(s.sizes, "channel_id", "kind", "message_size") == rows(
            jobs.size_counts(archive), "channel_id", "kind", "message_size"
        )
    finally:
        s.combined.unpersist()
