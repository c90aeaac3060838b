"""A replication session's state, and how a connection replicates (:class:`SyncConfig`).

The session manager (:class:`~sdk.sync.session.Replication`) and its strategies
(:mod:`sdk.sync.strategies`) share a :class:`Session` per open session; what it
has to send is its :class:`~sdk.sync.send_plan.SendQueue`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdk.documents.store import Incoming
from sdk.sync import rbsr
from sdk.sync.events import Phase
from sdk.sync.messages import Mode
from sdk.sync.send_plan import LogKey, SendQueue


@dataclass(frozen=True, slots=True)
class SyncConfig:
    """How a connection replicates and what it tolerates from the peer."""

    #: Mode of the sessions we request.
    mode: Mode = Mode.SET_RECONCILIATION
    #: Ask for live mode after the catch-up (SyncDone live_mode).
    live_mode: bool = False
    #: Set reconciliation: parts a differing range splits into, and the key count
    #: under which a range is sent as a list (8: the fewest bytes in ``bench/sync.py``
    #: with 50 logs per author and about as few with one, see docs/sync.md).
    branching: int = 4
    threshold: int = 8
    #: Parts of a split range with at most this many keys are sent as keys, larger
    #: ones as fingerprints (:class:`~sdk.sync.rbsr.Reconciler`).
    part_threshold: int = 1
    #: Entries held while they wait for a dependency, per session.
    max_pending_entries: int = 10_000
    #: Sessions open at once with one peer.
    max_sessions: int = 16
    #: Logs in one Have message, and messages in one reconciliation round.
    max_have_logs: int = 1_000_000
    max_round_messages: int = 200_000
    #: Messages rejected on one connection before it is closed (a flooding peer).
    max_rejected: int = 100
    #: A waiting session that hears nothing for this long is aborted (ms).
    stall_timeout_ms: int = 60_000
    #: Progress events every this many entries.
    progress_every: int = 500
    #: Entries stored in one transaction at most (a read's Entry messages are batched).
    max_batch: int = 2_000
    #: Entries read from the store and encoded per :meth:`Replication.data_to_send`
    #: call: what a session has to send is streamed in chunks of about this size
    #: (one document's logs stay in one chunk), so the peer gets the first entries
    #: at once and what waits to be sent is not held in memory.
    send_chunk: int = 256
    #: Whether we dialled (wins a concurrent request for the same session id).
    initiator: bool = True


@dataclass(slots=True)
class Session:
    """One open session with the peer: what we know of it and what is left to do."""

    id: int
    #: We requested it.
    local: bool
    mode: Mode
    schema_ids: tuple[str, ...]
    live_requested: bool
    last_heard: int
    queue: SendQueue
    #: The peer has sent a message of it (a request of ours stops being pending).
    established: bool = False
    phase: Phase = Phase.REQUESTED
    reconciler: rbsr.Reconciler | None = None
    local_done: bool = False
    remote_done: bool = False
    remote_live: bool = False
    sent_have: bool = False
    #: Everything we hold was queued for the peer (it opened with EmptySet).
    sent_all: bool = False
    received_have: bool = False
    peer_heights: dict[LogKey, int] = field(default_factory=dict)
    lacking: dict[LogKey, int] = field(default_factory=dict)
    pending: list[Incoming] = field(default_factory=list)
    live_backlog: dict[LogKey, int] = field(default_factory=dict)
    #: Everything we had to send is queued; our SyncDone may wait for the peer's
    #: (see ``Replication._local_done``).
    finished_sending: bool = False
    #: Our SyncDone is queued (``local_done`` once it is handed to the driver).
    done_queued: bool = False
    received: int = 0
    sent: int = 0

    @property
    def live(self) -> bool:
        """Both sides asked for live mode and the catch-up is over."""
        return self.phase is Phase.LIVE


__all__ = ["Session", "SyncConfig"]
