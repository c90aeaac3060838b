"""Prometheus metrics of one store node, on a private registry.

A private :class:`~prometheus_client.CollectorRegistry` (not the process-wide
default) lets tests and several nodes in one process keep separate counts.
:meth:`NodeMetrics.serve` exposes it over HTTP, bound to 127.0.0.1 unless the
configuration says otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_NS = "chorus_store"


class NodeMetrics:
    """Every instrument the node updates; names are prefixed ``chorus_store_``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.received = Counter(
            "ingest_received", "Envelopes received from transports", namespace=_NS, registry=r
        )
        self.rejected = Counter(
            "ingest_rejected",
            "Envelopes skipped because they are not valid SDS messages for their topic",
            ["reason"],
            namespace=_NS,
            registry=r,
        )
        self.skipped = Counter(
            "ingest_skipped",
            "Valid messages not archived by policy",
            ["reason"],
            namespace=_NS,
            registry=r,
        )
        self.archived = Counter(
            "ingest_archived", "Messages archived for the first time", namespace=_NS, registry=r
        )
        self.duplicates = Counter(
            "ingest_duplicates",
            "Copies of already-archived messages (rebroadcasts, duplicates)",
            namespace=_NS,
            registry=r,
        )
        self.write_errors = Counter(
            "ingest_write_errors", "Failed batch writes (retried)", namespace=_NS, registry=r
        )
        self.lost = Counter(
            "ingest_lost",
            "Messages dropped because the archive stayed unwritable through shutdown",
            namespace=_NS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "ingest_queue_depth",
            "Envelopes received but not yet written",
            namespace=_NS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "batch_rows",
            "Envelopes per write batch",
            namespace=_NS,
            registry=r,
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
        )
        self.batch_seconds = Histogram(
            "batch_write_seconds", "Time to decode and commit one batch", namespace=_NS, registry=r
        )
        self.rpcs = Counter(
            "rpc",
            "gRPC requests by method and status code",
            ["method", "code"],
            namespace=_NS,
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "rpc_seconds",
            "gRPC request latency",
            ["method"],
            namespace=_NS,
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.archive_messages = Gauge(
            "archive_messages",
            "Rows in the archive (refreshed periodically)",
            namespace=_NS,
            registry=r,
        )
        self.archive_bytes = Gauge(
            "archive_message_bytes",
            "Sum of message sizes in the archive (refreshed periodically)",
            namespace=_NS,
            registry=r,
        )
        self.retention_deleted = Counter(
            "retention_deleted", "Rows deleted by retention", ["reason"], namespace=_NS, registry=r
        )
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample by full name, e.g. ``chorus_store_ingest_archived_total``."""
        v = self.registry.get_sample_value(name, labels or None)
        return float(v) if v is not None else 0.0

    def track_queue(self, depth: Callable[[], int]) -> None:
        """Read the queue depth from ``depth`` at scrape time."""
        self.queue_depth.set_function(depth)

    def serve(self, listen: str) -> tuple[str, int]:
        """Expose the registry over HTTP at ``listen`` (``HOST:PORT``); return the bound address."""
        host, _, port = listen.rpartition(":")
        self._server, self._thread = start_http_server(int(port), addr=host, registry=self.registry)
        bound_host, bound_port = self._server.server_address[:2]
        return str(bound_host), int(bound_port)

    def close(self) -> None:
        """Stop the HTTP server, if any."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
