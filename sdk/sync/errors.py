"""The sync layer's exception tree: one root for every protocol under ``sdk.sync``.

::

    SyncError                          every error the sync layer raises; ``except SyncError``
     │                                 catches any sync failure (anything else is a bug)
     ├── LocalProtocolError            the caller misused the API (also a ValueError)
     │    ├── CollectionUsageError     collection sync (``sdk.sync.collection``)
     │    └── SymbolSizeError          RIBLT: an item of the wrong size (``sdk.sync.riblt``)
     ├── ConnectionLost                the connection ended too soon (also a ConnectionError)
     └── RemoteProtocolError           a peer broke the protocol; its session or connection ends
          ├── MalformedMessage         bytes that do not decode to a message of the protocol
          ├── LimitExceeded            a peer-controlled size over its bound, or a stall
          │    ├── DecodeLimitExceeded RIBLT symbols that never decode (``sdk.sync.riblt``)
          │    └── RoundTooLong        a reconciliation round over its bound (``sdk.sync.rbsr``)
          ├── UnknownSession           replication: a message for a session that is not open
          ├── UnexpectedEntry          replication: an entry nobody asked for
          ├── InvalidEntry             replication: an entry the document layer rejects
          ├── ReconcileError           range-based set reconciliation (``sdk.sync.rbsr``)
          ├── CollectionProtocolError  collection sync: UnsupportedRequest, UnknownSnapshot,
          │                            UnknownBlob, SnapshotTooLarge, NotInSnapshot, BadBlob
          │                            (``sdk.sync.collection.errors``)
          └── BambooP2PError           Bamboo point-to-point: FramingError, CreditViolation,
                                       RequestIdViolation, UnknownRequest, RangeViolation,
                                       AdjustmentViolation, DataOrderViolation,
                                       EagernessViolation, SkipViolation,
                                       PayloadSizeViolation, CompressionViolation,
                                       ApologyViolation, InvalidData
                                       (``sdk.sync.bamboo_p2p.errors``)

The classes defined here are shared: p2panda replication, collection sync, Bamboo
point-to-point and the store node's store sync all raise the same
:class:`MalformedMessage` and :class:`LimitExceeded`; a sub-package adds a class only
for a rule of its own, under the shared class it refines, and its errors module
re-exports the shared names. (``sdk.sync.riblt.RibltError`` is the common base of
RIBLT's two errors, which sit under the shared classes drawn above.)

A peer's bad input ends only the session (or connection) it belongs to; the store is
left unchanged by what was rejected and other sessions continue.
"""

from __future__ import annotations

from typing import ClassVar


class SyncError(Exception):
    """Base class of every error the sync layer raises.

    A subclass names its rule in its bases: ``class X(SyncError, rule="x")``.
    """

    #: Short, stable name of the rule that failed (also a counter key).
    rule: ClassVar[str] = "sync"

    def __init_subclass__(cls, rule: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if rule is not None:
            cls.rule = rule


class LocalProtocolError(SyncError, ValueError, rule="local"):
    """The caller used the API wrongly (unknown session, bad argument, ...)."""


class ConnectionLost(SyncError, ConnectionError, rule="connection_lost"):
    """The connection ended (closed, timed out, or dropped for falling behind) before the
    exchange was through: reconnect and ask again."""


class RemoteProtocolError(SyncError, rule="remote"):
    """A peer sent something the protocol does not allow."""

    def __init__(self, detail: str, session_id: int | None = None) -> None:
        super().__init__(detail if session_id is None else f"session {session_id}: {detail}")
        self.detail = detail
        self.session_id = session_id


class MalformedMessage(RemoteProtocolError, rule="malformed"):
    """Bytes that do not decode to a message of the protocol they arrived on (truncated,
    unknown type, bad varint, CBOR or hash, trailing bytes, a frame over the bound)."""


class LimitExceeded(RemoteProtocolError, rule="limit"):
    """A peer went over a bound (frame size, items, pending entries) or stalled."""


class UnknownSession(RemoteProtocolError, rule="unknown_session"):
    """A message names a session id that is not open with this peer."""


class UnexpectedEntry(RemoteProtocolError, rule="unexpected_entry"):
    """An entry that is not part of what was requested (schema, log, phase or order)."""


class InvalidEntry(RemoteProtocolError, rule="invalid_entry"):
    """An entry or operation the document layer rejects (signature, links, log rules,
    schema); ``cause`` says which rule."""

    def __init__(self, detail: str, session_id: int | None, cause: Exception) -> None:
        super().__init__(detail, session_id)
        self.cause = cause


__all__ = [
    "ConnectionLost",
    "InvalidEntry",
    "LimitExceeded",
    "LocalProtocolError",
    "MalformedMessage",
    "RemoteProtocolError",
    "SyncError",
    "UnexpectedEntry",
    "UnknownSession",
]
