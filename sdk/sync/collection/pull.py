"""Per-document pull: bring one document up to date from a peer that has more of it.

:class:`DocumentPull` asks the peer for one document's sedimentree
(:mod:`.sedimentree`), then, in one pipelined round trip, for the blob of every
loose commit this store lacks and the bundle (in parts of at most
``part_bytes``) of every stratum it does not hold as it is (same name from its
own copy). Each blob must be the entry its commit hash names, checked before
anything is stored, and goes through ``DocumentStore.ingest`` in the peer's
order as soon as its predecessors did, so every rule of the document layer
applies and at most the outstanding blobs are held.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from sdk.documents.bamboo import decode_entry
from sdk.documents.errors import DocumentError
from sdk.documents.events import DocumentEvent
from sdk.documents.store import DocumentStore
from sdk.sync.collection.errors import (
    BadBlob,
    CollectionProtocolError,
    CollectionUsageError,
    MalformedMessage,
)
from sdk.sync.collection.messages import (
    FetchBlobPartRequest,
    FetchBlobPartResponse,
    FetchSedimentreeRequest,
    FetchSedimentreeResponse,
    Request,
    Response,
    StratumMeta,
    expected_body,
)
from sdk.sync.collection.sedimentree import (
    operation_id_of,
    split_operation_blob,
    split_stratum_bundle,
    strata_of,
)

#: Largest stratum bundle a pull accepts (a stratum averages 256 operations).
MAX_STRATUM_BYTES = 64 * 1024 * 1024


class DocumentPull:
    """Fetch and store the operations of one document that this store lacks."""

    def __init__(
        self,
        store: DocumentStore,
        document_key: bytes,
        *,
        new_id: Callable[[], bytes] | None = None,
        max_blob_bytes: int = 1024 * 1024,
        part_bytes: int = 1024 * 1024,
    ) -> None:
        self.store = store
        self.document_key = document_key
        self.max_blob_bytes = max_blob_bytes
        self.part_bytes = part_bytes
        self._new_id = new_id or (lambda: os.urandom(16))
        self._tree_request: bytes | None = None
        # Operation ids, or (stratum name, its size), in the peer's order.
        self._wanted: list[str | tuple[bytes, int]] = []
        self._pending: dict[bytes, tuple[int, int]] = {}  # request id -> (index, offset)
        self._parts: dict[int, dict[int, bytes]] = {}
        self._blobs: dict[int, bytes] = {}
        self._next = 0
        self.done = False
        #: Operations stored by this pull.
        self.applied = 0

    def start(self) -> Request:
        """The ``fetch_sedimentree`` request."""
        if self._tree_request is not None:
            raise CollectionUsageError("start() opens a pull once")
        request = Request(self._new_id(), FetchSedimentreeRequest(self.document_key))
        self._tree_request = request.request_id
        return request

    def receive(self, response: Response) -> list[Request]:
        """Take one response; the requests to send next (none once :attr:`done`)."""
        if response.request_id == self._tree_request and not self._wanted:
            self._tree_request = None
            tree = expected_body(response, FetchSedimentreeResponse, "fetch_sedimentree")
            return self._tree(tree)
        pending = self._pending.pop(response.request_id, None)
        if pending is None:
            raise CollectionProtocolError("a response to no outstanding request")
        body = expected_body(response, FetchBlobPartResponse, "fetch_blob_part")
        index, offset = pending
        wanted = self._wanted[index]
        if isinstance(wanted, str):
            self._blobs[index] = body.data
        else:
            parts = self._parts.setdefault(index, {})
            if len(body.data) != min(self.part_bytes, wanted[1] - offset):
                raise BadBlob(f"a part of stratum {wanted[0].hex()[:16]}… has the wrong size")
            parts[offset] = body.data
            if sum(map(len, parts.values())) == wanted[1]:
                self._blobs[index] = b"".join(parts[o] for o in sorted(parts))
                del self._parts[index]
        self._ingest_ready()
        return []

    def _tree(self, body: FetchSedimentreeResponse) -> list[Request]:
        if body.content is None:
            self.done = True
            return []
        requests = self._strata(body.content.strata)
        for commit in body.content.commits:
            operation_id = operation_id_of(commit.hash)
            if self.store.has_entry(operation_id):
                continue
            if commit.blob.size > self.max_blob_bytes:
                raise BadBlob(f"operation {operation_id[:16]}… is {commit.blob.size} bytes")
            requests.append(self._fetch(commit.hash, len(self._wanted), 0, commit.blob.size))
            self._wanted.append(operation_id)
        self.done = not requests
        return requests

    def _fetch(self, blob: bytes, index: int, offset: int, length: int) -> Request:
        """A ``fetch_blob_part`` request for the part at ``offset`` of wanted ``index``."""
        request = Request(self._new_id(), FetchBlobPartRequest(blob, offset, length))
        self._pending[request.request_id] = (index, offset)
        return request

    def _strata(self, strata: tuple[StratumMeta, ...]) -> list[Request]:
        """Requests for the bundles of the strata this store does not hold as they are."""
        held: set[bytes] | None = None
        requests = []
        for meta in strata:
            end = operation_id_of(meta.end)
            if self.store.has_entry(end):
                if held is None:
                    document_id = self.store.document_of(end)
                    assert document_id is not None
                    held = {s.digest for s in strata_of(self.store.operations(document_id))[0]}
                if meta.blob.hash in held:
                    continue
            if meta.blob.size > MAX_STRATUM_BYTES:
                raise BadBlob(f"stratum {meta.blob.hash.hex()[:16]}… is {meta.blob.size} bytes")
            index = len(self._wanted)
            self._wanted.append((meta.blob.hash, meta.blob.size))
            for offset in range(0, max(meta.blob.size, 1), self.part_bytes):
                length = min(self.part_bytes, meta.blob.size - offset)
                requests.append(self._fetch(meta.blob.hash, index, offset, length))
        return requests

    def _ingest_ready(self) -> None:
        while self._next in self._blobs:
            wanted, blob = self._wanted[self._next], self._blobs.pop(self._next)
            if isinstance(wanted, str):
                operations = [(wanted, blob)]
            else:
                try:
                    operations = split_stratum_bundle(blob, wanted[0])
                except MalformedMessage as exc:
                    raise BadBlob(f"stratum {wanted[0].hex()[:16]}…: {exc}") from exc
            for operation_id, operation_blob in operations:
                if not self.store.has_entry(operation_id):  # held already, or stored meanwhile
                    ingest_operation_blob(self.store, operation_blob, operation_id)
                    self.applied += 1
            self._next += 1
        self.done = self._next == len(self._wanted)


def ingest_operation_blob(
    store: DocumentStore, blob: bytes, operation_id: str
) -> list[DocumentEvent]:
    """Store the operation in ``blob`` if it is the one ``operation_id`` names.

    Raises :class:`BadBlob` (nothing stored) when the blob does not split, holds
    another entry, or the document layer rejects it.
    """
    try:
        entry, operation = split_operation_blob(blob)
    except MalformedMessage as exc:
        raise BadBlob(f"the blob for {operation_id[:16]}… is malformed: {exc}") from exc
    try:
        if decode_entry(entry).id != operation_id:
            raise BadBlob(f"the blob for {operation_id[:16]}… holds another entry")
        return store.ingest(entry, operation)
    except DocumentError as exc:
        raise BadBlob(f"operation {operation_id[:16]}… is rejected: {exc}") from exc


__all__ = ["DocumentPull", "ingest_operation_blob"]
