"""Prometheus metrics of one store node, on a private registry, and its HTTP probes.

A private :class:`~prometheus_client.CollectorRegistry` (not the process-wide
default) lets tests and several nodes in one process keep separate counts.
:meth:`NodeMetrics.serve` exposes, bound to 127.0.0.1 unless the configuration
says otherwise:

- ``GET /metrics``: the Prometheus text exposition;
- ``GET /healthz``: liveness, ``200 ok`` while the process serves HTTP at all;
- ``GET /readyz``: readiness, ``200`` or ``503`` with a JSON body naming each
  check (broker connected, archive reachable; :mod:`store_node.health`) and
  ``details`` that decide nothing (referenced ids the archive lacks);
- anything else: ``404``.

The stream listeners (``[replication]``, ``[collection]``, ``[bamboo_p2p]``,
``[store_sync]``) are read at scrape time from :attr:`NodeMetrics.listeners`
(labelled ``listener``): ``listener_connections`` open now,
``listener_accepted_total``, ``listener_refused_total{reason}`` (capacity, tls,
peer_not_allowed), ``listener_cut_total{reason}`` (idle, write_timeout,
frame_deadline, memory) and ``listener_buffered_bytes`` (partly received frames).
Listeners served by the documents process (:mod:`store_node.documents_process`) are
read from the :class:`ListenerCounts` the child last reported.

Every labelled metric is created with its known label values, so each declared
series exists (at 0) from the first scrape rather than from its first event.
"""

from __future__ import annotations

import email.utils
import json
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from store_node.errors import StoreNodeError
from transports.guarded import CUTS, REFUSALS, GuardedListener

_NS = "chorus_store"

