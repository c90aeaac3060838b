"""p2panda operations in Beelay's commit-graph shapes (loose commits, upload items).

A p2panda document is a graph of operations; Beelay's sedimentree summarises
a commit graph. Chorus maps one operation to one *loose commit*: its hash is
the 32-byte BLAKE3 digest inside the operation id (the entry hash), its
parents the digests of the operation's ``previous``. The commit's blob is the
operation blob below; the signed entry inside it is content-addressed by the
commit hash (and commits to the operation's hash), so ``BlobMeta.hash`` is the
commit hash too and ``fetch_blob_part`` takes it; ``size`` is the blob's.

Strata (runs of operations grouped by the leading zeros of their hashes) are
not produced yet: every operation is a loose commit, which is exact but
linear in the document's history.

The operation blob is ``uleb128(len(entry)) ‖ entry ‖ uleb128(len(operation))
‖ operation``; a notification carries it inline, ``fetch_blob_part`` serves
it, and :func:`split_operation_blob` gives back the two parts for
``DocumentStore.ingest``.
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


def operation_id_of(digest: bytes) -> str:
    """The operation id (hex YASMF hash) of a 32-byte commit hash."""
    return "0020" + digest.hex()


def loose_commit(record: OperationRecord, blob_size: int) -> LooseCommit:
    """One operation as a loose commit."""
    digest = operation_digest(record.id)
    parents = tuple(sorted(operation_digest(p) for p in record.previous))
    return LooseCommit(digest, parents, BlobMeta(digest, blob_size))


def stored_operation_blob(store: DocumentStore, operation_id: str) -> bytes | None:
    """The operation blob of a stored operation, or ``None``."""
    stored = store.entry(operation_id)
    return None if stored is None else operation_blob(*stored)


def sedimentree_of(store: DocumentStore, document_id: str) -> SedimentreeSummary:
    """A stored document's operations as loose commits, in materialization order."""
    commits = []
    for record in store.operations(document_id):
        blob = stored_operation_blob(store, record.id)
        commits.append(loose_commit(record, 0 if blob is None else len(blob)))
    return SedimentreeSummary((), tuple(commits))


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def operation_blob(entry: bytes, operation: bytes) -> bytes:
    """An entry and its operation as one blob."""
    return _uleb(len(entry)) + entry + _uleb(len(operation)) + operation


def operation_upload_item(record: OperationRecord, entry: bytes, operation: bytes) -> UploadItem:
    """The upload item a notification carries for one stored operation."""
    blob = operation_blob(entry, operation)
    commit = loose_commit(record, len(blob))
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
    "operation_blob",
    "operation_digest",
    "operation_id_of",
    "operation_upload_item",
    "sedimentree_of",
    "split_operation_blob",
    "stored_operation_blob",
]
