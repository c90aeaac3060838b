"""The sync layer's exception tree.

::

    SyncError
     ├── LocalProtocolError      the caller misused the API (also a ValueError)
     └── RemoteProtocolError     a peer broke the protocol; the session is aborted
          ├── MalformedMessage   bytes that are not a replication message (bad CBOR,
          │                      unknown type, wrong shape, a frame over the bound)
          ├── UnknownSession     a message for a session that does not exist
          ├── UnexpectedEntry    an entry nobody asked for (schema, log, or order)
          ├── InvalidEntry       an entry the document layer rejects (signature,
          │                      links, log rules, schema); ``cause`` is its error
          └── LimitExceeded      a peer-controlled size over its bound, or a stall

A peer's bad input aborts only the session it belongs to; the store is left
unchanged by what was rejected and other sessions continue. Any other
exception is a bug.
"""

from __future__ import annotations


class SyncError(Exception):
    """Base class of every error the sync layer raises."""


class LocalProtocolError(SyncError, ValueError):
    """The caller used the API wrongly (unknown session, bad argument, ...)."""


class RemoteProtocolError(SyncError):
    """A peer sent something the protocol does not allow."""

    def __init__(self, detail: str, session_id: int | None = None) -> None:
        super().__init__(detail if session_id is None else f"session {session_id}: {detail}")
        self.detail = detail
        self.session_id = session_id


class MalformedMessage(RemoteProtocolError):
    """Bytes that do not decode to a replication message."""


class UnknownSession(RemoteProtocolError):
    """A message names a session id that is not open with this peer."""


class UnexpectedEntry(RemoteProtocolError):
    """An entry that is not part of what was requested (schema, log, or phase)."""


class InvalidEntry(RemoteProtocolError):
    """An entry or operation the document layer rejects; ``cause`` says which rule."""

    def __init__(self, detail: str, session_id: int | None, cause: Exception) -> None:
        super().__init__(detail, session_id)
        self.cause = cause


class LimitExceeded(RemoteProtocolError):
    """A peer went over a bound (frame size, items, pending entries) or stalled."""


__all__ = [
    "InvalidEntry",
    "LimitExceeded",
    "LocalProtocolError",
    "MalformedMessage",
    "RemoteProtocolError",
    "SyncError",
    "UnexpectedEntry",
    "UnknownSession",
]
