"""Events an endpoint reports, named for what happened."""

from __future__ import annotations

from dataclasses import dataclass

from sdk.documents.bamboo import Entry
from sdk.sync.bamboo_p2p.entries import LogKey
from sdk.sync.bamboo_p2p.errors import RemoteProtocolError
from sdk.sync.bamboo_p2p.messages import CancelReason, Propose


@dataclass(frozen=True, slots=True)
class SessionEstablished:
    """Both setups are known; modes and windows are negotiated."""

    send_greedy: bool
    receive_greedy: bool


@dataclass(frozen=True, slots=True)
class ProposalReceived:
    """The peer proposed ``proposal``."""

    proposal: Propose


@dataclass(frozen=True, slots=True)
class ProposalConfirmed:
    """``request_id`` is confirmed (by the peer, or by us for the peer's proposal)."""

    request_id: int


@dataclass(frozen=True, slots=True)
class ProposalDropped:
    """``request_id`` overlapped a concurrent proposal and counts as never sent."""

    request_id: int
    ours: bool


@dataclass(frozen=True, slots=True)
class RequestCancelled:
    """The peer cancelled ``request_id`` for ``reason`` (we confirm it)."""

    request_id: int
    reason: CancelReason


@dataclass(frozen=True, slots=True)
class RequestClosed:
    """All four cancellation messages of ``request_id`` are through; its id is free."""

    request_id: int
    ours: bool


@dataclass(frozen=True, slots=True)
class RequestStalled:
    """We gave up on ``request_id`` (cancelled with 128): it waited for a piece that
    neither side supplied, the metadata (``payload`` false) or the payload of entry
    ``seq_num`` of ``log``. See :meth:`~sdk.sync.bamboo_p2p.endpoint.Endpoint.give_up`."""

    request_id: int
    log: LogKey
    seq_num: int
    payload: bool


@dataclass(frozen=True, slots=True)
class EntryReceived:
    """A verified entry arrived and was stored."""

    entry: Entry


@dataclass(frozen=True, slots=True)
class PayloadReceived:
    """A verified payload arrived and was stored."""

    log: LogKey
    seq_num: int
    size: int


@dataclass(frozen=True, slots=True)
class EntryUnverifiable:
    """Metadata arrived whose links point to entries we do not hold; not stored."""

    log: LogKey
    seq_num: int


@dataclass(frozen=True, slots=True)
class LogForkDetected:
    """``log`` is forked: ``proof`` holds two entries of the author that contradict
    (``verified`` False: a peer claimed it with a proof that does not hold; not recorded)."""

    log: LogKey
    proof: tuple[Entry, Entry]
    verified: bool = True


@dataclass(frozen=True, slots=True)
class EndOfLogDetected:
    """``log`` ends at ``seq_num`` (an end-of-log entry we stored, or a peer's report)."""

    log: LogKey
    seq_num: int
    reported: bool


@dataclass(frozen=True, slots=True)
class StartingHashMismatch:
    """The peer's entry at the proposal's anchor differs from the expected hash."""

    request_id: int
    entry: Entry


@dataclass(frozen=True, slots=True)
class ConnectionDropped:
    """The peer broke the protocol; the connection must be closed."""

    error: RemoteProtocolError


Event = (
    SessionEstablished
    | ProposalReceived
    | ProposalConfirmed
    | ProposalDropped
    | RequestCancelled
    | RequestClosed
    | RequestStalled
    | EntryReceived
    | PayloadReceived
    | EntryUnverifiable
    | LogForkDetected
    | EndOfLogDetected
    | StartingHashMismatch
    | ConnectionDropped
)

__all__ = [
    "ConnectionDropped",
    "EndOfLogDetected",
    "EntryReceived",
    "EntryUnverifiable",
    "Event",
    "LogForkDetected",
    "PayloadReceived",
    "ProposalConfirmed",
    "ProposalDropped",
    "ProposalReceived",
    "RequestCancelled",
    "RequestClosed",
    "RequestStalled",
    "SessionEstablished",
    "StartingHashMismatch",
]
