"""Fixtures for the store-node tests: archives on both backends.

PostgreSQL tests use the real server on 127.0.0.1:5432, each in a fresh schema
that is dropped afterwards, so parallel runs never collide. When the server is
unreachable they skip, naming it, unless ``CHORUS_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store_node.archive.base import Archive
from tests.store_node.store_node_helpers import new_schema, postgres_dsn


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    """(dsn, schema) of a fresh PostgreSQL schema, dropped afterwards."""
    from store_node.archive.postgres import PostgresArchive

    dsn = postgres_dsn()
    schema = new_schema()
    yield dsn, schema
    PostgresArchive(dsn, schema=schema).drop_schema()


@pytest.fixture(params=["sqlite", "postgresql"])
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Archive]:
    """A migrated, empty archive on each backend."""
    if request.param == "sqlite":
        from store_node.archive.sqlite import SqliteArchive

        sqlite_archive = SqliteArchive(tmp_path / "archive.db")
        sqlite_archive.migrate()
        yield sqlite_archive
        sqlite_archive.close()
        return
    from store_node.archive.postgres import PostgresArchive

    pg = PostgresArchive(postgres_dsn(), schema=new_schema())
    try:
        pg.migrate()
        yield pg
    finally:
        pg.drop_schema()
