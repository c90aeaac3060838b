"""The PostgreSQL archive, for operators who outgrow a file.

Connections: one dedicated writer connection (batches stay ordered and each is
one transaction) and one autocommit connection per reader thread; a broken
connection is replaced on next use, so a database restart costs the in-flight
batch a retry, not the node. A batch of new messages is COPYed straight into
the table, as :meth:`bulk_load` does; one holding an archived key (the COPY
fails on it and is undone) is COPYed into a temporary staging table and merged
with one ``INSERT ... SELECT ... ON CONFLICT``. Everything lives in one
schema (``schema`` option, default ``chorus_store``), created on first migration,
so tests and several nodes can share a database.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql

from store_node.archive._sql import _ROW_COLUMNS, Migration, SqlArchive
from store_node.archive.base import ArchiveRow, WriteResult
from store_node.errors import ArchiveUnavailable

MIGRATIONS: tuple[Migration, ...] = (
    (
        1,
        (
            """CREATE TABLE messages (
                seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                channel_id TEXT NOT NULL,
                message_id TEXT NOT NULL,
                sender_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                lamport_timestamp BIGINT,
                causal_history JSONB NOT NULL,
                content_size INTEGER NOT NULL,
                message_size INTEGER NOT NULL,
                first_arrival BIGINT NOT NULL,
                last_arrival BIGINT NOT NULL,
                arrival_count INTEGER NOT NULL,
                transport_hash BYTEA,
                data BYTEA NOT NULL,
                UNIQUE (channel_id, message_id)
            )""",
            "CREATE INDEX messages_channel_time ON messages (channel_id, first_arrival, seq)",
            "CREATE INDEX messages_time ON messages (first_arrival, seq)",
            "CREATE INDEX messages_hash ON messages (transport_hash)",
        ),
    ),
    (2, ("CREATE TABLE meta (key TEXT PRIMARY KEY, value BYTEA NOT NULL)",)),
)


#: Per-connection staging table for batch COPY; emptied at every commit.
_STAGING = """CREATE TEMP TABLE IF NOT EXISTS chorus_staging (
    channel_id TEXT, message_id TEXT, sender_id TEXT, kind TEXT, lamport_timestamp BIGINT,
    causal_history JSONB, content_size INTEGER, message_size INTEGER, first_arrival BIGINT,
    last_arrival BIGINT, arrival_count INTEGER, transport_hash BYTEA, data BYTEA
) ON COMMIT DELETE ROWS"""


class PostgresArchive(SqlArchive):
    """Archive in a PostgreSQL schema; see the module docstring."""

    backend = "postgresql"
    placeholder = "%s"
    greatest = "GREATEST"
    octet_length = "octet_length"
    history_param = "?::jsonb"
    migrations = MIGRATIONS

    def __init__(self, dsn: str, *, schema: str = "chorus_store") -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = schema

    def connect(self, role: str = "reader") -> Any:
        """See :meth:`Archive.connect`."""
        try:
            conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=10,
                # Shows in pg_stat_activity, so an operator can tell the node's sessions apart.
                application_name=f"chorus-store-{role}",
            )
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        except psycopg.Error as exc:
            raise ArchiveUnavailable(f"cannot connect to PostgreSQL archive: {exc}") from exc
        return conn

    def _writer_conn(self) -> Any:
        if self._writer is not None and (self._writer.closed or self._writer.broken):
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        return super()._writer_conn()

    def _reader(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or conn.broken):
            with contextlib.suppress(Exception):
                conn.close()
            self._local.conn = None
        return super()._reader()

    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        tx: contextlib.AbstractContextManager[Any] = conn.transaction()
        return tx

    def _savepoint(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        tx: contextlib.AbstractContextManager[Any] = conn.transaction()  # nested: a savepoint
        return tx

    def _is_duplicate_key(self, exc: BaseException) -> bool:
        """See :meth:`SqlArchive._is_duplicate_key`."""
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def is_row_error(self, exc: BaseException) -> bool:
        """See :meth:`Archive.is_row_error`: SQLSTATE classes 22 (data exception, e.g.
        NUL in text or ``\\u0000`` in JSON) and 23 (integrity); psycopg raises the same
        ``DataError`` for a NUL it refuses to send."""
        return isinstance(exc, psycopg.DataError | psycopg.IntegrityError) or super().is_row_error(
            exc
        )

    def _lock_for_migration(self, conn: Any) -> None:
        # Two nodes starting at once on one database must not both migrate.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", ("chorus-store:" + self.schema,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))

    def _encode_history(self, history: Sequence[str]) -> Any:
        return json.dumps(list(history), separators=(",", ":"))

    def _decode_history(self, value: Any) -> list[str]:
        decoded: list[str] = json.loads(value) if isinstance(value, str | bytes) else value
        return decoded

    def _export_cursor(self, query: str, batch_size: int) -> Iterator[list[tuple[Any, ...]]]:
        conn = self.connect("export")
        try:
            # A named (server-side) cursor: rows stream in batches instead of the whole
            # result landing in client memory; the transaction gives a consistent snapshot.
            with conn.transaction(), conn.cursor(name="chorus_export") as cur:
                cur.itersize = batch_size
                cur.execute(query)
                while batch := cur.fetchmany(batch_size):
                    yield batch
        finally:
            conn.close()

    def _bulk_insert(self, conn: Any, rows: Sequence[ArchiveRow]) -> None:
        with conn.cursor() as cur, cur.copy(f"COPY messages ({_ROW_COLUMNS}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(self._bind(row))

    def write_batch(self, rows: Sequence[ArchiveRow]) -> WriteResult:
        """See :meth:`Archive.write_batch`: an all-new batch is COPYed straight into
        the table (:meth:`SqlArchive._insert_if_all_new`); any other is COPYed into a
        staging table, then merged with one upsert.

        COPY is PostgreSQL's fastest way in; the single ``INSERT ... SELECT ... ON
        CONFLICT`` then merges rebroadcasts, and ``RETURNING (xmax = 0)`` tells
        fresh rows from merged ones exactly, even with another writer on the schema.
        """
        if not rows:
            return WriteResult(0, 0)
        with self._write_lock:
            conn = self._writer_conn()
            with self._transaction(conn), conn.cursor() as cur:
                if self._insert_if_all_new(conn, rows):
                    return WriteResult(inserted=len(rows), updated=0)
                cur.execute(_STAGING)
                with cur.copy(f"COPY chorus_staging ({_ROW_COLUMNS}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(self._bind(row))
                cur.execute(
                    f"INSERT INTO messages ({_ROW_COLUMNS}) SELECT {_ROW_COLUMNS} "
                    "FROM chorus_staging "
                    "ON CONFLICT (channel_id, message_id) DO UPDATE SET "
                    "arrival_count = messages.arrival_count + excluded.arrival_count, "
                    "last_arrival = GREATEST(messages.last_arrival, excluded.last_arrival) "
                    "RETURNING (xmax = 0)"
                )
                inserted = sum(1 for (fresh,) in cur.fetchall() if fresh)
        return WriteResult(inserted=inserted, updated=len(rows) - inserted)

    def drop_schema(self) -> None:
        """Drop the archive's schema and everything in it (tests, decommissioning)."""
        self.close()
        conn = self.connect("admin")
        try:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
            )
        finally:
            conn.close()
