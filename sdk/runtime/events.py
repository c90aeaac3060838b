"""Events a :class:`~sdk.runtime.ReliableChannel` yields, beyond the SDS core's own.

The core's events (:mod:`sdk.sds.events`) pass through unchanged, except that
deliveries arrive as :class:`Delivery`, the core's
:class:`~sdk.sds.MessageDelivered` plus the delivery sequence number under
which the message was persisted (a name of its own: no class name is reused
across packages). The others
here are the runtime's: sync status, and failures of the transport or store
surfaced rather than swallowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sdk.sds import events as sds_events
from sdk.sds.records import fast_init


@dataclass(frozen=True, slots=True)
class Delivery(sds_events.MessageDelivered):
    """A message from a peer, delivered in causal order and already persisted.

    ``seq`` numbers the channel's local log in delivery order (our own sends
    take numbers too); pass the last ``seq`` you processed to
    ``events(after_seq=...)`` after a restart to resume exactly there.
    """

    seq: int = 0


# One per message delivered: see sdk/sds/records.py.
fast_init(Delivery)


class SyncState(StrEnum):
    """The reliable-channel API's two sync states."""

    #: Not aware of any missing message that can still be retrieved (some may be lost).
    SYNCED = "synced"
    #: Aware of missing messages and trying to retrieve them.
    SYNCING = "syncing"


@dataclass(frozen=True, slots=True)
class SyncStatus:
    """The reliable-channel API's ``SyncStatusDetail`` with its state."""

    state: SyncState
    #: Messages from other participants in the local log.
    received: int
    #: Dependencies absent but potentially retrievable.
    missing: int
    #: Dependencies declared irretrievably lost.
    lost: int


@dataclass(frozen=True, slots=True)
class SyncStatusChanged(sds_events.Event):
    """The channel became synced or syncing, or its details changed while syncing."""

    status: SyncStatus


@dataclass(frozen=True, slots=True)
class PublishFailed(sds_events.Event):
    """The transport refused to publish one of our datagrams.

    ``recoverable`` failures (connection trouble) leave a content message in
    the outgoing buffer, so it is resent by the sweep; unrecoverable ones (the
    payload is over the transport's limit) end its life: its acknowledgement
    waiters get :class:`~sdk.runtime.SendFailed`. ``message_id`` is empty for
    repair rebroadcasts.
    """

    message_id: str
    error: str
    recoverable: bool


@dataclass(frozen=True, slots=True)
class StoreRetrievalFailed(sds_events.Event):
    """A store query failed: for missing messages (retried at the next report), for a
    catch-up window (no ids; retried at the next trigger) or for the confirmation that
    the store holds our messages (retried an interval later)."""

    message_ids: tuple[str, ...]
    error: str


@dataclass(frozen=True, slots=True)
class SubscriptionEnded(sds_events.Event):
    """The transport ended the channel's subscription unexpectedly; nothing more arrives."""

    error: str


@dataclass(frozen=True, slots=True)
class NodeFailed(sds_events.Event):
    """A background step of the node (e.g. a database commit) failed; the node stopped.

    Nothing unsaved was published or delivered. Further calls raise
    :class:`~sdk.runtime.RuntimeFailure`.
    """

    error: str
