"""p2panda operations in Beelay's commit-graph shapes (loose commits, upload items).

A p2panda document is a graph of operations; Beelay's sedimentree summarises
a commit graph. Chorus maps one operation to one *loose commit*: its hash is
the 32-byte BLAKE3 digest inside the operation id (the entry hash), its
parents the digests of the operation's ``previous``. The commit's blob is the
operation blob below; the signed entry inside it is content-addressed by the
commit hash (and commits to the operation's hash), so ``BlobMeta.hash`` is the
commit hash too and ``fetch_blob_part`` takes it; ``size`` is the blob's.

Strata summarise a long history by a few hashes (docs/collection-sync.md,
"Per-document sync"): in materialization order, an operation whose commit hash
starts with :data:`STRATUM_ZERO_BYTES` zero bytes (one in 256) ends a *stratum*,
the run of operations since the previous one, described by a :class:`StratumMeta`
naming its *bundle*; operations after the last boundary stay loose commits. The
boundary rule and the bundle are Chorus's own, not Beelay's bytes.

A stratum's bundle is ``uleb128(count)`` then each operation blob with its
``uleb128`` length, in order. It is named (``BlobMeta.hash``) by
:func:`stratum_digest`, a BLAKE3 digest of its operations' commit hashes, so a
side can tell from its own store whether it holds the same stratum, and a
fetched bundle is checked entry by entry against the name before anything is
stored (each entry's hash commits to its operation, so this checks the bytes).

The operation blob is ``uleb128(len(entry)) ‖ entry ‖ uleb128(len(operation))
‖ operation``; a notification carries it inline, ``fetch_blob_part`` serves
it, and :func:`split_operation_blob` gives back the two parts for
``DocumentStore.ingest``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from blake3 import blake3

from sdk.documents.bamboo import decode_entry
from sdk.documents.errors import DocumentError
from sdk.documents.materialize import OperationRecord
from sdk.documents.store import DocumentStore
from sdk.sds.varint import VarintError, encode_uvarint, read_uvarint
from sdk.sync.collection.errors import LimitExceeded, MalformedMessage
from sdk.sync.collection.messages import (
    BlobMeta,
    BlobRef,
    CommitPart,
    LooseCommit,
    SedimentreeSummary,
    StratumMeta,
    UploadItem,
)
from sdk.sync.framing import FrameDecoder, encode_frame

#: Leading zero bytes of a commit hash that end a stratum (1 in 256 operations).
STRATUM_ZERO_BYTES = 1

_STRATUM_CONTEXT = b"chorus collection sync stratum v1"


def operation_digest(operation_id: str) -> bytes:
    """The 32-byte BLAKE3 digest inside an operation id (hex YASMF hash)."""
    return bytes.fromhex(operation_id)[2:34]  # after the 2-byte YASMF prefix


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


@dataclass(frozen=True, slots=True)
class Stratum:
    """A run of a document's operations ending at a boundary operation, named by
    ``digest`` (:func:`stratum_digest`)."""

    start: bytes | None
    end: bytes
    operations: tuple[str, ...]
    digest: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", stratum_digest(self.operations))


def stratum_digest(operation_ids: Sequence[str]) -> bytes:
    """BLAKE3 of a context string and the operations' commit hashes, in order."""
    hasher = blake3(_STRATUM_CONTEXT)
    for operation_id in operation_ids:
        hasher.update(operation_digest(operation_id))
    return hasher.digest()


def is_boundary(digest: bytes) -> bool:
    """Whether an operation with this commit hash ends a stratum."""
    return digest[:STRATUM_ZERO_BYTES] == bytes(STRATUM_ZERO_BYTES)


def strata_of(
    records: Sequence[OperationRecord],
) -> tuple[list[Stratum], list[OperationRecord]]:
    """A document's operations (materialization order) as strata and loose commits."""
    strata: list[Stratum] = []
    run: list[str] = []
    start: bytes | None = None
    for record in records:
        run.append(record.id)
        digest = operation_digest(record.id)
        if is_boundary(digest):
            strata.append(Stratum(start, digest, tuple(run)))
            start, run = digest, []
    return strata, list(records[len(records) - len(run) :])


