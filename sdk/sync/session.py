"""p2panda replication with one peer, as a pure state machine.

Theory of operation
-------------------
A :class:`Replication` is one connection to one peer over a reliable ordered
stream (``specs/p2panda-replication.txt``). It never touches a socket or a
clock: the driver passes the frames of each read to
:meth:`Replication.receive_many` (or one frame to :meth:`Replication.receive`)
with the current time, sends what :meth:`Replication.data_to_send` returns (one
message per frame) until it returns nothing, drains :meth:`Replication.next_event`,
and calls :meth:`Replication.handle_timer` at :meth:`Replication.get_timer`.

**Sending entries** streams: what a session has to send is queued as chunks of
logs (whole documents, in the order :meth:`SyncStore.entries_for` keeps across
chunks) and read from the store and encoded one chunk per session and call of
:meth:`Replication.data_to_send`, sessions taking turns. The peer gets the first
entries at once and the sender holds one chunk at a time. A log counts as sent
(``sent_upto``) once queued; our SyncDone goes after the session's last entry and, in a
session the peer opened, after the peer's SyncDone: the opener's done then means we
stored what it sent (see ``_local_done``).
Everything above the peer's heights (EmptySet, a Have) is not planned up front:
a lazy plan walks the range indexes a page of logs at a time as chunks are
asked for, and a chunk's documents' other logs join it as it is read.

**Announce** state is one per peer and replaced only by a newer timestamp.
**Sessions** are numbered per connection from 0 (aquadoggo ``manager.rs``
``INITIAL_SESSION_ID``, next id = last + 1); several run at once. A
SyncRequest is ignored when a schema is not in what we announce, when a
session over the same schemas is open, or when its id is taken. When both
sides request the same id (or the same schemas) at once, aquadoggo keeps the
request of the peer with the larger peer id (``manager.rs`` lines 219-296); a
bare stream has no peer ids, so here the side that dialled keeps its own and
the other drops its pending one and requests again with a new id.

**Set reconciliation** (mode 1) runs :class:`~sdk.sync.rbsr.Reconciler` over
the sync range, keys ``(public_key, log_id, seq_num)``. Each learned key tells
a log height: a key the peer holds and we lack is its height of that log; one
we hold that it lacks, with no key of that log from the peer, means it lacks
the log. As soon as we know the peer's height of a log is below ours we send
the missing entries (while reconciliation still runs). A log the peer lacks
altogether is sent as soon as a range that holds all of the log's possible
keys (no bound falls inside the log) is settled without a key of it from the
peer (:attr:`~sdk.sync.rbsr.Reconciler.peer_lacks`); the other logs it never
mentioned are sent when reconciliation has finished. Then SyncDone. A peer
that opens with EmptySet holds nothing: we answer with a bare Terminal and send
all our entries of the session's schemas straight away (spec 2.1), as Log-Height
would, without a list of our logs first.

**Log-Height** (mode 0) is aquadoggo's: the responder sends Have, the
initiator answers with its Have and the entries the responder lacks, the
responder sends what the initiator lacks (``strategies/log_height.rs``).

**Live mode**: when both SyncDone say ``live_mode``, entries stored later in
the session's schemas (published here or received from anyone else) are
pushed as Entry messages until either side sends SyncDone(false).

**Validation**: every received entry goes through the document store's
``ingest_many`` (signature, links, log rules, schema) and must belong to the
session's schemas and phase. :meth:`Replication.receive_many` takes the frames
of one read: consecutive Entry messages of one session are stored as one batch
(one transaction), before any other message is handled; an entry counts as
received once its batch has committed. Their signature checks start as they are
decoded (:meth:`~sdk.documents.bamboo.SignatureChecks.growing`), a chunk at a time
on a verification thread. An invalid entry in a batch aborts the
session; the valid entries before it stay stored. Anything else aborts that session with a typed
:class:`~sdk.sync.errors.RemoteProtocolError` (other sessions go on); nothing
invalid is stored. An entry waiting for a dependency sent later is held, up
to ``max_pending_entries``. A message that does not decode closes the
connection; one for an unknown session is rejected. A session that hears
nothing for ``stall_timeout_ms`` while it waits is aborted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice

from sdk.documents.bamboo import SignatureChecks
from sdk.documents.errors import DocumentError
from sdk.documents.schema import SYSTEM_SCHEMAS
from sdk.documents.store import DocumentStore, Incoming
from sdk.sync import rbsr
from sdk.sync.announce import supersedes
from sdk.sync.errors import (
    InvalidEntry,
    LimitExceeded,
    LocalProtocolError,
    MalformedMessage,
    RemoteProtocolError,
    SyncError,
    UnexpectedEntry,
    UnknownSession,
)
from sdk.sync.events import (
    AnnounceReceived,
    ConnectionClosed,
    PeerMessageRejected,
    Phase,
    Progress,
    RequestIgnored,
    SessionAborted,
    SessionDone,
    SessionStarted,
    SyncEvent,
)
from sdk.sync.messages import (
    LOG_PREFIX_SIZE,
    PUBLIC_KEY_SIZE,
    Announce,
    EntryMessage,
    Have,
    Message,
    Mode,
    RangeSync,
    RoundContext,
    SyncDone,
    SyncRequest,
    decode,
    encode,
    encode_entry,
    entry_parts,
    key_item,
    schema_id_set,
    short_bound,
)
from sdk.sync.store import EntryToSend, StoredEntry, SyncStore

LogKey = tuple[bytes, int]
#: Entries of a log to send: ``(author, log_id, after_seq, upto_seq)``.
_Wanted = tuple[bytes, int, int, int]

#: Logs a lazy plan (:class:`_Walk`) takes from the range index at a time.
WALK_PAGE = 256
#: After a range index key's log prefix: sorts after every key of that log and before
#: the next log's keys.
_PAST_LOG = b"\xff" * 8 + b"\x00"


@dataclass(slots=True)
class _Walk:
    """A lazy plan: a session's logs above the peer's heights, planned as chunks are pulled.

    The logs are walked in key order through the session's range indexes, a page
    (:data:`WALK_PAGE` logs) at a time: first the system schemas' logs, then the
    application schemas'. A log counts as sent (``sent_upto``) once it is in a
    chunk, up to its height when its page was walked; a log the walk has not reached
    yet is taken at its height when it is reached, so entries stored meanwhile in
    those logs go with it.
    """

    #: What is left to walk, in order: ``(system schemas, their logs)``.
    phases: deque[tuple[bool, rbsr.RangeSource]]
    #: The peer's heights (logs above them are sent).
    heights: dict[LogKey, int]
    #: Where the current phase goes on (``None``: its start).
    cursor: bytes | None = None
    #: Logs of the pages walked that are still to go in chunks, in order:
    #: ``(system, author, log_id, height)``.
    pending: deque[tuple[bool, bytes, int, int]] = field(default_factory=deque)
    #: A log longer than a chunk whose document has no other log to send: sent in parts.
    long_log: LogKey | None = None

    @property
    def done(self) -> bool:
        return not self.phases and not self.pending


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


class _State(Enum):
    PENDING = 0
    ESTABLISHED = 1


@dataclass(slots=True)
class _Session:
    id: int
    local: bool
    mode: Mode
    schema_ids: tuple[str, ...]
    live_requested: bool
    last_heard: int
    state: _State = _State.PENDING
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
    sent_upto: dict[LogKey, int] = field(default_factory=dict)
    pending: list[Incoming] = field(default_factory=list)
    live_backlog: dict[LogKey, int] = field(default_factory=dict)
    #: What is left to send, in order: chunks of logs ``(author, log_id, after,
    #: upto)`` to read and send, lazy plans that make such chunks as they are
    #: pulled, and messages that go after them (SyncDone).
    outbox: deque[list[_Wanted] | _Walk | SyncDone] = field(default_factory=deque)
    #: Everything we had to send is queued; our SyncDone may wait for the peer's
    #: (see ``Replication._local_done``).
    finished_sending: bool = False
    #: Our SyncDone is queued (``local_done`` once it is handed to the driver).
    done_queued: bool = False
    received: int = 0
    sent: int = 0
    rejected_duplicates: int = 0

    @property
    def live(self) -> bool:
        return self.phase is Phase.LIVE


class Replication:
    """Replication with one peer over one stream (sans I/O; see the module docstring).

    ``schema_ids`` is what we announce and serve: the peer may request any
    subset. ``now`` is the current time in milliseconds (any monotonic clock).
    """

    def __init__(
        self,
        store: SyncStore,
        schema_ids: Iterable[str],
        *,
        now: int,
        config: SyncConfig | None = None,
    ) -> None:
        self.store = store
        self.config = config or SyncConfig()
        self.schema_ids = schema_id_set(tuple(schema_ids))
        self._sessions: dict[int, _Session] = {}
        self._next_id = 0
        self._out: list[bytes] = []
        #: Sessions with something in their outbox, served in turn.
        self._sending: deque[_Session] = deque()
        self._events: deque[SyncEvent] = deque()
        self._now = now
        self.remote_announce: Announce | None = None
        self._announce_time = 0
        self.closed = False
        self.rejected = 0
        #: Bytes we sent and received, without entry and operation bytes.
        self.overhead_sent = 0
        self.overhead_received = 0
        #: Entry and operation bytes sent and received.
        self.payload_sent = 0
        self.payload_received = 0
        self._ingesting_from: int | None = None
        #: Entries received and checked, not stored yet (one session's, in order).
        self._batch: list[Incoming] = []
        self._batch_session: _Session | None = None
        #: The batch's signature checks, started as its entries are decoded.
        self._checks: SignatureChecks | None = None
        self._batching = False
        self._ended: deque[int] = deque(maxlen=64)
        self._skip_round: set[int] = set()
        # Same-author items of a round are written short (messages.RoundContext).
        self._sent_round = RoundContext(max(4 * self.config.max_sessions, 64))
        self._received_round = RoundContext(max(4 * self.config.max_sessions, 64))
        self._unlisten = store.add_listener(self._on_stored)

    # -- outputs -----------------------------------------------------------------------

    def data_to_send(self) -> list[bytes]:
        """Encoded messages to send, one per frame, in order; ``[]`` when nothing is left.

        Entries are read from the store and encoded here, about
        ``SyncConfig.send_chunk`` per call, taken from the sessions with
        something to send in turn: call it again (when the stream has room)
        until it returns nothing.
        """
        budget = self.config.send_chunk
        # A lazy plan may walk logs it has nothing to send of: go on until something
        # is to be sent (or nothing is left), so ``[]`` still means done.
        while self._sending and not self.closed and (budget > 0 or not self._out):
            session = self._sending.popleft()
            budget -= max(self._pull(session), 1)
            self._wake_sender(session)
        out, self._out = self._out, []
        return out

    @property
    def replies_pending(self) -> bool:
        """Messages wait that :meth:`data_to_send` has not handed out (replies to a read)."""
        return bool(self._out)

    def next_event(self) -> SyncEvent | None:
        """The next event, or ``None``."""
        return self._events.popleft() if self._events else None

    def get_timer(self) -> int | None:
        """When :meth:`handle_timer` must run next (ms), or ``None``."""
        waiting = [s.last_heard for s in self._sessions.values() if not s.live]
        if self.closed or not waiting:
            return None
        return min(waiting) + self.config.stall_timeout_ms

    def sessions(self) -> dict[int, Progress]:
        """The open sessions and their counters."""
        return {s.id: Progress(s.id, s.phase, s.received, s.sent) for s in self._sessions.values()}

    # -- inputs ------------------------------------------------------------------------

    def announce(self, now: int) -> Announce:
        """Our Announce (send it over pub/sub or the stream); timestamps always grow."""
        self._announce_time = max(now // 1000, self._announce_time + 1)
        return Announce(self._announce_time, self.schema_ids)

    def receive_announce(self, announce: Announce) -> bool:
        """Take a peer's Announce (from the stream or pub/sub); False if it was not newer."""
        if not supersedes(announce, self.remote_announce):
            return False
        self.remote_announce = announce
        self._events.append(AnnounceReceived(announce))
        return True

    def request(
        self,
        schema_ids: Iterable[str],
        now: int,
        *,
        mode: Mode | None = None,
        live_mode: bool | None = None,
    ) -> int:
        """Open a session over ``schema_ids``; return its id.

        Raises :class:`LocalProtocolError` if the connection is closed, a
        session over the same schemas is open, or ``schema_ids`` is empty.
        """
        self._now = now
        ids = schema_id_set(tuple(schema_ids))
        if self.closed:
            raise LocalProtocolError("the connection is closed")
        if not ids:
            raise LocalProtocolError("request at least one schema")
        if any(s.schema_ids == ids for s in self._sessions.values()):
            raise LocalProtocolError(f"a session over {ids} is already open")
        mode = self.config.mode if mode is None else mode
        live = self.config.live_mode if live_mode is None else live_mode
        while self._next_id in self._sessions:
            self._next_id += 1
        session = _Session(self._next_id, True, mode, ids, live, now)
        self._next_id += 1
        self._sessions[session.id] = session
        self._send(SyncRequest(session.id, mode, ids))
        self._events.append(SessionStarted(session.id, ids, mode, True))
        if mode is Mode.SET_RECONCILIATION:
            session.reconciler = self._reconciler(session)
            self._set_phase(session, Phase.RECONCILING)
            for m in session.reconciler.initiate():
                self._send(RangeSync(session.id, m))
        return session.id

    def end_live(self, session_id: int, now: int) -> None:
        """Leave live mode (SyncDone live_mode=false) and close the session."""
        self._now = now
        session = self._sessions.get(session_id)
        if session is None:
            raise LocalProtocolError(f"no session {session_id}")
        # After the entries queued for it (they still go); the session ends now.
        self._send_after_entries(session, SyncDone(session_id, False))
        self._finish(session)

    def close(self) -> None:
        """Stop: abort open sessions, stop listening to the store."""
        if self.closed:
            return
        self.closed = True
        self._unlisten()
        self._sessions.clear()
        self._sending.clear()
        if self._checks is not None:
            self._checks.cancel()
        self.store.flush()
        self._events.append(ConnectionClosed(None))

    def receive(self, data: bytes, now: int) -> None:
        """Take one frame from the peer."""
        self._now = now
        if self.closed:
            return
        parts = entry_parts(data)
        if parts is not None:
            # An Entry message, read by decode's fast path without a message object.
            session_id, entry, operation = parts
            payload = len(entry) + len(operation)
            self.payload_received += payload
            self.overhead_received += len(data) - payload
            try:
                session = self._heard(session_id)
                if session is not None:
                    self._on_entry(session, entry, operation)
            except RemoteProtocolError as exc:
                self._on_remote_error(exc)
            return
        try:
            message = decode(data, self._received_round)
        except MalformedMessage as exc:
            self._store_batch()  # what came before the bad frame was fine
            self._fail(exc)
            return
        if not isinstance(message, EntryMessage):
            # Whatever comes next may depend on the entries before it being stored.
            self._store_batch()
        payload = _payload_size(message)
        self.payload_received += payload
        self.overhead_received += len(data) - payload
        try:
            self._dispatch(message)
        except RemoteProtocolError as exc:
            self._on_remote_error(exc)

    def _on_remote_error(self, exc: RemoteProtocolError) -> None:
        """A message broke the protocol: abort its session, or reject it if it has none."""
        session = self._sessions.get(exc.session_id) if exc.session_id is not None else None
        if session is None:
            self._reject(exc)
            return
        if self._batch_session is session:
            # The valid entries before the bad message are kept (and may fail first).
            self._store_batch()
        if self._sessions.get(session.id) is session:
            self._abort(session, exc)

    def receive_many(self, frames: Sequence[bytes], now: int) -> None:
        """Take the frames of one read, in order; their entries are stored in batches.

        Equivalent to :meth:`receive` for each frame, except that consecutive
        Entry messages of one session go to the store in one transaction.
        """
        self._batching = True
        receive = self.receive
        try:
            for data in frames:
                receive(data, now)
        finally:
            self._batching = False
        self._store_batch()

    def handle_timer(self, now: int) -> None:
        """Abort sessions that waited longer than ``stall_timeout_ms``."""
        self._now = now
        for session in list(self._sessions.values()):
            if not session.live and now - session.last_heard >= self.config.stall_timeout_ms:
                self._abort(
                    session,
                    LimitExceeded(f"peer silent for {now - session.last_heard} ms", session.id),
                )

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Announce):
            self.receive_announce(message)
            return
        if isinstance(message, SyncRequest):
            self._on_request(message)
            return
        if message.session_id in self._skip_round and isinstance(message, RangeSync):
            if isinstance(message.message, rbsr.Terminal):
                self._skip_round.discard(message.session_id)
            return
        session = self._heard(message.session_id)
        if session is None:
            return
        if isinstance(message, EntryMessage):
            self._on_entry(session, message.entry, message.operation)
        elif isinstance(message, SyncDone):
            self._on_done(session, message)
        elif isinstance(message, Have):
            self._on_have(session, message)
        else:
            self._on_range(session, message)

    def _heard(self, session_id: int) -> _Session | None:
        """The open session a message of ``session_id`` is for, now heard from.

        ``None`` for a session that ended (the peer sent before it learned);
        raises :class:`UnknownSession` for any other id.
        """
        session = self._sessions.get(session_id)
        if session is None:
            if session_id in self._ended:
                # Messages the peer sent before it learned we ended the session.
                return None
            raise UnknownSession(f"no open session {session_id}")
        session.last_heard = self._now
        session.state = _State.ESTABLISHED
        if session.phase is Phase.REQUESTED:
            self._set_phase(session, Phase.RECONCILING)
        return session

    def _on_request(self, request: SyncRequest) -> None:
        sid, ids = request.session_id, request.schema_ids
        if not set(ids) <= set(self.schema_ids):
            # Spec 2: every schema must be in our announcement, else ignore.
            self._events.append(RequestIgnored(sid, "schemas not announced"))
            return
        clash = self._sessions.get(sid) or next(
            (s for s in self._sessions.values() if s.schema_ids == ids), None
        )
        if clash is not None:
            if not clash.local or clash.state is not _State.PENDING or self.config.initiator:
                if (
                    clash.local
                    and request.mode is Mode.SET_RECONCILIATION
                    and len(self._skip_round) < 64
                ):
                    # The peer's opening round for the request we ignore follows
                    # under the same id; it is not an answer to ours.
                    self._skip_round.add(sid)
                self._events.append(RequestIgnored(sid, "duplicate session"))
                return
            # Concurrent requests: the dialling side keeps its own; we drop ours
            # and ask again under a new id if it was about other schemas.
            del self._sessions[clash.id]
            if clash.schema_ids != ids:
                self._next_id = max(self._next_id, sid + 1)
                self.request(clash.schema_ids, self._now, mode=clash.mode)
        if len(self._sessions) >= self.config.max_sessions:
            self._events.append(RequestIgnored(sid, "too many sessions"))
            return
        session = _Session(sid, False, request.mode, ids, self.config.live_mode, self._now)
        session.state = _State.ESTABLISHED
        self._sessions[sid] = session
        self._next_id = max(self._next_id, sid + 1)
        self._events.append(SessionStarted(sid, ids, request.mode, False))
        self._set_phase(session, Phase.RECONCILING)
        if request.mode is Mode.SET_RECONCILIATION:
            session.reconciler = self._reconciler(session)
        else:
            self._send_have(session)

    # -- set reconciliation ------------------------------------------------------------

    def _reconciler(self, session: _Session) -> rbsr.Reconciler:
        return rbsr.Reconciler(
            self.store.sync_range(session.schema_ids),
            branching=self.config.branching,
            threshold=self.config.threshold,
            limits=rbsr.ReconcilerLimits(
                max_round_messages=self.config.max_round_messages,
                max_key_size=48,
            ),
            shorten=short_bound,
            part_threshold=self.config.part_threshold,
            # A peer opening with EmptySet gets our entries, not a list of our logs first.
            keys_for_empty_set=False,
            # A log the peer holds nothing of is sent as soon as that is known, and
            # its key is not sent back: the entries follow.
            group_prefix=LOG_PREFIX_SIZE,
            send_lacking=False,
        )

    def _on_range(self, session: _Session, message: RangeSync) -> None:
        reconciler = session.reconciler
        if reconciler is None or reconciler.finished:
            raise UnexpectedEntry("set reconciliation message outside reconciliation", session.id)
        try:
            reply = reconciler.receive(message.message)
        except rbsr.RoundTooLong as exc:
            raise LimitExceeded(str(exc), session.id) from exc
        except rbsr.ReconcileError as exc:
            raise MalformedMessage(str(exc), session.id) from exc
        for m in reply:
            self._send(RangeSync(session.id, m))
        if reconciler.peer_empty and not session.sent_all:
            # Spec 2.1: EmptySet asks for all entries of the requested schemas, at once.
            session.sent_all = True
            self._send_all_above(session)
        if isinstance(message.message, rbsr.Terminal) or reply:
            self._apply_differences(session)
        if reconciler.finished:
            self._reconciled(session)

    def _apply_differences(self, session: _Session) -> None:
        assert session.reconciler is not None
        local_only, remote_only = session.reconciler.take_differences()
        wanted: list[_Wanted] = []
        remote = [key_item(key) for key in remote_only]
        # The heights of the logs this side did not list, in one query per 500 logs.
        stored = self.store.log_heights_of(
            (author, log_id)
            for author, log_id, _ in remote
            if (author, log_id) not in session.lacking
        )
        for author, log_id, seq in remote:
            log = (author, log_id)
            session.peer_heights[log] = max(session.peer_heights.get(log, 0), seq)
            mine = session.lacking.pop(log, None)
            if mine is None:
                mine = stored.get(log)
            if mine is None:
                mine = self.store.log_height(author, log_id)
            if mine > seq:
                wanted.append((author, log_id, seq, mine))
        for key in local_only:
            author, log_id, seq = key_item(key)
            log = (author, log_id)
            if log in session.peer_heights:
                continue
            session.lacking[log] = seq
        # Logs the peer holds no entry of, known before the end: sent now, not at the end.
        for key in session.reconciler.take_peer_lacks():
            author, log_id, seq = key_item(key)
            log = (author, log_id)
            if log in session.peer_heights:
                continue
            session.lacking.pop(log, None)
            wanted.append((author, log_id, 0, seq))
        self._send_entries(session, wanted)

    def _reconciled(self, session: _Session) -> None:
        self._set_phase(session, Phase.EXCHANGING)
        # Logs the peer never mentioned a key of: it has none of them (spec 2.2).
        missing = [(author, log_id, 0, seq) for (author, log_id), seq in session.lacking.items()]
        session.lacking.clear()
        self._send_entries(session, missing)
        self._local_done(session)

    # -- log heights -------------------------------------------------------------------

    def _send_have(self, session: _Session) -> None:
        # The range indexes hold one key per log, in (author, log id) order: the Have's.
        by_author: list[tuple[bytes, list[tuple[int, int]]]] = []
        count = 0
        for key in self._logs_of(session.schema_ids).keys_in(None, None):
            author, log_id, seq = key_item(key)
            if not by_author or by_author[-1][0] != author:
                by_author.append((author, []))
            by_author[-1][1].append((log_id, seq))
            count += 1
        heights = tuple((a, tuple(logs)) for a, logs in by_author)
        self._send(Have(session.id, heights))
        session.sent_have = True
        if count == 0:
            # aquadoggo: nothing to offer means done right away (log_height.rs).
            self._local_done(session)

    def _on_have(self, session: _Session, have: Have) -> None:
        if session.mode is not Mode.LOG_HEIGHT:
            raise UnexpectedEntry("Have in a set-reconciliation session", session.id)
        if session.received_have:
            raise UnexpectedEntry("Have received twice", session.id)
        count = sum(len(logs) for _, logs in have.log_heights)
        if count > self.config.max_have_logs:
            raise LimitExceeded(f"Have with {count} logs", session.id)
        session.received_have = True
        if not session.sent_have:
            self._send_have(session)
        remote = {(a, log_id): seq for a, logs in have.log_heights for log_id, seq in logs}
        session.peer_heights.update(remote)
        self._set_phase(session, Phase.EXCHANGING)
        self._send_all_above(session)
        self._local_done(session)

    def _send_all_above(self, session: _Session) -> None:
        """Queue the entries of our logs of the session's schemas above the peer's heights
        (``peer_heights``), planned lazily (:class:`_Walk`): the first chunk is read at
        once, the next logs only as the chunks before them go."""
        system = [s for s in session.schema_ids if s in SYSTEM_SCHEMAS]
        application = [s for s in session.schema_ids if s not in SYSTEM_SCHEMAS]
        phases: deque[tuple[bool, rbsr.RangeSource]] = deque()
        for is_system, ids in ((True, system), (False, application)):
            if ids:
                phases.append((is_system, self._logs_of(ids)))
        session.outbox.append(_Walk(phases, session.peer_heights))
        self._wake_sender(session)

    def _logs_of(self, schema_ids: Sequence[str]) -> rbsr.RangeSource:
        """The range index of the schemas' logs (one key per log, in key order)."""
        if len(schema_ids) == 1:
            return self.store.index(schema_ids[0])
        return self.store.sync_range(schema_ids)

    # -- entries -----------------------------------------------------------------------

    def _send_entries(self, session: _Session, wanted: Iterable[_Wanted]) -> None:
        """Queue entries ``after < seq_num <= upto`` of logs for the peer, in chunks.

        Nothing is read yet (:meth:`_pull` reads a chunk when the driver asks for
        data). A chunk holds whole documents: an operation's ``previous`` names
        operations of its own document, so :meth:`SyncStore.entries_for` orders
        each chunk as if it read everything at once; system-schema documents come
        first. A document with one log larger than a chunk is split along its log
        (each part after its backlinks); one with several logs stays whole.
        """
        todo: dict[LogKey, tuple[int, int]] = {}
        for author, log_id, after, upto in wanted:
            log = (author, log_id)
            after = max(after, session.sent_upto.get(log, 0))
            if upto > after:
                low, high = todo.get(log, (after, upto))
                todo[log] = (min(low, after), max(high, upto))
        if not todo:
            return
        for log, (_, upto) in todo.items():
            # Queued counts as sent: a live push or a later difference does not queue it again.
            session.sent_upto[log] = upto
        documents = self.store.log_documents(todo) if len(todo) > 1 else {}
        # Sorted logs, each document's together where its first log is (dicts keep order).
        groups: dict[object, list[_Wanted]] = {}
        for log in sorted(todo):
            after, upto = todo[log]
            document = documents.get(log)
            key = log if document is None else document[1]
            groups.setdefault(key, []).append((log[0], log[1], after, upto))
        system = {document for is_system, document in documents.values() if is_system}
        ordered = [group for key, group in groups.items() if key in system]
        ordered += [group for key, group in groups.items() if key not in system]
        chunk: list[_Wanted] = []
        size = 0
        limit = max(1, self.config.send_chunk)
        for group in ordered:
            for count, part in _parts(group, limit):
                if chunk and size + count > limit:
                    session.outbox.append(chunk)
                    chunk, size = [], 0
                chunk.extend(part)
                size += count
        if chunk:
            session.outbox.append(chunk)
        self._wake_sender(session)

    def _walk_chunk(self, session: _Session, walk: _Walk) -> tuple[list[_Wanted], int, bool]:
        """The next chunk of a lazy plan: its logs, how many logs were walked to make it,
        and whether its documents' other logs are still to be looked for.

        Each log goes in whole, a log longer than a chunk alone: in parts along it if its
        document has no other log to send, else whole with the others. The other logs
        of a document join it when the chunk is read (:meth:`_read_walk_chunk`). A
        chunk holds system-schema logs or application ones, not both. At most
        ``16 * send_chunk`` logs are walked per call: the chunk may come back empty
        with the walk not done.
        """
        limit = max(1, self.config.send_chunk)
        heights, sent_upto, pending = walk.heights, session.sent_upto, walk.pending
        chunk: list[_Wanted] = []
        size = walked = 0
        system = False
        while True:
            if pending:
                log_system, author, log_id, upto = pending[0]
                log = (author, log_id)
                after = max(heights.get(log, 0), sent_upto.get(log, 0))
                count = upto - after
                if count <= 0:
                    pending.popleft()
                    continue
                if chunk and (size + count > limit or log_system is not system):
                    break
                if count > limit:
                    return self._long_chunk(session, walk, log, after, upto), walked, False
                pending.popleft()
                # Queued counts as sent: a live push or a later difference does not queue it again.
                sent_upto[log] = upto
                chunk.append((author, log_id, after, upto))
                size += count
                system = log_system
                continue
            if size >= limit or not walk.phases or walked >= 16 * limit:
                break
            walked += self._walk_page(session, walk)
        return chunk, walked, True

    def _long_chunk(
        self, session: _Session, walk: _Walk, log: LogKey, after: int, upto: int
    ) -> list[_Wanted]:
        """The chunk of a log longer than a chunk (the head of ``walk.pending``): its next
        part, or the whole document when it has other logs to send."""
        limit = max(1, self.config.send_chunk)
        if walk.long_log != log:
            _, others = self.store.document_logs({log: upto})
            chunk = self._document_rest(session, walk, others, {log})
            if chunk:
                walk.pending.popleft()
                session.sent_upto[log] = upto
                return [(log[0], log[1], after, upto), *chunk]
            walk.long_log = log
        high = min(after + limit, upto)
        session.sent_upto[log] = high
        if high == upto:
            walk.pending.popleft()
            walk.long_log = None
        return [(log[0], log[1], after, high)]

    def _document_rest(
        self,
        session: _Session,
        walk: _Walk,
        documents: dict[str, dict[LogKey, int]],
        chunk: set[LogKey],
    ) -> list[_Wanted]:
        """Of the logs of ``documents`` (with our heights), those not in ``chunk`` that
        the peer lacks: they go with the chunk (counted as sent)."""
        heights, sent_upto = walk.heights, session.sent_upto
        rest: list[_Wanted] = []
        for logs in documents.values():
            for log, height in sorted(logs.items()):
                if log in chunk:
                    continue
                low = max(heights.get(log, 0), sent_upto.get(log, 0))
                if height > low:
                    rest.append((log[0], log[1], low, height))
                    sent_upto[log] = height
        return rest

    def _walk_page(self, session: _Session, walk: _Walk) -> int:
        """Walk the next page of logs of a lazy plan into ``walk.pending`` (those with
        entries the peer lacks); return how many logs were walked."""
        system, source = walk.phases[0]
        keys = list(islice(source.keys_in(walk.cursor, None), WALK_PAGE))
        if len(keys) < WALK_PAGE:
            walk.phases.popleft()
            walk.cursor = None
        else:
            walk.cursor = keys[-1][:LOG_PREFIX_SIZE] + _PAST_LOG
        heights, sent_upto, pending = walk.heights, session.sent_upto, walk.pending
        from_bytes = int.from_bytes
        for key in keys:
            # key_item, inlined: a walk reads every log's key.
            author = key[:PUBLIC_KEY_SIZE]
            log_id = from_bytes(key[PUBLIC_KEY_SIZE:LOG_PREFIX_SIZE], "big")
            upto = from_bytes(key[LOG_PREFIX_SIZE:], "big")
            log = (author, log_id)
            if upto > heights.get(log, 0) and upto > sent_upto.get(log, 0):
                pending.append((system, author, log_id, upto))
        return len(keys)

    def _read_walk_chunk(
        self, session: _Session, walk: _Walk, chunk: list[_Wanted]
    ) -> list[EntryToSend]:
        """Read a chunk of a lazy plan with the other logs of its documents the peer lacks."""
        logs = {(author, log_id) for author, log_id, _, _ in chunk}
        return self.store.entries_for(
            chunk,
            same_kind=True,
            documents=lambda documents: self._document_rest(session, walk, documents, logs),
        )

    def _send_after_entries(self, session: _Session, message: SyncDone) -> None:
        """Send ``message`` after the entries queued for ``session``."""
        if session.outbox:
            session.outbox.append(message)
        else:
            self._send_done(session, message)

    def _wake_sender(self, session: _Session) -> None:
        if session.outbox and session not in self._sending:
            self._sending.append(session)

    def _pull(self, session: _Session) -> int:
        """Send the next chunk of ``session``'s outbox (and the messages after it); return
        the work done, in entries: those sent, and a sixteenth of the logs a lazy plan
        walked."""
        sent = work = 0
        outbox = session.outbox
        while outbox and not sent:
            item = outbox[0]
            if isinstance(item, SyncDone):
                outbox.popleft()
                self._send_done(session, item)
                continue
            if isinstance(item, _Walk):
                # A walk's chunk is of system schemas or of application ones, not both.
                chunk, walked, grouped = self._walk_chunk(session, item)
                work += walked // 16
                if item.done:
                    outbox.popleft()
                if not chunk:
                    if not item.done:
                        break  # walked its share: the other sessions' turn
                    continue
                if grouped:
                    entries = self._read_walk_chunk(session, item, chunk)
                else:
                    entries = self.store.entries_for(chunk, same_kind=True)
            else:
                outbox.popleft()
                entries = self.store.entries_for(item)
            sent = self._send_chunk(session, entries)
        while outbox and (
            isinstance(outbox[0], SyncDone) or (isinstance(outbox[0], _Walk) and outbox[0].done)
        ):
            item = outbox.popleft()
            if isinstance(item, SyncDone):
                self._send_done(session, item)
        return sent + work

    def _send_chunk(self, session: _Session, entries: list[EntryToSend]) -> int:
        """Encode and queue a chunk's entries; return how many."""
        sid, out = session.id, self._out
        payload = overhead = 0
        every = self.config.progress_every
        for entry in entries:
            data = encode_entry(sid, entry.entry, entry.operation)
            size = len(entry.entry) + len(entry.operation)
            payload += size
            overhead += len(data) - size
            out.append(data)
            session.sent += 1
            if session.sent % every == 0:
                self._progress(session)
        self.payload_sent += payload
        self.overhead_sent += overhead
        return len(entries)

    def _send_done(self, session: _Session, message: SyncDone) -> None:
        self._send(message)
        if session.done_queued and not session.local_done and self._is_open(session):
            session.local_done = True
            self._maybe_done(session)

    def _is_open(self, session: _Session) -> bool:
        return self._sessions.get(session.id) is session

    def _on_entry(self, session: _Session, entry_bytes: bytes, operation_bytes: bytes) -> None:
        if session.remote_done and not session.live:
            raise UnexpectedEntry("entry after the peer's SyncDone", session.id)
        try:
            incoming = DocumentStore.decode(entry_bytes, operation_bytes)
        except DocumentError as exc:
            raise InvalidEntry(f"entry does not decode: {exc}", session.id, exc) from exc
        schema_id = incoming.operation.schema_id  # type: ignore[union-attr]  # decoded above
        if schema_id not in session.schema_ids:
            # Spec 2.2: "Is the data related to what was requested".
            raise UnexpectedEntry(f"entry of schema {schema_id}, not requested", session.id)
        # A log of a document outside the requested schemas cannot get in either: the
        # store refuses an UPDATE/DELETE whose schema is not its document's
        # (SchemaMismatch) or that is not in its document's log (LogMismatch).
        entry = incoming.entry
        log = (entry.author, entry.log_id)
        heights = session.peer_heights
        if heights.get(log, 0) < entry.seq_num:
            heights[log] = entry.seq_num
        if self._batch_session is not session:
            self._store_batch()
        self._batch_session = session
        self._batch.append(incoming)
        if self._batching:
            if self._checks is None:
                self._checks = SignatureChecks.growing(self.config.max_batch)
            self._checks.add(entry)
        if not self._batching:
            self._ingest_batch()
        elif len(self._batch) >= self.config.max_batch:
            self._store_batch()

    def _store_batch(self) -> None:
        """Store the entries waiting in the batch; abort their session if one is invalid."""
        session = self._batch_session
        if session is None:
            return
        try:
            self._ingest_batch()
        except RemoteProtocolError as exc:
            if self._sessions.get(session.id) is session:
                self._abort(session, exc)

    def _ingest_batch(self) -> None:
        """Store the batch in one transaction; raise the session's error for an invalid entry."""
        session, batch, checks = self._batch_session, self._batch, self._checks
        self._batch_session, self._batch, self._checks = None, [], None
        if session is None or not batch or self._sessions.get(session.id) is not session:
            if checks is not None:
                checks.cancel()
            return
        stored = self._ingest(session, batch, checks)
        if stored:
            self._release(session)

    def _ingest(
        self, session: _Session, batch: list[Incoming], checks: SignatureChecks | None = None
    ) -> int:
        """Store ``batch``; hold what waits for a dependency; return how many were stored."""
        self._ingesting_from = session.id
        try:
            result = self.store.ingest_many(batch, checks)
        finally:
            self._ingesting_from = None
        accepted = len(result.stored) + result.duplicates
        for _ in range(accepted):
            session.received += 1
            if session.received % self.config.progress_every == 0:
                self._progress(session)
        if result.error is not None:
            exc = result.error[1]
            raise InvalidEntry(f"{type(exc).__name__}: {exc}", session.id, exc) from exc
        for incoming, _missing in result.waiting:
            if len(session.pending) >= self.config.max_pending_entries:
                raise LimitExceeded(
                    f"more than {self.config.max_pending_entries} entries wait for a dependency",
                    session.id,
                )
            session.pending.append(incoming)
        return len(result.stored)

    def _release(self, session: _Session) -> None:
        """Retry held entries until none of them can be stored."""
        while session.pending:
            held, session.pending = session.pending, []
            if not self._ingest(session, held):
                return

    def _on_stored(self, stored: StoredEntry) -> None:
        """Live mode: push what was stored to sessions that want its schema.

        A session that asked for live mode but is not live yet keeps what is
        stored meanwhile (up to ``max_pending_entries`` logs) and sends it
        once both SyncDone said live, so nothing published during the
        catch-up falls between the two phases.
        """
        for session in self._sessions.values():
            if (
                session.id == self._ingesting_from
                or stored.schema_id not in session.schema_ids
                or not session.live_requested
            ):
                continue
            log = (stored.author, stored.log_id)
            if session.live:
                self._push_live(session, log, stored.seq_num)
            elif len(session.live_backlog) < self.config.max_pending_entries:
                session.live_backlog[log] = max(session.live_backlog.get(log, 0), stored.seq_num)

    def _push_live(self, session: _Session, log: LogKey, seq_num: int) -> None:
        if session.sent_upto.get(log, 0) >= seq_num:
            return
        if session.peer_heights.get(log, 0) >= seq_num:
            return
        after = max(session.peer_heights.get(log, 0), session.sent_upto.get(log, 0))
        self._send_entries(session, [(log[0], log[1], min(after, seq_num - 1), seq_num)])

    # -- ending ------------------------------------------------------------------------

    def _local_done(self, session: _Session) -> None:
        """Send our SyncDone once the entries queued before it have gone.

        In a session the peer opened, our SyncDone also waits for the peer's: it
        then says we stored everything the peer sent (its entries come before its
        SyncDone, and a read's entries are committed before the next message is
        handled), so the side that opened the session is done only once we hold
        what it pushed. The opener never waits for ours, nor does aquadoggo
        (``session.rs``, ``Session::flippy_flaggy``): no deadlock.
        """
        if session.done_queued:
            return
        session.finished_sending = True
        if not session.local and not session.remote_done:
            return  # _on_done queues it
        session.done_queued = True
        self._send_after_entries(session, SyncDone(session.id, session.live_requested))

    def _on_done(self, session: _Session, message: SyncDone) -> None:
        if session.live and not message.live_mode:
            self._finish(session)
            return
        if session.remote_done:
            raise UnexpectedEntry("SyncDone received twice", session.id)
        session.remote_done = True
        session.remote_live = message.live_mode
        if session.finished_sending and not session.done_queued:
            self._local_done(session)  # ends the session once our SyncDone is handed out
            return
        self._maybe_done(session)

    def _maybe_done(self, session: _Session) -> None:
        if not (session.local_done and session.remote_done):
            return
        if session.pending:
            # The peer sent everything; what still waits has dependencies outside
            # this session's schemas. Keep nothing unvalidated.
            self._events.append(Progress(session.id, session.phase, session.received, session.sent))
            session.pending.clear()
        self.store.flush()
        if session.live_requested and session.remote_live:
            self._set_phase(session, Phase.LIVE)
            backlog, session.live_backlog = session.live_backlog, {}
            for log, seq_num in backlog.items():
                self._push_live(session, log, seq_num)
            return
        self._finish(session)

    def _finish(self, session: _Session) -> None:
        self._sessions.pop(session.id, None)
        self._ended.append(session.id)
        session.phase = Phase.DONE
        self.store.flush()
        self._progress(session)
        self._events.append(SessionDone(session.id, session.received, session.sent))

    def _abort(self, session: _Session, error: SyncError) -> None:
        self._sessions.pop(session.id, None)
        session.outbox.clear()
        self._ended.append(session.id)
        session.phase = Phase.ABORTED
        self.store.flush()
        self._events.append(SessionAborted(session.id, error))
        self._count_rejection()

    def _reject(self, error: SyncError) -> None:
        self._events.append(PeerMessageRejected(error))
        self._count_rejection()

    def _count_rejection(self) -> None:
        self.rejected += 1
        if self.rejected > self.config.max_rejected and not self.closed:
            self._fail(LimitExceeded(f"more than {self.config.max_rejected} rejected messages"))

    def fail(self, error: SyncError) -> None:
        """Close the connection because of ``error`` (e.g. a frame the driver could not read)."""
        self._fail(error)

    def _fail(self, error: SyncError) -> None:
        self._sending.clear()
        for session in list(self._sessions.values()):
            self._sessions.pop(session.id, None)
            self._events.append(SessionAborted(session.id, error))
        self.closed = True
        self._unlisten()
        self.store.flush()
        self._events.append(ConnectionClosed(error))

    # -- helpers -----------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        data = encode(message, self._sent_round)
        payload = _payload_size(message)
        self.payload_sent += payload
        self.overhead_sent += len(data) - payload
        self._out.append(data)

    def _set_phase(self, session: _Session, phase: Phase) -> None:
        if session.phase is not phase:
            session.phase = phase
            self._progress(session)

    def _progress(self, session: _Session) -> None:
        self._events.append(Progress(session.id, session.phase, session.received, session.sent))


def _parts(group: list[_Wanted], limit: int) -> list[tuple[int, list[_Wanted]]]:
    """A document's logs to send as parts of a chunk, with their entry counts: the whole
    group, or a single log longer than ``limit`` split along the log."""
    if len(group) == 1 and group[0][3] - group[0][2] > limit:
        author, log_id, after, upto = group[0]
        return [
            (min(low + limit, upto) - low, [(author, log_id, low, min(low + limit, upto))])
            for low in range(after, upto, limit)
        ]
    return [(sum([upto - after for _, _, after, upto in group]), group)]


def _payload_size(message: Message) -> int:
    if isinstance(message, EntryMessage):
        return len(message.entry) + len(message.operation)
    return 0


__all__ = ["Replication", "SyncConfig"]
