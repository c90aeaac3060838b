"""Liveness and readiness of a running store node, and the log lines of its state changes.

:class:`NodeHealth` probes the node's two dependencies every ``interval``
seconds, from the event loop, and keeps the answers:

- the **broker**: the transport's ``connected`` property (``MqttTransport``;
  a transport without one counts as connected) and its ``stats.connects``
  counter, so a loss and a reconnect between two probes are still counted;
- the **archive**: ``schema_version()`` on a worker thread, with a timeout.

Every change is a JSON log line (``broker disconnected``, ``broker connected``,
``archive unreachable``, ``archive reachable``) and moves the gauges
``chorus_store_broker_connected`` and ``chorus_store_archive_reachable`` and
the counters ``chorus_store_broker_disconnects_total`` and
``chorus_store_broker_reconnects_total``. ``/readyz`` and the standard
``grpc.health.v1`` service both report the cached answer, so a probe never
waits on a database and a flood of probes never reaches it. ``/readyz`` also
carries ``details`` that decide nothing: ``referenced_missing``, how many ids
archived messages reference that the archive lacks (:mod:`store_node.missing`),
read from memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from store_node.metrics import NodeMetrics

log = logging.getLogger("store_node.health")

#: The default time between probes, in seconds.
PROBE_INTERVAL = 1.0


class NodeHealth:
    """Cached readiness of one node; :meth:`run` keeps it fresh."""

    def __init__(
        self,
        metrics: NodeMetrics,
        *,
        interval: float = PROBE_INTERVAL,
        archive_timeout: float = 5.0,
    ) -> None:
        self.metrics = metrics
        self.interval = interval
        self.archive_timeout = archive_timeout
        self.broker_connected: bool | None = None
        self.archive_ok: bool | None = None
        self._connects = 0
        self._losses = 0
        self._last_ready: bool | None = None
        self._listeners: list[Callable[[bool], Awaitable[None]]] = []
        #: Named checks a node adds for the services it runs (``replication_serving``:
        #: the replication listener is open; ``documents_serving``: the documents child
        #: process serves its listeners). Each is reported in the checks and required for
        #: readiness.
        self.serving: dict[str, Callable[[], bool]] = {}
        #: Set by a node whose ingest tracks referenced ids it lacks
        #: (:class:`store_node.missing.MissingReferences`): reported as
        #: ``referenced_missing`` in :meth:`details`, never deciding readiness (a node
        #: missing old messages still serves what it has).
        self.referenced_missing: Callable[[], int] | None = None
        #: Set by a node serving its document services from a child process
        #: (:mod:`store_node.documents_process`): reported as ``documents_process``
        #: in :meth:`details` (pid, ports, restarts); whether it serves is the
        #: ``documents_serving`` check.
        self.documents_process: Callable[[], dict[str, Any]] | None = None
        metrics.readiness = self.ready
        metrics.details = self.details

    def on_change(self, listener: Callable[[bool], Awaitable[None]]) -> None:
        """Await ``listener(ready)`` after every probe that changes readiness."""
        self._listeners.append(listener)

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, checks)`` from the last probe; not ready before the first one.

        A node without a transport (``broker_connected`` stays ``None``) needs only its
        archive; a node running document services also needs each :attr:`serving` check.
        """
        checks: dict[str, Any] = {
            "broker_connected": self.broker_connected,
            "archive_reachable": self.archive_ok,
        }
        ready = bool(self.archive_ok) and self.broker_connected is not False
        for name, check in self.serving.items():
            checks[name] = serving = check()
            ready = ready and serving
        return ready, checks

    def details(self) -> dict[str, Any]:
        """What ``/readyz`` shows beside the checks, deciding nothing."""
        out: dict[str, Any] = {}
        if self.referenced_missing is not None:
            out["referenced_missing"] = self.referenced_missing()
        if self.documents_process is not None:
            out["documents_process"] = self.documents_process()
        return out

    async def probe(self, archive: Any, transport: Any) -> None:
        """Probe once; log and count what changed."""
        if transport is not None:
            self._probe_broker(transport)
        if archive is not None:
            await self._probe_archive(archive)
        ready = self.ready()[0]
        if ready != self._last_ready:
            self._last_ready = ready
            for listener in self._listeners:
                await listener(ready)

    def _probe_broker(self, transport: Any) -> None:
        connected = bool(getattr(transport, "connected", True))
        stats = getattr(transport, "stats", None)
        connects = int(getattr(stats, "connects", 0) or 0)
        losses = getattr(stats, "connection_losses", None)
        # Counted from the transport's own counters when it has them, so a loss and a
        # reconnect between two probes are counted too: every connect after the first
        # is a reconnect.
        if connects > self._connects:
            reconnects = connects - max(self._connects, 1)
            if reconnects > 0:
                self.metrics.broker_reconnects.inc(reconnects)
            self._connects = connects
        if losses is not None and int(losses) > self._losses:
            self.metrics.broker_disconnects.inc(int(losses) - self._losses)
            self._losses = int(losses)
        elif losses is None and self.broker_connected and not connected:
            self.metrics.broker_disconnects.inc()
        if connected == self.broker_connected:
            return
        if not connected:
            log.warning("broker disconnected", extra={"event": "broker_disconnected"})
        else:
            event = "broker_connected" if self.broker_connected is None else "broker_reconnected"
            log.info("broker connected", extra={"event": event, "connects": connects})
        self.broker_connected = connected
        self.metrics.broker_connected.set(1 if connected else 0)

    async def _probe_archive(self, archive: Any) -> None:
        try:
            async with asyncio.timeout(self.archive_timeout):
                await asyncio.to_thread(archive.schema_version)
            ok, error = True, ""
        except Exception as exc:  # the driver's own errors: connection refused, timeout, ...
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if ok != self.archive_ok:
            if ok:
                log.info("archive reachable", extra={"event": "archive_reachable"})
            else:
                log.error(
                    "archive unreachable",
                    extra={"event": "archive_unreachable", "error": error[:200]},
                )
            self.archive_ok = ok
            self.metrics.archive_reachable.set(1 if ok else 0)

    async def run(self, archive: Any, transport: Any) -> None:
        """Probe every ``interval`` seconds until cancelled."""
        while True:
            await self.probe(archive, transport)
            await asyncio.sleep(self.interval)
