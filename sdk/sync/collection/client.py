"""The asking side of collection sync: which documents of a collection are out of sync.

:class:`SnapshotSync` feeds the peer's coded symbols to a RIBLT decoder holding
this side's view of the collection (the documents its store reaches from the
root, as 48-byte items), one request outstanding at a time, until
:attr:`SnapshotSync.result` says which documents changed, which exist only at
the peer (by key) and which only here. More symbols than ``config.max_symbols``
for the sizes involved, or a larger difference than both collections together,
is :class:`LimitExceeded`. :class:`SnapshotListener` checks the notifications
that follow ``listen``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sdk.documents.events import DocumentEvent
from sdk.documents.store import DocumentStore
from sdk.sync.collection.errors import (
    BadBlob,
    CollectionProtocolError,
    CollectionUsageError,
    LimitExceeded,
    NotInSnapshot,
    SnapshotTooLarge,
    UnknownSnapshot,
)
from sdk.sync.collection.messages import (
    CommitPart,
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    ListenRequest,
    ListenResponse,
    Notification,
    Request,
    Response,
    SnapshotSymbolsRequest,
    SnapshotSymbolsResponse,
    expected_body,
)
from sdk.sync.collection.pull import ingest_operation_blob
from sdk.sync.collection.reachability import reachable_documents
from sdk.sync.collection.sedimentree import operation_id_of
from sdk.sync.collection.server import CollectionConfig
from sdk.sync.collection.symbols import DOC_AND_STATE, document_item, document_key, split_item
from sdk.sync.riblt import DecodeLimitExceeded, Decoder

#: The peer's errors a snapshot request may fail with, raised as themselves.
_REFUSALS = (UnknownSnapshot, SnapshotTooLarge, LimitExceeded)


@dataclass(frozen=True, slots=True)
class OutOfSync:
    """What reconciling with a snapshot found."""

    snapshot_id: bytes
    #: Documents held here whose state differs from the snapshot's.
    changed: tuple[str, ...]
    #: Keys of documents in the snapshot that this side does not hold.
    missing: tuple[bytes, ...]
    #: Documents this side reaches from the root that the snapshot lacks.
    only_local: tuple[str, ...]
    #: Keys of every document in the snapshot.
    snapshot_keys: frozenset[bytes]

    @property
    def in_sync(self) -> bool:
        """True when nothing differs."""
        return not (self.changed or self.missing or self.only_local)


class SnapshotSync:
    """Reconcile this store's view of one collection with a peer's snapshot."""

    def __init__(
        self,
        store: DocumentStore,
        root_document_id: str,
        config: CollectionConfig | None = None,
        *,
        new_id: Callable[[], bytes] | None = None,
    ) -> None:
        self.config = config or CollectionConfig()
        self._new_id = new_id or (lambda: os.urandom(16))
        self.root_key = document_key(root_document_id)
        views = reachable_documents(store, root_document_id, self.config.max_snapshot_documents)
        self._local = {
            document_key(v.document_id): (v.document_id, document_item(v.document_id, v.view_id))
            for v in views
        }
        bound = len(self._local) + self.config.max_snapshot_documents
        self._decoder = Decoder(
            DOC_AND_STATE,
            (item for _, item in self._local.values()),
            max_symbols=self.config.max_symbols(bound),
            max_difference=bound,
        )
        self._pending: Request | None = None
        self.snapshot_id: bytes | None = None
        self.result: OutOfSync | None = None
        #: Requests sent so far: each is one round trip.
        self.round_trips = 0

    @property
    def symbols_received(self) -> int:
        """Coded symbols received so far."""
        return self._decoder.symbols_received

    def _send(self, body: CreateSnapshotRequest | SnapshotSymbolsRequest) -> Request:
        request = Request(self._new_id(), body)
        self._pending = request
        self.round_trips += 1
        return request

    def start(self) -> Request:
        """The ``create_snapshot`` request that opens the session."""
        if self._pending is not None or self.snapshot_id is not None:
            raise CollectionUsageError("start() opens a session once")
        return self._send(CreateSnapshotRequest(self.root_key))

    def receive(self, response: Response) -> Request | None:
        """Take the answer to the outstanding request; the next request, or ``None``
        when :attr:`result` is ready."""
        pending = self._pending
        if pending is None or response.request_id != pending.request_id:
            raise CollectionProtocolError("a response to no outstanding request")
        self._pending = None
        body: CreateSnapshotResponse | SnapshotSymbolsResponse
        if isinstance(pending.body, CreateSnapshotRequest):
            body = expected_body(response, CreateSnapshotResponse, "create_snapshot", _REFUSALS)
            self.snapshot_id = body.snapshot_id
        else:
            body = expected_body(response, SnapshotSymbolsResponse, "snapshot_symbols", _REFUSALS)
        if not body.symbols:
            raise CollectionProtocolError("a response without coded symbols")
        try:
            decoded = self._decoder.add_symbols(body.symbols)
        except DecodeLimitExceeded as exc:
            raise LimitExceeded(f"the snapshot's symbols do not decode: {exc}") from exc
        assert self.snapshot_id is not None
        if not decoded:
            return self._send(SnapshotSymbolsRequest(self.snapshot_id))
        remote = {split_item(item)[0] for item in self._decoder.remote}
        local = {split_item(item)[0] for item in self._decoder.local}
        self.result = OutOfSync(
            self.snapshot_id,
            changed=tuple(sorted(self._local[k][0] for k in remote & local)),
            missing=tuple(sorted(remote - local)),
            only_local=tuple(sorted(self._local[k][0] for k in local - remote)),
            snapshot_keys=frozenset((self._local.keys() - (local - remote)) | remote),
        )
        return None

    def listen(self) -> tuple[Request, SnapshotListener]:
        """The ``listen`` request for the decoded snapshot, and the listener to check
        its notifications with."""
        if self.result is None:
            raise CollectionUsageError("listen() after the snapshot has been reconciled")
        request = Request(self._new_id(), ListenRequest(self.result.snapshot_id))
        return request, SnapshotListener(
            request.request_id, self.result.snapshot_keys, self.config.max_pending_notifications
        )


class SnapshotListener:
    """Checks and de-duplicates notifications for one listened-to snapshot."""

    def __init__(self, request_id: bytes, keys: frozenset[bytes], remembered: int) -> None:
        self.request_id = request_id
        self.keys = keys
        #: Set once the peer accepted the listen request.
        self.accepted = False
        self._seen: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()
        self._remembered = max(1, remembered)

    def receive_response(self, response: Response) -> None:
        """The answer to the listen request."""
        if response.request_id != self.request_id:
            raise CollectionProtocolError("a response to no outstanding request")
        expected_body(response, ListenResponse, "listen")
        self.accepted = True

    def _marker(self, notification: Notification) -> tuple[bytes, bytes] | None:
        """The change's identity, or ``None`` for a repeat; NotInSnapshot if foreign."""
        if notification.document not in self.keys:
            raise NotInSnapshot(f"a notification for {notification.document.hex()}")
        part = notification.item.tree_part
        marker = (notification.document, part.hash if isinstance(part, CommitPart) else part.end)
        return None if marker in self._seen else marker

    def is_new(self, notification: Notification) -> bool:
        """False for a change already passed on; :class:`NotInSnapshot` for a document
        outside the snapshot."""
        return self._marker(notification) is not None

    def apply(self, notification: Notification, store: DocumentStore) -> list[DocumentEvent]:
        """Check a notification and store the operation it carries; a repeat stores nothing.

        Raises :class:`NotInSnapshot`, or :class:`BadBlob` when the blob is not
        inline, not the commit it names, or does not validate. Only a change that
        was stored counts as seen, so a forged notification cannot mask the real one.
        """
        marker = self._marker(notification)
        if marker is None:
            return []
        part, blob = notification.item.tree_part, notification.item.blob.data
        if not isinstance(part, CommitPart) or blob is None:
            raise BadBlob("a notification without an inline operation")
        events = ingest_operation_blob(store, blob, operation_id_of(part.hash))
        self._seen[marker] = None
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        return events


__all__ = ["OutOfSync", "SnapshotListener", "SnapshotSync"]
