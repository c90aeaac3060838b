"""The store node's store-sync service: listener, periodic sessions, the indexer.

:class:`StoreSyncService` opens the archive's sync index (checking it and
indexing what was archived since it last ran), then

* keeps it current: every ``index_interval_s`` the rows committed since are
  indexed (:meth:`~store_node.store_sync.index.ArchiveIndex.catch_up`);
* serves sessions on ``listen`` (TCP, :class:`transports.guarded.GuardedListener`:
  the section's connection cap, deadlines, TLS and client certificates);
* syncs with every peer at start and every ``interval_s`` (one session per peer
  at a time; a failed session is logged and retried at the next interval), and
  early when ingest notices archived messages referencing ids the archive lacks
  (:meth:`StoreSyncService.request_sync`, :mod:`store_node.missing`): after
  :data:`GAP_SYNC_DELAY_S`, if ids noticed since the last check are still missing
  then, so a burst of references, or a copy merely arriving late, costs at most
  one session, and ids no peer had do not ask again; while ids are missing a
  failed session is retried with backoff (from that delay up to ``interval_s``),
  so a node and its peer restarting together heal.

A session's side of the node (:class:`ArchiveSide`) reconciles the index above
the node's floor (:meth:`StoreSyncService.floor_ms`) and hands what it receives to
the node's :class:`store_node.ingest.Ingest`, like messages from the transport;
its acknowledgements are the commits a session waits for. Why TCP and the sync
layer's framing rather than a gRPC stream: ``docs/store-node.md``, "Store-to-store sync".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sdk.sync import rbsr
from sdk.sync.errors import RemoteProtocolError
from sdk.sync.framing import FrameMeter
from store_node.addresses import parse_listen
from store_node.archive.base import Archive
from store_node.ingest import Ingest
from store_node.store_sync.config import StoreSyncConfig
from store_node.store_sync.index import ArchiveIndex
from store_node.store_sync.session import (
    ReconciliationParams,
    SessionLimits,
    SessionStats,
    run_session,
)
from transports.base import Envelope, topic_for_channel
from transports.guarded import GuardedListener, GuardedStream, fingerprint
from transports.stream import Stream, StreamClosed, connect_tcp, stop_tcp_server

T = TypeVar("T")

log = logging.getLogger("store_node.store_sync")

#: Seconds between a request for an early session and the session (see the module docstring).
GAP_SYNC_DELAY_S = 2.0


class ArchiveSide:
    """One session's view of the node: the index to reconcile, ingest to feed.

    With ``channels`` (a peer limited by ``peer_channels``) the peer is sent nothing
    of another channel, and what it sends of another channel is dropped.
    """

    def __init__(
        self, index: ArchiveIndex, ingest: Ingest, channels: frozenset[str] | None = None
    ) -> None:
        self._index = index
        self._ingest = ingest
        self.channels = channels
        self._outstanding = 0
        self._all_committed = asyncio.Event()
        self._all_committed.set()

    def source(self) -> rbsr.RangeIndex:
        """The archive's range index."""
        assert self._index.index is not None
        return self._index.index

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the index's thread."""
        return await self._index.call(fn)

    async def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        """The archived messages with these keys (on the index's thread), of ``channels``."""
        found = await self._index.call(lambda: self._index.load(keys))
        if self.channels is None:
            return found
        return [(channel, data) for channel, data in found if channel in self.channels]

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        """Submit to ingest as a transport envelope (its ack marks it committed); drop
        a message of a channel not in ``channels``."""
        if self.channels is not None and channel_id not in self.channels:
            return
        self._outstanding += 1
        self._all_committed.clear()
        await self._ingest.submit(
            Envelope(topic_for_channel(channel_id), data, digest, ack=self._acknowledged)
        )

    def _acknowledged(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            self._all_committed.set()

    async def committed(self) -> None:
        """Wait until ingest has committed (or rejected) everything accepted."""
        await self._all_committed.wait()


class StoreSyncService:
    """Serves and runs store-sync sessions for one node; see the module docstring."""

    def __init__(
        self,
        config: StoreSyncConfig,
        archive: Archive,
        ingest: Ingest,
        *,
        max_age_days: float | None = None,
    ) -> None:
        self.config = config
        #: Retention by age (``[retention] max_age_days``): older messages are not synced.
        self.max_age_days = max_age_days
        self.index = ArchiveIndex(archive)
        self.ingest = ingest
        self.limits = SessionLimits(max_round_messages=config.max_round_messages)
        self.params = ReconciliationParams(branching=config.branching, threshold=config.threshold)
        self.port = 0
        #: The last session's stats per peer (``HOST:PORT``), for tests and operators.
        self.last: dict[str, SessionStats] = {}
        #: Sessions per peer that failed since its last successful one.
        self.failures: dict[str, int] = {}
        #: The guarded listener once :meth:`start` served (its counters feed the metrics).
        self.listener: GuardedListener | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._noticed = asyncio.Event()
        self._wake = {peer: asyncio.Event() for peer in config.peers}

    def request_sync(self) -> None:
        """Sync with every peer soon: ingest noticed referenced ids the archive lacks."""
        self._noticed.set()

    async def _gap_loop(self) -> None:
        while True:
            await self._noticed.wait()
            await asyncio.sleep(GAP_SYNC_DELAY_S)
            self._noticed.clear()
            # Off the loop: the tracker's lock is held while it looks ids up in the archive.
            fresh = await asyncio.to_thread(self.ingest.missing.take_fresh)
            if fresh:
                self.ingest.metrics.store_sync_gap_requests.inc()
                log.info("store sync requested: referenced ids missing", extra={"fresh": fresh})
                for wake in self._wake.values():
                    wake.set()

    async def start(self) -> None:
        """Open and check the index, start listening, the indexer and the peer loops."""
        await self.index.call(self.index.open)
        if self.config.listen:
            host, port = parse_listen(self.config.listen, "store_sync.listen")
            listener = self.config.listener
            self.listener = GuardedListener(
                "store_sync", self._serve, listener.limits, tls=listener.tls, meter=FrameMeter
            )
            self.port = await self.listener.start(host, port)
        self._tasks.append(asyncio.create_task(self._index_loop(), name="store-sync-index"))
        for peer in self.config.peers:
            task = asyncio.create_task(self._peer_loop(peer), name=f"store-sync:{peer}")
            self._tasks.append(task)
        if self.config.peers:
            loop = asyncio.get_running_loop()

            def noticed(_: int) -> None:  # on ingest's decoder thread
                loop.call_soon_threadsafe(self.request_sync)

            self.ingest.missing.on_noticed = noticed
            if self.ingest.missing.count:
                # Noticed before the hook was in place (ingest judges the archive at start).
                self.request_sync()
            self._tasks.append(asyncio.create_task(self._gap_loop(), name="store-sync-gaps"))
        log.info("store sync started", extra={"port": self.port, "peers": list(self.config.peers)})

    async def stop(self) -> None:
        """Stop sessions and loops, close the listener and the index."""
        self.ingest.missing.on_noticed = None
        closed = self.listener is None or await self.listener.close()
        await stop_tcp_server(None, self._tasks)
        if not closed:
            log.warning("store sync listener did not close in time")
        await asyncio.to_thread(self.index.close)

    async def _index_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.index_interval_s)
            try:
                await self.index.call(self.index.catch_up)
            except Exception as exc:
                log.error("store sync indexing failed", extra={"error": repr(exc)[:500]})

    async def _peer_loop(self, peer: str) -> None:
        retry = GAP_SYNC_DELAY_S
        while True:
            failed = True
            try:
                await self.sync_with(peer)
                failed = False
            except (OSError, RemoteProtocolError) as exc:
                log.warning("store sync with peer failed", extra={"peer": peer, "error": str(exc)})
            except Exception as exc:
                log.error("store sync with peer failed", extra={"peer": peer, "error": repr(exc)})
            self.failures[peer] = self.failures.get(peer, 0) + 1 if failed else 0
            wait = self.config.interval_s
            if failed and self.ingest.missing.count:
                # A known gap: back off from GAP_SYNC_DELAY_S (see the module docstring).
                wait, retry = min(retry, wait), min(retry * 2, wait)
            else:
                retry = GAP_SYNC_DELAY_S
            # The next session: in ``wait`` seconds, or when a gap asks for one (_gap_loop).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake[peer].wait()
            self._wake[peer].clear()

    async def _prepare(self) -> None:
        # Everything committed so far is in the index, and retention's deletions
        # are noticed (the index is rebuilt) before fingerprints are compared.
        await self.index.call(self.index.verify)

    async def sync_with(self, peer: str) -> SessionStats:
        """One session with ``peer`` (``HOST:PORT``) as initiator; its stats."""
        host, port = parse_listen(peer, "store_sync.peers")
        await self._prepare()
        stream = await connect_tcp(host, port, ssl=self.config.listener.peer_context())
        try:
            stats = await self._run(stream, ArchiveSide(self.index, self.ingest), initiator=True)
        finally:
            await stream.close()
        self.last[peer] = stats
        log.info(
            "store sync session done",
            extra={
                "peer": peer,
                "received": stats.messages_received,
                "sent": stats.messages_sent,
                "rounds": stats.rounds_sent,
            },
        )
        return stats

    def floor_ms(self) -> int:
        """The oldest timestamp this node syncs now: its retention cutoff or sync window."""
        now = time.time()
        floors = [0.0]
        if self.max_age_days is not None:
            floors.append(now - self.max_age_days * 86_400)
        if self.config.window_s is not None:
            floors.append(now - self.config.window_s)
        return max(0, int(max(floors) * 1000))

    async def _run(self, stream: Stream, side: ArchiveSide, *, initiator: bool) -> SessionStats:
        # No bookkeeping of its own: a served session is a task of the listener, one
        # this node opens runs in its peer loop, and stop() cancels both.
        return await run_session(
            stream,
            side,
            initiator=initiator,
            floor_ms=self.floor_ms(),
            limits=self.limits,
            params=self.params,
        )

    async def _serve(self, stream: GuardedStream) -> None:
        channels = None  # the channels the peer may sync (None: all)
        if self.config.peer_channels:
            certificate = stream.peer_certificate
            peer = "" if certificate is None else fingerprint(certificate)
            if peer not in self.config.peer_channels:
                log.warning("store sync peer not in peer_channels", extra={"peer": stream.peer})
                return
            channels = self.config.peer_channels[peer]
        try:
            await self._prepare()
            side = ArchiveSide(self.index, self.ingest, channels)
            stats = await self._run(stream, side, initiator=False)
            log.info(
                "store sync session served",
                extra={"received": stats.messages_received, "sent": stats.messages_sent},
            )
        except (RemoteProtocolError, StreamClosed) as exc:
            log.warning("store sync session aborted", extra={"error": str(exc)[:500]})
        except Exception as exc:
            log.error("store sync session failed", extra={"error": repr(exc)[:500]})


__all__ = ["ArchiveSide", "StoreSyncService"]
