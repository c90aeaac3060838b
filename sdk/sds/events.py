"""What the SDS core tells the application, drained with ``next_event()``.

Small frozen dataclasses named for what happened. Every event carries the
``channel_id`` it concerns.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdk.sds.errors import RejectReason
from sdk.sds.records import fast_init


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of every SDS event."""

    channel_id: str


@dataclass(frozen=True, slots=True)
class MessageDelivered(Event):
    """A content message's dependencies are met: it is in the local log, in causal order."""

    message_id: str
    sender_id: str
    lamport_timestamp: int
    content: bytes
    retrieval_hint: bytes | None = None


@dataclass(frozen=True, slots=True)
class EphemeralReceived(Event):
    """An ephemeral message: delivered at once, never buffered, logged or acknowledged."""

    message_id: str
    sender_id: str
    content: bytes


@dataclass(frozen=True, slots=True)
class MessageSent(Event):
    """One of our messages went out (``attempt`` 0 first, then 1, 2, ... for resends)."""

    message_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class MessagePossiblyAcknowledged(Event):
    """Our message is in ``hits`` distinct peers' bloom filters, below the ack threshold."""

    message_id: str
    hits: int


@dataclass(frozen=True, slots=True)
class MessageAcknowledged(Event):
    """Our message is acknowledged (a peer's causal history, or enough filters): no more resends."""

    message_id: str


@dataclass(frozen=True, slots=True)
class MessageSendExpired(Event):
    """Our message was resent ``max_resends`` times without acknowledgement; resending stopped."""

    message_id: str
    attempts: int


@dataclass(frozen=True, slots=True)
class MessageMissing(Event):
    """A dependency is missing: fetch it (e.g. from a store node) and feed it to ``receive``.

    Reported when first detected, then after ``retrieval_interval_ms``, and
    again with the wait doubling each time (up to ``lost_timeout_ms / 4``) until
    it arrives or is declared lost: one retrieval in flight per id, with backoff.
    """

    message_id: str
    retrieval_hint: bytes | None
    sender_id: str | None


@dataclass(frozen=True, slots=True)
class RetrieveRange(Event):
    """Messages of the channel are missing from a time window: fetch every message a
    store archived with an arrival time in ``[from_ms, to_ms)`` and feed each to ``receive``.

    Emitted when a message reveals a missing dependency (the window runs from
    a margin before the last time this participant heard the channel to now,
    so one query covers a whole gap rather than one causal-history level per
    round) and by :meth:`~sdk.sds.MessageChannel.announce` after a reconnect.
    Windows already asked for within ``retrieval_interval_ms`` are not asked
    for again. Ids still missing afterwards are reported as :class:`MessageMissing`.
    """

    from_ms: int
    to_ms: int


@dataclass(frozen=True, slots=True)
class MessageLost(Event):
    """A dependency stayed missing for ``lost_timeout_ms``: irretrievably lost.

    Messages waiting only for it are delivered next.
    """

    message_id: str


@dataclass(frozen=True, slots=True)
class MessageRejected(Event):
    """Bytes from a peer were invalid or out of bounds; nothing in the channel changed.

    ``channel_id`` is empty when the bytes could not be decoded far enough to tell.
    """

    reason: RejectReason
    detail: str
    sender_id: str | None = None


@dataclass(frozen=True, slots=True)
class BloomProfileMismatch(Event):
    """A peer's bloom filter is ``size`` bytes where this channel's profile makes
    ``expected``: it runs another profile, so its filter acknowledges nothing here.
    Every participant of a channel must use the same profile. Reported once per peer.
    """

    sender_id: str
    size: int
    expected: int


# Several are built per message (sent, delivered): construct them without the
# generated frozen __init__'s per-field object.__setattr__ (sdk/sds/records.py).
fast_init(*[c for c in list(globals().values()) if isinstance(c, type) and issubclass(c, Event)])
