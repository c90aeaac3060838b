"""The Chorus store node: archive every SDS message of a set of channels, serve them back.

Theory of operation::

    transport ──Envelope──▶ ingest.Ingest ──batches──▶ archive.Archive ◀── service.StoreService
     (subscriptions)        (decode, bound,            (SQLite / PostgreSQL)   (gRPC Query/Health)
                             merge, backpressure)            │
                                                            └──▶ export (Parquet for analytics)

- :mod:`store_node.archive` keeps one row per distinct ``(channel_id, message_id)``
  with the raw bytes and the fields analysts need, counting rebroadcasts.
- :mod:`store_node.ingest` turns transport envelopes into archive rows in
  size/time-bounded batches on one writer thread; malformed bytes are counted
  and skipped.
- :mod:`store_node.service` answers the ``chorus.store.v1.Store`` gRPC API
  (``proto/store/v1/store.proto``); :mod:`store_node.cursor` makes its
  pagination cursors opaque and tamper-evident.
- :mod:`store_node.node` wires it together with metrics, retention and
  graceful shutdown; :mod:`store_node.cli` is the ``store-node`` command.

Errors are rooted in :class:`~store_node.errors.StoreNodeError`.
"""

from __future__ import annotations

from store_node.errors import (
    ArchiveError,
    ArchiveUnavailable,
    ConfigError,
    InvalidCursor,
    InvalidQuery,
    MigrationError,
    StoreNodeError,
)

__all__ = [
    "ArchiveError",
    "ArchiveUnavailable",
    "ConfigError",
    "InvalidCursor",
    "InvalidQuery",
    "MigrationError",
    "StoreNodeError",
]