def sedimentree_of(
    store: DocumentStore, document_id: str, *, strata: bool = True
) -> tuple[SedimentreeSummary, list[Stratum]]:
    """A stored document's sedimentree (strata, then loose commits in materialization
    order) and the strata it names; with ``strata=False`` every operation is loose."""
    records = store.operations(document_id)
    layers, loose = strata_of(records) if strata else ([], records)
    metas = tuple(
        StratumMeta(s.start, s.end, BlobMeta(s.digest, len(stratum_bundle(store, s.operations))))
        for s in layers
    )
    commits = tuple(
        loose_commit(record, len(stored_operation_blob(store, record.id) or b""))
        for record in loose
    )
    return SedimentreeSummary(metas, commits), layers


def stratum_bundle(store: DocumentStore, operation_ids: Sequence[str]) -> bytes:
    """The bundle of a stratum's operations (all must be stored)."""
    out = bytearray(encode_uvarint(len(operation_ids)))
    for operation_id in operation_ids:
        blob = stored_operation_blob(store, operation_id)
        if blob is None:  # entries are never deleted: a caller's bug
            raise KeyError(operation_id)
        out += encode_frame(blob)
    return bytes(out)


def split_stratum_bundle(bundle: bytes, digest: bytes) -> list[tuple[str, bytes]]:
    """``(operation id, operation blob)`` of a bundle named ``digest``, in order.

    Raises :class:`MalformedMessage` when the bytes do not split or their
    entries are not the operations ``digest`` names.
    """
    try:
        count, pos = read_uvarint(bundle, 0, max_bytes=5)
    except VarintError:
        raise MalformedMessage("a stratum bundle's count is truncated or too long") from None
    blobs = _pieces(bundle[pos:], "a stratum bundle")
    if len(blobs) != count:
        raise MalformedMessage(f"a stratum bundle of {len(blobs)} operations counts {count}")
    out: list[tuple[str, bytes]] = []
    for blob in blobs:
        try:
            entry, _ = split_operation_blob(blob)
            out.append((decode_entry(entry).id, blob))
        except (DocumentError, ValueError) as exc:
            raise MalformedMessage(f"a stratum bundle holds a bad entry: {exc}") from exc
    if stratum_digest([operation_id for operation_id, _ in out]) != digest:
        raise MalformedMessage("a stratum bundle holds other operations than its name says")
    return out


def _pieces(data: bytes, what: str) -> list[bytes]:
    """The length-prefixed pieces ``data`` is made of (each as one frame of
    :mod:`sdk.sync.framing`)."""
    frames = FrameDecoder(len(data))
    try:
        pieces = frames.feed(data)
    except LimitExceeded:
        raise MalformedMessage(f"{what} ends early") from None
    if frames.buffered:
        raise MalformedMessage(f"{what} ends early")
    return pieces


def operation_blob(entry: bytes, operation: bytes) -> bytes:
    """An entry and its operation as one blob."""
    return encode_frame(entry) + encode_frame(operation)


def operation_upload_item(record: OperationRecord, entry: bytes, operation: bytes) -> UploadItem:
    """The upload item a notification carries for one stored operation."""
    blob = operation_blob(entry, operation)
    commit = loose_commit(record, len(blob))
    return UploadItem(BlobRef(data=blob), CommitPart(commit.hash, commit.parents))


def split_operation_blob(blob: bytes) -> tuple[bytes, bytes]:
    """``(entry, operation)`` from a notification's inline blob."""
    parts = _pieces(blob, "an operation blob")
    if len(parts) != 2:
        raise MalformedMessage(f"an operation blob of {len(parts)} parts (entry, operation)")
    return parts[0], parts[1]


__all__ = [
    "STRATUM_ZERO_BYTES",
    "Stratum",
    "is_boundary",
    "loose_commit",
    "operation_blob",
    "operation_digest",
    "operation_id_of",
    "operation_upload_item",
    "sedimentree_of",
    "split_operation_blob",
    "split_stratum_bundle",
    "stored_operation_blob",
    "strata_of",
    "stratum_bundle",
    "stratum_digest",
]
