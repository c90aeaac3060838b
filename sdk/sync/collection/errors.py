"""Collection sync's exception classes, a branch of the tree drawn in :mod:`sdk.sync.errors`.

The shared classes (:class:`ConnectionLost`, :class:`MalformedMessage`,
:class:`LimitExceeded`, :class:`RemoteProtocolError`) are re-exported here, and
:class:`CollectionError` is :class:`sdk.sync.errors.SyncError` under the name this
package has always exported. Decoders raise only :class:`MalformedMessage`,
:class:`UnsupportedRequest` or :class:`LimitExceeded` on any byte string; any
other exception is a bug.
"""

from __future__ import annotations

from sdk.sync.errors import (
    ConnectionLost,
    LimitExceeded,
    LocalProtocolError,
    MalformedMessage,
    RemoteProtocolError,
    SyncError,
)

CollectionError = SyncError


class CollectionUsageError(LocalProtocolError, rule="collection_usage"):
    """The caller used the collection-sync API wrongly."""


class CollectionProtocolError(RemoteProtocolError, rule="collection"):
    """A peer broke a rule of collection sync."""


class UnsupportedRequest(CollectionProtocolError, rule="unsupported_request"):
    """A request type this implementation does not serve; answer with an error response."""

    def __init__(self, detail: str, request_id: bytes) -> None:
        super().__init__(detail)
        self.request_id = request_id


class UnknownSnapshot(CollectionProtocolError, rule="unknown_snapshot"):
    """A snapshot id that was never issued here, expired, or belongs to another peer."""


class UnknownBlob(CollectionProtocolError, rule="unknown_blob"):
    """A fetch for a blob (an operation) that is not stored here."""


class SnapshotTooLarge(CollectionProtocolError, rule="snapshot_too_large"):
    """The collection reachable from the root has more documents than the limit."""


class NotInSnapshot(CollectionProtocolError, rule="not_in_snapshot"):
    """A notification names a document that is not part of the snapshot listened to."""


class BadBlob(CollectionProtocolError, rule="bad_blob"):
    """A fetched operation blob does not match its hash or does not validate
    (``__cause__``: the error of the split or of the document layer, if one)."""


__all__ = [
    "BadBlob",
    "CollectionError",
    "CollectionProtocolError",
    "CollectionUsageError",
    "ConnectionLost",
    "LimitExceeded",
    "MalformedMessage",
    "NotInSnapshot",
    "RemoteProtocolError",
    "SnapshotTooLarge",
    "UnknownBlob",
    "UnknownSnapshot",
    "UnsupportedRequest",
]
