"""What a replication connection tells its owner: small frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sdk.sync.errors import SyncError
from sdk.sync.messages import Announce, Mode


class Phase(StrEnum):
    """Where a session is."""

    #: SyncRequest sent, nothing heard back yet.
    REQUESTED = "requested"
    #: Finding the difference: set reconciliation rounds, or waiting for Have.
    RECONCILING = "reconciling"
    #: Difference known; sending and receiving the remaining entries.
    EXCHANGING = "exchanging"
    #: Both sides sent SyncDone(live_mode=true): new entries are pushed as they are stored.
    LIVE = "live"
    #: Both sides sent SyncDone; the session is over.
    DONE = "done"
    #: A protocol error ended the session (see :class:`SessionAborted`).
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """A session opened, by us (``local``) or by the peer."""

    session_id: int
    schema_ids: tuple[str, ...]
    mode: Mode
    local: bool


@dataclass(frozen=True, slots=True)
class Progress:
    """A session's counters, on every phase change and every few hundred entries."""

    session_id: int
    phase: Phase
    entries_received: int
    entries_sent: int


@dataclass(frozen=True, slots=True)
class SessionDone:
    """A session ended normally (both SyncDone, or live mode ended)."""

    session_id: int
    entries_received: int
    entries_sent: int


@dataclass(frozen=True, slots=True)
class SessionAborted:
    """A session ended because of ``error``; nothing invalid was stored."""

    session_id: int
    error: SyncError


@dataclass(frozen=True, slots=True)
class RequestIgnored:
    """A SyncRequest we did not accept (schemas not announced, duplicate, too many)."""

    session_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class PeerMessageRejected:
    """A peer message outside any session we could abort (e.g. an unknown session id)."""

    error: SyncError


@dataclass(frozen=True, slots=True)
class AnnounceReceived:
    """The peer's announcement replaced its previous one (newer timestamp)."""

    announce: Announce


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is unusable (``error``) or was closed by us (``None``)."""

    error: SyncError | None


SyncEvent = (
    SessionStarted
    | Progress
    | SessionDone
    | SessionAborted
    | RequestIgnored
    | PeerMessageRejected
    | AnnounceReceived
    | ConnectionClosed
)

__all__ = [
    "AnnounceReceived",
    "ConnectionClosed",
    "PeerMessageRejected",
    "Phase",
    "Progress",
    "RequestIgnored",
    "SessionAborted",
    "SessionDone",
    "SessionStarted",
    "SyncEvent",
]
