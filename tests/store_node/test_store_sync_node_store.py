"""The range index's node store is one SQL implementation; SQLite and PostgreSQL
differ only by its dialect (sdk/sync/rbsr, store_node/store_sync/index.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk.sync import rbsr
from store_node.store_sync.index import POSTGRES
from tests.store_node.store_node_helpers import new_schema, postgres_dsn

KEYS = [i.to_bytes(4, "big") + b"k" for i in range(0, 6000, 3)]


@pytest.fixture(params=["sqlite", "postgresql"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A function opening a new connection to one database, and the dialect to use."""
    if request.param == "sqlite":
        path = str(tmp_path / "index.db")
        yield lambda: (sqlite3.connect(path, isolation_level=None), rbsr.SQLITE)
        return
    import psycopg

    dsn, schema = postgres_dsn(), new_schema()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        opened: list[Any] = []

        def open_pg() -> tuple[Any, rbsr.SqlDialect]:
            conn = psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")
            opened.append(conn)
            return conn, POSTGRES

        yield open_pg
        for conn in opened:
            conn.close()
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def test_the_same_index_persists_in_either_database(connect: Any) -> None:
    db, dialect = connect()
    index = rbsr.RangeIndex(rbsr.SqlNodeStore(db, "t", dialect), fanout=16)
    for key in KEYS[::2]:
        index.insert(key)
    index.watermark = 41
    index.flush()  # the second flush rewrites nodes and meta of the first
    for key in KEYS[1::2]:
        index.insert(key)
    index.remove(KEYS[7])
    index.watermark = 42
    index.flush()
    index.insert(b"unflushed")
    expected = index.summary(KEYS[100], KEYS[900])

    other, _ = connect()
    reopened = rbsr.RangeIndex(rbsr.SqlNodeStore(other, "t", dialect), fanout=16)
    assert reopened.watermark == 42
    assert len(reopened) == len(KEYS) - 1
    assert b"unflushed" not in reopened and KEYS[7] not in reopened
    assert reopened.summary(KEYS[100], KEYS[900]) == expected
    assert rbsr.SqlNodeStore(other, "another tree", dialect).get_meta() is None
