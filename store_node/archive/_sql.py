"""The SQL both backends share: one implementation of every archive rule.

:class:`SqlArchive` holds the queries; a backend subclass supplies connections,
the dialect's few differences (placeholder, ``GREATEST``, JSON column, bulk
path, integrity pragma) and its ordered list of migrations. Connections: one
writer, serialized by a lock (SQLite allows one writer anyway, and one
PostgreSQL connection per writer keeps batches ordered), plus one connection
per reader thread, so queries never wait for a batch commit.
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from store_node.archive.base import (
    Archive,
    ArchiveRow,
    ArchiveStats,
    Criteria,
    ExportRow,
    Key,
    Page,
    StoredMessage,
    WriteResult,
)
from store_node.errors import ArchiveClosed, MigrationError

#: A migration: its version and the statements that reach it from the previous one.
Migration = tuple[int, tuple[str, ...]]

_ROW_COLUMNS = (
    "channel_id, message_id, sender_id, kind, lamport_timestamp, causal_history, "
    "content_size, message_size, first_arrival, last_arrival, arrival_count, transport_hash, data"
)
_PAGE_COLUMNS = (
    "seq, channel_id, message_id, sender_id, lamport_timestamp, first_arrival, "
    "message_size, transport_hash"
)
_EXPORT_COLUMNS = (
    "message_id, channel_id, sender_id, kind, lamport_timestamp, causal_history, "
    "content_size, message_size, first_arrival, last_arrival, arrival_count, transport_hash"
)
#: Ids per existence check: well under both databases' bound-parameter limits.
_IDS_PER_CHECK = 200
#: Rows deleted per retention transaction, so readers and the ingest writer interleave.
_DELETE_CHUNK = 5_000
#: Batches written by the split path after one that held an archived key, before a
#: batch is tried as all-new again (rebroadcasts come in bursts: a peer resending,
#: a store-to-store catch-up).
_FRESH_BACKOFF = 16


class SqlArchive(Archive):
    """Archive over a DB-API connection; see the module docstring."""

    #: The dialect's bound-parameter marker.
    placeholder: str = "?"
    #: The dialect's two-argument maximum.
    greatest: str = "max"
    #: The dialect's byte length of a blob.
    octet_length: str = "length"
    #: SQL expression that turns a bound JSON text into the history column's type.
    history_param: str = "?"
    #: Seconds :meth:`close` waits for reads in progress.
    close_wait: float = 30.0
    #: Ordered migrations; the last version is the current schema.
    migrations: tuple[Migration, ...] = ()

    def __init__(self) -> None:
        self._write_lock = threading.Lock()
        self._writer: Any = None
        self._local = threading.local()
        self._readers: list[Any] = []
        #: Guards ``_readers``, ``_reads`` and ``_closed``; notified when a read ends.
        self._readers_lock = threading.Condition()
        #: Reads in progress, per reader connection (by ``id``).
        self._reads: dict[int, int] = {}
        self._closed = False
        #: Batches left before :meth:`_insert_if_all_new` is tried again.
        self._fresh_backoff = 0

    # -- backend hooks ---------------------------------------------------------------

    @abc.abstractmethod
    def connect(self, role: str = "reader") -> Any:
        """See :meth:`Archive.connect`."""

    @abc.abstractmethod
    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Context manager: one write transaction on ``conn`` (commit or roll back)."""

    @abc.abstractmethod
    def _lock_for_migration(self, conn: Any) -> None:
        """Inside the migration transaction: keep concurrent migrators out."""

    @abc.abstractmethod
    def _encode_history(self, history: Sequence[str]) -> Any:
        """Bind value for the causal-history column."""

    @abc.abstractmethod
    def _decode_history(self, value: Any) -> list[str]:
        """The causal-history column back to a list of ids."""

    @abc.abstractmethod
    def _export_cursor(self, sql: str, batch_size: int) -> Iterator[list[tuple[Any, ...]]]:
        """Run ``sql`` on a dedicated connection, streaming rows in batches."""

    def _database_checks(self, conn: Any) -> list[str]:
        """Backend-specific integrity checks (e.g. SQLite's ``integrity_check``)."""
        return []

    # -- connections -----------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _writer_conn(self) -> Any:
        if self._closed:
            raise ArchiveClosed("the archive is closed")
        if self._writer is None:
            self._writer = self.connect("writer")
        return self._writer

    def _reader(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connect()
            with self._readers_lock:
                if self._closed:
                    conn.close()
                    raise ArchiveClosed("the archive is closed")
                self._readers.append(conn)
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Any]:
        """This thread's reader connection, marked in use until the block ends, so
        :meth:`close` never closes it under a read; :class:`ArchiveClosed` after close."""
        with self._readers_lock:
            if self._closed:
                raise ArchiveClosed("the archive is closed")
        conn = self._reader()
        key = id(conn)
        with self._readers_lock:
            if self._closed:
                raise ArchiveClosed("the archive is closed")
            self._reads[key] = self._reads.get(key, 0) + 1
        try:
            yield conn
        finally:
            with self._readers_lock:
                if self._reads[key] == 1:
                    del self._reads[key]
                    self._readers_lock.notify_all()
                else:
                    self._reads[key] -= 1

    def close(self) -> None:
        """See :meth:`Archive.close`: new reads and writes fail with
        :class:`ArchiveClosed`; reads in progress end first (up to
        :attr:`close_wait` seconds; a connection still reading then is left open
        rather than closed under its thread), and so does a write in progress."""
        with self._readers_lock:
            if self._closed:
                return
            self._closed = True
            self._readers_lock.wait_for(lambda: not self._reads, timeout=self.close_wait)
            busy = set(self._reads)
            readers, self._readers = self._readers, []
        for conn in readers:
            if id(conn) in busy:
                continue
            with contextlib.suppress(Exception):
                conn.close()
        with self._write_lock:
            if self._writer is not None:
                with contextlib.suppress(Exception):
                    self._writer.close()
                self._writer = None

    # -- schema ----------------------------------------------------------------------

    def migrate(self) -> int:
        """See :meth:`Archive.migrate`."""
        latest = self.migrations[-1][0] if self.migrations else 0
        with self._write_lock:
            conn = self._writer_conn()
            with self._transaction(conn):
                self._lock_for_migration(conn)
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version ("
                    "version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"
                )
                current = self._current_version(conn)
                if current > latest:
                    raise MigrationError(
                        f"archive schema is version {current}, newer than this store node "
                        f"understands ({latest}); upgrade the store node"
                    )
                for version, statements in self.migrations:
                    if version <= current:
                        continue
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute(
                        self._sql("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)"),
                        (version, int(time.time() * 1000)),
                    )
        return latest

    @staticmethod
    def _current_version(conn: Any) -> int:
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def schema_version(self) -> int:
        """See :meth:`Archive.schema_version`."""
        with self._reading() as conn:
            try:
                return self._current_version(conn)
            except Exception:
                # No schema_version table yet: a fresh database. (Readers are autocommit,
                # so a failed statement leaves no aborted transaction behind.)
                return 0

    # -- writes ----------------------------------------------------------------------

    def _values(self) -> str:
        """Placeholders for one row of :data:`_ROW_COLUMNS`."""
        return "(" + ", ".join(["?"] * 5 + [self.history_param] + ["?"] * 7) + ")"

    def _bind(self, row: ArchiveRow) -> tuple[Any, ...]:
        return (
            row.channel_id,
            row.message_id,
            row.sender_id,
            row.kind,
            row.lamport_timestamp,
            self._encode_history(row.causal_history),
            row.content_size,
            row.message_size,
            row.first_arrival,
            row.last_arrival,
            row.arrival_count,
            row.transport_hash,
            row.data,
        )

    def _existing(self, conn: Any, rows: Sequence[ArchiveRow]) -> set[tuple[str, str]]:
        """Which of the rows' keys are already archived (index lookups, per channel)."""
        by_channel: dict[str, list[str]] = {}
        for r in rows:
            by_channel.setdefault(r.channel_id, []).append(r.message_id)
        return self._existing_keys(conn, by_channel)

    def _existing_keys(
        self, conn: Any, by_channel: Mapping[str, Collection[str]]
    ) -> set[tuple[str, str]]:
        """Which ``(channel_id, message_id)`` of ``by_channel`` are archived, on ``conn``."""
        found: set[tuple[str, str]] = set()
        for channel, wanted in by_channel.items():
            ids = list(wanted)
            for start in range(0, len(ids), _IDS_PER_CHECK):
                chunk = ids[start : start + _IDS_PER_CHECK]
                marks = ", ".join("?" * len(chunk))
                sql = self._sql(
                    "SELECT message_id FROM messages "
                    f"WHERE channel_id = ? AND message_id IN ({marks})"
                )
                found.update((channel, m) for (m,) in conn.execute(sql, [channel, *chunk]))
        return found

    def _savepoint(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A nested transaction: undone alone when its block raises."""
        return _savepoint(conn)

    def _is_duplicate_key(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the ``(channel_id, message_id)`` uniqueness refusing a row."""
        return False

    def _insert_if_all_new(self, conn: Any, rows: Sequence[ArchiveRow]) -> bool:
        """Insert ``rows`` the bulk way, all or none, in the caller's transaction.

        The common batch holds only messages the archive has not seen: then this
        is exactly :meth:`bulk_load`'s insert, with no existence check and no
        conflict handling. Returns ``False``, having written nothing, when one of
        the keys is archived already; the caller then takes the split path, and
        so do the next :data:`_FRESH_BACKOFF` batches. Any other error is raised.
        """
        if self._fresh_backoff:
            self._fresh_backoff -= 1
            return False
        try:
            with self._savepoint(conn):
                self._bulk_insert(conn, rows)
        except Exception as exc:
            if not self._is_duplicate_key(exc):
                raise
            self._fresh_backoff = _FRESH_BACKOFF
            return False
        return True

    def write_batch(self, rows: Sequence[ArchiveRow]) -> WriteResult:
        """See :meth:`Archive.write_batch`: all-new batches as :meth:`bulk_load` writes
        them (:meth:`_insert_if_all_new`), others split into new and archived keys."""
        if not rows:
            return WriteResult(0, 0)
        # Split the batch into new keys and rebroadcasts up front (inside the write
        # transaction, so the split is exact for this writer): new rows then go in with
        # one prepared statement run many times, which both databases execute far
        # faster than per-row conflict handling with RETURNING. The insert still says
        # ON CONFLICT, so a row that appears between the split and the insert (another
        # process on the same file) merges instead of failing the batch.
        upsert = self._sql(
            f"INSERT INTO messages ({_ROW_COLUMNS}) VALUES {self._values()} "
            "ON CONFLICT (channel_id, message_id) DO UPDATE SET "
            "arrival_count = messages.arrival_count + excluded.arrival_count, "
            f"last_arrival = {self.greatest}(messages.last_arrival, excluded.last_arrival)"
        )
        bump = self._sql(
            "UPDATE messages SET arrival_count = arrival_count + ?, "
            f"last_arrival = {self.greatest}(last_arrival, ?) "
            "WHERE channel_id = ? AND message_id = ?"
        )
        with self._write_lock:
            conn = self._writer_conn()
            with self._transaction(conn):
                if self._insert_if_all_new(conn, rows):
                    return WriteResult(inserted=len(rows), updated=0)
                existing = self._existing(conn, rows)
                new = [r for r in rows if (r.channel_id, r.message_id) not in existing]
                seen = [r for r in rows if (r.channel_id, r.message_id) in existing]
                cur = conn.cursor()
                if new:
                    cur.executemany(upsert, [self._bind(r) for r in new])
                if seen:
                    cur.executemany(
                        bump,
                        [
                            (r.arrival_count, r.last_arrival, r.channel_id, r.message_id)
                            for r in seen
                        ],
                    )
        return WriteResult(inserted=len(new), updated=len(seen))

    def bulk_load(self, rows: Sequence[ArchiveRow]) -> None:
        """See :meth:`Archive.bulk_load`."""
        with self._write_lock:
            conn = self._writer_conn()
            with self._transaction(conn):
                self._bulk_insert(conn, rows)

    def _bulk_insert(self, conn: Any, rows: Sequence[ArchiveRow]) -> None:
        sql = self._sql(f"INSERT INTO messages ({_ROW_COLUMNS}) VALUES {self._values()}")
        conn.cursor().executemany(sql, [self._bind(r) for r in rows])

    # -- referenced but missing ------------------------------------------------------

    def existing_ids(self, by_channel: Mapping[str, Collection[str]]) -> set[tuple[str, str]]:
        """See :meth:`Archive.existing_ids` (index lookups on a reader connection)."""
        with self._reading() as conn:
            return self._existing_keys(conn, by_channel)

    def recent_references(self, limit: int) -> list[tuple[str, str, list[str]]]:
        """See :meth:`Archive.recent_references` (a backward primary-key scan)."""
        with self._reading() as conn:
            rows = conn.execute(
                self._sql(
                    "SELECT channel_id, message_id, causal_history FROM messages "
                    "ORDER BY seq DESC LIMIT ?"
                ),
                (limit,),
            ).fetchall()
        return [(c, m, self._decode_history(h)) for c, m, h in rows]

    # -- store sync ------------------------------------------------------------------

    def sync_keys_after(self, seq: int, limit: int) -> list[tuple[int, int | None, bytes]]:
        """See :meth:`Archive.sync_keys_after` (a primary-key range scan)."""
        with self._reading() as conn:
            rows = conn.execute(
                self._sql(
                    "SELECT seq, lamport_timestamp, transport_hash FROM messages "
                    "WHERE seq > ? AND transport_hash IS NOT NULL ORDER BY seq LIMIT ?"
                ),
                (seq, limit),
            ).fetchall()
        return [(int(s), lamport, bytes(digest)) for s, lamport, digest in rows]

    def count_sync_keys(self, up_to_seq: int) -> int:
        """See :meth:`Archive.count_sync_keys`."""
        with self._reading() as conn:
            row = conn.execute(
                self._sql(
                    "SELECT count(*) FROM messages WHERE seq <= ? AND transport_hash IS NOT NULL"
                ),
                (up_to_seq,),
            ).fetchone()
        return int(row[0])

    # -- queries ---------------------------------------------------------------------

    def _where(self, criteria: Criteria) -> tuple[list[str], list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if criteria.is_lookup:
            # Each OR term is indexable on its own ((channel_id, message_id) and
            # transport_hash), so both databases answer with index lookups, never a scan.
            terms: list[str] = []
            if criteria.message_ids:
                marks = ", ".join("?" * len(criteria.message_ids))
                terms.append(f"(channel_id = ? AND message_id IN ({marks}))")
                params += [criteria.channel_id, *criteria.message_ids]
            if criteria.message_hashes:
                marks = ", ".join("?" * len(criteria.message_hashes))
                scope = " AND channel_id = ?" if criteria.channel_id is not None else ""
                terms.append(f"(transport_hash IN ({marks}){scope})")
                params += list(criteria.message_hashes)
                if criteria.channel_id is not None:
                    params.append(criteria.channel_id)
            clauses.append("(" + " OR ".join(terms) + ")")
        else:
            if criteria.channel_id is not None:
                clauses.append("channel_id = ?")
                params.append(criteria.channel_id)
            if criteria.time_start is not None:
                clauses.append("first_arrival >= ?")
                params.append(criteria.time_start)
            if criteria.time_end is not None:
                clauses.append("first_arrival < ?")
                params.append(criteria.time_end)
        return clauses, params

    def find(
        self,
        criteria: Criteria,
        *,
        after: Key | None,
        forward: bool,
        limit: int,
        max_bytes: int,
        include_data: bool,
    ) -> Page:
        """See :meth:`Archive.find`."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        clauses, params = self._where(criteria)
        # A lookup must be answered from the key indexes (a few rows, then sorted);
        # a filter query walks (channel_id, first_arrival, seq) in order. The unary
        # "+" hides the order columns from the planner for lookups: without table
        # statistics SQLite otherwise prefers walking the whole channel in time order
        # and testing every row against the id list.
        fa, sq = ("+first_arrival", "+seq") if criteria.is_lookup else ("first_arrival", "seq")
        if after is not None:
            clauses.append(f"({fa}, {sq}) {'>' if forward else '<'} (?, ?)")
            params += [after[0], after[1]]
        order = "ASC" if forward else "DESC"
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        keys = (
            f"SELECT {_PAGE_COLUMNS} FROM messages{where} "
            f"ORDER BY {fa} {order}, {sq} {order} LIMIT ?"
        )
        with self._reading() as conn:
            rows = self._page_rows(
                conn, keys, [*params, limit + 1], forward, limit, max_bytes, include_data
            )
        picked: list[tuple[Any, ...]] = []
        more = False
        for row in rows:
            if len(picked) == limit or (include_data and row[10] is None):
                more = True
                break
            picked.append(row)
        messages = [
            StoredMessage(
                seq=int(r[0]),
                channel_id=r[1],
                message_id=r[2],
                sender_id=r[3],
                lamport_timestamp=r[4],
                first_arrival=int(r[5]),
                message_size=int(r[6]),
                transport_hash=bytes(r[7]) if r[7] is not None else None,
                data=bytes(r[10]) if include_data else None,
            )
            for r in picked
        ]
        next_key = (int(picked[-1][5]), int(picked[-1][0])) if more and picked else None
        if not forward:
            messages.reverse()
        return Page(messages=messages, next_key=next_key)

    def _page_rows(
        self,
        conn: Any,
        keys: str,
        params: Sequence[Any],
        forward: bool,
        limit: int,
        max_bytes: int,
        include_data: bool,
    ) -> list[tuple[Any, ...]]:
        """A page's rows in page order, from ``keys`` (the statement selecting its
        :data:`_PAGE_COLUMNS`, ordered and limited; ``params`` bind it).

        Without data, those 8 columns; with data, ``(8 key columns, running, rn, data)``
        where ``data`` is ``None`` from the first row past ``max_bytes`` (the first row
        always fits, so a page is never empty). Here in one statement (one round trip to
        a server): a running total of the sizes in page order, and the bytes of only the
        rows that fit the budget; the CASE keeps the database from even reading the
        others' blobs.
        """
        if not include_data:
            return list(conn.execute(self._sql(keys), params).fetchall())
        order = "ASC" if forward else "DESC"
        sql = (
            f"SELECT p.*, CASE WHEN p.running <= ? OR p.rn = 1 THEN m.data END "
            f"FROM (SELECT k.*, sum(k.message_size) OVER w AS running, "
            f"row_number() OVER w AS rn FROM ({keys}) AS k "
            f"WINDOW w AS (ORDER BY k.first_arrival {order}, k.seq {order} "
            "ROWS UNBOUNDED PRECEDING)) AS p "
            "JOIN messages AS m ON m.seq = p.seq "
            f"ORDER BY p.first_arrival {order}, p.seq {order}"
        )
        return list(conn.execute(self._sql(sql), [max_bytes, *params]).fetchall())

    def iter_export(self, batch_size: int = 10_000) -> Iterator[list[ExportRow]]:
        """See :meth:`Archive.iter_export`."""
        sql = f"SELECT {_EXPORT_COLUMNS} FROM messages ORDER BY channel_id, first_arrival, seq"
        for batch in self._export_cursor(sql, batch_size):
            yield [
                ExportRow(
                    message_id=r[0],
                    channel_id=r[1],
                    sender_id=r[2],
                    kind=r[3],
                    lamport_timestamp=r[4],
                    causal_history=self._decode_history(r[5]),
                    content_size=int(r[6]),
                    message_size=int(r[7]),
                    first_arrival=int(r[8]),
                    last_arrival=int(r[9]),
                    arrival_count=int(r[10]),
                    transport_hash=bytes(r[11]) if r[11] is not None else None,
                )
                for r in batch
            ]

    def count(self) -> int:
        """See :meth:`Archive.count`."""
        with self._reading() as conn:
            return int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])

    def stats(self) -> ArchiveStats:
        """See :meth:`Archive.stats`."""
        with self._reading() as conn:
            n, total, arrivals, oldest, newest = conn.execute(
                "SELECT count(*), coalesce(sum(message_size), 0), coalesce(sum(arrival_count), 0), "
                "min(first_arrival), max(first_arrival) FROM messages"
            ).fetchone()
            channels = {
                c: int(k)
                for c, k in conn.execute(
                    "SELECT channel_id, count(*) FROM messages "
                    "GROUP BY channel_id ORDER BY channel_id"
                ).fetchall()
            }
            version = self._current_version(conn)
        return ArchiveStats(
            schema_version=version,
            message_count=int(n),
            total_message_bytes=int(total),
            total_arrivals=int(arrivals),
            channels=channels,
            oldest_arrival=int(oldest) if oldest is not None else None,
            newest_arrival=int(newest) if newest is not None else None,
        )

    # -- retention -------------------------------------------------------------------

    def _delete_chunks(self, condition: str, params: Sequence[Any]) -> int:
        deleted = 0
        sql = self._sql(
            "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages WHERE "
            f"{condition} ORDER BY first_arrival, seq LIMIT {_DELETE_CHUNK})"
        )
        while True:
            with self._write_lock:
                conn = self._writer_conn()
                with self._transaction(conn):
                    n = int(conn.execute(sql, list(params)).rowcount)
            deleted += max(n, 0)
            if n < _DELETE_CHUNK:
                return deleted

    def delete_older_than(self, cutoff: int) -> int:
        """See :meth:`Archive.delete_older_than`."""
        return self._delete_chunks("first_arrival < ?", (cutoff,))

    def _trim_boundary(self, conn: Any, max_bytes: int) -> Key | None:
        """The key of the newest row :meth:`trim_to_bytes` deletes, or ``None``."""
        total = int(
            conn.execute("SELECT coalesce(sum(message_size), 0) FROM messages").fetchone()[0]
        )
        excess = total - max_bytes
        if excess <= 0:
            return None
        # Walk the oldest rows in keyset chunks until they cover the excess; that row's
        # key is the boundary. Rows written meanwhile are newer, so they stay.
        boundary: Key | None = None
        acc = 0
        after: Key = (-(2**62), -1)
        sql = self._sql(
            "SELECT first_arrival, seq, message_size FROM messages "
            "WHERE (first_arrival, seq) > (?, ?) ORDER BY first_arrival, seq LIMIT 10000"
        )
        while boundary is None:
            rows = conn.execute(sql, list(after)).fetchall()
            if not rows:
                break
            for first, seq, size in rows:
                acc += int(size)
                if acc >= excess:
                    boundary = (int(first), int(seq))
                    break
            after = (int(rows[-1][0]), int(rows[-1][1]))
        return boundary

    def trim_to_bytes(self, max_bytes: int) -> int:
        """See :meth:`Archive.trim_to_bytes`."""
        with self._reading() as conn:
            boundary = self._trim_boundary(conn, max_bytes)
        if boundary is None:
            return 0
        return self._delete_chunks("(first_arrival, seq) <= (?, ?)", boundary)

    # -- integrity and metadata ------------------------------------------------------

    def check_integrity(self) -> list[str]:
        """See :meth:`Archive.check_integrity`."""
        with self._reading() as conn:
            problems = self._database_checks(conn)
            dupes = conn.execute(
                "SELECT channel_id, message_id, count(*) FROM messages "
                "GROUP BY channel_id, message_id HAVING count(*) > 1 LIMIT 5"
            ).fetchall()
            problems += [f"duplicate row for ({c!r}, {m!r}): {n} copies" for c, m, n in dupes]
            for what, condition in (
                ("arrival_count below 1", "arrival_count < 1"),
                ("last_arrival before first_arrival", "last_arrival < first_arrival"),
                (
                    "message_size differs from the stored bytes",
                    f"message_size <> {self.octet_length}(data)",
                ),
            ):
                n = conn.execute(f"SELECT count(*) FROM messages WHERE {condition}").fetchone()[0]
                if n:
                    problems.append(f"{n} rows with {what}")
        return problems

    def get_meta(self, key: str) -> bytes | None:
        """See :meth:`Archive.get_meta`."""
        with self._reading() as conn:
            found = conn.execute(
                self._sql("SELECT value FROM meta WHERE key = ?"), (key,)
            ).fetchone()
        return bytes(found[0]) if found else None

    def set_meta_if_absent(self, key: str, value: bytes) -> bytes:
        """See :meth:`Archive.set_meta_if_absent`."""
        with self._write_lock:
            conn = self._writer_conn()
            with self._transaction(conn):
                conn.execute(
                    self._sql(
                        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
                    ),
                    (key, value),
                )
                found = conn.execute(
                    self._sql("SELECT value FROM meta WHERE key = ?"), (key,)
                ).fetchone()
        return bytes(found[0])


@contextlib.contextmanager
def _savepoint(conn: Any) -> Iterator[None]:
    conn.execute("SAVEPOINT chorus_batch")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK TO SAVEPOINT chorus_batch")
        conn.execute("RELEASE SAVEPOINT chorus_batch")
        raise
    conn.execute("RELEASE SAVEPOINT chorus_batch")
