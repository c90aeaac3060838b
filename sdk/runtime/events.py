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

    #: Not aware of any missing message that can still be retrieved (some may be lost),
    #: and no catch-up window owed.
    SYNCED = "synced"
    #: Aware of missing messages, or owing itself a catch-up window, and trying to
    #: retrieve them.
    SYNCING = "syncing"


class CatchUpState(StrEnum):
    """Where a channel stands with the catch-up it owes itself from the store.

    A window is *owed* from when the participant was last known to have
    everything (its last activity before a restart, the moment its transport
    went down, a gap) to when it noticed; it is persisted, retried with backoff
    and settled only once the store answered for all of it
    (``docs/runtime.md``, "Catch-up from the store").
    """

    #: Nothing owed (or no store configured).
    IDLE = "idle"
    #: A window is owed and the store is answering (or about to be asked).
    CATCHING_UP = "catching_up"
    #: The store did not answer; retried with backoff, on reconnect and at restart.
    STORE_UNREACHABLE = "store_unreachable"
    #: The store answered that it does not archive this channel.
    NOT_ARCHIVED = "not_archived"


@dataclass(frozen=True, slots=True)
class SyncStatus:
    """The reliable-channel API's ``SyncStatusDetail`` with its state, plus where the
    catch-up from the store stands (times in epoch ms)."""

    state: SyncState
    #: Messages from other participants in the local log.
    received: int
    #: Dependencies absent but potentially retrievable.
    missing: int
    #: Dependencies declared irretrievably lost.
    lost: int
    #: The catch-up from the store (:class:`CatchUpState`).
    catch_up: CatchUpState = CatchUpState.IDLE
    #: The owed time window ``[owed_from, owed_to)``, when one is owed.
    owed_from: int | None = None
    owed_to: int | None = None
    #: Store pages received for the window being fetched.
    pages: int = 0
    #: When the store first failed to answer (``STORE_UNREACHABLE``).
    store_down_since: int | None = None
    #: The store's last error (``STORE_UNREACHABLE``, ``NOT_ARCHIVED``).
    store_error: str = ""


@dataclass(frozen=True, slots=True)
class SyncStatusChanged(sds_events.Event):
    """The channel's :class:`SyncStatus` changed: synced or syncing, the catch-up state,
    or (while syncing) its details."""

    status: SyncStatus


@dataclass(frozen=True, slots=True)
class StoreUnreachable(sds_events.Event):
    """The store stopped answering while a catch-up window is owed (once per outage).

    The window stays owed and is retried with backoff
    (``RuntimeOptions.catch_up_retry_min``/``catch_up_retry_max``), at a transport
    reconnect, when another store query succeeds and after a restart.
    """

    since: int
    owed_from: int
    owed_to: int
    error: str


@dataclass(frozen=True, slots=True)
class ChannelNotArchived(sds_events.Event):
    """The store answered that it does not archive this channel (once, until it does).

    Catch-up cannot succeed and the check that the store holds our messages
    stops publishing them again; the channel never reports itself synced
    meanwhile. The fix is the store node's configuration (``[ingest] channels``).
    """

    error: str


@dataclass(frozen=True, slots=True)
class CatchUpCompleted(sds_events.Event):
    """The store answered for a whole owed window: it is settled."""

    from_ms: int
    to_ms: int
    #: Messages the store returned for it (duplicates included).
    retrieved: int
    pages: int


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
    """A store query failed: for missing messages (retried at the next report), for an
    owed catch-up window (no ids; it stays owed and is retried with backoff, see
    :class:`StoreUnreachable`) or for the confirmation that the store holds our
    messages (retried after the message's backoff)."""

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
