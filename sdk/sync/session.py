"""p2panda replication with one peer: the session manager.

Theory of operation
-------------------
A :class:`Replication` is one connection to one peer over a reliable ordered
stream (``specs/p2panda-replication.txt``), a :class:`~sdk.sync.machine.Machine`
that touches no socket and no clock: the peer's bytes go in with
:meth:`Replication.receive_data` (cut into frames, one message each; the frames
of one read are handled together, :meth:`Replication.receive_many`), bytes to
write come out of :meth:`Replication.data_to_send` (the messages of
:meth:`Replication.messages_to_send`, framed), events out of
:meth:`Replication.next_event`, and :meth:`Replication.handle_timer` is wanted at
:meth:`Replication.get_timer` (the stall timer). It is not pure: those calls use
its store (check and commit what came, read what goes), so the driver runs them
where the store may be used (:mod:`sdk.sync.driver`: the store's worker). The
strategies of a session are :mod:`sdk.sync.strategies`; what a session has to
send, a chunk at a time, is its :class:`~sdk.sync.send_plan.SendQueue`, sessions
taking turns. Backpressure: no data is wanted while replies to a read wait to be
taken. Our SyncDone goes after the session's last entry and, in a session the
peer opened, after the peer's SyncDone: the opener's done then means we stored
what it sent (see ``_local_done``).

**Announce** state is one per peer and replaced only by a newer timestamp.
**Sessions** are numbered per connection from 0 (aquadoggo ``manager.rs``
``INITIAL_SESSION_ID``, next id = last + 1); several run at once. A
SyncRequest is ignored when a schema is not in what we announce, when a
session over the same schemas is open, or when its id is taken. When both
sides request the same id (or the same schemas) at once, aquadoggo keeps the
request of the peer with the larger peer id (``manager.rs`` lines 219-296); a
bare stream has no peer ids, so here the side that dialled keeps its own and
the other drops its pending one and requests again with a new id.

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

from sdk.documents.bamboo import SignatureChecks
from sdk.documents.errors import DocumentError
from sdk.documents.store import DocumentStore, Incoming
from sdk.sds.varint import encode_uvarint
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
from sdk.sync.framing import MAX_FRAME, FrameDecoder, WireStats
from sdk.sync.messages import (
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
    schema_id_set,
)
from sdk.sync.send_plan import LazyPlan, LogKey, SendQueue, Wanted
from sdk.sync.session_state import Session, SyncConfig
from sdk.sync.store import EntryToSend, StoredEntry, SyncStore
from sdk.sync.strategies import Strategies

#: Bytes of frames joined into one write (:meth:`Replication.data_to_send`).
WRITE_CHUNK = 64 * 1024


class Replication(Strategies):
    """Replication with one peer over one stream, a sync machine (see the module docstring).

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
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.store = store
        self.config = config or SyncConfig()
        self.schema_ids = schema_id_set(tuple(schema_ids))
        self._sessions: dict[int, Session] = {}
        self._next_id = 0
        self._out: list[bytes] = []
        #: Sessions with something in their outbox, served in turn.
        self._sending: deque[Session] = deque()
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
        self._batch_session: Session | None = None
        #: The batch's signature checks, started as its entries are decoded.
        self._checks: SignatureChecks | None = None
        self._batching = False
        self._ended: deque[int] = deque(maxlen=64)
        self._skip_round: set[int] = set()
        # Same-author items of a round are written short (messages.RoundContext).
        self._sent_round = RoundContext(max(4 * self.config.max_sessions, 64))
        self._received_round = RoundContext(max(4 * self.config.max_sessions, 64))
        self._unlisten = store.add_listener(self._on_stored)
        #: The stream: bytes and frames moved, frames being cut, messages taken from
        #: :meth:`messages_to_send` that did not fit in the last write.
        self.stats = WireStats()
        self._decoder = FrameDecoder(max_frame)
        self._queued: deque[bytes] = deque()
        self._closing = False
        #: Replication reports errors as events: the connection never fails with one.
        self.error: Exception | None = None

    # -- outputs -----------------------------------------------------------------------

    def messages_to_send(self) -> list[bytes]:
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

    def next_event(self) -> SyncEvent | None:
        """The next event, or ``None``."""
        return self._events.popleft() if self._events else None

    def get_timer(self) -> int | None:
        """When :meth:`handle_timer` must run next (ms), or ``None``."""
        # list(): atomic, the driver asks on the loop's thread while a step may run.
        waiting = [s.last_heard for s in list(self._sessions.values()) if not s.live]
        if self.closed or not waiting:
            return None
        return min(waiting) + self.config.stall_timeout_ms

    def sessions(self) -> dict[int, Progress]:
        """The open sessions and their counters."""
        return {s.id: Progress(s.id, s.phase, s.received, s.sent) for s in self._sessions.values()}

    # -- the machine (sdk.sync.machine): the bytes of a stream ----------------------------

    @property
    def wants_data(self) -> bool:
        """Read while the replies to what was read have been taken for a write
        (backpressure; entries a session streams go out in between reads)."""
        return not self._out

    @property
    def finished(self) -> bool:
        """Closed: the peer closed, the connection failed, or :meth:`close_when_sent`."""
        return self.closed

    def close_when_sent(self) -> None:
        """Close once everything queued (sessions' entries included) went out."""
        self._closing = True

    def receive_data(self, data: bytes, now: int) -> None:
        """Take the peer's bytes (``b""``: it closed); one read's entries are stored in
        one transaction. A frame too large or that does not decode closes the connection."""
        self.stats.bytes_received += len(data)
        if not data:
            self.close()
            return
        try:
            frames = self._decoder.feed(data)
        except (MalformedMessage, LimitExceeded) as exc:
            self.fail(exc)
            return
        self.stats.frames_received += len(frames)
        self.receive_many(frames, now)

    def data_to_send(self) -> bytes:
        """Frames of :meth:`messages_to_send`, joined into writes of up to
        :data:`WRITE_CHUNK` bytes (a catch-up's thousands of small Entry frames would
        cost a write each)."""
        queued, pieces, size = self._queued, list[bytes](), 0
        while True:
            if not queued:
                queued.extend(self.messages_to_send())
                if not queued:
                    break
            message = queued[0]
            head = encode_uvarint(len(message))
            if pieces and size + len(head) + len(message) > WRITE_CHUNK:
                break
            queued.popleft()
            pieces += (head, message)
            size += len(head) + len(message)
        if not pieces and self._closing:
            self.close()
        self.stats.bytes_sent += size
        self.stats.frames_sent += len(pieces) // 2
        return b"".join(pieces)

    def next_request(self) -> None:
        """None: the replication uses its store itself, in its steps (not pure)."""
        return None

    def request_done(self, request: object, result: object, now: int) -> None:
        """Never called: replication makes no requests."""
        raise AssertionError("Replication makes no requests")

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
        session = Session(self._next_id, True, mode, ids, live, now, self._queue())
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
        """Stop: drop open sessions, stop listening to the store."""
        self.fail(None)

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
            self.fail(exc)
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
        if self._is_open(session):
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

    def _heard(self, session_id: int) -> Session | None:
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
        session.established = True
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
            if not clash.local or clash.established or self.config.initiator:
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
        session = Session(
            sid, False, request.mode, ids, self.config.live_mode, self._now, self._queue()
        )
        session.established = True
        self._sessions[sid] = session
        self._next_id = max(self._next_id, sid + 1)
        self._events.append(SessionStarted(sid, ids, request.mode, False))
        self._set_phase(session, Phase.RECONCILING)
        if request.mode is Mode.SET_RECONCILIATION:
            session.reconciler = self._reconciler(session)
        else:
            self._send_have(session)

    def _send_all_above(self, session: Session) -> None:
        session.queue.above(session.schema_ids, session.peer_heights)
        self._wake_sender(session)

    def _send_entries(self, session: Session, wanted: Iterable[Wanted]) -> None:
        session.queue.entries(wanted)
        self._wake_sender(session)

    def _send_after_entries(self, session: Session, message: SyncDone) -> None:
        """Send ``message`` after the entries queued for ``session``."""
        if session.queue:
            session.queue.then(message)
        else:
            self._send_done(session, message)

    def _wake_sender(self, session: Session) -> None:
        if session.queue and session not in self._sending:
            self._sending.append(session)

    def _pull(self, session: Session) -> int:
        """Send the next chunk of ``session``'s queue (and the messages after it); return
        the work done, in entries: those sent, and a sixteenth of the logs a lazy plan
        walked."""
        sent = work = 0
        queue = session.queue
        while queue and (not sent or not isinstance(queue.outbox[0], list | LazyPlan)):
            item, walked = queue.next()
            work += walked // 16
            if item is None:
                break  # a lazy plan walked its share: the other sessions' turn
            if isinstance(item, list):
                sent = self._send_chunk(session, item)
            else:
                self._send_done(session, item)
        return sent + work

    def _send_chunk(self, session: Session, entries: list[EntryToSend]) -> int:
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

    def _send_done(self, session: Session, message: Message) -> None:
        self._send(message)
        if session.done_queued and not session.local_done and self._is_open(session):
            session.local_done = True
            self._maybe_done(session)

    def _is_open(self, session: Session) -> bool:
        return self._sessions.get(session.id) is session

    def _on_entry(self, session: Session, entry_bytes: bytes, operation_bytes: bytes) -> None:
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
        if not self._batching or len(self._batch) >= self.config.max_batch:
            self._store_batch()

    def _store_batch(self) -> None:
        """Store the batch in one transaction; abort its session if an entry is invalid."""
        session, batch, checks = self._batch_session, self._batch, self._checks
        self._batch_session, self._batch, self._checks = None, [], None
        if session is None or not batch or not self._is_open(session):
            if checks is not None:
                checks.cancel()
            return
        try:
            if self._ingest(session, batch, checks):
                self._release(session)
        except RemoteProtocolError as exc:
            if self._is_open(session):
                self._abort(session, exc)

    def _ingest(
        self, session: Session, batch: list[Incoming], checks: SignatureChecks | None = None
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

    def _release(self, session: Session) -> None:
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

    def _push_live(self, session: Session, log: LogKey, seq_num: int) -> None:
        if session.queue.sent_upto.get(log, 0) >= seq_num:
            return
        if session.peer_heights.get(log, 0) >= seq_num:
            return
        after = max(session.peer_heights.get(log, 0), session.queue.sent_upto.get(log, 0))
        self._send_entries(session, [(log[0], log[1], min(after, seq_num - 1), seq_num)])

    # -- ending ------------------------------------------------------------------------

    def _local_done(self, session: Session) -> None:
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

    def _on_done(self, session: Session, message: SyncDone) -> None:
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

    def _maybe_done(self, session: Session) -> None:
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

    def _finish(self, session: Session) -> None:
        self._end(session, Phase.DONE)
        self._progress(session)
        self._events.append(SessionDone(session.id, session.received, session.sent))

    def _abort(self, session: Session, error: SyncError) -> None:
        self._end(session, Phase.ABORTED)
        session.queue.outbox.clear()
        self._events.append(SessionAborted(session.id, error))
        self._count_rejection()

    def _end(self, session: Session, phase: Phase) -> None:
        self._sessions.pop(session.id, None)
        self._ended.append(session.id)
        session.phase = phase
        self.store.flush()

    def _reject(self, error: SyncError) -> None:
        self._events.append(PeerMessageRejected(error))
        self._count_rejection()

    def _count_rejection(self) -> None:
        self.rejected += 1
        if self.rejected > self.config.max_rejected and not self.closed:
            self.fail(LimitExceeded(f"more than {self.config.max_rejected} rejected messages"))

    def fail(self, error: SyncError | None) -> None:
        """Close the connection because of ``error`` (its open sessions abort with it)."""
        if self.closed:
            return
        self.closed = True
        self._unlisten()
        self._sending.clear()
        if error is not None:
            self._events.extend(SessionAborted(sid, error) for sid in self._sessions)
        self._sessions.clear()
        if self._checks is not None:
            self._checks.cancel()
        self.store.flush()
        self._events.append(ConnectionClosed(error))

    # -- helpers -----------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        data = encode(message, self._sent_round)
        payload = _payload_size(message)
        self.payload_sent += payload
        self.overhead_sent += len(data) - payload
        self._out.append(data)

    def _queue(self) -> SendQueue:
        return SendQueue(self.store, self.config.send_chunk)

    def _set_phase(self, session: Session, phase: Phase) -> None:
        if session.phase is not phase:
            session.phase = phase
            self._progress(session)

    def _progress(self, session: Session) -> None:
        self._events.append(Progress(session.id, session.phase, session.received, session.sent))


def _payload_size(message: Message) -> int:
    if isinstance(message, EntryMessage):
        return len(message.entry) + len(message.operation)
    return 0


__all__ = ["WRITE_CHUNK", "Replication", "Session", "SyncConfig", "WireStats"]
