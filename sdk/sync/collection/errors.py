"""Collection sync's exception tree.

::

    CollectionError
     ├── CollectionUsageError      the caller misused the API (also a ValueError)
     ├── ConnectionClosed          the stream ended (or timed out) before the answer came
     └── CollectionProtocolError   a peer broke the protocol; its request or session ends
          ├── MalformedMessage     bytes that are not a Beelay message (truncated, unknown
          │                        type, overlong LEB128, trailing bytes)
          ├── UnsupportedRequest   a well-formed request this implementation does not serve
          │                        (upload commits, upload blob)
          ├── UnknownSnapshot      a snapshot id this side never issued, or one it dropped
          ├── UnknownBlob          a blob (operation) this side does not hold
          ├── SnapshotTooLarge     the collection reachable from the root is over the limit
          ├── LimitExceeded        a peer-controlled size over its bound (symbols, hashes,
          │                        listeners, notifications pending) or RIBLT that never peels
          ├── NotInSnapshot        a notification for a document outside the snapshot
          └── BadBlob              a fetched blob is not the operation its hash names, or
                                   the document layer rejects it (``cause``)

Decoders raise only :class:`MalformedMessage`, :class:`UnsupportedRequest` or
:class:`LimitExceeded` on any byte string; any other exception is a bug. The
sync layer's other protocols have their own tree in ``sdk.sync.errors``; this
one stays separate until the two are merged under one root.
"""

from __future__ import annotations


class CollectionError(Exception):
    """Base class of every error collection sync raises."""


class CollectionUsageError(CollectionError, ValueError):
    """The caller used the API wrongly."""


class ConnectionClosed(CollectionError):
    """The stream closed, or a request went unanswered for too long: reconnect and
    take a new snapshot (a listener that fell behind is disconnected this way)."""


class CollectionProtocolError(CollectionError):
    """A peer sent something the protocol does not allow."""


class MalformedMessage(CollectionProtocolError):
    """Bytes that do not decode to a Beelay message."""


class UnsupportedRequest(CollectionProtocolError):
    """A request type this implementation does not serve; answer with an error response."""

    def __init__(self, detail: str, request_id: bytes) -> None:
        super().__init__(detail)
        self.request_id = request_id


class UnknownSnapshot(CollectionProtocolError):
    """A snapshot id that was never issued here, expired, or belongs to another peer."""


class UnknownBlob(CollectionProtocolError):
    """A fetch for a blob (an operation) that is not stored here."""


class SnapshotTooLarge(CollectionProtocolError):
    """The collection reachable from the root has more documents than the limit."""


class LimitExceeded(CollectionProtocolError):
    """A peer went over a bound, or sent RIBLT symbols that never decode."""


class NotInSnapshot(CollectionProtocolError):
    """A notification names a document that is not part of the snapshot listened to."""


class BadBlob(CollectionProtocolError):
    """A fetched operation blob does not match its hash or does not validate."""

    def __init__(self, detail: str, cause: Exception | None = None) -> None:
        super().__init__(detail)
        self.cause = cause


__all__ = [
    "BadBlob",
    "CollectionError",
    "CollectionProtocolError",
    "CollectionUsageError",
    "ConnectionClosed",
    "LimitExceeded",
    "MalformedMessage",
    "NotInSnapshot",
    "SnapshotTooLarge",
    "UnknownBlob",
    "UnknownSnapshot",
    "UnsupportedRequest",
]
