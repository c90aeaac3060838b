"""The serving side of collection sync: snapshots, their RIBLT symbols, listeners.

Theory of operation
-------------------
A peer sends ``create_snapshot(root)``. The server walks the collection
(:mod:`.reachability`), turns each document into a 48-byte item (document key
‖ state digest, :mod:`.symbols`), keeps the items and a RIBLT encoder under a
fresh random 16-byte snapshot id, and answers with the id and the first coded
symbols. ``snapshot_symbols(id)`` continues the same sequence. The peer peels
until it knows which documents differ, then fetches those
(``fetch_sedimentree``), and may ``listen(id)``: from then on every stored
operation of a document in the snapshot becomes one notification for it.

The first batch is sized from the expected difference: the items changed since
the last snapshot the server gave the same device of the same root (a bounded
LRU; the device is the peer unless ``handle`` is told otherwise), or a guess for
a device it has no history for (:func:`first_batch_size`); each later batch
makes the total grow fourfold (:func:`followup_batch_size`).
docs/collection-sync.md ("First batch") gives the numbers and why.

Everything is bounded: documents per snapshot, live snapshots and the items
they hold together (oldest evicted, and expired after ``snapshot_ttl_ms``),
symbols per snapshot (a peer that never decodes is refused), listeners,
notifications queued per listener (a listener that falls behind is dropped and
must re-snapshot). Time is passed in (``now``, epoch milliseconds); nothing here
does I/O.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sdk.documents.materialize import DocumentView
from sdk.documents.store import DocumentStore
from sdk.sync.collection.errors import (
    CollectionUsageError,
    LimitExceeded,
    RemoteProtocolError,
    UnknownBlob,
    UnknownSnapshot,
)
from sdk.sync.collection.messages import (
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    ErrorResponse,
    FetchBlobPartRequest,
    FetchBlobPartResponse,
    FetchSedimentreeRequest,
    FetchSedimentreeResponse,
    ListenRequest,
    ListenResponse,
    Notification,
    Request,
    Response,
    ResponseBody,
    SnapshotSymbolsRequest,
    SnapshotSymbolsResponse,
    encode_message,
)
from sdk.sync.collection.reachability import reachable_documents
from sdk.sync.collection.sedimentree import (
    operation_id_of,
    operation_upload_item,
    sedimentree_of,
    stored_operation_blob,
    stratum_bundle,
)
from sdk.sync.collection.symbols import DOC_AND_STATE, document_item, document_key
from sdk.sync.riblt import Encoder

#: Coded symbols per differing item the first batch is sized for (the issue's bound).
SYMBOLS_PER_DIFFERENCE = 1.6


@dataclass(frozen=True, slots=True)
class CollectionConfig:
    """Bounds and batch sizing of collection sync (both sides use the same object)."""

    max_snapshot_documents: int = 100_000
    max_snapshots: int = 1024
    max_total_items: int = 2_000_000
    snapshot_ttl_ms: int = 10 * 60 * 1000
    expected_difference: int = 32
    expected_change_fraction: float = 0.01
    expected_local_changes: int = 4
    min_followup_batch: int = 100
    followup_factor: int = 3
    max_listeners: int = 1024
    max_pending_notifications: int = 1000
    remembered_peers: int = 4096
    max_blob_part_bytes: int = 1024 * 1024
    #: Summarise histories in strata (``sedimentree``); False lists every operation.
    strata: bool = True
    #: Strata whose bundles can be fetched (those of recent ``fetch_sedimentree``s).
    max_remembered_strata: int = 100_000

    def max_symbols(self, documents: int) -> int:
        """Symbols after which a snapshot stops answering: far past any honest need
        (a difference of every document on both sides needs about ``2.7 n``)."""
        return 4 * documents + 2 * self.min_followup_batch + 64


def first_batch_size(expected_difference: int) -> int:
    """Coded symbols to send first for a difference of ``expected_difference`` items."""
    return math.ceil(SYMBOLS_PER_DIFFERENCE * max(0, expected_difference)) + 1


def followup_batch_size(sent: int, config: CollectionConfig) -> int:
    """Coded symbols to send on a later request after ``sent`` symbols: the total
    grows ``followup_factor + 1``-fold per round trip."""
    return max(config.min_followup_batch, config.followup_factor * sent)


@dataclass(slots=True)
class _Snapshot:
    peer: str
    created_at: int
    items: dict[bytes, bytes]  # key -> item (key ‖ digest)
    encoder: Encoder
    listening: bool = False
    pending: deque[Notification] = field(default_factory=deque)


class CollectionServer:
    """Serves snapshots of one document store's collections to many peers."""

    def __init__(
        self,
        store: DocumentStore,
        config: CollectionConfig | None = None,
        *,
        new_id: Callable[[], bytes] | None = None,
    ) -> None:
        self.store = store
        self.config = config or CollectionConfig()
        self._new_id = new_id or (lambda: os.urandom(16))
        self._snapshots: OrderedDict[bytes, _Snapshot] = OrderedDict()
        self._history: OrderedDict[tuple[str, bytes], dict[bytes, bytes]] = OrderedDict()
        self._key_index: dict[bytes, str] = {}
        self._indexed_entries = -1
        self._strata: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
        #: Peers a listener of which fell ``max_pending_notifications`` behind and was dropped.
        self.dropped: set[str] = set()
        #: Operations whose blobs peers fetched (a stratum's bundle counts all of its
        #: operations, counted at its first part): what this side pushed when a peer
        #: pulled from it.
        self.operations_served = 0

    # -- requests ---------------------------------------------------------------------------

    def handle(
        self, peer: str, request: Request, now: int, *, device: str | None = None
    ) -> Response:
        """Answer one decoded request; a peer's error becomes an :class:`ErrorResponse`.

        ``device`` names whose history sizes a first batch when ``peer`` is only a
        connection (a stream adapter's peers change on every reconnect); by
        default the peer itself."""
        self.expire(now)
        body: ResponseBody
        try:
            req = request.body
            if isinstance(req, CreateSnapshotRequest):
                body = self._create_snapshot(peer, req.root, now, device or peer)
            elif isinstance(req, SnapshotSymbolsRequest):
                body = self._more_symbols(peer, req.snapshot_id)
            elif isinstance(req, FetchSedimentreeRequest):
                body = self._fetch_sedimentree(req.document)
            elif isinstance(req, FetchBlobPartRequest):
                body = self._fetch_blob_part(req)
            else:
                body = self._listen(peer, req)
        except RemoteProtocolError as exc:
            body = ErrorResponse(f"{type(exc).__name__}: {exc}")
        return Response(request.request_id, body)

    def _create_snapshot(
        self, peer: str, root_key: bytes, now: int, device: str
    ) -> CreateSnapshotResponse:
        root_id = self.document_id(root_key)
        limit = self.config.max_snapshot_documents
        views = [] if root_id is None else reachable_documents(self.store, root_id, limit)
        items = dict(self._index(view) for view in views)
        encoder = Encoder(DOC_AND_STATE, items.values())
        snapshot_id = self._new_id()
        if len(snapshot_id) != 16 or snapshot_id in self._snapshots:
            raise CollectionUsageError("new_id must return fresh 16-byte ids")
        held = sum(len(s.items) for s in self._snapshots.values())
        while self._snapshots and (
            len(self._snapshots) >= self.config.max_snapshots
            or held + len(items) > self.config.max_total_items
        ):
            held -= len(self._snapshots.popitem(last=False)[1].items)
        self._snapshots[snapshot_id] = _Snapshot(peer, now, items, encoder)
        expected = self._expected_difference(device, root_key, items)
        symbols = tuple(encoder.produce_batch(first_batch_size(expected)))
        return CreateSnapshotResponse(snapshot_id, symbols)

    def _expected_difference(self, peer: str, root_key: bytes, items: dict[bytes, bytes]) -> int:
        key = (peer, root_key)
        before = self._history.pop(key, None)
        self._history[key] = dict(items)
        while len(self._history) > self.config.remembered_peers:
            self._history.popitem(last=False)
        if before is None:
            return max(
                self.config.expected_difference,
                math.ceil(len(items) * self.config.expected_change_fraction),
            )
        # Items on one side only: a changed document counts twice (old and new item).
        changed = len(before.items() ^ items.items())
        return changed + self.config.expected_local_changes

    def _snapshot_of(self, peer: str, snapshot_id: bytes) -> _Snapshot:
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None or snapshot.peer != peer:
            raise UnknownSnapshot(f"unknown snapshot {snapshot_id.hex()}")
        return snapshot

    def _more_symbols(self, peer: str, snapshot_id: bytes) -> SnapshotSymbolsResponse:
        snapshot = self._snapshot_of(peer, snapshot_id)
        encoder = snapshot.encoder
        limit = self.config.max_symbols(len(snapshot.items))
        if encoder.produced >= limit:
            raise LimitExceeded(f"snapshot {snapshot_id.hex()} already sent {limit} symbols")
        n = min(followup_batch_size(encoder.produced, self.config), limit - encoder.produced)
        return SnapshotSymbolsResponse(tuple(encoder.produce_batch(n)))

    def _fetch_sedimentree(self, key: bytes) -> FetchSedimentreeResponse:
        document_id = self.document_id(key)
        if document_id is None:
            return FetchSedimentreeResponse(None)
        summary, strata = sedimentree_of(self.store, document_id, strata=self.config.strata)
        for stratum in strata:
            self._strata[stratum.digest] = stratum.operations
            self._strata.move_to_end(stratum.digest)
        while len(self._strata) > self.config.max_remembered_strata:
            self._strata.popitem(last=False)
        return FetchSedimentreeResponse(summary)

    def _fetch_blob_part(self, request: FetchBlobPartRequest) -> FetchBlobPartResponse:
        """An operation blob by its commit hash, or a stratum's bundle by its name
        (strata named by a recent ``fetch_sedimentree``)."""
        operations = self._strata.get(request.blob)
        if operations is not None:
            blob: bytes | None = stratum_bundle(self.store, operations)
        else:
            blob = stored_operation_blob(self.store, operation_id_of(request.blob))
        if blob is None:
            raise UnknownBlob(f"no blob {request.blob.hex()}")
        length = min(request.length, self.config.max_blob_part_bytes)
        if request.offset == 0:
            self.operations_served += 1 if operations is None else len(operations)
        return FetchBlobPartResponse(blob[request.offset : request.offset + length])

    def _listen(self, peer: str, request: ListenRequest) -> ListenResponse:
        snapshot = self._snapshot_of(peer, request.snapshot_id)
        if not snapshot.listening:
            if (listeners := self.listener_count) >= self.config.max_listeners:
                raise LimitExceeded(f"already {listeners} listeners")
            snapshot.listening = True
        return ListenResponse()

    # -- documents ----------------------------------------------------------------------

    def _index(self, view: DocumentView) -> tuple[bytes, bytes]:
        key = document_key(view.document_id)
        self._key_index[key] = view.document_id
        return key, document_item(view.document_id, view.view_id)

    def document_id(self, key: bytes) -> str | None:
        """The id of the stored document with this key, or ``None``. Keys seen in
        snapshots and stored operations are indexed; a miss rescans the store only if
        it holds new entries since the last scan, so unknown keys from a peer cost a
        count, not a scan, each."""
        known = self._key_index.get(key)
        if known is not None:
            return known
        entries = self.store.entry_count()
        if entries != self._indexed_entries:
            self._indexed_entries = entries
            for view in self.store.documents(deleted=True):
                self._key_index[document_key(view.document_id)] = view.document_id
        return self._key_index.get(key)

    def operation_stored(
        self, document_id: str, operation_id: str, entry: bytes, operation: bytes, from_peer: str
    ) -> None:
        """Tell the server an operation was stored: listeners whose snapshot holds the
        document get one notification for each new state (a repeat is not a change)."""
        view = self.store.document(document_id)
        if view is None:
            raise CollectionUsageError(f"document {document_id} is not stored")
        key, item = self._index(view)
        record = next(r for r in self.store.operations(document_id) if r.id == operation_id)
        notification = Notification(from_peer, key, operation_upload_item(record, entry, operation))
        for snapshot in list(self._snapshots.values()):
            if not snapshot.listening or snapshot.items.get(key, item) == item:
                continue  # not listened to, not in the snapshot, or no new state
            snapshot.items[key] = item
            if len(snapshot.pending) >= self.config.max_pending_notifications:
                snapshot.listening = False
                snapshot.pending.clear()
                self.dropped.add(snapshot.peer)
                continue
            snapshot.pending.append(notification)

    def notifications(self, peer: str) -> list[bytes]:
        """Drain the notifications queued for ``peer``, encoded, oldest first."""
        out: list[bytes] = []
        for snapshot in self._snapshots.values():
            if snapshot.peer == peer:
                while snapshot.pending:
                    out.append(encode_message(snapshot.pending.popleft()))
        return out

    # -- housekeeping -------------------------------------------------------------------

    def expire(self, now: int) -> None:
        """Drop snapshots older than ``snapshot_ttl_ms`` that nobody listens to."""
        ttl = self.config.snapshot_ttl_ms
        self._forget(lambda s: not s.listening and now - s.created_at > ttl)

    def _forget(self, which: Callable[[_Snapshot], bool]) -> None:
        for snapshot_id in [i for i, s in self._snapshots.items() if which(s)]:
            del self._snapshots[snapshot_id]

    def close_peer(self, peer: str) -> None:
        """Forget every snapshot (and listener) of ``peer``, e.g. when it disconnects;
        its history stays, so its next first batch is still sized from it."""
        self._forget(lambda s: s.peer == peer)
        self.take_dropped(peer)

    def take_dropped(self, peer: str) -> bool:
        """Whether a listener of ``peer``'s was dropped since last asked."""
        dropped = peer in self.dropped
        self.dropped.discard(peer)
        return dropped

    @property
    def listener_count(self) -> int:
        """How many snapshots are listened to (nothing to notify when zero)."""
        return sum(1 for s in self._snapshots.values() if s.listening)

    @property
    def snapshot_count(self) -> int:
        """How many snapshots are held."""
        return len(self._snapshots)


__all__ = [
    "SYMBOLS_PER_DIFFERENCE",
    "CollectionConfig",
    "CollectionServer",
    "first_batch_size",
    "followup_batch_size",
]
