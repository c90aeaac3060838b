"""p2panda replication with one peer: the session manager.

Theory of operation
-------------------
A :class:`Replication` is one connection to one peer over a reliable ordered
stream (``specs/p2panda-replication.txt``), a pure :class:`~sdk.sync.machine.Machine`
(bytes in and out, one message a frame, events, a timer: a waiting session's stall,
a live connection's keepalive): no socket, no clock, no store. What needs the store
(check and commit what came, answer a reconciliation round over the range index,
read what goes) leaves as a request (:mod:`sdk.sync.session_state`), one at a time,
carried out by :func:`sdk.sync.store_work.perform` (the driver, :mod:`sdk.sync.driver`:
on the store's worker); frames that come meanwhile wait, and are handled in order
once its answer is in. Entries the store stores meanwhile from elsewhere come in
with :meth:`Replication.stored` (live mode). What a session has to send, a chunk
per request, is its :class:`~sdk.sync.send_plan.SendQueue`, sessions taking turns.
Backpressure: no data is wanted while replies to a read wait to be taken, nor while
a read's worth of frames waits to be handled; the next chunk is read once the last
was taken. When our SyncDone goes, and why: ``_local_done``.

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
the session's schemas (published here or received from anyone else, told with
:meth:`Replication.stored`) are pushed as Entry messages until either side sends
SyncDone(false).

**Validation**: every received entry goes through the document store's
``ingest_many`` (signature, links, log rules, schema) and must belong to the
session's schemas and phase. Consecutive Entry messages of one session (up to
``max_batch``, as many as have come) are stored as one batch (one transaction, an
:class:`~sdk.sync.session_state.StoreBatch` request), before any other message is
handled; an entry counts as received once its batch has committed. An invalid
entry in a batch aborts the session; the valid entries before it stay stored.
Anything else aborts that session with a typed
:class:`~sdk.sync.errors.RemoteProtocolError` (other sessions go on); nothing
invalid is stored. An entry waiting for a dependency sent later is held, up
to ``max_pending_entries``. A message that does not decode closes the
connection; one for an unknown session is rejected. A session that hears
nothing for ``stall_timeout_ms`` while it waits is aborted.

Strategies
----------
**Set reconciliation** (mode 1) runs :class:`~sdk.sync.rbsr.Reconciler` over
the sync range, keys ``(public_key, log_id, seq_num)``. Each learned key tells
a log height: a key the peer holds and we lack is its height of that log; one
we hold that it lacks, with no key of that log from the peer, means it lacks
the log. As soon as we know the peer's height of a log is below ours we send
the missing entries (while reconciliation still runs). A log the peer lacks
altogether is sent as soon as the reconciler learns it (a log's keys are a group,
:attr:`~sdk.sync.rbsr.Reconciler.peer_lacks`); the other logs it never
mentioned are sent when reconciliation has finished. Then SyncDone. A peer
that opens with EmptySet holds nothing: we answer with a bare Terminal and send
all our entries of the session's schemas straight away (spec 2.1), as Log-Height
would, without a list of our logs first.

**Log-Height** (mode 0) is aquadoggo's: the responder sends Have, the
initiator answers with its Have and the entries the responder lacks, the
responder sends what the initiator lacks (``strategies/log_height.rs``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from sdk.sds.varint import encode_uvarint
from sdk.sync import rbsr
from sdk.sync.announce import supersedes
from sdk.sync.errors import (
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
    KEY_SIZE,
    LOG_PREFIX_SIZE,
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
    entry_parts,
    key_item,
    schema_id_set,
    short_bound,
)
from sdk.sync.send_plan import LazyPlan, SendQueue, Todo, Wanted
from sdk.sync.session_state import (
    BatchStored,
    Flush,
    Read,
    ReadHave,
    Reconcile,
    Reconciled,
    Request,
    Session,
    StoreBatch,
    SyncConfig,
)

#: Bytes of frames joined into one write (:meth:`Replication.data_to_send`).
WRITE_CHUNK = 64 * 1024
#: Bytes of frames read and not handled yet (a request is out) above which no more
#: data is wanted.
INBOX_BYTES = 1024 * 1024


#: An entry the store stored: ``(schema_id, author, log_id, seq_num)``.
Stored = tuple[str, bytes, int, int]


class Replication:
    """Replication with one peer over one stream, a sync machine (see the module docstring).

    ``schema_ids`` is what we announce and serve: the peer may request any
    subset. ``now`` is the current time in milliseconds (any monotonic clock).
    """

    def __init__(
        self,
        schema_ids: Iterable[str],
        *,
        now: int,
        config: SyncConfig | None = None,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.config = config or SyncConfig()
        self.schema_ids = schema_id_set(schema_ids)
        self._sessions: dict[int, Session] = {}
        self._next_id = 0
        self._out: list[bytes] = []
        #: Sessions with something in their outbox, served in turn.
        self._sending: deque[Session] = deque()
        self._events: deque[SyncEvent] = deque()
        self._now = now
        self.remote_announce: Announce | None = None
        self._announce_time = 0
        #: When a byte last went either way (the keepalive's clock).
        self._last_traffic = now
        self.closed = False
        self.rejected = 0
        #: Bytes we sent and received, without entry and operation bytes.
        self.overhead_sent = self.overhead_received = 0
        #: Entry and operation bytes sent and received.
        self.payload_sent = self.payload_received = 0
        #: Entries received, not stored yet (one session's, in order), and their bytes.
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0
        self._batch_session: Session | None = None
        #: Frames read and not handled yet (a request is out), and their bytes.
        self._inbox: deque[bytes] = deque()
        self._inbox_bytes = 0
        self._peer_closed = False
        #: Requests to hand out, in order, and the one being carried out.
        self._requests: deque[Request] = deque()
        self._in_flight: Request | None = None
        #: Logs the store grew meanwhile (:meth:`stored`), not looked at yet.
        self._grown: list[Stored] = []
        self._ended: deque[int] = deque(maxlen=64)
        self._skip_round: set[int] = set()
        # Same-author items of a round are written short (messages.RoundContext).
        self._sent_round = RoundContext(max(4 * self.config.max_sessions, 64))
        self._received_round = RoundContext(max(4 * self.config.max_sessions, 64))
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
        """Encoded messages ready to send, one per frame, in order; ``[]``: none now."""
        self._pump()
        out, self._out = self._out, []
        return out

    def next_event(self) -> SyncEvent | None:
        """The next event, or ``None``."""
        return self._events.popleft() if self._events else None

    def get_timer(self) -> int | None:
        """When :meth:`handle_timer` must run next (ms), or ``None``: a waiting session's
        stall deadline, or a live one's keepalive."""
        stall, keepalive = self.config.stall_timeout_ms, self.config.keepalive_ms
        due = [s.last_heard + stall for s in self._sessions.values() if not s.live]
        if keepalive is not None and any(s.live for s in self._sessions.values()):
            due.append(self._last_traffic + keepalive)
        return min(due, default=None)  # none once closed: fail() drops every session

    def sessions(self) -> dict[int, Progress]:
        """The open sessions and their counters."""
        return {s.id: Progress(s.id, s.phase, s.received, s.sent) for s in self._sessions.values()}

    # -- the machine (sdk.sync.machine): the bytes of a stream ----------------------------

    @property
    def wants_data(self) -> bool:
        """Backpressure, as the module docstring says (entries a session streams go out
        in between reads)."""
        return not self._out and not self._peer_closed and self._inbox_bytes < INBOX_BYTES

    @property
    def finished(self) -> bool:
        """Closed: the peer closed, the connection failed, or :meth:`close_when_sent`."""
        return self.closed

    def close_when_sent(self) -> None:
        """Close once everything queued (sessions' entries included) went out."""
        self._closing = True

    def receive_data(self, data: bytes, now: int) -> None:
        """Take the peer's bytes (``b""``: it closed, once what came before is handled).
        A frame too large or that does not decode closes the connection."""
        self.stats.bytes_received += len(data)
        self._now = self._last_traffic = now
        if not data:
            self._peer_closed = True
            self._process()
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
        queued.extend(self.messages_to_send())
        while queued:
            message = queued[0]
            head = encode_uvarint(len(message))
            if pieces and size + len(head) + len(message) > WRITE_CHUNK:
                break
            queued.popleft()
            pieces += (head, message)
            size += len(head) + len(message)
        if not pieces and self._closing and not self._sending and not self._busy:
            self.close()
        self.stats.bytes_sent += size
        self.stats.frames_sent += len(pieces) // 2
        if size:
            self._last_traffic = self._now
        return b"".join(pieces)

    def next_request(self) -> Request | None:
        """The next request for the store (one at a time): what the frames handled so far
        asked for, else the next chunk a session has to send."""
        if self._in_flight is not None or self.closed:
            return None
        self._in_flight = self._requests.popleft() if self._requests else self._next_read()
        return self._in_flight

    def request_done(self, request: Any, result: Any, now: int) -> None:
        """``request`` was carried out with ``result``: go on with what waited for it."""
        self._in_flight = None
        self._now = now
        if self.closed:
            return
        if isinstance(request, Read):
            self._on_read(request, result)
        elif (session := self._sessions.get(getattr(request, "session_id", -1))) is not None:
            if isinstance(request, StoreBatch):
                self._on_ingested(session, result)
            elif isinstance(request, Reconcile) and session.reconciler is request.reconciler:
                self._on_reconciled(session, request, result)
            elif isinstance(request, ReadHave):  # our Have, read: send it
                self._send(Have(session.id, result))
                if not result:  # aquadoggo: nothing to offer means done at once (log_height.rs)
                    self._local_done(session)
        self._process()

    def reading_batch(self) -> list[tuple[bytes, bytes]] | None:
        """The entries read so far into the next batch while one is being stored (the
        list the next :class:`StoreBatch` will carry; not to be changed), else ``None``:
        the driver may start checking their signatures meanwhile."""
        return self._batch if self._batch and isinstance(self._in_flight, StoreBatch) else None

    def stored(self, entries: Iterable[Stored]) -> None:
        """Entries the store stored meanwhile, not through this replication: live mode
        pushes them to the sessions that want their schemas."""
        self._grown.extend(entries)
        self._process()

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
        ids = schema_id_set(schema_ids)
        if self.closed:
            raise LocalProtocolError("the connection is closed")
        if not ids:
            raise LocalProtocolError("request at least one schema")
        if any(s.schema_ids == ids for s in self._sessions.values()):
            raise LocalProtocolError(f"a session over {ids} is already open")
        mode = self.config.mode if mode is None else mode
        live = self.config.live_mode if live_mode is None else live_mode
        # Free: every open session's id is below _next_id (_open raises it past each).
        session = self._open(self._next_id, True, mode, ids, live)
        self._send(SyncRequest(session.id, mode, ids))
        if session.reconciler is not None:
            self._set_phase(session, Phase.RECONCILING)
            self._requests.append(Reconcile(session.id, ids, session.reconciler, None))
        return session.id

    def _open(self, sid: int, local: bool, mode: Mode, ids: tuple[str, ...], live: bool) -> Session:
        """A new open session (with its reconciler in set reconciliation)."""
        session = Session(sid, local, mode, ids, live, self._now, SendQueue(self.config.send_chunk))
        session.established = not local
        self._sessions[sid] = session
        self._next_id = max(self._next_id, sid + 1)
        self._events.append(SessionStarted(sid, ids, mode, local))
        if mode is Mode.SET_RECONCILIATION:
            # The set it reads is given on the store side.
            session.reconciler = rbsr.Reconciler(
                None,
                branching=self.config.branching,
                threshold=self.config.threshold,
                limits=rbsr.ReconcilerLimits(
                    max_round_messages=self.config.max_round_messages,
                    max_key_size=KEY_SIZE,
                ),
                shorten=short_bound,
                part_threshold=self.config.part_threshold,
                # As *Strategies* says (EmptySet, a log the peer lacks); the entries
                # follow rather than the keys.
                keys_for_empty_set=False,
                group_prefix=LOG_PREFIX_SIZE,
                send_lacking=False,
            )
        return session

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
        """Stop: drop open sessions (nothing more is asked of the store)."""
        self.fail(None)

    def receive_many(self, frames: Sequence[bytes], now: int) -> None:
        """Take the frames of one read, in order (batched and handled as the module
        docstring says)."""
        self._now = now
        if self.closed:
            return
        self._inbox.extend(frames)
        self._inbox_bytes += sum(map(len, frames))
        self._process()

    @property
    def _busy(self) -> bool:
        """A request is out or waits to be handed out: frames wait."""
        return self._in_flight is not None or bool(self._requests)

    def _process(self) -> None:
        """Handle the frames that came, in order, until one needs a request's answer."""
        inbox = self._inbox
        while inbox and not self.closed:
            data = inbox[0]
            parts = entry_parts(data)
            if self._busy and not self._joins_next_batch(parts):
                break
            if parts is None and self._batch:
                # Whatever comes next may depend on the entries before it being stored.
                self._store_batch()
                continue
            inbox.popleft()
            self._inbox_bytes -= len(data)
            self._frame(data, parts)
        if self._busy or self.closed:
            return
        if self._batch:
            self._store_batch()
            return
        grown, self._grown = self._grown, []
        for entry in grown:
            self._on_stored(entry)
        if self._peer_closed:  # the live pushes above ask nothing of the store
            self.close()

    def _joins_next_batch(self, parts: tuple[int, bytes, bytes] | None) -> bool:
        """Whether an Entry frame joins the next batch while its session's batch is stored,
        overlapping the store's work: up to one short of ``max_batch``, under
        :data:`INBOX_BYTES` (past that it waits in the inbox, which stops reading at the
        same bound). Only an entry :meth:`_on_entry` takes without asking for anything:
        nothing else is handled before the answer."""
        request = self._in_flight
        if parts is None or self._requests or not isinstance(request, StoreBatch):
            return False
        session = self._sessions.get(parts[0])
        return (
            session is not None
            and session.id == request.session_id
            and (session.live or not session.remote_done)
            and (not self._batch or self._batch_session is session)
            and len(self._batch) + 1 < self.config.max_batch
            and self._batch_bytes < INBOX_BYTES
        )

    def _frame(self, data: bytes, parts: tuple[int, bytes, bytes] | None) -> None:
        """Handle one frame (``parts``: its :func:`entry_parts`), errors as *Validation* says."""
        if parts is None:
            try:
                message = decode(data, self._received_round)
            except MalformedMessage as exc:
                self.fail(exc)
                return
            if isinstance(message, EntryMessage):  # one entry_parts left to the decoder
                parts = (message.session_id, message.entry, message.operation)
        payload = 0 if parts is None else len(parts[1]) + len(parts[2])
        self.payload_received += payload
        self.overhead_received += len(data) - payload
        try:
            if parts is None:
                self._dispatch(message)
            elif (session := self._heard(parts[0])) is not None:
                self._on_entry(session, parts[1], parts[2])
        except RemoteProtocolError as exc:
            session = self._sessions.get(exc.session_id) if exc.session_id is not None else None
            if session is None:
                self._events.append(PeerMessageRejected(exc))
                self._count_rejection()
            else:
                self._abort(session, exc)

    def handle_timer(self, now: int) -> None:
        """Abort sessions that waited longer than ``stall_timeout_ms``; send our Announce
        on a live connection quiet for ``keepalive_ms``."""
        self._now = now
        for session in list(self._sessions.values()):
            silent = now - session.last_heard
            if not session.live and silent >= self.config.stall_timeout_ms:
                self._abort(session, LimitExceeded(f"peer silent for {silent} ms", session.id))
        keepalive = self.config.keepalive_ms
        live = any(s.live for s in self._sessions.values())
        if live and keepalive is not None and now - self._last_traffic >= keepalive:
            self._send(self.announce(now))  # why an Announce: SyncConfig.keepalive_ms
            self._last_traffic = now

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Announce):
            self.receive_announce(message)
        elif isinstance(message, SyncRequest):
            self._on_request(message)
        elif isinstance(message, RangeSync) and message.session_id in self._skip_round:
            if isinstance(message.message, rbsr.Terminal):
                self._skip_round.discard(message.session_id)
        elif (session := self._heard(message.session_id)) is None:
            pass  # a session that ended (see _heard)
        elif isinstance(message, SyncDone):
            self._on_done(session, message)
        elif isinstance(message, Have):
            self._on_have(session, message)
        elif isinstance(message, RangeSync):  # an Entry never comes here (see _frame)
            self._on_range(session, message)

    def _heard(self, session_id: int) -> Session | None:
        """The open session a message of ``session_id`` is for, now heard from.

        ``None`` for a session that ended (the peer sent before it learned we ended it);
        raises :class:`UnknownSession` for any other id.
        """
        session = self._sessions.get(session_id)
        if session is None:
            if session_id in self._ended:
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
            if clash.established or self.config.initiator:
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
            # Concurrent requests (module docstring): ours goes; asked again if other schemas.
            del self._sessions[clash.id]
            if clash.schema_ids != ids:
                self._next_id = max(self._next_id, sid + 1)
                self.request(clash.schema_ids, self._now, mode=clash.mode)
        if len(self._sessions) >= self.config.max_sessions:
            self._events.append(RequestIgnored(sid, "too many sessions"))
            return
        session = self._open(sid, False, request.mode, ids, self.config.live_mode)
        self._set_phase(session, Phase.RECONCILING)
        if session.reconciler is None:  # Log-Height: the responder's Have goes first
            self._requests.append(ReadHave(session.id, session.schema_ids))

    def _send_entries(self, session: Session, wanted: Iterable[Wanted] | None) -> None:
        """Queue ``wanted`` for the peer, or (``None``) all we hold above its heights."""
        if wanted is None:
            session.queue.above(session.schema_ids, session.peer_heights)
        else:
            session.queue.entries(wanted)
        if session.queue and session not in self._sending:
            self._sending.append(session)

    def _send_after_entries(self, session: Session, message: SyncDone) -> None:
        """Send ``message`` after the entries queued for ``session``."""
        if session.queue:
            session.queue.then(message)
        else:
            self._send_done(session, message)

    def _pump(self) -> None:
        """Send the messages at the head of the sessions' outboxes (those after entries
        already sent); drop the sessions with nothing left to send."""
        reading = self._in_flight.queue if isinstance(self._in_flight, Read) else None
        for session in list(self._sending):
            if session.queue is reading:
                continue  # the store side has it
            outbox = session.queue.outbox
            while outbox and not isinstance(outbox[0], list | Todo | LazyPlan):
                self._send_done(session, outbox.popleft())  # type: ignore[arg-type]
            if not outbox:
                self._sending.remove(session)

    def _next_read(self) -> Read | None:
        """The next chunk to read, of the next session with entries to send, once the
        last chunk was taken."""
        self._pump()
        # Once the peer closed, nobody is there to send to (what came is still stored).
        busy = self._out or len(self._queued) >= self.config.send_chunk or self._peer_closed
        if busy or not self._sending:
            return None
        session = self._sending[0]
        self._sending.rotate(-1)
        return Read(session.id, session.queue)

    def _on_read(self, request: Read, result: tuple[list[bytes], int]) -> None:
        """A chunk was read: queue its Entry messages."""
        session = next((s for s in self._sending if s.queue is request.queue), None)
        if session is None:
            return  # aborted meanwhile
        messages, payload = result
        self._out += messages
        self.payload_sent += payload
        self.overhead_sent += sum(map(len, messages)) - payload
        self._count(session, "sent", len(messages))
        self._pump()

    def _count(self, session: Session, counter: str, n: int) -> None:
        """Add ``n`` to a session's ``received`` or ``sent``; Progress every
        ``progress_every``."""
        before = getattr(session, counter)
        setattr(session, counter, before + n)
        every = self.config.progress_every
        for _ in range(before // every, (before + n) // every):
            self._progress(session)

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
        if self._batch_session is not session and self._batch:
            self._store_batch()  # this entry starts the next batch
        self._batch_session = session
        self._batch.append((entry_bytes, operation_bytes))
        self._batch_bytes += len(entry_bytes) + len(operation_bytes)
        if len(self._batch) >= self.config.max_batch:
            self._store_batch()

    def _store_batch(self) -> None:
        """Ask for the batch to be stored (one transaction), with the entries its session
        holds for a dependency."""
        session, batch = self._batch_session, self._batch
        self._batch_session, self._batch, self._batch_bytes = None, [], 0
        if session is None or not batch or not self._is_open(session):
            return
        held, session.pending = session.pending, []
        self._requests.append(
            StoreBatch(session.id, session.schema_ids, batch, held, self.config.max_pending_entries)
        )

    def _on_ingested(self, session: Session, result: BatchStored) -> None:
        for log, seq_num in result.heights.items():
            session.peer_heights[log] = max(session.peer_heights.get(log, 0), seq_num)
        self._count(session, "received", result.accepted)
        session.pending = result.held
        if isinstance(result.error, RemoteProtocolError):
            self._abort(session, result.error)

    def _on_stored(self, stored: Stored) -> None:
        """Live mode: push what was stored to sessions that want its schema.

        A session that asked for live mode but is not live yet keeps what is
        stored meanwhile (up to ``max_pending_entries`` logs) and sends it
        once both SyncDone said live, so nothing published during the
        catch-up falls between the two phases.
        """
        schema_id, author, log_id, seq_num = stored
        for session in self._sessions.values():
            if schema_id not in session.schema_ids or not session.live_requested:
                continue
            log = (author, log_id)
            if session.live:
                # The queue leaves out what it queued already; the peer's height, what it holds.
                self._send_entries(session, [(*log, session.peer_heights.get(log, 0), seq_num)])
            elif len(session.live_backlog) < self.config.max_pending_entries:
                session.live_backlog[log] = max(session.live_backlog.get(log, 0), seq_num)

    # -- strategies: set reconciliation (mode 1), Log-Height (mode 0) ---------------------

    def _on_range(self, session: Session, message: RangeSync) -> None:
        reconciler = session.reconciler
        if reconciler is None or reconciler.finished:
            raise UnexpectedEntry("set reconciliation message outside reconciliation", session.id)
        try:
            round_ = reconciler.collect(message.message)
        except rbsr.RoundTooLong as exc:
            raise LimitExceeded(str(exc), session.id) from exc
        except rbsr.ReconcileError as exc:
            raise MalformedMessage(str(exc), session.id) from exc
        if round_ is not None:
            self._requests.append(Reconcile(session.id, session.schema_ids, reconciler, round_))

    def _on_reconciled(self, session: Session, request: Reconcile, result: Reconciled) -> None:
        """A round was answered (or the opening round made) on the store side."""
        if result.error is not None:
            self._abort(session, MalformedMessage(str(result.error), session.id))
            return
        reconciler = request.reconciler
        for m in result.reply:
            self._send(RangeSync(session.id, m))
        if request.round is None:
            return
        if reconciler.peer_empty:  # that round finishes the reconciler: this runs once
            # Spec 2.1: EmptySet asks for all entries of the requested schemas, at once.
            self._send_entries(session, None)
        self._apply_differences(session, result)
        if reconciler.finished:
            self._set_phase(session, Phase.EXCHANGING)
            # Logs the peer never mentioned a key of: it has none of them (spec 2.2).
            self._send_entries(session, [(*log, 0, seq) for log, seq in session.lacking.items()])
            session.lacking.clear()
            self._local_done(session)

    def _apply_differences(self, session: Session, result: Reconciled) -> None:
        wanted: list[Wanted] = []
        heights, lacking = session.peer_heights, session.lacking
        for author, log_id, seq in map(key_item, result.remote_only):
            log = (author, log_id)
            heights[log] = max(heights.get(log, 0), seq)
            # Our height: the key we hold that the peer lacks, else the store's.
            mine = lacking.pop(log) if log in lacking else result.heights.get(log, 0)
            if mine > seq:
                wanted.append((author, log_id, seq, mine))
        for author, log_id, seq in map(key_item, result.local_only):
            if (author, log_id) not in heights:
                lacking[author, log_id] = seq
        # Logs the peer holds no entry of, known before the end: sent now, not at the end.
        for author, log_id, seq in map(key_item, result.peer_lacks):
            if (author, log_id) not in heights:
                lacking.pop((author, log_id), None)
                wanted.append((author, log_id, 0, seq))
        self._send_entries(session, wanted)

    def _on_have(self, session: Session, have: Have) -> None:
        if session.mode is not Mode.LOG_HEIGHT:
            raise UnexpectedEntry("Have in a set-reconciliation session", session.id)
        if session.phase is not Phase.RECONCILING:  # a Have moves it on
            raise UnexpectedEntry("Have received twice", session.id)
        count = sum(len(logs) for _, logs in have.log_heights)
        if count > self.config.max_have_logs:
            raise LimitExceeded(f"Have with {count} logs", session.id)
        if session.local:
            # Only the responder sent its Have unasked (_on_request); the opener answers.
            self._requests.append(ReadHave(session.id, session.schema_ids))
        remote = {(a, log_id): seq for a, logs in have.log_heights for log_id, seq in logs}
        session.peer_heights.update(remote)
        self._set_phase(session, Phase.EXCHANGING)
        self._send_entries(session, None)
        self._local_done(session)

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
            self._progress(session)
            session.pending.clear()
        if session.live_requested and session.remote_live:
            self._set_phase(session, Phase.LIVE)
            backlog, session.live_backlog = session.live_backlog, {}
            heights = session.peer_heights
            self._send_entries(
                session, [(*log, heights.get(log, 0), n) for log, n in backlog.items()]
            )
            return
        self._finish(session)

    def _finish(self, session: Session) -> None:
        self._end(session, Phase.DONE)
        self._progress(session)
        self._events.append(SessionDone(session.id, session.received, session.sent))

    def _abort(self, session: Session, error: SyncError) -> None:
        self._end(session, Phase.ABORTED)
        # A new queue, not a cleared one: a Read may be reading the old (_pump drops the session).
        session.queue = SendQueue(self.config.send_chunk)
        self._events.append(SessionAborted(session.id, error))
        self._count_rejection()

    def _end(self, session: Session, phase: Phase) -> None:
        self._sessions.pop(session.id, None)
        self._ended.append(session.id)
        session.phase = phase
        if not any(isinstance(r, Flush) for r in self._requests):
            self._requests.append(Flush())

    def _count_rejection(self) -> None:
        self.rejected += 1
        if self.rejected > self.config.max_rejected and not self.closed:
            self.fail(LimitExceeded(f"more than {self.config.max_rejected} rejected messages"))

    def fail(self, error: SyncError | None) -> None:
        """Close the connection because of ``error`` (its open sessions abort with it)."""
        if self.closed:
            return
        self.closed = True
        self._sending.clear()
        self._inbox.clear()
        self._requests.clear()
        if error is not None:
            self._events.extend(SessionAborted(sid, error) for sid in self._sessions)
        self._sessions.clear()
        self._events.append(ConnectionClosed(error))

    # -- helpers -----------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        """Send a message that is not an Entry (entries go out through :meth:`_on_read`):
        all of its bytes are overhead."""
        data = encode(message, self._sent_round)
        self.overhead_sent += len(data)
        self._out.append(data)

    def _set_phase(self, session: Session, phase: Phase) -> None:
        if session.phase is not phase:
            session.phase = phase
            self._progress(session)

    def _progress(self, session: Session) -> None:
        self._events.append(Progress(session.id, session.phase, session.received, session.sent))


__all__ = ["INBOX_BYTES", "WRITE_CHUNK", "Replication", "Stored", "SyncConfig"]
