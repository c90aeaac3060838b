"""The store node's exception tree.

::

    StoreNodeError
     ├── ConfigError          the configuration file or a CLI argument is wrong (also a ValueError)
     ├── ArchiveError         the archive failed
     │    ├── ArchiveUnavailable  cannot reach / open the database
     │    │    └── ArchiveClosed   the archive was closed (the node is stopping)
     │    ├── ArchiveLocked       another store node owns this archive
     │    └── MigrationError      the schema cannot be brought to this version
     ├── InvalidQuery         a client's request is malformed or over a limit (also a ValueError)
     │    └── InvalidCursor   a pagination cursor was not issued for this query
     └── AnalyticsError       the Spark analytics job (tree in store_node.analytics.errors)

The gRPC service maps :class:`InvalidQuery` to ``INVALID_ARGUMENT`` and
:class:`ArchiveUnavailable` to ``UNAVAILABLE``; malformed SDS bytes arriving
from a transport are not exceptions at all, only counters
(:class:`store_node.ingest.IngestStats`). Any other exception is a bug.
"""

from __future__ import annotations


class StoreNodeError(Exception):
    """Base class of every error the store node raises."""


class ConfigError(StoreNodeError, ValueError):
    """The configuration is invalid; the message says which key and why."""


class ArchiveError(StoreNodeError):
    """The archive could not complete an operation."""


class ArchiveUnavailable(ArchiveError):
    """The database cannot be reached or opened."""


class ArchiveClosed(ArchiveUnavailable):
    """The archive was closed: no read or write starts after ``close()``."""


class ArchiveLocked(ArchiveError):
    """Another store node holds the archive's lock (:mod:`store_node.lock`)."""


class MigrationError(ArchiveError):
    """The archive's schema is newer than this code, or a migration failed."""


class InvalidQuery(StoreNodeError, ValueError):
    """A store query is malformed or exceeds a server limit."""


class InvalidCursor(InvalidQuery):
    """A pagination cursor is corrupt, forged, or belongs to another query."""
