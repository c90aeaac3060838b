"""Where a :class:`~sdk.sync.rbsr.RangeIndex` keeps its nodes: memory, or one SQL
implementation over any database, a :class:`SqlDialect` saying what differs."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol


class NodeStore(Protocol):
    """Where a :class:`RangeIndex` keeps its nodes (memory, SQLite, ...).

    Nodes are opaque bytes under integer ids. ``meta`` holds the root id, the
    next free id and a caller's watermark; writes may be buffered until
    :meth:`flush`.
    """

    def get(self, node_id: int) -> bytes:
        """The stored bytes of a node."""
        ...

    def put(self, node_id: int, data: bytes) -> None:
        """Store (or replace) a node."""
        ...

    def delete(self, node_id: int) -> None:
        """Forget a node."""
        ...

    def get_meta(self) -> tuple[int, int, int] | None:
        """``(root id, next free id, watermark)``, or ``None`` for a new index."""
        ...

    def put_meta(self, root: int, next_id: int, watermark: int) -> None:
        """Record the root, the next free id and the watermark."""
        ...

    def flush(self) -> None:
        """Make the writes so far durable."""
        ...


class MemoryNodeStore(NodeStore):
    """Nodes in a dict: for tests and for indexes rebuilt on start."""

    def __init__(self) -> None:
        self._nodes: dict[int, bytes] = {}
        self._meta: tuple[int, int, int] | None = None

    def get(self, node_id: int) -> bytes:
        return self._nodes[node_id]

    def put(self, node_id: int, data: bytes) -> None:
        self._nodes[node_id] = data

    def delete(self, node_id: int) -> None:
        self._nodes.pop(node_id, None)

    def get_meta(self) -> tuple[int, int, int] | None:
        return self._meta

    def put_meta(self, root: int, next_id: int, watermark: int) -> None:
        self._meta = (root, next_id, watermark)

    def flush(self) -> None:
        """Nothing to do: memory is as durable as it gets."""


@contextmanager
def sqlite_transaction(db: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """One SQLite transaction opened by ``begin`` (``BEGIN IMMEDIATE``: with the write
    lock), or the caller's when one is open (it commits it)."""
    if db.in_transaction:
        yield
        return
    db.execute(begin)
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@dataclass(frozen=True, slots=True)
class SqlDialect:
    """What a database changes in :class:`SqlNodeStore`: the rest is one SQL."""

    #: The driver's parameter placeholder (``?``, ``%s``).
    param: str
    #: Column types of a 64-bit integer and of a byte string.
    integer: str
    blob: str
    #: ``transaction(db)``: a context that commits what runs in it, at once.
    transaction: Callable[[Any], AbstractContextManager[object]]


#: SQLite (:mod:`sqlite3`); PostgreSQL's is in :mod:`store_node.store_sync.index`.
SQLITE = SqlDialect("?", "INTEGER", "BLOB", sqlite_transaction)


class SqlNodeStore(NodeStore):
    """Nodes as rows of ``rbsr_nodes`` in an SQL database, one index per ``name``.

    Writes wait in memory until :meth:`flush`, which commits them in one
    transaction (the caller flushes after a batch of inserts). A query reads only
    the O(log n) nodes on its path; reads go through the pending writes.
    """

    def __init__(self, db: Any, name: str, dialect: SqlDialect) -> None:
        self._db = db
        self._name = name
        self._dialect = dialect
        p, integer, blob = dialect.param, dialect.integer, dialect.blob
        with dialect.transaction(db):
            db.execute(
                f"CREATE TABLE IF NOT EXISTS rbsr_nodes (tree TEXT NOT NULL, id {integer} NOT NULL,"
                f" data {blob} NOT NULL, PRIMARY KEY (tree, id))"
            )
            db.execute(
                f"CREATE TABLE IF NOT EXISTS rbsr_meta (tree TEXT PRIMARY KEY, root {integer} "
                f"NOT NULL, next_id {integer} NOT NULL, watermark {integer} NOT NULL)"
            )
        self._select_node_sql = f"SELECT data FROM rbsr_nodes WHERE tree = {p} AND id = {p}"
        self._select_meta_sql = f"SELECT root, next_id, watermark FROM rbsr_meta WHERE tree = {p}"
        self._delete_sql = f"DELETE FROM rbsr_nodes WHERE tree = {p} AND id = {p}"
        self._put_sql = (
            f"INSERT INTO rbsr_nodes (tree, id, data) VALUES ({p}, {p}, {p}) "
            "ON CONFLICT (tree, id) DO UPDATE SET data = excluded.data"
        )
        self._meta_sql = (
            f"INSERT INTO rbsr_meta (tree, root, next_id, watermark) VALUES ({p}, {p}, {p}, {p}) "
            "ON CONFLICT (tree) DO UPDATE SET root = excluded.root, "
            "next_id = excluded.next_id, watermark = excluded.watermark"
        )
        self._pending: dict[int, bytes | None] = {}
        self._meta: tuple[int, int, int] | None = None

    def get(self, node_id: int) -> bytes:
        """The stored bytes of a node (a pending write if there is one)."""
        if node_id in self._pending:
            data = self._pending[node_id]
        else:
            row = self._db.execute(self._select_node_sql, (self._name, node_id)).fetchone()
            data = None if row is None else bytes(row[0])
        if data is None:
            raise KeyError(node_id)
        return data

    def put(self, node_id: int, data: bytes) -> None:
        """Store (or replace) a node at the next flush."""
        self._pending[node_id] = data

    def delete(self, node_id: int) -> None:
        """Forget a node at the next flush."""
        self._pending[node_id] = None

    def get_meta(self) -> tuple[int, int, int] | None:
        if self._meta is not None:
            return self._meta
        row = self._db.execute(self._select_meta_sql, (self._name,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[2]))

    def put_meta(self, root: int, next_id: int, watermark: int) -> None:
        """Record the root, the next free id and the watermark at the next flush."""
        self._meta = (root, next_id, watermark)

    def flush(self) -> None:
        """Write the pending nodes and meta in one transaction (or the caller's open one)."""
        if not self._pending and self._meta is None:
            return
        name = self._name
        puts = [(name, i, d) for i, d in self._pending.items() if d is not None]
        deletes = [(name, i) for i, d in self._pending.items() if d is None]
        with self._dialect.transaction(self._db), closing(self._db.cursor()) as cur:
            if deletes:
                cur.executemany(self._delete_sql, deletes)
            if puts:
                cur.executemany(self._put_sql, puts)
            if self._meta is not None:
                cur.execute(self._meta_sql, (name, *self._meta))
        self._pending.clear()
        self._meta = None


class SqliteNodeStore(SqlNodeStore):
    """:class:`SqlNodeStore` in SQLite: a connection, or a path to open."""

    def __init__(self, db: sqlite3.Connection | str, name: str = "default") -> None:
        if isinstance(db, str):
            db = sqlite3.connect(db, isolation_level=None)
        super().__init__(db, name, SQLITE)


__all__ = [
    "SQLITE",
    "MemoryNodeStore",
    "NodeStore",
    "SqlDialect",
    "SqlNodeStore",
    "SqliteNodeStore",
    "sqlite_transaction",
]
