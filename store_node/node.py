"""The running store node: archive, ingest, gRPC, metrics, retention, shutdown.

:class:`StoreNode` owns every part and starts/stops them in order. Shutdown
(SIGTERM / SIGINT, or :meth:`StoreNode.stop`) closes the transport (no new
messages), archives every message already received (including those still
queued in the subscriptions), stops the gRPC server after in-flight requests
finish (bounded grace), then closes the archive. A stop requested while the
node is still starting (a broker that does not answer, a database that hangs)
cancels the start.

Durability with MQTT: unless the ``[transport]`` section says otherwise, the
node connects with ``manual_ack = true`` (a message is acknowledged only once
the batch holding it is committed, see :mod:`store_node.ingest`),
``persistent_session = true`` (the broker keeps the subscription and queues
what arrives while the node is down, for ``session_expiry`` seconds, default
:data:`MQTT_SESSION_EXPIRY`) and a ``client_id`` that is stable for the
archive (``chorus-store-`` and an id kept in the archive's metadata), so a
restarted node resumes its own session. ``docs/store-node.md`` ("Durability")
lists the broker settings that bound what the broker keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from store_node.archive import Archive, open_archive
from store_node.bamboo_p2p import BambooP2PService
from store_node.collection import CollectionNodeService
from store_node.config import ADAPTERS, NodeConfig, TransportConfig
from store_node.cursor import SECRET_META_KEY, CursorCodec
from store_node.documents_process import SECTIONS, DocumentServices, DocumentsProcess
from store_node.errors import ConfigError, StoreNodeError
from store_node.health import NodeHealth
from store_node.ingest import Ingest
from store_node.lock import ArchiveLock
from store_node.metrics import ListenerCounts, NodeMetrics
from store_node.replication import ReplicationService
from store_node.service import StoreService, start_server
from transports.base import InvalidChannelId, Transport, topic_for_channel, validate_channel_id
from transports.tasks import cancel_and_wait

if TYPE_CHECKING:
    from store_node.store_sync.service import StoreSyncService
    from transports.guarded import GuardedListener

log = logging.getLogger("store_node.node")

T = TypeVar("T")

#: Archive metadata key of the node's stable id (its MQTT client id).
NODE_ID_META_KEY = "node_id"

#: Session expiry (seconds) the node asks an MQTT 5 broker for unless configured: a
#: week, so a node down over a weekend still finds its queue.
MQTT_SESSION_EXPIRY = 7 * 86_400

#: The outage budget ``examples/mosquitto.conf`` (and ``scripts/services``) size the
#: broker's queue for the node's session to: while the node is down the broker keeps
#: at most this many messages (``max_queued_messages``) ...
BROKER_QUEUE_MESSAGES = 1_000_000
#: ... and at most this many bytes of them (``max_queued_bytes``, 1 GiB), whichever
#: comes first. docs/store-node.md, "Outage budget", says what that is in time and
#: what a longer outage costs.
BROKER_QUEUE_BYTES = 1 << 30


def durable_mqtt_options(
    options: dict[str, Any], node_id: str, queue_size: int = 20_000
) -> dict[str, Any]:
    """The MQTT adapter options with the store node's durability defaults filled in
    (each can be overridden in ``[transport]``; see the module docstring).

    ``receive_maximum`` defaults to the ingest queue's size (at most 65535): with
    acknowledgement after commit the broker's in-flight window is what bounds the
    messages the node holds, so it matches what ingest can queue.
    """
    out = dict(options)
    out.setdefault("manual_ack", True)
    if out["manual_ack"]:
        out.setdefault("receive_maximum", max(1, min(queue_size, 65_535)))
    out.setdefault("persistent_session", True)
    out.setdefault("client_id", f"chorus-store-{node_id}")
    if out["persistent_session"]:
        out.setdefault("session_expiry", MQTT_SESSION_EXPIRY)
    return out


def check_channels(channels: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` (one line) for a channel no transport can carry."""
    for channel in channels:
        try:
            validate_channel_id(channel)
        except InvalidChannelId as exc:
            raise ConfigError(f"ingest.channels: {exc}") from None


