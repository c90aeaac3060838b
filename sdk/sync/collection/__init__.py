"""Collection sync (Beelay): learn which of many linked documents changed in one or
two round trips, with RIBLT snapshots (``sdk.sync.riblt``).

``CollectionServer`` (store side: snapshots, symbols, listeners) and
``SnapshotSync`` (client side) are pure state machines over a
``DocumentStore``: bytes and ``now`` in, bytes out; ``messages`` is the wire
codec, ``symbols`` the 48-byte items, ``reachability`` the collection walk,
``sedimentree`` the operation-to-commit mapping. See docs/collection-sync.md.
"""

from __future__ import annotations

from sdk.sync.collection.client import OutOfSync, SnapshotListener, SnapshotSync
from sdk.sync.collection.errors import (
    CollectionError,
    CollectionProtocolError,
    CollectionUsageError,
    LimitExceeded,
    MalformedMessage,
    NotInSnapshot,
    SnapshotTooLarge,
    UnknownSnapshot,
    UnsupportedRequest,
)
from sdk.sync.collection.messages import decode_message, encode_message
from sdk.sync.collection.reachability import reachable_documents
from sdk.sync.collection.server import (
    CollectionConfig,
    CollectionServer,
    ListenerDropped,
    first_batch_size,
)
from sdk.sync.collection.symbols import DOC_AND_STATE, document_item, document_key

__all__ = [
    "DOC_AND_STATE",
    "CollectionConfig",
    "CollectionError",
    "CollectionProtocolError",
    "CollectionServer",
    "CollectionUsageError",
    "LimitExceeded",
    "ListenerDropped",
    "MalformedMessage",
    "NotInSnapshot",
    "OutOfSync",
    "SnapshotListener",
    "SnapshotSync",
    "SnapshotTooLarge",
    "UnknownSnapshot",
    "UnsupportedRequest",
    "decode_message",
    "document_item",
    "document_key",
    "encode_message",
    "first_batch_size",
    "reachable_documents",
]
