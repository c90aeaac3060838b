"""The archive contract, run unchanged on SQLite and on real PostgreSQL."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from store_node.archive.base import Archive, Criteria, Page
from store_node.errors import ArchiveClosed
from store_node.ingest import merge_rows
from tests.store_node.store_node_helpers import BASE_MS, archive_row

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


def test_a_batch_mixing_new_and_archived_keys_is_undone_then_merged(archive: Archive) -> None:
    # All-new batches go in the bulk way; one archived key in a batch undoes that
    # insert (nothing half-written) and the batch is merged row by row instead,
    # and so are the next few; then all-new batches take the bulk way again.
    from store_node.archive._sql import _FRESH_BACKOFF

    assert archive.write_batch([archive_row("c", i) for i in range(3)]).inserted == 3
    mixed = archive.write_batch([archive_row("c", i) for i in range(1, 6)])
    assert (mixed.inserted, mixed.updated) == (3, 2)
    for k in range(_FRESH_BACKOFF + 2):
        fresh = archive.write_batch([archive_row("d", 10 * k + i) for i in range(10)])
        assert (fresh.inserted, fresh.updated) == (10, 0)
    assert archive.count() == 6 + 10 * (_FRESH_BACKOFF + 2)
    exported = {r.message_id: r for batch in archive.iter_export() for r in batch}
    assert [exported[archive_row("c", i).message_id].arrival_count for i in range(6)] == [
        1,
        2,
        2,
        1,
        1,
        1,
    ]
    assert archive.check_integrity() == []


def test_migrate_is_idempotent_and_versioned(archive: Archive) -> None:
    version = archive.schema_version()
    assert version == archive.migrations[-1][0] >= 1  # type: ignore[attr-defined]
    assert archive.migrate() == version
    assert archive.schema_version() == version


def test_write_is_idempotent_and_counts_rebroadcasts(archive: Archive) -> None:
    rows = [archive_row("c", i) for i in range(10)]
    first = archive.write_batch(rows)
    assert (first.inserted, first.updated) == (10, 0)
    again = [archive_row("c", i, arrival=BASE_MS + 1000 + i) for i in range(5)]
    second = archive.write_batch(again)
    assert (second.inserted, second.updated) == (0, 5)
    assert archive.count() == 10
    stats = archive.stats()
    assert stats.total_arrivals == 15
    assert stats.channels == {"c": 10}
    # first_arrival never moves (it is the pagination key); last_arrival does.
    exported = {r.message_id: r for batch in archive.iter_export() for r in batch}
    bumped = exported[rows[0].message_id]
    assert (bumped.first_arrival, bumped.last_arrival, bumped.arrival_count) == (
        BASE_MS,
        BASE_MS + 1000,
        2,
    )
    assert archive.check_integrity() == []


def test_same_message_id_in_two_channels_is_two_rows(archive: Archive) -> None:
    a = archive_row("a", 1)
    b = archive_row("b", 1)
    b = dataclasses.replace(b, message_id=a.message_id)
    assert archive.write_batch([a, b]).inserted == 2


def test_merge_rows_collapses_copies_within_a_batch(archive: Archive) -> None:
    copies = [archive_row("c", 1, arrival=BASE_MS + k) for k in range(3)]
    merged = merge_rows(copies)
    assert len(merged) == 1 and merged[0].arrival_count == 3
    assert archive.write_batch(merged).inserted == 1
    assert archive.stats().total_arrivals == 3


def test_lookup_by_ids_hashes_and_presence(archive: Archive) -> None:
    rows = [archive_row("c", i) for i in range(20)] + [archive_row("d", i) for i in range(5)]
    archive.write_batch(rows)
    ids = (*(r.message_id for r in rows[:3]), "missing")
    hashes = (rows[5].transport_hash or b"", b"\x00" * 32)
    page = archive.find(
        Criteria(channel_id="c", message_ids=ids, message_hashes=hashes),
        after=None,
        forward=True,
        limit=100,
        max_bytes=1 << 20,
        include_data=True,
    )
    assert [m.message_id for m in page.messages] == [r.message_id for r in (*rows[:3], rows[5])]
    assert [m.data for m in page.messages] == [r.data for r in (*rows[:3], rows[5])]
    assert page.next_key is None
    # Presence: keys only, no bytes.
    presence = archive.find(
        Criteria(channel_id="c", message_ids=ids),
        after=None,
        forward=True,
        limit=100,
        max_bytes=1,
        include_data=False,
    )
    assert len(presence.messages) == 3 and all(m.data is None for m in presence.messages)
    # A hash lookup without channel finds it in any channel; scoped to another channel, not.
    anywhere = archive.find(
        Criteria(message_hashes=(rows[21].transport_hash or b"",)),
        after=None,
        forward=True,
        limit=10,
        max_bytes=1 << 20,
        include_data=False,
    )
    assert [m.channel_id for m in anywhere.messages] == ["d"]
    elsewhere = archive.find(
        Criteria(channel_id="c", message_hashes=(rows[21].transport_hash or b"",)),
        after=None,
        forward=True,
        limit=10,
        max_bytes=1 << 20,
        include_data=False,
    )
    assert elsewhere.messages == []


@pytest.mark.parametrize("forward", [True, False])
def test_time_range_pages_cover_everything_once(archive: Archive, forward: bool) -> None:
    # Several rows share an arrival time: the seq tie-break must keep paging exact.
    rows = [archive_row("c", i, arrival=BASE_MS + i // 3) for i in range(100)]
    rows += [archive_row("other", i) for i in range(10)]
    archive.bulk_load(rows)
    criteria = Criteria(channel_id="c", time_start=BASE_MS + 2, time_end=BASE_MS + 30)
    expected = [r.message_id for r in rows[:100] if BASE_MS + 2 <= r.first_arrival < BASE_MS + 30]
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = archive.find(
            criteria, after=after, forward=forward, limit=7, max_bytes=1 << 20, include_data=True
        )
        pages += 1
        keys = [m.key for m in page.messages]
        assert keys == sorted(keys), "pages are in forward order whatever the direction"
        seen += [m.message_id for m in page.messages] if forward else []
        if not forward:
            seen[:0] = [m.message_id for m in page.messages]
        if page.next_key is None:
            break
        after = page.next_key
    assert seen == expected
    assert pages == -(-len(expected) // 7)


def test_page_stops_at_byte_budget_but_returns_at_least_one(archive: Archive) -> None:
    rows = [archive_row("c", i, content=bytes(1000)) for i in range(10)]
    archive.write_batch(rows)
    size = rows[0].message_size
    page = archive.find(
        Criteria(channel_id="c"),
        after=None,
        forward=True,
        limit=100,
        max_bytes=3 * size,
        include_data=True,
    )
    assert len(page.messages) == 3 and page.next_key == page.messages[-1].key
    tiny = archive.find(
        Criteria(channel_id="c"),
        after=None,
        forward=True,
        limit=100,
        max_bytes=1,
        include_data=True,
    )
    assert len(tiny.messages) == 1


def test_retention_by_age_and_size(archive: Archive) -> None:
    rows = [archive_row("c", i, arrival=BASE_MS + i * 1000) for i in range(50)]
    archive.write_batch(rows)
    assert archive.delete_older_than(BASE_MS + 10_000) == 10
    assert archive.count() == 40
    total = archive.stats().total_message_bytes
    one = rows[0].message_size
    assert archive.trim_to_bytes(total) == 0
    deleted = archive.trim_to_bytes(total - 5 * one)
    assert deleted == 5
    left = [r.first_arrival for batch in archive.iter_export() for r in batch]
    assert min(left) == BASE_MS + 15_000, "the oldest rows go first"
    assert archive.stats().total_message_bytes <= total - 5 * one


def test_export_iterates_in_channel_then_time_order(archive: Archive) -> None:
    rows = [archive_row(ch, i, arrival=BASE_MS - i) for ch in ("b", "a") for i in range(30)]
    archive.write_batch(rows)
    got = [(r.channel_id, r.first_arrival) for b in archive.iter_export(batch_size=7) for r in b]
    assert got == sorted(got) and len(got) == 60


def test_causal_history_round_trips(archive: Archive) -> None:
    row = archive_row("c", 1, history=("x", "y", "z"))
    archive.write_batch([row])
    (exported,) = [r for b in archive.iter_export() for r in b]
    assert exported.causal_history == ["x", "y", "z"]
    assert exported.kind == "content" and exported.transport_hash == row.transport_hash


def test_meta_set_once(archive: Archive) -> None:
    assert archive.get_meta("k") is None
    assert archive.set_meta_if_absent("k", b"one") == b"one"
    assert archive.set_meta_if_absent("k", b"two") == b"one"
    assert archive.get_meta("k") == b"one"


def test_concurrent_readers_while_writing(archive: Archive) -> None:
    archive.write_batch([archive_row("c", i) for i in range(100)])
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(20):
                page = archive.find(
                    Criteria(channel_id="c"),
                    after=None,
                    forward=False,
                    limit=10,
                    max_bytes=1 << 20,
                    include_data=True,
                )
                assert len(page.messages) == 10
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for k in range(10):
        archive.write_batch([archive_row("c", 1000 + k * 10 + j) for j in range(10)])
    for t in threads:
        t.join()
    assert errors == []
    assert archive.count() == 200


def test_a_page_returns_every_value_as_stored(archive: Archive) -> None:
    # SQLite hands a page back as one JSON row (store_node.archive.sqlite): text that
    # JSON escapes, every byte value, a row without transport hash and without a
    # Lamport timestamp must all come back exactly as written, in page order.
    odd = dataclasses.replace(
        archive_row("c", 1),
        message_id='id "quoted" \\ back\tslash é ☃ \U0001f600',
        sender_id="sender\nline",
        data=bytes(range(256)) * 3,
        transport_hash=None,
        lamport_timestamp=None,
    )
    big = dataclasses.replace(archive_row("c", 2), lamport_timestamp=2**63 - 1)
    archive.write_batch([odd, big, archive_row("c", 3)])
    for forward in (True, False):
        page = archive.find(
            Criteria(channel_id="c", message_ids=(odd.message_id, big.message_id)),
            after=None,
            forward=forward,
            limit=10,
            max_bytes=1 << 20,
            include_data=True,
        )
        assert [
            (m.message_id, m.sender_id, m.data, m.transport_hash, m.lamport_timestamp)
            for m in page.messages
        ] == [
            (r.message_id, r.sender_id, r.data, r.transport_hash, r.lamport_timestamp)
            for r in (odd, big)
        ]
        assert page.next_key is None


class _GatedReader:
    """Holds the next page read inside a statement on its reader connection until
    released (a SQL function that waits), as a slow query would."""

    def __init__(self, archive: Archive) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        inner = archive._page_rows  # type: ignore[attr-defined]

        def gated(conn: object, *args: object) -> object:
            conn.create_function("chorus_gate", 0, self._wait)  # type: ignore[attr-defined]
            conn.execute("SELECT chorus_gate()").fetchone()  # type: ignore[attr-defined]
            return inner(conn, *args)

        archive._page_rows = gated  # type: ignore[attr-defined]

    def _wait(self) -> int:
        self.entered.set()
        assert self.release.wait(10)
        return 1


def _read_in_thread(archive: Archive) -> tuple[threading.Thread, list[object]]:
    results: list[object] = []

    def read() -> None:
        try:
            results.append(
                archive.find(
                    Criteria(channel_id="c"),
                    after=None,
                    forward=True,
                    limit=10,
                    max_bytes=1 << 20,
                    include_data=True,
                )
            )
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    return thread, results


def test_close_waits_for_a_read_in_progress_then_refuses_new_ones(tmp_path: Path) -> None:
    # close() used to close every thread's reader connection at once, also one a
    # thread was reading through (a segfault once). Now it waits for the read to end.
    from store_node.archive.sqlite import SqliteArchive

    archive = SqliteArchive(tmp_path / "archive.db")
    archive.migrate()
    archive.write_batch([archive_row("c", i) for i in range(5)])
    assert archive.count() == 5  # this thread's reader connection exists before close()
    gate = _GatedReader(archive)
    reader, results = _read_in_thread(archive)
    assert gate.entered.wait(10)
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (archive.close(), closed.set()))
    closer.start()
    # close() has begun (new reads are refused) but does not return mid-read.
    deadline = time.monotonic() + 10
    while True:
        try:
            archive.count()
        except ArchiveClosed:
            break
        assert time.monotonic() < deadline, "close() never started refusing reads"
    assert not closed.wait(0.3)
    gate.release.set()
    reader.join(10)
    assert closed.wait(10)
    closer.join(10)
    (page,) = results
    assert isinstance(page, Page) and len(page.messages) == 5
    with pytest.raises(ArchiveClosed, match="closed"):
        archive.find(
            Criteria(channel_id="c"),
            after=None,
            forward=True,
            limit=1,
            max_bytes=1,
            include_data=False,
        )
    with pytest.raises(ArchiveClosed, match="closed"):
        archive.write_batch([archive_row("c", 9)])
    archive.close()  # idempotent


def test_close_leaves_a_connection_still_reading_after_close_wait_open(tmp_path: Path) -> None:
    # A read that outlasts close_wait keeps its connection: close() returns without
    # closing it under the thread, and the read still ends well.
    from store_node.archive.sqlite import SqliteArchive

    archive = SqliteArchive(tmp_path / "archive.db")
    archive.migrate()
    archive.write_batch([archive_row("c", i) for i in range(3)])
    archive.close_wait = 0.05
    gate = _GatedReader(archive)
    reader, results = _read_in_thread(archive)
    assert gate.entered.wait(10)
    archive.close()
    gate.release.set()
    reader.join(10)
    (page,) = results
    assert isinstance(page, Page) and len(page.messages) == 3
