"""Collection sync over a stream: :class:`~.machine.CollectionMachine` on the one driver.

A :class:`CollectionConnection` runs the machine over one
:class:`transports.stream.Stream` with :class:`sdk.sync.run.MachineRun`, carries
out its requests (answering the peer with a :class:`~.server.CollectionServer`,
draining its notifications) and gives the client API, ``snapshot`` and
``listen``. Every step that reads or writes the store or the server runs on the
store's worker thread holding its lock, so the steps of every connection and of
replication over the same store take turns. The error that ends the connection
(:mod:`.errors`) is raised by pending requests and ``listen``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any

from sdk.documents.errors import MissingDependency
from sdk.documents.events import DocumentEvent
from sdk.documents.store import DocumentStore
from sdk.sync.collection.client import OutOfSync, SnapshotListener, SnapshotSync
from sdk.sync.collection.errors import (
    BadBlob,
    CollectionError,
    CollectionUsageError,
    ConnectionLost,
)
from sdk.sync.collection.machine import CollectionMachine
from sdk.sync.collection.messages import (
    DEFAULT_LIMITS,
    CommitPart,
    CreateSnapshotRequest,
    MessageLimits,
    Notification,
    Request,
    Response,
)
from sdk.sync.collection.pull import DocumentPull
from sdk.sync.collection.sedimentree import operation_id_of
from sdk.sync.collection.server import CollectionConfig, CollectionServer
from sdk.sync.collection.symbols import document_key
from sdk.sync.run import MachineConnection, now_ms, store_step
from transports.stream import Stream, connect_tcp
from transports.tasks import cancel_and_wait


@dataclass(frozen=True, slots=True)
class CollectionSnapshot:
    """A reconciled snapshot of a collection, its documents brought up to date."""

    root_document_id: str
    #: What reconciling found (before the pulls).
    out_of_sync: OutOfSync
    #: Round trips to learn the out-of-sync set.
    round_trips: int
    #: Documents pulled and operations stored by the pulls.
    documents_pulled: int
    operations_applied: int
    session: SnapshotSync = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class CollectionChange:
    """A change to a document of the snapshot, stored here."""

    document_id: str
    operation_id: str
    #: The peer that made the change, as the notification names it.
    from_peer: str
    #: What storing it changed: empty for a change to a deleted document, and when
    #: the change was stored by pulling its document (it depended on an operation
    #: made between the snapshot and ``listen``, which is not notified on its own).
    events: tuple[DocumentEvent, ...]


class CollectionConnection(MachineConnection[CollectionMachine]):
    """Collection sync with the peer at the other end of ``stream``.

    A :class:`~sdk.sync.run.MachineConnection` (an async context manager).
    ``server`` answers the peer's requests over ``store`` (``None``: this side
    only asks, and answers requests with an error response); ``peer`` is the
    name the server knows this connection by (its snapshots belong to it);
    ``device``: see :meth:`CollectionServer.handle`.
    With ``pull_back``, a snapshot the peer asks for of a collection this side
    holds is answered only after taking one of the peer's in return and pulling
    what it has newer (the peer must serve: ``connect_collection(...,
    serve=True)``; one that does not costs one refused request): one connection
    then brings both sides up to date, and the peer's snapshot shows it only
    what it lacks. ``keepalive``: seconds without traffic after which a
    listening connection repeats its listen request (``None``: never).
    """

    peer_errors = (CollectionError,)
    error: CollectionError | None

    def __init__(
        self,
        store: DocumentStore,
        stream: Stream,
        *,
        server: CollectionServer | None = None,
        peer: str = "peer",
        config: CollectionConfig | None = None,
        limits: MessageLimits = DEFAULT_LIMITS,
        timeout: float | None = 60.0,
        keepalive: float | None = 120.0,
        max_concurrent_pulls: int = 64,
        pull_back: bool = False,
        device: str | None = None,
    ) -> None:
        if max_concurrent_pulls < 1:
            raise CollectionUsageError("max_concurrent_pulls must be at least 1")
        self.store = store
        self.server = server
        self.peer = peer
        self.config = config or (server.config if server is not None else CollectionConfig())
        self.limits = limits
        self.max_concurrent_pulls = max_concurrent_pulls
        self.device = device
        self._off_loop = store_step(store)
        machine = CollectionMachine(
            serving=server is not None,
            pull_back=pull_back,
            limits=limits,
            timeout_ms=None if timeout is None else int(timeout * 1000),
            keepalive_ms=None if keepalive is None else int(keepalive * 1000),
            max_pending_notifications=self.config.max_pending_notifications,
            now=now_ms(),
        )
        super().__init__(machine, stream, self._perform, on_event=self._on_event)
        #: Bytes, frames and requests this connection moved (the machine's counters).
        self.stats = machine.stats
        self._waiting: dict[bytes, asyncio.Future[Response]] = {}
        self._pulling_back: set[str] = set()
        self._listener: SnapshotListener | None = None

    def notify(self) -> None:
        """The server may have queued notifications for this peer: push them (safe from
        any thread)."""
        self.machine.notify()
        self.wake()

    async def aclose(self) -> None:
        """Close the stream and stop; pending requests raise :class:`ConnectionLost`.
        The server forgets the peer's snapshots."""
        await super().aclose()
        if (server := self.server) is not None:
            await self._off_loop(lambda: server.close_peer(self.peer))

    # -- client API --------------------------------------------------------------------

    async def request(self, request: Request) -> Response:
        """Send ``request`` and wait for its response."""
        if self.closed.is_set():
            raise self._closed_error()
        self.machine.send(request, now_ms())
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._waiting[request.request_id] = future
        self.wake()
        try:
            return await future
        finally:
            if self._waiting.pop(request.request_id, None) is not None:
                self.machine.abandon(request.request_id)

    async def snapshot(
        self,
        root_document_id: str,
        *,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> CollectionSnapshot:
        """Reconcile the collection reachable from ``root_document_id`` with the peer's
        snapshot (:class:`SnapshotSync`) and bring every out-of-sync document up to
        date (:class:`DocumentPull`, at most ``max_concurrent_pulls`` at a time).

        ``on_progress(done, total)`` is called as documents are pulled (``total``
        once known, then after each document). Raises :class:`LimitExceeded` when
        the peer's symbols never decode, :class:`BadBlob` for an operation that
        does not validate (nothing of it is stored), :class:`ConnectionLost`.
        """
        session = await self._off_loop(
            lambda: SnapshotSync(self.store, root_document_id, self.config)
        )
        request: Request | None = await self._off_loop(session.start)
        while request is not None:
            response = await self.request(request)
            request = await self._off_loop(functools.partial(session.receive, response))
        result = session.result
        assert result is not None
        keys = [document_key(d) for d in result.changed] + list(result.missing)
        applied = await self.pull(keys, on_progress=on_progress)
        return CollectionSnapshot(
            root_document_id, result, session.round_trips, len(keys), applied, session
        )

    async def pull(
        self,
        keys: list[bytes],
        *,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Bring the documents with these keys up to date; the operations stored."""
        done = itertools.count(1)
        gate = asyncio.Semaphore(self.max_concurrent_pulls)
        progress = on_progress or (lambda done, total: None)
        progress(0, len(keys))

        async def one(key: bytes) -> int:
            async with gate:
                pull = DocumentPull(self.store, key, max_blob_bytes=self.limits.max_blob_part_bytes)
                first = await self.request(await self._off_loop(pull.start))
                requests = await self._off_loop(lambda: pull.receive(first))
                for response in await asyncio.gather(*map(self.request, requests)):
                    await self._off_loop(functools.partial(pull.receive, response))
            progress(next(done), len(keys))
            return pull.applied

        tasks = [asyncio.ensure_future(one(key)) for key in keys]
        try:
            return sum(await asyncio.gather(*tasks))
        finally:
            await cancel_and_wait(tasks)

    async def listen(self, snapshot: CollectionSnapshot) -> AsyncIterator[CollectionChange]:
        """Ask for notifications of changes to ``snapshot``'s documents and yield each
        change once it is stored here, until the connection closes.

        Raises :class:`NotInSnapshot` for a notification naming another document,
        :class:`BadBlob` for one whose operation is not what it names or does not
        validate, and the error that ended the connection if one did (a clean
        close just ends the iteration). One ``listen`` per connection at a time.
        """
        if self._listener is not None:
            raise CollectionUsageError("this connection is already listening")
        request, listener = snapshot.session.listen()
        self._listener = listener
        self.machine.listen(snapshot.out_of_sync.snapshot_id, now_ms())
        try:
            listener.receive_response(await self.request(request))
            while True:
                while (notification := self.machine.take_notification()) is None:
                    if self.closed.is_set():
                        if self.error is not None:
                            raise self.error
                        return
                    await self._wait_change()
                if not listener.is_new(notification):
                    continue
                store = functools.partial(self._store_change, listener, notification)
                try:
                    change = await self._off_loop(store)
                except BadBlob as exc:
                    # It depends on an unnotified change (see CollectionChange.events).
                    if not isinstance(exc.__cause__, MissingDependency):
                        raise
                    await self.pull([notification.document])
                    change = await self._off_loop(functools.partial(store, pulled=True))
                if change is not None:
                    yield change
        finally:
            self._listener = None
            self.machine.listen(None, now_ms())

    def _store_change(
        self, listener: SnapshotListener, notification: Notification, pulled: bool = False
    ) -> CollectionChange | None:
        """Check and store a notification's change (on the worker); ``None`` when it
        was stored here before (e.g. this side's own change, pulled back by the peer),
        unless it was just ``pulled`` with its document."""
        part = notification.item.tree_part
        known = isinstance(part, CommitPart) and self.store.has_entry(operation_id_of(part.hash))
        events = listener.apply(notification, self.store)  # BadBlob unless an inline commit
        assert isinstance(part, CommitPart)
        operation_id = operation_id_of(part.hash)
        document_id = self.store.document_of(operation_id)
        if (known and not pulled) or document_id is None:
            return None
        return CollectionChange(document_id, operation_id, notification.from_peer, tuple(events))

    # -- the driver's side -------------------------------------------------------------

    async def _perform(self, work: Any) -> Any:
        """Carry out one of the machine's requests: answer the peer, or drain the
        server's notifications for it."""
        server, peer = self.server, self.peer
        assert server is not None  # the machine asks only when serving
        if isinstance(work, Request):
            now = now_ms()
            return await self._off_loop(lambda: server.handle(peer, work, now, device=self.device))
        return await self._off_loop(lambda: (server.notifications(peer), server.take_dropped(peer)))

    def _on_event(self, event: Any) -> None:
        if isinstance(event, Response):
            future = self._waiting.pop(event.request_id, None)
            if future is not None and not future.done():
                future.set_result(event)
        else:  # a create_snapshot to answer after pulling back
            self._tasks = [t for t in self._tasks if not t.done()]
            self._tasks.append(asyncio.ensure_future(self._answer_after_pull_back(event)))

    async def _answer_after_pull_back(self, request: Request) -> None:
        """Pull back for the peer's ``create_snapshot`` (see the class docstring), then answer."""
        assert self.server is not None and isinstance(request.body, CreateSnapshotRequest)
        server, key = self.server, request.body.root
        try:
            root = await self._off_loop(lambda: server.document_id(key))
            if root is not None and root not in self._pulling_back:
                self._pulling_back.add(root)
                try:
                    await self.snapshot(root)
                finally:
                    self._pulling_back.discard(root)
        except CollectionError:
            pass  # the peer does not serve, serves badly, or the connection ended: still answer
        finally:
            self.machine.serve(request)
            self.wake()

    def _closed_error(self) -> CollectionError:
        return self.error or ConnectionLost("the collection-sync connection is closed")

    def _closing(self) -> None:
        self._fail_waiting(self._waiting.values(), self._closed_error())


async def connect_collection(
    store: DocumentStore,
    host: str,
    port: int,
    *,
    config: CollectionConfig | None = None,
    timeout: float | None = 60.0,
    keepalive: float | None = 120.0,
    serve: bool = False,
    ssl: SSLContext | None = None,
) -> CollectionConnection:
    """Open a started :class:`CollectionConnection` to a collection service over TCP
    (use it with ``async with``). With ``serve``, this side answers the service's
    requests over ``store`` too, so a service that pulls back (the store node
    does) takes this side's own changes in the same connection. ``ssl``: over TLS
    (:func:`transports.guarded.tls_client_context`)."""
    stream = await connect_tcp(host, port, ssl=ssl)
    server = CollectionServer(store, config) if serve else None
    connection = CollectionConnection(
        store, stream, server=server, config=config, timeout=timeout, keepalive=keepalive
    )
    connection.start()
    return connection


__all__ = ["CollectionChange", "CollectionConnection", "CollectionSnapshot", "connect_collection"]
