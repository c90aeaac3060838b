"""p2panda operations in Beelay's commit-graph shapes (loose commits, upload items).

A p2panda document is a graph of operations; Beelay's sedimentree summarises
a commit graph. Chorus maps one operation to one *loose commit*: its hash is
the 32-byte BLAKE3 digest inside the operation id (the entry hash), its
parents the digests of the operation's ``previous``. The commit's blob is the
signed entry itself, which is content-addressed by that same hash, so
``BlobMeta.hash`` repeats it and ``size`` is 0 (not given: the store does not
expose entry sizes; fetching blobs is part of per-document sync, not built yet).

Strata (runs of operations grouped by the leading zeros of their hashes) are
not produced yet: every operation is a loose commit, which is exact but
linear in the document's history.

A notification carries the operation inline: the blob is
``uleb128(len(entry)) ‖ entry ‖ uleb128(len(operation)) ‖ operation``, which a
listener hands to ``DocumentStore.ingest`` after :func:`split_operation_blob`.
"""

from __future__ import annotations

from sdk.documents.materialize import OperationRecord
from sdk.documents.store import DocumentStore
from sdk.sync.collection.errors import MalformedMessage
from sdk.sync.collection.messages import (
    BlobMeta,
    BlobRef,
    CommitPart,
    LooseCommit,
    SedimentreeSummary,
    UploadItem,
)

_DIGEST = slice(2, 34)


def operation_digest(operation_id: str) -> bytes:
    """The 32-byte BLAKE3 digest inside an operation id (hex YASMF hash)."""
    return bytes.fromhex(operation_id)[_DIGEST]


def loose_commit(record: OperationRecord) -> LooseCommit:
    """One operation as a loose commit."""
    digest = operation_digest(record.id)
    parents = tuple(sorted(operation_digest(p) for p in record.previous))
    return LooseCommit(digest, parents, BlobMeta(digest, 0))


def sedimentree_of(store: DocumentStore, document_id: str) -> SedimentreeSummary:
    """A stored document's operations as loose commits, in materialization order."""
    return SedimentreeSummary((), tuple(loose_commit(r) for r in store.operations(document_id)))


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def operation_upload_item(record: OperationRecord, entry: bytes, operation: bytes) -> UploadItem:
    """The upload item a notification carries for one stored operation."""
    commit = loose_commit(record)
    blob = _uleb(len(entry)) + entry + _uleb(len(operation)) + operation
    return UploadItem(BlobRef(data=blob), CommitPart(commit.hash, commit.parents))


def split_operation_blob(blob: bytes) -> tuple[bytes, bytes]:
    """``(entry, operation)`` from a notification's inline blob."""
    parts: list[bytes] = []
    pos = 0
    for _ in range(2):
        n = shift = 0
        while True:
            if pos >= len(blob) or shift > 28:
                raise MalformedMessage("an operation blob's length is truncated or too long")
            byte = blob[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + n > len(blob):
            raise MalformedMessage("an operation blob ends early")
        parts.append(blob[pos : pos + n])
        pos += n
    if pos != len(blob):
        raise MalformedMessage("bytes after an operation blob's operation")
    return parts[0], parts[1]


__all__ = [
    "loose_commit",
    "operation_digest",
    "operation_upload_item",
    "sedimentree_of",
    "split_operation_blob",
]
