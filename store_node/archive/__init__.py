"""Archives: one interface (:class:`Archive`), SQLite and PostgreSQL backends.

Backends import lazily through :func:`open_archive`, so a SQLite-only node
never imports psycopg.
"""

from __future__ import annotations

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
from store_node.config import ArchiveConfig

__all__ = [
    "Archive",
    "ArchiveRow",
    "ArchiveStats",
    "Criteria",
    "ExportRow",
    "Key",
    "Page",
    "StoredMessage",
    "WriteResult",
    "open_archive",
]


def open_archive(config: ArchiveConfig, *, migrate: bool = True) -> Archive:
    """Open the configured archive and, unless told not to, migrate it to the latest schema."""
    archive: Archive
    if config.backend == "sqlite":
        from store_node.archive.sqlite import SqliteArchive

        archive = SqliteArchive(config.path, synchronous=config.synchronous)
    else:
        from store_node.archive.postgres import PostgresArchive

        archive = PostgresArchive(config.dsn, schema=config.schema)
    if migrate:
        try:
            archive.migrate()
        except BaseException:
            archive.close()
            raise
    return archive