async def bind_listener(section: str, listen: str, start: Awaitable[T]) -> T:
    """Await a listener's ``start``; an ``OSError`` (port in use, address not on this
    host, no permission) becomes a one-line :class:`StoreNodeError` naming the key, so
    ``store-node serve`` exits 1 with ``store-node: <section>: cannot listen on ...``."""
    try:
        return await start
    except OSError as exc:
        raise listen_error(section, listen, exc) from None


def listen_error(section: str, listen: str, exc: OSError) -> StoreNodeError:
    """The one-line error for ``section``'s listener failing to bind ``listen``."""
    # asyncio's own strerror repeats the address: the errno's text is enough.
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    return StoreNodeError(f"{section}: cannot listen on {listen}: {reason}")


async def make_transport(config: TransportConfig) -> Transport:
    """Build and start the configured transport.

    ``factory(**options)`` (awaited if it returns an awaitable), then its async
    context is entered: that is how the adapters connect (``MqttTransport``) or
    start their host (``Libp2pTransport``); for a transport that needs no start
    it is a no-op. The node closes it at shutdown.
    """
    target = config.factory if config.kind == "factory" else ADAPTERS[config.kind]
    module_name, _, attr = target.partition(":")
    try:
        factory: Callable[..., Any] = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"transport {config.kind!r}: cannot load {target}: {exc}") from exc
    try:
        transport = factory(**dict(config.options))
    except (TypeError, ValueError) as exc:
        # The adapter refused an option value the config loader could not judge.
        raise ConfigError(f"transport ({config.kind}): {exc}") from None
    if inspect.isawaitable(transport):
        transport = await transport
    if not isinstance(transport, Transport):
        raise ConfigError(f"transport factory {target} returned {type(transport).__name__}")
    return await transport.__aenter__()


