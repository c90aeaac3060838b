"""The SQLite archive: the default, one file, zero set-up.

Durability choice: WAL with ``synchronous=NORMAL`` by default. In WAL mode NORMAL
never corrupts the database and loses nothing when the *process* dies (SIGKILL,
crash): a committed batch is in the WAL file. Only an OS crash or power loss can
roll back the last few commits, and a store node is a cache of messages that
SDS peers also hold and rebroadcast, so trading that window for one fsync per
checkpoint instead of per batch is the right default. Operators who want every
committed batch on disk set ``synchronous = "full"`` (one fsync per batch).
"""

from __future__ import annotations

import contextlib
import json
import operator
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from store_node.archive._sql import Migration, SqlArchive
from store_node.errors import ArchiveUnavailable, ConfigError

MIGRATIONS: tuple[Migration, ...] = (
    (
        1,
        (
            """CREATE TABLE messages (
                seq INTEGER PRIMARY KEY,
                channel_id TEXT NOT NULL,
                message_id TEXT NOT NULL,
                sender_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                lamport_timestamp INTEGER,
                causal_history TEXT NOT NULL,
                content_size INTEGER NOT NULL,
                message_size INTEGER NOT NULL,
                first_arrival INTEGER NOT NULL,
                last_arrival INTEGER NOT NULL,
                arrival_count INTEGER NOT NULL,
                transport_hash BLOB,
                data BLOB NOT NULL,
                UNIQUE (channel_id, message_id)
            )""",
            "CREATE INDEX messages_channel_time ON messages (channel_id, first_arrival, seq)",
            "CREATE INDEX messages_time ON messages (first_arrival, seq)",
            "CREATE INDEX messages_hash ON messages (transport_hash)",
        ),
    ),
    (2, ("CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)",)),
)

_SYNCHRONOUS = ("normal", "full")


#: A page's key columns as JSON values (blobs in hex, which JSON lacks).
_KEY_JSON = (
    "seq, channel_id, message_id, sender_id, lamport_timestamp, first_arrival, message_size, "
    "CASE WHEN transport_hash IS NULL THEN NULL ELSE hex(transport_hash) END"
)


#: A page row's ``(first_arrival, seq)``.
_PAGE_ORDER = operator.itemgetter(5, 0)


