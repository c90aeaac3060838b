"""Referenced but missing (issue 27.4): ids archived messages point at that the archive lacks.

The tracker (:class:`store_node.missing.MissingReferences`) is checked against the
analytics job's definition (an id in the causal history of an archived message, in
the same channel, never archived itself) on a real SQLite archive, with a recent
window small enough that most references go to the archive; then its bounds, and
the judging again at a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.sds.message import decode_message
from store_node.archive.base import Archive, ArchiveRow
from store_node.archive.sqlite import SqliteArchive
from store_node.ingest import Ingest, merge_rows
from store_node.metrics import NodeMetrics
from store_node.missing import MissingReferences
from tests.store_node.store_node_helpers import archive_row, envelope, sds_message, wait_for

IDS = [f"id{i}" for i in range(12)]


def _row(channel: str, message_id: str, history: tuple[str, ...]) -> ArchiveRow:
    """A row with a hand-picked id (the tracker never checks ids against bytes)."""
    base = archive_row(channel, 0, history=history)
    fields = {f: getattr(base, f) for f in ArchiveRow.__dataclass_fields__}
    return ArchiveRow(**{**fields, "message_id": message_id})


def _model(batches: list[list[ArchiveRow]]) -> set[tuple[str, str]]:
    """The analytics definition, computed from scratch over everything archived."""
    rows = [r for batch in batches for r in batch]
    archived = {(r.channel_id, r.message_id) for r in rows}
    referenced = {(r.channel_id, ref) for r in rows for ref in r.causal_history}
    return referenced - archived


@pytest.fixture
def sqlite_archive(tmp_path: Path) -> Iterator[SqliteArchive]:
    archive = SqliteArchive(tmp_path / "archive.db")
    archive.migrate()
    yield archive
    archive.close()


rows_strategy = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(["c", "d"]),
            st.sampled_from(IDS),
            st.lists(st.sampled_from(IDS), max_size=3).map(tuple),
        ),
        min_size=1,
        max_size=6,
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=rows_strategy, recent=st.integers(1, 6))
def test_the_missing_set_is_the_analytics_definition(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[str, str, tuple[str, ...]]]],
    recent: int,
) -> None:
    archive = SqliteArchive(tmp_path_factory.mktemp("m") / "archive.db")
    archive.migrate()
    metrics = NodeMetrics()
    tracker = MissingReferences(archive, metrics, recent_keys=recent)
    written: list[list[ArchiveRow]] = []
    try:
        for spec in batches:
            batch = merge_rows([_row(c, m, h) for c, m, h in spec])
            # As ingest does: judged on the decoder thread, then committed.
            tracker.observe(batch)
            archive.write_batch(batch)
            written.append(batch)
            assert set(tracker.missing()) == _model(written)
        assert metrics.value("chorus_store_referenced_missing") == len(_model(written))
    finally:
        archive.close()


def test_a_missing_id_is_recovered_when_it_arrives_and_only_in_its_channel(
    sqlite_archive: SqliteArchive,
) -> None:
    metrics = NodeMetrics()
    tracker = MissingReferences(sqlite_archive, metrics)
    noticed: list[int] = []
    tracker.on_noticed = noticed.append
    # "x" exists in channel d only: a reference from c to it is missing (per channel).
    first = [_row("d", "x", ()), _row("c", "a", ("x", "y"))]
    assert tracker.observe(first) == 2
    sqlite_archive.write_batch(first)
    assert noticed == [2] and tracker.count == 2
    assert tracker.observe([_row("c", "b", ("x", "a"))]) == 0  # already known: not again
    tracker.observe([_row("c", "x", ())])
    assert set(tracker.missing()) == {("c", "y")}
    assert metrics.value("chorus_store_referenced_recovered_total") == 1
    assert metrics.value("chorus_store_referenced_missing") == 1


def test_missing_ids_are_given_up_when_too_old_or_too_many(sqlite_archive: SqliteArchive) -> None:
    now = [0.0]
    metrics = NodeMetrics()
    tracker = MissingReferences(
        sqlite_archive, metrics, max_missing=3, give_up_after=60, clock=lambda: now[0]
    )
    tracker.observe([_row("c", "a", ("m1",))])
    tracker.observe([_row("c", "b", ("m2",))])
    now[0] = 30.0
    tracker.observe([_row("c", "e", ("m3", "m4"))])  # four missing, bound three: m1 dropped
    assert set(tracker.missing()) == {("c", "m2"), ("c", "m3"), ("c", "m4")}
    given_up = "chorus_store_referenced_given_up_total"
    assert metrics.value(given_up, reason="overflow") == 1
    now[0] = 61.0
    assert tracker.sweep() == 1  # m2, noticed at 0
    assert set(tracker.missing()) == {("c", "m3"), ("c", "m4")}
    assert metrics.value(given_up, reason="expired") == 1
    assert metrics.value("chorus_store_referenced_missing") == 2


def test_only_ids_noticed_since_the_last_look_and_still_missing_ask_again(
    sqlite_archive: SqliteArchive,
) -> None:
    tracker = MissingReferences(sqlite_archive)
    tracker.observe([_row("c", "a", ("lost",))])
    assert tracker.take_fresh() == 1
    tracker.observe([_row("c", "b", ("lost", "late"))])  # "lost" is known: not fresh
    tracker.observe([_row("c", "late", ())])  # its copy merely arrived late
    assert tracker.take_fresh() == 0
    assert tracker.missing() == [("c", "lost")]


async def test_a_restarted_ingest_judges_the_newest_rows_again(tmp_path: Path) -> None:
    archive: Archive = SqliteArchive(tmp_path / "archive.db")
    archive.migrate()
    gap = [sds_message("c", i) for i in range(3)]
    ids = [decode_message(p).message_id for p in gap]
    after = sds_message("c", 10, history=(ids[1], ids[2]))
    first = Ingest(archive, batch_interval=0.0)
    await first.start()
    for payload in (gap[0], after):
        await first.submit(envelope("c", payload))
    await first.stop()
    assert first.missing.count == 2
    archive.close()

    archive = SqliteArchive(tmp_path / "archive.db")
    metrics = NodeMetrics()
    again = Ingest(archive, batch_interval=0.0, metrics=metrics)
    await again.start()
    try:
        # Nothing new arrives: what it knows it learned from the archive.
        await wait_for(lambda: again.missing.count == 2)
        assert set(again.missing.missing()) == {("c", ids[1]), ("c", ids[2])}
        await again.submit(envelope("c", gap[2]))
        await wait_for(lambda: again.missing.count == 1)
        assert metrics.value("chorus_store_referenced_recovered_total") == 1
    finally:
        await again.stop()
        archive.close()


def test_both_backends_answer_the_trackers_two_questions(archive: Archive) -> None:
    rows = [_row("c", "a", ()), _row("c", "b", ("a",)), _row("d", "a", ("zz", "b"))]
    for row in rows:
        archive.write_batch([row])
    assert archive.recent_references(2) == [("d", "a", ["zz", "b"]), ("c", "b", ["a"])]
    assert archive.existing_ids({"c": ["a", "b", "zz"], "d": {"b", "a"}, "e": ["a"]}) == {
        ("c", "a"),
        ("c", "b"),
        ("d", "a"),
    }
    tracker = MissingReferences(archive)
    assert tracker.seed() == 2
    assert set(tracker.missing()) == {("d", "zz"), ("d", "b")}
