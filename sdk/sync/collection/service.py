"""Serving collection sync over TCP: one :class:`CollectionServer` for every connection.

:class:`CollectionService` owns the server over a :class:`~sdk.sync.store.SyncStore`
and a TCP listener (:class:`transports.guarded.GuardedListener`: a connection
cap, idle, write and frame deadlines, a memory budget, optional TLS and
client certificates, as ``listener`` and ``tls`` say). Each accepted stream
becomes a :class:`~sdk.sync.collection.connection.CollectionConnection` that
answers the peer's requests under a name of its own (snapshots belong to the
connection that made them) and, with ``pull_back``, takes a snapshot of a serving
peer's collection before answering its own. Every entry the store stores, from
any source, is told to the server, which queues one notification per listener
whose snapshot holds the document; the connections then push them.

The server's work runs on the store's worker thread (a snapshot of 10,000
documents costs about a second of CPU, see docs/collection-sync.md), and a stored
entry is told to it on the thread that stored it, holding the store's lock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING

from sdk.documents.bamboo import decode_entry
from sdk.sync.collection.connection import CollectionConnection
from sdk.sync.collection.server import CollectionConfig, CollectionServer
from sdk.sync.framing import FrameMeter
from sdk.sync.store import StoredEntry, SyncStore
from transports.guarded import GuardedListener, GuardedStream, ListenerLimits, TlsServer
from transports.stream import Stream
from transports.tasks import cancel_and_wait

if TYPE_CHECKING:
    from transports.libp2p import Libp2pTransport

log = logging.getLogger("sdk.sync.collection")

#: The libp2p protocol id of collection sync streams.
LIBP2P_PROTOCOL = "/chorus/collection-sync/1.0.0"


class CollectionService:
    """Serves ``store``'s collections to any number of peers (at most ``max_connections``)."""

    def __init__(
        self,
        store: SyncStore,
        config: CollectionConfig | None = None,
        *,
        max_connections: int = 256,
        timeout: float | None = 60.0,
        pull_back: bool = True,
        listener: ListenerLimits | None = None,
        tls: TlsServer | None = None,
    ) -> None:
        self.store = store
        self.server = CollectionServer(store, config)
        self.max_connections = max_connections
        self.timeout = timeout
        self.pull_back = pull_back
        self.port = 0
        #: The connections being served, and the tasks serving them.
        self._connections: dict[CollectionConnection, asyncio.Task[None]] = {}
        self._names = itertools.count(1)
        #: The TCP listener's limits (default: ``max_connections`` and the shared defaults).
        self.listener_limits = listener or ListenerLimits(max_connections=max_connections)
        self.tls = tls
        #: The guarded TCP listener once :meth:`start` ran.
        self.listener: GuardedListener | None = None
        self._unlisten = store.add_listener(self._stored)

    def _stored(self, stored: StoredEntry) -> None:
        """An entry was stored, on whichever thread stored it (the loop's or the store's
        worker), holding the store's lock, which also guards the server's state."""
        if not self.server.listener_count:
            return  # nobody listens: skip materializing the document
        operation_id = decode_entry(stored.entry).id
        document_id = self.store.document_of(operation_id)
        if document_id is None:
            return
        try:
            self.server.operation_stored(
                document_id, operation_id, stored.entry, stored.operation, stored.author.hex()
            )
        except Exception as exc:  # the entry is stored; a listener missing it re-snapshots
            log.error("collection sync: notification failed", extra={"error": repr(exc)})
            return
        for connection in list(self._connections):
            connection.notify()  # safe from any thread

    async def serve(self, stream: Stream, peer: str = "peer", device: str | None = None) -> None:
        """Answer the peer at the other end of ``stream`` until it closes; ``device``
        names whose snapshot history sizes its first batches (default: this
        connection only, so every first batch is a cold one)."""
        if len(self._connections) >= self.max_connections:
            log.warning("collection sync: connection refused", extra={"peer": peer})
            await stream.close()
            return
        connection = CollectionConnection(
            self.store,
            stream,
            server=self.server,
            peer=f"{peer}#{next(self._names)}",
            timeout=self.timeout,
            pull_back=self.pull_back,
            device=device,
        )
        task = asyncio.current_task()
        assert task is not None
        self._connections[connection] = task
        try:
            await connection.until_closed()
            if connection.error is not None:
                log.info(
                    "collection sync: peer dropped",
                    extra={"peer": peer, "error": str(connection.error)},
                )
        finally:
            del self._connections[connection]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Accept TCP connections on ``host:port``; return the bound port."""

        async def handle(stream: GuardedStream) -> None:
            # A device reconnecting from the same address is most likely the same
            # one: its last snapshot sizes the first batch (a wrong guess costs a
            # round trip or a few symbols, never correctness).
            await self.serve(stream, stream.peer, device=stream.peer.rpartition(":")[0])

        self.listener = GuardedListener(
            "collection", handle, self.listener_limits, tls=self.tls, meter=FrameMeter
        )
        self.port = await self.listener.start(host, port)
        log.info("collection sync listening", extra={"port": self.port})
        return self.port

    def serve_libp2p(self, host: Libp2pTransport, protocol: str = LIBP2P_PROTOCOL) -> None:
        """Answer collection sync on ``host``'s libp2p streams for ``protocol`` too
        (a client opens one with ``host.open_stream(addr, LIBP2P_PROTOCOL)``)."""
        host.handle_streams(lambda stream: self.serve(stream, "libp2p"), protocol)

    async def close(self) -> None:
        """Stop listening, close every connection, stop notifying (the store stays open)."""
        self._unlisten()
        self._unlisten = lambda: None
        if self.listener is not None:
            await self.listener.close(connection_timeout=None)
        await cancel_and_wait(list(self._connections.values()), timeout=None)


__all__ = ["LIBP2P_PROTOCOL", "CollectionService"]
