"""A replication session's state, how a connection replicates (:class:`SyncConfig`), and
what the replication asks of its store (the requests).

The session manager (:class:`~sdk.sync.session.Replication`) keeps a :class:`Session`
per open session; what it asks of its store leaves it as a request (see
:mod:`sdk.sync.session`). An object a request carries (a reconciler, a send queue,
held entries) is the store side's until the request is done: the machine takes no
input meanwhile, and replaces rather than changes such an object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    #: A connection with a live session and no byte either way for this long sends our
    #: Announce (ms; a message any peer takes and does not answer: no change to the
    #: protocol), so that a listener's idle deadline does not cut a quiet live session;
    #: ``None``: never.
    keepalive_ms: int | None = 120_000
    #: Progress events every this many entries.
    progress_every: int = 500
    #: Entries stored in one transaction at most (a read's Entry messages are batched).
    max_batch: int = 2_000
    #: Entries per chunk a session's entries are read and sent in (about; one document's
    #: logs stay in one chunk, :mod:`sdk.sync.send_plan`).
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
    peer_heights: dict[LogKey, int] = field(default_factory=dict)
    lacking: dict[LogKey, int] = field(default_factory=dict)
    #: Entries waiting for a dependency (decoded on the store side, opaque here).
    pending: list[Any] = field(default_factory=list)
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


@dataclass(frozen=True, slots=True)
class StoreBatch:
    """Check and store a session's entries (``(entry, operation)`` bytes, in order) in one
    transaction, then retry its ``held`` entries; answered with :class:`BatchStored`."""

    session_id: int
    schema_ids: tuple[str, ...]
    entries: list[tuple[bytes, bytes]]
    held: list[Any]
    #: More held entries than this fail the session.
    max_held: int


@dataclass(frozen=True, slots=True)
class BatchStored:
    """What :class:`StoreBatch` did: entries stored or already there (held ones included),
    the highest sequence number per log of the entries sent, what still waits, and the
    first invalid entry's error (the entries before it are stored)."""

    accepted: int
    heights: dict[LogKey, int]
    held: list[Any]
    error: Exception | None


@dataclass(frozen=True, slots=True)
class Reconcile:
    """Run ``reconciler`` over the sync range of ``schema_ids``: its opening round
    (``round`` ``None``) or its answer to the peer's ``round``; answered with
    :class:`Reconciled`."""

    session_id: int
    schema_ids: tuple[str, ...]
    reconciler: rbsr.Reconciler
    round: list[rbsr.RangeMessage] | None


@dataclass(frozen=True, slots=True)
class Reconciled:
    """The reconciler's answer, the differences it learned, the local-only keys of logs
    the peer lacks, our heights of the logs in ``remote_only`` (0: none), or the peer
    round's error."""

    reply: list[rbsr.RangeMessage]
    local_only: list[bytes]
    remote_only: list[bytes]
    peer_lacks: list[bytes]
    heights: dict[LogKey, int]
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class ReadHave:
    """Our log heights of ``schema_ids`` for a Have: answered with
    ``((author, ((log_id, seq_num), ...)), ...)``."""

    session_id: int
    schema_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Read:
    """The next entries of ``queue`` (the head of its outbox: a chunk or a plan), read,
    ordered and encoded as Entry messages of ``session_id``; answered with the list of
    encoded messages and their entry and operation bytes (``(messages, payload)``)."""

    session_id: int
    queue: SendQueue


@dataclass(frozen=True, slots=True)
class Flush:
    """Persist the range indexes (a session ended); answered with ``None``."""


#: What the replication asks of its store.
Request = StoreBatch | Reconcile | ReadHave | Read | Flush

__all__ = [
    "BatchStored",
    "Flush",
    "Read",
    "ReadHave",
    "Reconcile",
    "Reconciled",
    "Request",
    "Session",
    "StoreBatch",
    "SyncConfig",
]