class SqliteArchive(SqlArchive):
    """Archive in one SQLite file (WAL); see the module docstring."""

    backend = "sqlite"
    migrations = MIGRATIONS

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        super().__init__()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError(
                f"archive.synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}"
            )
        self.path = Path(path)
        self.synchronous = synchronous

    def connect(self, role: str = "reader") -> Any:
        """See :meth:`Archive.connect`: the writer sets up WAL, other roles map the file."""
        writer = role == "writer"
        try:
            if writer:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit (isolation_level=None): transactions are explicit BEGIN/COMMIT.
            # check_same_thread=False: the writer is used from the ingest thread under
            # SqlArchive's lock; readers are thread-local; store sync's index closes its
            # connection from a thread other than its own.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 10000")
            if writer:
                conn.execute("PRAGMA journal_mode = WAL")
                # Checkpoint every ~40 MB of WAL instead of ~4 MB: each checkpoint
                # copies the B-tree pages a batch touched, and with random message-id
                # keys that is most of them; ~10% less CPU per ingested message.
                conn.execute("PRAGMA wal_autocheckpoint = 10000")
            conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            conn.execute("PRAGMA cache_size = -65536")
            if not writer:
                # Readers map the file: page reads skip a syscall and a copy each, which
                # is most of a lookup's time once the pages are cached (~30% in
                # bench/store.py). Address space only; the OS page cache holds the data.
                conn.execute("PRAGMA mmap_size = 1073741824")
        except sqlite3.Error as exc:
            raise ArchiveUnavailable(f"cannot open SQLite archive {self.path}: {exc}") from exc
        return conn

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        # IMMEDIATE takes the write lock up front, so a batch never fails half-way
        # with SQLITE_BUSY on lock upgrade.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def is_row_error(self, exc: BaseException) -> bool:
        """See :meth:`Archive.is_row_error`: SQLite's data and constraint errors
        (``OperationalError``, e.g. locked or disk full, is an outage)."""
        return isinstance(
            exc, sqlite3.DataError | sqlite3.IntegrityError | sqlite3.InterfaceError
        ) or super().is_row_error(exc)

    def _is_duplicate_key(self, exc: BaseException) -> bool:
        """See :meth:`SqlArchive._is_duplicate_key`."""
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE constraint failed" in str(exc)

    def _lock_for_migration(self, conn: Any) -> None:
        """BEGIN IMMEDIATE already excludes other writers."""

    def _encode_history(self, history: Sequence[str]) -> Any:
        return json.dumps(list(history), separators=(",", ":"))

    def _decode_history(self, value: Any) -> list[str]:
        decoded: list[str] = json.loads(value)
        return decoded

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
        """See :meth:`SqlArchive._page_rows`: keys, then bytes, each as ONE result row.

        Python's sqlite3 lets go of the GIL for every row it steps through and must
        take it back after each; while another thread keeps the interpreter busy (a
        catch-up's decoding), a retake can wait a whole switch interval. So the keys
        come back as one JSON array, the budget is applied here, and the bytes of the
        rows that fit come back as one blob with their lengths: four steps whatever
        the page's size, where a row per step took two hundred for a 100-id lookup.
        """
        (keys_json,) = conn.execute(
            f"SELECT json_group_array(json_array({_KEY_JSON})) FROM ({keys})", params
        ).fetchone()
        rows: list[list[Any]] = json.loads(keys_json)
        fromhex = bytes.fromhex
        for row in rows:
            if row[7] is not None:
                row[7] = fromhex(row[7])
        rows.sort(key=_PAGE_ORDER, reverse=not forward)
        if not include_data or not rows:
            return [tuple(row) for row in rows]
        # The rows within the byte budget (the first always fits), then their bytes.
        fit = total = 0
        for row in rows[:limit]:
            total += row[6]
            if total > max_bytes and fit:
                break
            fit += 1
        marks = ", ".join("?" * fit)
        # group_concat reads each blob as text, unconverted in a UTF-8 database, and the
        # CAST turns the whole back into bytes; the lengths cut it apart again.
        seqs, lengths, joined = conn.execute(
            "SELECT json_group_array(seq), json_group_array(length(data)), "
            f"CAST(group_concat(data, '') AS BLOB) FROM messages WHERE seq IN ({marks})",
            [row[0] for row in rows[:fit]],
        ).fetchone()
        found: dict[int, bytes] = {}
        at = 0
        for seq, length in zip(json.loads(seqs), json.loads(lengths), strict=True):
            found[seq] = joined[at : at + length]
            at += length
        # A row deleted by retention between the two reads simply drops out; the row
        # after the last that fits, if any, comes without bytes: the page goes on.
        page = [(*row, 0, 0, found[row[0]]) for row in rows[:fit] if row[0] in found]
        if len(rows) > fit:
            page.append((*rows[fit], 0, 0, None))
        return page

    def _export_cursor(self, sql: str, batch_size: int) -> Iterator[list[tuple[Any, ...]]]:
        conn = self.connect("export")
        # A single sequential pass: mapping the file would only add every page to this
        # process's resident set (and to an operator's alarm) for no speed-up.
        conn.execute("PRAGMA mmap_size = 0")
        try:
            # One read transaction: a consistent snapshot even while ingest keeps writing.
            conn.execute("BEGIN")
            cur = conn.execute(sql)
            while batch := cur.fetchmany(batch_size):
                yield batch
            conn.execute("COMMIT")
        finally:
            conn.close()

    def _database_checks(self, conn: Any) -> list[str]:
        results = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        return [] if results == ["ok"] else [f"sqlite integrity_check: {r}" for r in results]