class StoreNode:
    """One store node built from a :class:`NodeConfig`."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        transport: Transport | None = None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or NodeMetrics()
        self.transport = transport
        self.archive: Archive | None = None
        self.ingest: Ingest | None = None
        self.service: StoreService | None = None
        self.grpc_port = 0
        self.metrics_address: tuple[str, int] | None = None
        self._server: Any = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        #: Readiness (/readyz, grpc.health.v1) and broker/archive state changes.
        self.health = NodeHealth(self.metrics)
        self._health_task: asyncio.Task[None] | None = None
        self._lock = ArchiveLock(config.archive)
        #: ``[collection]``'s port once bound.
        self.collection_port = 0
        self._stopped = asyncio.Event()
        #: Store-to-store sync (``[store_sync]``), when configured.
        self.store_sync: StoreSyncService | None = None
        #: ``[replication]``'s port once bound (0 when it does not listen).
        self.replication_port = 0
        self._ports: dict[str, int] = {}
        #: The document services on this node's event loop (``process = "node"``).
        self.documents: DocumentServices | None = None
        #: The child serving the document services when ``[replication] process`` is
        #: ``separate`` (:mod:`store_node.documents_process`).
        self.documents_process: DocumentsProcess | None = None
        self.metrics.listeners = self._listeners

    @property
    def replication(self) -> ReplicationService | None:
        """p2panda replication served on this node's event loop, else None."""
        return self.documents.replication if self.documents is not None else None

    @property
    def collection(self) -> CollectionNodeService | None:
        """Collection sync served on this node's event loop, else None."""
        return self.documents.collection if self.documents is not None else None

    @property
    def bamboo_p2p(self) -> BambooP2PService | None:
        """Bamboo point-to-point served on this node's event loop, else None."""
        return self.documents.bamboo_p2p if self.documents is not None else None

    def _listeners(self) -> list[GuardedListener | ListenerCounts]:
        """The stream listeners serving now, this process's and the documents
        process's (for the metrics)."""
        found: list[GuardedListener | ListenerCounts] = []
        if self.documents is not None:
            found += self.documents.listeners()
        if self.documents_process is not None:
            found += self.documents_process.listeners()
        if self.store_sync is not None and self.store_sync.listener is not None:
            found.append(self.store_sync.listener)
        return found

    async def start(self) -> None:
        """Open the archive, start ingest, the gRPC server and metrics.

        Raises :class:`ConfigError` for a channel id no transport can carry, before
        anything is opened. :meth:`stop` from another task cancels a start that hangs.
        """
        self._starting = asyncio.current_task()
        try:
            await self._start()
        finally:
            self._starting = None

    async def _start(self) -> None:
        cfg = self.config
        check_channels(cfg.ingest.channels)
        await asyncio.to_thread(self._lock.acquire)
        self.archive = await asyncio.to_thread(open_archive, cfg.archive)
        secret = await asyncio.to_thread(
            self.archive.set_meta_if_absent, SECRET_META_KEY, os.urandom(32)
        )
        if cfg.metrics.listen:
            self.metrics_address = self.metrics.serve(cfg.metrics.listen)
        self.ingest = Ingest(
            self.archive,
            batch_size=cfg.ingest.batch_size,
            batch_interval=cfg.ingest.batch_interval_ms / 1000,
            queue_size=cfg.ingest.queue_size,
            queue_bytes=cfg.ingest.queue_bytes,
            archive_ephemeral=cfg.ingest.archive_ephemeral,
            metrics=self.metrics,
        )
        await self.ingest.start()
        ingest = self.ingest
        self.health.referenced_missing = lambda: ingest.missing.count
        self.service = StoreService(
            self.archive,
            cfg.grpc,
            CursorCodec(secret),
            metrics=self.metrics,
            archived=cfg.ingest.channels or None,
        )
        self._server, self.grpc_port = await start_server(self.service, cfg.grpc.listen)
        if self.transport is None and cfg.ingest.channels:
            transport_config = cfg.transport
            if transport_config.kind == "mqtt":
                node_id = await asyncio.to_thread(
                    self.archive.set_meta_if_absent, NODE_ID_META_KEY, os.urandom(8).hex().encode()
                )
                transport_config = dataclasses.replace(
                    transport_config,
                    options=durable_mqtt_options(
                        dict(transport_config.options), node_id.decode(), cfg.ingest.queue_size
                    ),
                )
            self.transport = await make_transport(transport_config)
        if self.transport is not None:
            transport, ingest = self.transport, self.ingest

            async def follow(channel: str) -> None:
                ingest.attach(await transport.subscribe(topic_for_channel(channel)))

            # All at once: after a restart the broker sends the session's backlog
            # first, and each SUBACK waits behind it; one after the other, a node with
            # many channels would read the backlog once per channel before starting.
            await asyncio.gather(*(follow(channel) for channel in cfg.ingest.channels))
        if cfg.store_sync.enabled:
            from store_node.store_sync.service import StoreSyncService

            self.store_sync = StoreSyncService(
                cfg.store_sync,
                self.archive,
                self.ingest,
                max_age_days=cfg.retention.max_age_days,
            )
            await bind_listener("store_sync", cfg.store_sync.listen, self.store_sync.start())
        await self._start_documents()
        self._housekeeping = asyncio.create_task(self._housekeep(), name="housekeeping")
        self.health.on_change(self.service.set_serving)
        self.service.archive_reachable = lambda: self.health.archive_ok
        await self.health.probe(self.archive, self.transport)
        self._health_task = asyncio.create_task(
            self.health.run(self.archive, self.transport), name="health"
        )
        log.info(
            "store node started",
            extra={
                "backend": self.archive.backend,
                "grpc_port": self.grpc_port,
                "metrics": self.metrics_address,
                "channels": list(cfg.ingest.channels),
                # libp2p peers dial these to reach the node's GossipSub host.
                "transport_addrs": getattr(self.transport, "addrs", None),
                "collection_port": self.collection_port or None,
                "replication_port": self.replication_port or None,
                "bamboo_p2p_port": self._ports.get("bamboo_p2p"),
            },
        )

    async def _start_documents(self) -> None:
        """Start the document services that are on: in a supervised child with
        ``[replication] process = "separate"``, else on this event loop."""
        cfg = self.config
        sections = {name: getattr(cfg, name) for name in SECTIONS if getattr(cfg, name).enabled}
        if not sections:
            return
        if cfg.replication.process == "separate":
            process = DocumentsProcess(sections, cfg.log.level)
            self.documents_process = process
            self._ports = await process.start()
            # The child serves every enabled section or none: one check for all of
            # them, and ``replication_serving`` too when replication listens there.
            self.health.serving["documents_serving"] = lambda: process.serving
            if cfg.replication.listen:
                self.health.serving["replication_serving"] = lambda: process.serving
            self.health.documents_process = process.details
        else:
            documents = self.documents = DocumentServices(
                cfg.replication, cfg.collection, cfg.bamboo_p2p
            )
            self._ports = await documents.start()
            if cfg.replication.listen:
                self.health.serving["replication_serving"] = lambda: documents.replication_serving
        self.replication_port = self._ports.get("replication", 0)
        self.collection_port = self._ports.get("collection", 0)

    async def _housekeep(self) -> None:
        """Retention and the archive-size gauges, every ``retention.interval_s``."""
        while True:
            job = asyncio.ensure_future(asyncio.to_thread(self.run_retention))
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                # A thread cannot be stopped: stop() closes the archive next, and closing
                # a connection a thread is still reading (through its memory map)
                # crashes the process. Let the pass end first.
                with contextlib.suppress(Exception):
                    await job
                raise
            except Exception as exc:
                log.error("housekeeping failed", extra={"error": repr(exc)})
            await asyncio.sleep(self.config.retention.interval_s)

    def run_retention(self) -> None:
        """Apply the retention policy once, give up ids missing too long
        (:meth:`store_node.missing.MissingReferences.sweep`) and refresh the size
        gauges (blocking)."""
        assert self.archive is not None
        r = self.config.retention
        if r.max_age_days is not None:
            cutoff = int((time.time() - r.max_age_days * 86400) * 1000)
            n = self.archive.delete_older_than(cutoff)
            if n:
                self.metrics.retention_deleted.labels("age").inc(n)
                log.info("retention by age", extra={"deleted": n, "cutoff": cutoff})
        if r.max_bytes is not None:
            n = self.archive.trim_to_bytes(r.max_bytes)
            if n:
                self.metrics.retention_deleted.labels("size").inc(n)
                log.info("retention by size", extra={"deleted": n, "max_bytes": r.max_bytes})
        if self.ingest is not None:
            # Ids missing too long are given up even when no traffic comes to judge them.
            self.ingest.missing.sweep()
        stats = self.archive.stats()
        self.metrics.archive_messages.set(stats.message_count)
        self.metrics.archive_bytes.set(stats.total_message_bytes)
        if self.service is not None:
            self.service.cached_count = stats.message_count

    async def stop(self, grace: float = 5.0) -> None:
        """Flush and shut down every part; idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.info("store node stopping")
        starting = self._starting
        await cancel_and_wait([starting, self._housekeeping, self._health_task])
        if self.store_sync is not None:
            # Before ingest stops: what sessions already submitted is still committed.
            await self.store_sync.stop()
        if self.documents is not None:
            await self.documents.close()
        if self.documents_process is not None:
            await self.documents_process.close()
            log.info("documents process stopped")
        if self.service is not None:
            await self.service.health.enter_graceful_shutdown()
        if self.transport is not None:
            # First, so no new messages arrive; the subscriptions end after the
            # envelopes they already hold, and ingest archives those (drain=True).
            if self.ingest is not None:
                self.ingest.expect_subscriptions_to_end()
            try:
                await self.transport.close()
            except Exception as exc:
                log.error("transport close failed", extra={"error": repr(exc)})
        stops = []
        if self.ingest is not None:
            stops.append(self.ingest.stop(drain=True))
        if self._server is not None:
            stops.append(self._server.stop(grace))
        await asyncio.gather(*stops)
        if self.service is not None:
            self.service.close()
        if self.archive is not None:
            self.archive.close()
        self._lock.release()
        self.metrics.close()
        log.info(
            "store node stopped",
            extra={"lost": self.metrics.value("chorus_store_ingest_lost_total")},
        )

    async def run(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then stop gracefully."""
        check_channels(self.config.ingest.channels)  # a config error, before any log line
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():
                # Tools often deliver a signal twice (to the process and its group):
                # a repeat must not abort the flush that the first one started.
                log.warning("already stopping", extra={"signal": sig.name})
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        starting = asyncio.create_task(self.start(), name="store-node-start")
        stopping = asyncio.create_task(stop.wait(), name="store-node-stop-signal")
        try:
            # A signal during a start that hangs (broker or database not answering)
            # must still end the process: whichever comes first wins.
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                log.warning("stop requested while starting; start cancelled")
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
            else:
                starting.result()  # a failed start raises here
                await stopping
        finally:
            stopping.cancel()
            try:
                await self.stop()
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