#: ``(ready, checks)``: what ``/readyz`` reports.
Readiness = Callable[[], tuple[bool, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class ListenerCounts:
    """What the metrics read of a stream listener, as plain numbers: how a documents
    process (:mod:`store_node.documents_process`) reports its listeners to the node."""

    name: str
    open_connections: int = 0
    buffered_bytes: int = 0
    accepted: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    cut: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CUTS, 0))

    @classmethod
    def of(cls, listener: GuardedListener | ListenerCounts) -> ListenerCounts:
        """A copy of ``listener``'s counters now."""
        return cls(
            listener.name,
            listener.open_connections,
            listener.buffered_bytes,
            listener.accepted,
            dict(listener.refused),
            dict(listener.cut),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ListenerCounts:
        """The counts :meth:`to_json` wrote (reasons it lacks count 0)."""
        return cls(
            str(data["name"]),
            int(data["open_connections"]),
            int(data["buffered_bytes"]),
            int(data["accepted"]),
            {reason: int(data["refused"].get(reason, 0)) for reason in REFUSALS},
            {reason: int(data["cut"].get(reason, 0)) for reason in CUTS},
        )

    def to_json(self) -> dict[str, Any]:
        """The counts as a JSON object."""
        return {
            "name": self.name,
            "open_connections": self.open_connections,
            "buffered_bytes": self.buffered_bytes,
            "accepted": self.accepted,
            "refused": self.refused,
            "cut": self.cut,
        }

    def plus(self, later: ListenerCounts) -> ListenerCounts:
        """These totals (of a listener that is gone) continued by ``later``'s: the
        counters add up, the gauges (open connections, buffered bytes) are ``later``'s."""
        return ListenerCounts(
            self.name,
            later.open_connections,
            later.buffered_bytes,
            self.accepted + later.accepted,
            {reason: self.refused[reason] + later.refused[reason] for reason in REFUSALS},
            {reason: self.cut[reason] + later.cut[reason] for reason in CUTS},
        )

    def ended(self) -> ListenerCounts:
        """These counters with nothing open: what stays of a listener whose process ended."""
        return ListenerCounts(self.name, 0, 0, self.accepted, self.refused, self.cut)


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
        self.broker_connected = Gauge(
            "broker_connected",
            "1 while the transport is connected to its broker / network, else 0",
            namespace=_NS,
            registry=r,
        )
        self.broker_disconnects = Counter(
            "broker_disconnects", "Connections to the broker lost", namespace=_NS, registry=r
        )
        self.broker_reconnects = Counter(
            "broker_reconnects",
            "Connections to the broker re-established after a loss",
            namespace=_NS,
            registry=r,
        )
        self.archive_reachable = Gauge(
            "archive_reachable",
            "1 while the archive answered its last probe, else 0",
            namespace=_NS,
            registry=r,
        )
        self.referenced_missing = Gauge(
            "referenced_missing",
            "Ids archived messages reference in their causal history (same channel) that "
            "the archive lacks and still seeks (store_node.missing)",
            namespace=_NS,
            registry=r,
        )
        self.referenced_recovered = Counter(
            "referenced_recovered",
            "Referenced ids that were missing and then archived (store sync, a late copy)",
            namespace=_NS,
            registry=r,
        )
        self.referenced_given_up = Counter(
            "referenced_given_up",
            "Referenced ids no longer sought: missing too long (expired) or beyond the "
            "tracking bound (overflow)",
            ["reason"],
            namespace=_NS,
            registry=r,
        )
        self.store_sync_gap_requests = Counter(
            "store_sync_gap_requests",
            "Store-sync sessions run early because archived messages referenced ids "
            "the archive lacks",
            namespace=_NS,
            registry=r,
        )
        for reason in ("age", "size"):
            self.retention_deleted.labels(reason)
        for reason in ("expired", "overflow"):
            self.referenced_given_up.labels(reason)
        self.skipped.labels("ephemeral")
        #: The node's open stream listeners, read at each scrape (the node installs its own).
        self.listeners: Callable[[], Iterable[GuardedListener | ListenerCounts]] = lambda: ()
        r.register(_ListenerCollector(self))
        #: Called by ``/readyz``; :class:`store_node.health.NodeHealth` installs its own.
        self.readiness: Readiness = lambda: (True, {})
        #: Called by ``/readyz`` for its ``details`` (shown, deciding nothing).
        self.details: Callable[[], dict[str, Any]] = dict
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample by full name, e.g. ``chorus_store_ingest_archived_total``."""
        v = self.registry.get_sample_value(name, labels or None)
        return float(v) if v is not None else 0.0

    def track_queue(self, depth: Callable[[], int]) -> None:
        """Read the queue depth from ``depth`` at scrape time."""
        self.queue_depth.set_function(depth)

    def serve(self, listen: str) -> tuple[str, int]:
        """Serve ``/metrics``, ``/healthz``, ``/readyz`` at ``listen`` (``HOST:PORT``).

        Returns the bound address; a port in use or an address that cannot be
        bound is a :class:`~store_node.errors.StoreNodeError`, never a traceback.
        """
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        handler = type("Handler", (_ProbeHandler,), {"metrics": self})
        server_class = type("Server", (_ProbeServer,), {"address_family": _family(host)})
        try:
            self._server = server_class((host, int(port)), handler)
        except OSError as exc:
            raise StoreNodeError(
                f"metrics: cannot listen on {listen}: {exc.strerror or exc}"
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()
        bound_host, bound_port = self._server.server_address[:2]
        return str(bound_host), int(bound_port)

    def close(self) -> None:
        """Stop the HTTP server, if any."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _ListenerCollector:
    """The stream listeners' counters, read from the listeners when scraped."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        """Nothing up front: the series appear with the listeners."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One sample per listener (and reason)."""
        prefix = f"{_NS}_listener"
        connections = GaugeMetricFamily(
            f"{prefix}_connections", "Connections open on a stream listener", labels=["listener"]
        )
        buffered = GaugeMetricFamily(
            f"{prefix}_buffered_bytes",
            "Bytes of partly received frames held by a stream listener's connections",
            labels=["listener"],
        )
        accepted = CounterMetricFamily(
            f"{prefix}_accepted", "Connections handed to the protocol", labels=["listener"]
        )
        refused = CounterMetricFamily(
            f"{prefix}_refused",
            "Connections refused before the protocol read a byte",
            labels=["listener", "reason"],
        )
        cut = CounterMetricFamily(
            f"{prefix}_cut", "Connections cut off by a limit", labels=["listener", "reason"]
        )
        for listener in self._metrics.listeners():
            name = listener.name
            connections.add_metric([name], listener.open_connections)
            buffered.add_metric([name], listener.buffered_bytes)
            accepted.add_metric([name], listener.accepted)
            for reason in REFUSALS:
                refused.add_metric([name, reason], listener.refused[reason])
            for reason in CUTS:
                cut.add_metric([name, reason], listener.cut[reason])
        yield from (connections, buffered, accepted, refused, cut)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


#: The liveness request answered on the listening thread, in each of its two methods.
_LIVENESS = {b"GET /healthz ": True, b"HEAD /healthz ": False}
#: Longest request head :class:`_ProbeServer` answers on the listening thread.
_INLINE_HEAD = 4096


class _ProbeServer(ThreadingHTTPServer):
    """The probe listener: ``/healthz`` on the listening thread, the rest on a thread each.

    Every blocking call hands the GIL over, and while a catch-up keeps another thread
    busy in Python each retake can wait a switch interval. A liveness probe whose
    request has fully arrived is answered right here: one look, one read, one write,
    one close, and no thread started. Anything else (a partial request, another path)
    goes the usual way (:class:`_ProbeHandler` on its own thread).
    """

    daemon_threads = True

    def process_request(self, request: Any, client_address: Any) -> None:
        """Answer ``request`` here when it is a complete liveness probe, else on a thread."""
        try:
            head = request.recv(_INLINE_HEAD, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            head = b""
        end = head.find(b"\r\n\r\n")
        with_body = next((v for k, v in _LIVENESS.items() if head.startswith(k)), None)
        if end < 0 or with_body is None:
            super().process_request(request, client_address)
            return
        try:
            request.recv(end + 4)  # the head only: it is there (peeked)
            request.sendall(_liveness_response(with_body))
        except OSError:
            pass
        self.close_request(request)  # nothing unread is left, so the peer sees a plain end


def _liveness_response(with_body: bool) -> bytes:
    """``/healthz``'s whole answer, as :class:`_ProbeHandler` would write it."""
    body = b"ok\n"
    head = (
        "HTTP/1.0 200 OK\r\n"
        f"Server: {_ProbeHandler.server_version} {_ProbeHandler.sys_version}\r\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    return head + body if with_body else head


class _ProbeHandler(BaseHTTPRequestHandler):
    """``/metrics``, ``/healthz``, ``/readyz``; 404 for every other path."""

    metrics: NodeMetrics
    server_version = "chorus-store-node"
    #: Buffer the reply, so its head and body leave in one write (one GIL handover).
    wbufsize = 1 << 16

    def do_GET(self) -> None:
        """Answer one probe or scrape."""
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry))
        elif path == "/healthz":
            self._send(200, "text/plain; charset=utf-8", b"ok\n")
        elif path == "/readyz":
            answer: dict[str, Any]
            try:
                ready, checks = self.metrics.readiness()
                answer = {"ready": ready, "checks": checks}
                if details := self.metrics.details():
                    answer["details"] = details
            except Exception as exc:  # a probe must answer, whatever broke
                ready = False
                answer = {"ready": ready, "checks": {"error": type(exc).__name__}}
            body = json.dumps(answer).encode() + b"\n"
            self._send(200 if ready else 503, "application/json", body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

    def do_HEAD(self) -> None:
        """Same status as GET, no body (some probes use HEAD)."""
        self.do_GET()

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a scrape every few seconds is not news (the default writes to stderr)."""
