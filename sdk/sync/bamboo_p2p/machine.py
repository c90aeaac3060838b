"""One side of a Bamboo point-to-point connection, as a sans-I/O machine.

Theory of operation
-------------------
:class:`BambooMachine` is a :class:`sdk.sync.machine.Machine`: bytes from the
peer go into :meth:`~BambooMachine.receive_data`, bytes for the peer come out of
:meth:`~BambooMachine.data_to_send`, what happened comes out of
:meth:`~BambooMachine.next_event`. It holds no store: what it needs from one
leaves as a request (:mod:`.requests`) and the answer comes back with
:meth:`~BambooMachine.request_done` (:func:`.store.carry_out` answers them;
:class:`~sdk.sync.bamboo_p2p.endpoint.Endpoint` does so at once, the driver on
the store's worker).

The connection opens with each side's setup bytes (:mod:`.setup`), then frames of
the control and the data channel (:mod:`.framing`). On the control channel the
endpoints grant credit, propose ranges of logs, adjust (the non-proposer's first
adjustment confirms) and cancel them (:mod:`.codec`). Once a request is confirmed,
both endpoints walk the request's sequence of pieces (:mod:`.sequence`) on the
data channel, each with its own cursor: a side that has a piece the other wants
transmits it, a side behind the other notifies past what the other transmitted,
skips payloads it may skip, and waits where it has nothing. A finite request whose
two cursors reach the end is cancelled with reason 130; cancellation takes four
messages (both control cancellations, both data-channel markers) before a request
id is free again.

Where the two cursors differ, the machine keeps how the leading side passed each
piece in between (transmitted/notified, skipped, or invalid awaiting an apology)
as run-length encoded runs, so notifying past thousands of pieces costs O(runs).

Every spec invariant (``specs/bamboo-point-2-point.md``, the two "Invariants,
drop connection if violated" lists) is checked where the message is handled; a
violation is the :class:`~.errors.RemoteProtocolError` subclass named for it
(:attr:`~BambooMachine.error`), reported as :class:`~.events.ConnectionDropped`.

The store, through requests:

* Received metadata and payloads go out in one :class:`~.requests.Write` per
  batch of the peer's bytes, in order (what the store makes of each: :mod:`.requests`;
  a fork is answered with cancellation 135). Events of a batch come out only once its
  write is done, so nothing is reported received before it is durable; the
  machine reads on meanwhile, up to :data:`MAX_WRITES` writes outstanding
  (backpressure). With greedy receiving, an invalid piece must be known before the
  next message, so each is written on its own and the input waits for it.
* What the machine sends is read ahead (:class:`~.requests.StoreRead`): :data:`READ_FIRST`
  pieces, twice as many each time a window was used up, at most :data:`READ_PIECES`
  pieces and about :data:`READ_BYTES` payload bytes; a few again after waiting (a live
  range reads only what is new).
* What a peer's proposal or a payload without its metadata needs (start and
  anchor entries, entry sizes) is read before the message is handled: the input
  waits for it. :meth:`~BambooMachine.store_changed` says the store changed, so
  what it lacked may be there now.

Bounded wait, as the machine's timer: every quarter of ``stall_timeout_ms`` the
finite requests are scanned, and one whose cursors have not moved for
``stall_timeout_ms`` is given up (:meth:`BambooMachine.give_up`). Open ranges wait.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from sdk.documents.bamboo import Entry, lipmaa
from sdk.sync.bamboo_p2p.certpool import shortest_path
from sdk.sync.bamboo_p2p.codec import decode_control, decode_data, encode_control, encode_data
from sdk.sync.bamboo_p2p.entries import LogKey, entry_tag, is_end_of_log
from sdk.sync.bamboo_p2p.errors import (
    AdjustmentViolation,
    ApologyViolation,
    CompressionViolation,
    CreditViolation,
    DataOrderViolation,
    EagernessViolation,
    InvalidData,
    LocalProtocolError,
    PayloadSizeViolation,
    RangeViolation,
    RemoteProtocolError,
    RequestIdViolation,
    SkipViolation,
    UnknownRequest,
)
from sdk.sync.bamboo_p2p.events import (
    ConnectionDropped,
    EndOfLogDetected,
    EntryReceived,
    EntryUnverifiable,
    Event,
    LogForkDetected,
    PayloadReceived,
    ProposalConfirmed,
    ProposalDropped,
    ProposalReceived,
    RequestCancelled,
    RequestClosed,
    RequestStalled,
    SessionEstablished,
    StartingHashMismatch,
)
from sdk.sync.bamboo_p2p.framing import MAX_FRAME_SIZE, Channel, ChannelFrameDecoder, encode_frame
from sdk.sync.bamboo_p2p.lzfoo import Compressor, Decompressor
from sdk.sync.bamboo_p2p.messages import (
    ALL,
    MAX_U64,
    NOTIFY,
    Adjust,
    Apology,
    Cancel,
    CancelMarker,
    CancelReason,
    CompressedPayload,
    ControlMessage,
    DataMessage,
    EagerMode,
    Eagerness,
    GrantCredit,
    Metadata,
    Notify,
    PayloadChunk,
    Propose,
    SkipBytes,
    SkipTooLarge,
    SkipTooSmall,
    SkipUnavailable,
    SwitchRequest,
)
from sdk.sync.bamboo_p2p.requests import (
    ForkProof,
    Item,
    KeepPartial,
    Outcome,
    ReceivedEntry,
    ReceivedPayload,
    Snapshot,
    StoreRead,
    Write,
    Written,
)
from sdk.sync.bamboo_p2p.sequence import INFINITE, PieceKind, PieceSequence
from sdk.sync.bamboo_p2p.setup import Role, SessionParams, SetupInfo, decode_setup, negotiate
from sdk.sync.errors import SyncError

#: Writes (batches of what the peer sent) outstanding before the machine stops reading.
MAX_WRITES = 2
#: Read ahead for sending: pieces at first and at most, payload bytes (module docstring).
READ_FIRST = 16
READ_PIECES = 256
READ_BYTES = 1 << 20
#: Entry sizes remembered for checking payloads whose metadata did not travel.
KNOWN_LIMIT = 1 << 16


class _Pass(IntEnum):
    """How a side moved its cursor past one piece."""

    HAD = 0  # transmitted or notified: the side has the piece
    SKIPPED = 1  # skipped a payload (4, 5, 6)
    PENDING = 2  # invalid data sent in greedy mode, an apology must follow


_ME, _PEER = True, False


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """How an endpoint behaves where the protocol leaves the choice to it."""

    #: Proposal credit granted to the peer at the start.
    initial_credit: int = 16
    #: Grant one more credit whenever a peer proposal is fully closed.
    replenish_credit: bool = True
    #: Confirm every acceptable peer proposal right away, with ``confirm_eagerness``.
    auto_confirm: bool = True
    confirm_eagerness: Eagerness = ALL
    #: Let the proposer skip payloads it lacks when confirming (else we would require
    #: them: the non-proposer starts out expecting mandatory payloads).
    confirm_allow_skip: bool = True
    #: Largest payload this endpoint accepts (it never buffers more for one piece).
    max_payload: int = 16 * 1024 * 1024
    #: Payload bytes per data message.
    chunk_size: int = 64 * 1024
    #: What to announce in the setup.
    send_greedy: bool = False
    receive_greedy: bool = False
    #: LZFoo window announced for both directions (0: never compress); the negotiated
    #: window is the smaller of the two sides'. Payload chunks go out compressed when
    #: that is shorter.
    compression_window: int = 0
    #: Cancel with reason 132 instead of waiting when the peer requires a payload
    #: this endpoint does not have.
    cancel_on_missing_mandatory: bool = False


@dataclass(slots=True)
class EndpointStats:
    """Counters of one connection."""

    bytes_sent: int = 0
    bytes_received: int = 0
    control_bytes_sent: int = 0
    data_bytes_sent: int = 0
    entries_sent: int = 0
    payloads_sent: int = 0
    entries_received: int = 0
    payloads_received: int = 0
    #: Payload bytes moved (uncompressed, a resumed payload's rest only).
    payload_bytes_sent: int = 0
    payload_bytes_received: int = 0
    unverifiable: int = 0


@dataclass(slots=True)
class _Wishes:
    """What one side wants to receive on a request (its proposal, confirmation and
    adjustments set it)."""

    eager: Eagerness | None = None
    min: int = 0
    max: int = MAX_U64
    mandatory: bool = True


@dataclass(slots=True)
class _Request:
    """Everything both endpoints track about one proposal until it is fully cancelled."""

    request_id: int
    ours: bool
    proposal: Propose
    seq: PieceSequence
    confirmed: bool = False
    # What this endpoint wants to receive, and the peer.
    my: _Wishes = field(default_factory=_Wishes)
    peer: _Wishes = field(default_factory=_Wishes)
    #: The payload sizes (min, max) we asked for before any adjustment (the peer may
    #: have sent by them before it saw the adjustment), and whether we changed our eagerness.
    my_loose: tuple[int, int] = (0, MAX_U64)
    my_eager_changed: bool = False
    # Cancellation: the four messages (our marker goes out with our cancellation).
    i_cancelled: bool = False
    peer_cancelled: bool = False
    peer_marker: bool = False
    # Cursors: next piece of each side; the peer's position inside a payload.
    mine: int = 0
    theirs: int = 0
    their_offset: int = 0
    their_buffer: bytearray = field(default_factory=bytearray)
    their_skipped_bytes: bool = False
    #: (seq, size, payload hash) of the last metadata the peer transmitted.
    their_meta: tuple[int, int, bytes] | None = None
    #: Runs [how, count] of the leading side's passes between the two cursors.
    lead: deque[list[int]] = field(default_factory=deque)
    #: Sequence number of the last metadata we transmitted (not just notified).
    my_meta_sent: int = 0
    #: Bytes of the payload at our cursor we transmitted so far (a payload goes out
    #: over several ``data_to_send`` calls when it does not fit in one's limit).
    my_offset: int = 0
    pending_invalid: bool = False
    pending_popped: int | None = None
    #: Whether we hold the entries whose payloads the range moves without metadata.
    holds: bool = True
    #: What we read to send: entries and payloads by sequence number, the store's
    #: generation when read, and whether a read is under way.
    window: dict[int, Entry | None] = field(default_factory=dict)
    payloads: dict[int, bytes | None] = field(default_factory=dict)
    window_gen: int = -1
    reading: bool = False
    #: The pieces the window was read for (sequence number, whether a payload), from
    #: piece ``ahead_from`` on, and how many to read next time.
    ahead: list[tuple[int, bool]] = field(default_factory=list)
    ahead_from: int = 0
    ahead_size: int = READ_FIRST
    #: Pieces the peer sent that are not written yet, and a cancellation that waits
    #: for them.
    unwritten: int = 0
    deferred: Cancel | None = None
    #: The stall timer's: the request's progress when last scanned, and since when (ms).
    seen: tuple[int, int, int, int] | None = None
    seen_at: int = 0

    @property
    def log(self) -> LogKey:
        return (self.proposal.author, self.proposal.log_id)

    @property
    def progress(self) -> tuple[int, int, int, int]:
        """Both cursors and how far into a payload each side is (as ``BambooMachine.progress``)."""
        return (self.mine, self.theirs, self.their_offset, self.my_offset)

    @property
    def strict(self) -> Eagerness | None:
        """The eagerness the peer's data is held to: ours, unless we changed it (the
        peer may have sent by the old one before it saw the change)."""
        return None if self.my_eager_changed else self.my.eager


def _overlap(a: Propose, b: Propose) -> bool:
    same_log = (a.author, a.log_id) == (b.author, b.log_id)
    return same_log and (a.end is None or b.start <= a.end) and (b.end is None or a.start <= b.end)


def _payload_positions(
    start: int, end: int | None, sparse: bool, offset: int | None, payload_only: bool
) -> list[int] | range:
    """The entries whose payload a proposal moves without their metadata: every entry
    of a payload-only range (its link path when sparse), or the start of a range with
    a starting offset. A side can only follow such a payload if it holds the entry."""
    if payload_only and end is not None:
        return shortest_path(end, start) if sparse else range(start, end + 1)
    return [start] if offset is not None else []


def _needs(
    start: int, lower: int, end: int | None, sparse: bool, offset: int | None, payload_only: bool
) -> list[int]:
    """The entries to read before a proposal is made or answered: its start, the
    anchor of its lower certpool info and those of :func:`_payload_positions`."""
    anchor = [lipmaa(lower)] if lower > 1 else []
    return [start, *anchor, *_payload_positions(start, end, sparse, offset, payload_only)]


def _holds(p: Propose, known: dict[int, Entry | None]) -> bool:
    """Whether ``known`` (read from the store) holds the entries of :func:`_payload_positions`."""
    positions = _payload_positions(p.start, p.end, p.sparse, p.offset, p.payload_only)
    return all(known.get(seq_num) is not None for seq_num in positions)


def _check_proposal_ranges(p: Propose, error: Callable[[str], Exception]) -> None:
    """The range invariants of a proposal; raise ``error(reason)`` on the first broken."""
    if p.start < 1:
        raise error("sequence numbers are nonzero: start is 0")
    if p.lower_certpool is not None and not 1 <= p.lower_certpool <= p.start:
        raise error(f"lower certpool info {p.lower_certpool} not in 1..start {p.start}")
    if p.end is not None and p.end < p.start:
        raise error(f"end {p.end} below start {p.start}")
    if p.upper_certpool is not None and p.end is not None and p.upper_certpool < p.end:
        raise error(f"upper certpool info {p.upper_certpool} below end {p.end}")


class _Missing(SyncError):
    """A message needs entries the machine has not read: it waits for them (never
    leaves the machine)."""

    def __init__(self, log: LogKey, seqs: list[int]) -> None:
        super().__init__(log, seqs)
        self.log, self.seqs = log, seqs


@dataclass(slots=True, eq=False)
class _Slot:
    """Where the events of one written item go, in the order of the peer's messages."""

    events: list[Event] = field(default_factory=list)
    done: bool = False


class BambooMachine:
    """One side of a connection; see the module docstring for the theory of operation."""

    def __init__(
        self,
        role: Role,
        config: EndpointConfig | None = None,
        *,
        write_limit: int = 1 << 20,
        stall_timeout_ms: float | None = None,
        now: int = 0,
    ) -> None:
        self.role = role
        config = self.config = config or EndpointConfig()
        self.stats = EndpointStats()
        self.params: SessionParams | None = None
        #: The peer's violation that cut the connection, if any.
        self.error: RemoteProtocolError | None = None
        #: Data bytes made per :meth:`data_to_send` (backpressure unit).
        self.write_limit = write_limit
        window = config.compression_window  # announced for both directions
        self._setup = SetupInfo(config.send_greedy, config.receive_greedy, window, window)
        self._compressor: Compressor | None = None
        self._decompressor: Decompressor | None = None
        self._unsent_setup = self._setup.encode()
        self._inbuf = bytearray()
        self._frames = ChannelFrameDecoder()
        #: Frames read and not yet handled: (channel, body, position), and a message
        #: taken out of them that waits for a read.
        self._input: deque[tuple[Channel, bytes, int]] = deque()
        self._held: tuple[Channel, ControlMessage | DataMessage] | None = None
        self._eof = False
        self._events: deque[Event | _Slot] = deque()
        self._sink: deque[Event | _Slot] | list[Event] = self._events
        #: Requests for the driver, how many it holds, writes outstanding, the one the
        #: input waits for (with what to do with its answer), the write being filled.
        self._todo: deque[StoreRead | Write] = deque()
        self._in_flight = 0
        self._writes = 0
        self._blocked: tuple[StoreRead | Write, Callable[[Any], None]] | None = None
        self._batch = Write([])
        #: What the store said: entry sizes and hashes (with the store's generation
        #: for an absence), ends of logs; the generation counts store changes.
        self._known: dict[tuple[LogKey, int], tuple[tuple[int, bytes] | None, int]] = {}
        self._eol: dict[LogKey, int | None] = {}
        self._gen = 0
        #: Encoded messages in the order they were produced, as runs of one channel each
        #: (framing: frames keep production order across both channels).
        self._out: list[tuple[Channel, list[bytes]]] = []
        self._data_out_size = 0
        self._pending_notify = 0
        self._requests: dict[int, _Request] = {}
        #: Peer proposals dropped by overlap resolution: later messages about them are void.
        self._ghosts: set[int] = set()
        self._credit_to_peer = 0
        self._credit_from_peer = 0
        self._next_id = role.id_parity
        self._my_current: int | None = None
        self._peer_current: int | None = None
        self._rotation = 0
        self.set_stall_timeout(stall_timeout_ms, now)
        if config.initial_credit:
            self.grant_credit(config.initial_credit)

    # ------------------------------------------------------------- machine API

    @property
    def wants_data(self) -> bool:
        """True unless the input waits for the store or too many writes are outstanding."""
        return self._blocked is None and not self._input and self._writes < MAX_WRITES

    @property
    def finished(self) -> bool:
        """True once the peer closed its stream and all it sent is written."""
        idle = self._blocked is None and not (self._input or self._todo or self._in_flight)
        return self._eof and idle

    def receive_data(self, data: bytes, now: int = 0) -> None:
        """Take bytes from the peer (``b""``: it closed); a violation becomes :attr:`error`."""
        if not data:
            self._eof = True
            return
        if self.error is not None:
            return
        self.stats.bytes_received += len(data)
        try:
            self._receive(data)
        except RemoteProtocolError as exc:
            self._fail(exc)

    def data_to_send(self, limit: int | None = None) -> bytes:
        """Bytes to write to the peer: setup, then control and data messages in the order
        they were produced (data up to about ``limit``, default :attr:`write_limit`).

        The order matters: a cancellation sent after the last data of a request must not
        overtake that data, or the peer would confirm it and drop the data as stale."""
        if self.error is not None:
            return b""
        parts, self._unsent_setup = [self._unsent_setup], b""
        self._pump(self.write_limit if limit is None else limit)
        self._flush_notify()
        for channel, messages in self._out:
            parts += self._frames_of(channel, messages)
        self._out = []
        self._data_out_size = 0
        out = b"".join(parts)
        self.stats.bytes_sent += len(out)
        return out

    def next_event(self) -> Event | None:
        """The next event, or None (events after a write not yet done wait for it)."""
        events = self._events
        while events and (not isinstance(events[0], _Slot) or events[0].done):
            head = events.popleft()
            if not isinstance(head, _Slot):
                return head
            events.extendleft(reversed(head.events))
        return None

    def next_request(self) -> StoreRead | Write | None:
        """The next read or write for the store (:func:`.store.carry_out`), or ``None``."""
        self._flush_batch()
        if not self._todo:
            return None
        self._in_flight += 1
        return self._todo.popleft()

    def request_done(self, request: Any, result: Any, now: int = 0) -> None:
        """``request`` was carried out with ``result``; handle the answer, go on reading."""
        self._in_flight -= 1
        if isinstance(request, Write):
            self._writes -= 1
        try:
            if self._blocked is not None and self._blocked[0] is request:
                (_, answer), self._blocked = self._blocked, None
                answer(result)
            elif isinstance(request, Write):
                self._written(request, result)
            else:
                self._window_read(request, result)
            self._process()
        except RemoteProtocolError as exc:
            self._fail(exc)

    def store_changed(self) -> None:
        """The store changed (an entry or payload put): what was missing may be there now."""
        self._gen += 1

    def set_stall_timeout(self, stall_timeout_ms: float | None, now: int) -> None:
        """Give up a finite request after ``stall_timeout_ms`` without progress (``None``:
        never); ``now`` is the clock the timer runs on."""
        self._stall_timeout = stall_timeout_ms
        self._scan_every = max(1, int((stall_timeout_ms or 0) / 4))
        self._next_scan = None if stall_timeout_ms is None else now + self._scan_every

    def get_timer(self) -> int | None:
        """When the next stall scan is due, or ``None`` without a stall timeout."""
        return None if self.error is not None else self._next_scan

    def handle_timer(self, now: int) -> None:
        """Scan for stalled requests, give them up, and set the next scan."""
        timeout = self._stall_timeout
        if timeout is None or self._next_scan is None or now < self._next_scan:
            return
        self._next_scan = now + self._scan_every
        for _, r in sorted(self._requests.items()):
            if r.seq.end is None:
                continue  # an open range: waiting is what it is for
            if r.seen != r.progress:
                r.seen, r.seen_at = r.progress, now
            elif now - r.seen_at >= timeout:
                self.give_up(r.request_id)

    # ------------------------------------------------------------------ queries

    @property
    def credit(self) -> int:
        """Proposal credit the peer granted us and we have not spent."""
        return self._credit_from_peer

    def request_ids(self) -> list[int]:
        """Ids of the requests not yet fully cancelled."""
        return sorted(self._requests)

    def request_state(self, request_id: int) -> dict[str, object]:
        """A read-only summary of one request (for tests, tools and progress reports)."""
        r = self._request(request_id)
        return {
            "ours": r.ours,
            "confirmed": r.confirmed,
            "mine": r.mine,
            "theirs": r.theirs,
            "pieces": r.seq.count(),
            "i_cancelled": r.i_cancelled,
            "peer_cancelled": r.peer_cancelled,
            "end": r.seq.end,
        }

    def give_up(self, request_id: int) -> RequestStalled | None:
        """Cancel a request that waits for a piece, with reason 128; ``None`` if done.

        The protocol has no timers, so two endpoints that both lack a piece of a
        request (an upper certificate pool that does not exist yet, a payload
        neither holds) would wait for each other forever. The stall timer (or a
        caller that saw a request make no progress for a while) calls this: the
        request is cancelled ("do not retry": this pair cannot complete it) and
        :class:`RequestStalled` names the first piece that not both cursors passed.
        """
        r = self._request(request_id)
        first = min(r.mine, r.theirs)  # the first piece not both cursors passed
        if r.i_cancelled or not r.confirmed or first >= r.seq.count():
            return None
        seq_num, kind = r.seq.piece(first)
        stalled = RequestStalled(request_id, r.log, seq_num, kind is PieceKind.PAYLOAD)
        self._emit(stalled)
        self._cancel(r, Cancel(request_id, CancelReason.DO_NOT_RETRY))
        return stalled

    def progress(self, request_id: int) -> tuple[int, int, int, int] | None:
        """Where an active request stands: our cursor, the peer's, how far into a payload
        the peer is and how far into one we are (a large payload moves no cursor for a
        while); ``None`` once the request is released."""
        r = self._requests.get(request_id)
        return None if r is None else r.progress

    def connection_lost(self) -> None:
        """The connection ended: ask the store to keep the prefix of every payload the
        peer was inside (:meth:`LogStore.put_partial_payload`), so that a proposal with a
        starting offset can resume it on the next connection. Carry out the requests
        that follow (:meth:`next_request`)."""
        for r in self._requests.values():
            self._keep_partial(r)
        self._flush_batch()

    def proposal_read(
        self,
        log: LogKey,
        start: int,
        *,
        end: int | None = None,
        lower: int = 1,
        sparse: bool = False,
        offset: int | None = None,
        payload_only: bool = False,
        **_: object,
    ) -> StoreRead:
        """What :meth:`propose` needs to know of the store (its ``known``) for the same
        arguments (:func:`_needs`)."""
        return StoreRead(log, _needs(start, lower, end, sparse, offset, payload_only))

    # -------------------------------------------------------------- control API

    def grant_credit(self, amount: int) -> None:
        """Allow the peer ``amount`` more proposals."""
        if amount < 1 or self._credit_to_peer + amount > MAX_U64:
            raise LocalProtocolError("outstanding credit stays within 1..2^64-1")
        self._credit_to_peer += amount
        self._send_control(GrantCredit(amount))

    def propose(
        self,
        log: LogKey,
        start: int,
        *,
        end: int | None = None,
        lower: int = 1,
        upper: int | None = None,
        sparse: bool = False,
        eagerness: Eagerness = ALL,
        min_payload: int = 0,
        max_payload: int | None = None,
        mandatory: bool = False,
        offset: int | None = None,
        payload_only: bool = False,
        known: Snapshot | None = None,
    ) -> int:
        """Propose to synchronize ``start..end`` of ``log`` (no end: follow it live).

        ``known``: what the store answered to :meth:`proposal_read` for the same
        arguments (without it, as if the store held nothing).

        ``lower`` is the lower certpool info: metadata of the start's certificate pool
        from there on is sent first; unless it is 1 we must hold entry
        ``lipmaa(lower)``, whose hash anchors the range. ``upper`` (default ``end``)
        bounds the upper certificate pool sent after the end. Returns the request id.

        ``offset``: the range begins inside the payload of ``start``, at that byte (we
        must hold entry ``start``, whose hash anchors the range; no lower certpool
        info). Received bytes complete the prefix the store kept of that payload
        (:meth:`LogStore.partial_payload`, kept when a transfer was cut). ``payload_only``:
        only the payloads of a finite range travel, no metadata; unless ``eagerness`` is
        notify-only we must hold the entries whose payloads we ask for.
        """
        if self._credit_from_peer < 1:
            raise LocalProtocolError("no proposal credit: wait for the peer to grant some")
        entries = {} if known is None else known.entries
        expected: bytes | None = None
        lower_certpool: int | None = lower
        if offset is not None:
            if lower != 1:
                raise LocalProtocolError("a range with a starting offset has no lower certpool")
            start_entry = entries.get(start)
            if start_entry is None:
                raise LocalProtocolError(f"a starting offset needs entry {start}")
            size = start_entry.payload_size
            if not 0 <= offset <= size:
                raise LocalProtocolError(f"offset {offset} outside the {size}-byte payload")
            expected, lower_certpool = start_entry.hash, None
        elif lower != 1:
            anchor_seq = lipmaa(lower) if lower > 1 else 0  # no entry 0: an error below
            anchor = entries.get(anchor_seq)
            if anchor is None:
                raise LocalProtocolError(f"lower certpool info {lower} needs entry {anchor_seq}")
            expected = anchor.hash
        if end is None and (sparse or payload_only):
            kind = "sparse" if sparse else "payload-only"
            raise LocalProtocolError(f"a {kind} range needs an end")
        limit = self.config.max_payload
        while self._next_id in self._requests:
            self._next_id += 2
        request_id, self._next_id = self._next_id, self._next_id + 2
        proposal = Propose(
            request_id=request_id,
            author=log[0],
            log_id=log[1],
            start=start,
            lower_certpool=lower_certpool,
            min_payload=min_payload,
            max_payload=limit if max_payload is None else min(max_payload, limit),
            expected_hash=expected,
            eagerness=eagerness,
            end=end,
            upper_certpool=end if upper is None else upper,
            offset=offset,
            payload_only=payload_only,
            sparse=sparse,
            mandatory=mandatory,
        )
        _check_proposal_ranges(proposal, LocalProtocolError)
        holds = _holds(proposal, entries)
        self._check_can_follow(holds, eagerness)
        for other in self._requests.values():
            if other.confirmed or other.log != log:
                continue
            # Overlap resolution is only the same on both sides when each side has at
            # most one unconfirmed proposal per log and never proposes over one of the
            # peer's (docs/bamboo-p2p.md, "Concurrent proposals").
            if other.ours:
                raise LocalProtocolError(
                    f"proposal {other.request_id} on this log is not confirmed yet: wait for it"
                )
            if _overlap(other.proposal, proposal):
                raise LocalProtocolError(
                    f"overlaps the peer's unconfirmed proposal {other.request_id}: confirm or "
                    "cancel it first"
                )
        self._credit_from_peer -= 1
        wishes = _Wishes(eagerness, proposal.min_payload, proposal.max_payload, mandatory)
        r = _Request(request_id, True, proposal, PieceSequence.of(proposal), holds=holds, my=wishes)
        r.my_loose = (wishes.min, wishes.max)
        if known is not None:
            self._eol[log] = known.end_of_log
        self._requests[request_id] = r
        self._send_control(proposal)
        return request_id

    def adjust(
        self,
        request_id: int,
        *,
        eagerness: Eagerness | None = None,
        allow_skip: bool = False,
        end: int | None = None,
        upper: int | None = None,
        min_payload: int | None = None,
        max_payload: int | None = None,
    ) -> None:
        """Adjust a request; for a peer proposal the first adjustment confirms it."""
        r = self._request(request_id)
        if r.i_cancelled:
            raise LocalProtocolError("the request is cancelled")
        message = Adjust(request_id, eagerness, allow_skip, end, upper, min_payload, max_payload)
        if message.is_empty():
            raise LocalProtocolError("adjust at least one thing")
        if eagerness is not None:
            self._check_can_follow(r.holds, eagerness)
        try:
            self._apply_adjust(r, message, mine=True)
        except RemoteProtocolError as exc:
            raise LocalProtocolError(exc.detail) from exc
        self._send_control(message)

    def confirm(self, request_id: int, eagerness: Eagerness | None = None) -> None:
        """Confirm a peer proposal (eagerness and our payload limit)."""
        config = self.config
        eager = eagerness or config.confirm_eagerness
        max_payload = config.max_payload if config.max_payload < MAX_U64 else None
        allow_skip = config.confirm_allow_skip
        self.adjust(request_id, eagerness=eager, max_payload=max_payload, allow_skip=allow_skip)

    def cancel(self, request_id: int, reason: CancelReason = CancelReason.DO_NOT_RETRY) -> None:
        """Cancel a request (reasons 133-135 are sent by the endpoint itself)."""
        r = self._request(request_id)
        if r.i_cancelled:
            raise LocalProtocolError("already cancelled")
        if reason in (CancelReason.HASH_MISMATCH, CancelReason.END_OF_LOG, CancelReason.FORKED):
            raise LocalProtocolError("reasons 133-135 carry proofs the endpoint adds itself")
        self._cancel(r, Cancel(request_id, reason))

    # ---------------------------------------------------------------- internals

    def _request(self, request_id: int) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise LocalProtocolError(f"no active request {request_id}") from None

    @staticmethod
    def _check_can_follow(holds: bool, eagerness: Eagerness) -> None:
        """Asking for payloads whose metadata a range does not move needs their entries:
        we could not follow payload bytes whose metadata we lack (decision 15)."""
        if eagerness.mode is not EagerMode.NOTIFY and not holds:
            raise LocalProtocolError(
                "payloads without their metadata need the entries: hold them, or ask NOTIFY"
            )

    @staticmethod
    def _piece_base(r: _Request, index: int) -> int:
        """The byte a piece starts at: the offset for the first piece of a range with a
        starting offset, else 0."""
        offset = r.proposal.offset
        return offset if index == 0 and offset else 0

    def _send_control(self, message: ControlMessage) -> None:
        data = encode_control(message)
        self.stats.control_bytes_sent += len(data)
        self._queue(Channel.CONTROL, data)

    def _queue(self, channel: Channel, data: bytes) -> None:
        self._flush_notify()  # notifications produced before it go out before it
        out = self._out
        if out and out[-1][0] is channel:
            out[-1][1].append(data)
        else:
            out.append((channel, [data]))

    def _emit_data(self, message: DataMessage) -> None:
        data = encode_data(message)
        self._queue(Channel.DATA, data)
        self._data_out_size += len(data)

    def _flush_notify(self) -> None:
        if self._pending_notify:
            n, self._pending_notify = self._pending_notify, 0
            self._emit_data(Notify(n))

    def _frames_of(self, channel: Channel, messages: list[bytes]) -> list[bytes]:
        frames: list[bytes] = []
        first = size = 0  # the frame being filled: its first message and its size
        for i, m in enumerate(messages):
            if size + len(m) > MAX_FRAME_SIZE and size:
                frames.append(encode_frame(channel, b"".join(messages[first:i])))
                first, size = i, 0
            size += len(m)
        frames.append(encode_frame(channel, b"".join(messages[first:])))
        if channel is Channel.DATA:
            self.stats.data_bytes_sent += sum(len(f) for f in frames)
        return frames

    def _cancel(self, r: _Request, message: Cancel) -> None:
        if r.unwritten and message.reason in (CancelReason.END_OF_RANGE, CancelReason.CONFIRM):
            # The peer takes these as "through": they go once what it sent is stored.
            r.deferred = message
            return
        self._keep_partial(r)  # data the peer sends from now on is not kept
        r.i_cancelled = True
        self._send_control(message)
        self._emit_data(CancelMarker(r.request_id))
        if self._my_current == r.request_id:
            self._my_current = None  # spec: after cancelling the current request, switch
        self._maybe_release(r)

    def _keep_partial(self, r: _Request) -> None:
        """Keep the prefix of a payload the peer is inside (for a resumption by offset)."""
        if not r.their_offset or r.their_skipped_bytes or r.theirs >= r.seq.proposed_count:
            return
        seq_num, kind = r.seq.piece(r.theirs)
        if kind is PieceKind.PAYLOAD:
            base = self._piece_base(r, r.theirs)
            self._write(KeepPartial(r.log, seq_num, bytes(r.their_buffer), base))

    def _maybe_release(self, r: _Request) -> None:
        if not (r.i_cancelled and r.peer_cancelled and r.peer_marker):
            return  # the four messages of a cancellation are not all through
        self._forget(r.request_id)
        self._emit(RequestClosed(r.request_id, r.ours))
        if not r.ours and self.config.replenish_credit:
            self.grant_credit(1)

    def _forget(self, request_id: int) -> None:
        """The one way a request leaves: the peer's data can no longer name it (if the
        peer had switched to it, its next data must switch first)."""
        del self._requests[request_id]
        if self._peer_current == request_id:
            self._peer_current = None

    # ------------------------------------------------------------------ receiving

    def _receive(self, data: bytes) -> None:
        if self.params is None:  # the peer's setup first
            self._inbuf += data
            decoded = decode_setup(bytes(self._inbuf))
            if decoded is None:
                return
            theirs, used = decoded
            params = self.params = negotiate(self._setup, theirs)
            if params.compression_window:
                self._compressor = Compressor(params.compression_window)
            if params.decompression_window:
                self._decompressor = Decompressor(params.decompression_window)
            self._emit(SessionEstablished(params.send_greedy, params.receive_greedy))
            data = bytes(self._inbuf[used:])
            self._inbuf.clear()
        self._input.extend((channel, body, 0) for channel, body in self._frames.feed(data))
        self._process()

    def _process(self) -> None:
        """Handle the peer's messages until the input is used up or waits for the store."""
        frames = self._input
        while self._blocked is None and self.error is None:
            if self._held is not None:
                (channel, m), self._held = self._held, None
            elif not frames:
                break
            else:
                channel, body, pos = frames[0]
                if pos >= len(body):
                    frames.popleft()
                    continue
                if channel is Channel.CONTROL:
                    m, pos = decode_control(body, pos)
                else:
                    m, pos = decode_data(body, pos, self._backlink_expected)
                    if isinstance(m, CompressedPayload):
                        m = self._decompress(m)
                frames[0] = (channel, body, pos)
            try:
                if channel is Channel.CONTROL:
                    self._on_control(m)  # type: ignore[arg-type]
                else:
                    self._on_data(m)  # type: ignore[arg-type]
            except _Missing as missing:
                self._held = (channel, m)
                read = StoreRead(missing.log, missing.seqs, gen=self._gen)
                self._block(read, functools.partial(self._learn, read.log, gen=read.gen))
        self._flush_batch()

    def _emit(self, event: Event) -> None:
        self._sink.append(event)

    def _fail(self, exc: RemoteProtocolError) -> None:
        """The peer broke the protocol: close, and let every held event out."""
        if self.error is not None:
            return
        self.error = exc
        self._input.clear()
        self._held = None
        for slot in self._events:
            if isinstance(slot, _Slot):
                slot.done = True
        self._sink = self._events
        self._emit(ConnectionDropped(exc))

    def _write(self, item: Item) -> None:
        """Queue ``item`` in the write being filled; its events will go where it is in
        the event queue (items in a row share a slot)."""
        events, batch = self._events, self._batch
        slot = events[-1] if events else None
        if not batch.slots or slot is not batch.slots[-1]:
            slot = _Slot()
            events.append(slot)
        batch.items.append(item)
        batch.slots.append(slot)

    def _flush_batch(self) -> None:
        if self._batch.items:
            self._todo.append(self._batch)
            self._writes += 1
            self._batch = Write([])

    def _block(self, request: StoreRead | Write, answer: Callable[[Any], None]) -> None:
        """Stop handling input until ``request``'s answer came (after what was written)."""
        self._flush_batch()
        if isinstance(request, Write):
            self._writes += 1
        self._todo.append(request)
        self._blocked = (request, answer)

    def _write_now(self, item: Item, then: Callable[[], None] | None = None) -> None:
        """Write ``item`` on its own and wait for it (the next message depends on it);
        then handle it as if received greedily, and call ``then``."""
        self._flush_batch()
        self._write(item)
        write, self._batch = self._batch, Write([])

        def answer(results: list[Written]) -> None:
            self._written(write, results, greedy=True)
            if then is not None:
                then()

        self._block(write, answer)

    def _written(self, write: Write, results: list[Written], *, greedy: bool = False) -> None:
        """Handle what the store made of each item; its events go where its slot is."""
        try:
            for item, slot, w in zip(write.items, write.slots, results, strict=True):
                self._sink = slot.events
                if isinstance(item, ReceivedEntry | ReceivedPayload):
                    self._piece_written(item, w, greedy)
                elif isinstance(item, ForkProof):
                    self._emit(LogForkDetected(item.log, item.proof, w.verified))
                slot.done = True
        finally:
            self._sink = self._events

    def _learn(self, log: LogKey, snapshot: Snapshot, *, gen: int) -> None:
        """Remember entry sizes (and absences, as of store generation ``gen``) and the
        end of the log from a read."""
        known = self._known
        if len(known) > KNOWN_LIMIT:
            known.clear()
        for seq_num, entry in snapshot.entries.items():
            size = None if entry is None else (entry.payload_size, entry.payload_hash)
            known[log, seq_num] = (size, gen)
        self._eol[log] = snapshot.end_of_log

    # ---- control channel

    def _on_control(self, m: ControlMessage) -> None:
        if isinstance(m, GrantCredit):
            if self._credit_from_peer + m.amount > MAX_U64:
                raise CreditViolation("outstanding credit above 2^64 - 1")
            self._credit_from_peer += m.amount
            return
        if isinstance(m, Propose):
            self._on_propose(m)
            return
        r = self._peer_request(m.request_id, "adjustment or cancellation for")
        if r is None:
            return
        if r.peer_cancelled:
            raise AdjustmentViolation(f"request {m.request_id} was already cancelled by the peer")
        if isinstance(m, Adjust):
            self._apply_adjust(r, m, mine=False)
        else:
            self._on_cancel(r, m)

    def _peer_request(self, request_id: int, what: str) -> _Request | None:
        """The request a peer's message names; None for one of its dropped proposals."""
        r = self._requests.get(request_id)
        if r is None and request_id not in self._ghosts:
            raise UnknownRequest(f"{what} inactive request {request_id}")
        return r

    def _on_propose(self, p: Propose) -> None:
        if self._credit_to_peer < 1:
            raise CreditViolation(f"proposal {p.request_id} without credit")
        if p.request_id % 2 == self.role.id_parity:
            raise RequestIdViolation(f"request id {p.request_id} has our parity")
        if p.request_id in self._requests:
            raise RequestIdViolation(f"request id {p.request_id} is in use")
        _check_proposal_ranges(p, RangeViolation)
        self._credit_to_peer -= 1
        self._ghosts.discard(p.request_id)
        # Overlap with our unconfirmed proposals (spec, "The Control Channel"): the
        # one starting later counts as never sent; on equal starts the reactive one.
        losers: list[_Request] = []
        for _, mine in sorted(self._requests.items()):
            if not mine.ours or mine.confirmed or not _overlap(mine.proposal, p):
                continue
            later = p.start > mine.proposal.start
            if later or (p.start == mine.proposal.start and self.role is Role.PROACTIVE):
                self._credit_to_peer += 1
                self._ghosts.add(p.request_id)
                self._emit(ProposalDropped(p.request_id, ours=False))
                return
            losers.append(mine)
        for mine in losers:
            self._forget(mine.request_id)
            self._credit_from_peer += 1
            self._emit(ProposalDropped(mine.request_id, ours=True))
        peer = _Wishes(p.eagerness, p.min_payload, p.max_payload, p.mandatory)
        r = _Request(p.request_id, False, p, PieceSequence.of(p), peer=peer)
        self._requests[p.request_id] = r
        self._emit(ProposalReceived(p))
        if p.end is None and (p.sparse or p.payload_only):
            # Not implemented here (see docs/bamboo-p2p.md): refuse for good.
            self._cancel(r, Cancel(p.request_id, CancelReason.DO_NOT_RETRY))
            return
        lower = p.lower_certpool if p.lower_certpool is not None else p.start
        seqs = _needs(p.start, lower, p.end, p.sparse, p.offset, p.payload_only)
        read = StoreRead(r.log, seqs, fork=True, gen=self._gen)
        self._block(read, lambda snapshot: self._answer(r, snapshot))

    def _answer(self, r: _Request, known: Snapshot) -> None:
        """Refuse or confirm the peer's proposal, knowing what the store holds."""
        p = r.proposal
        self._learn(r.log, known, gen=self._gen)
        r.holds = _holds(p, known.entries)
        if r.i_cancelled:  # by us while the read was out (the peer's input waited for it)
            return
        refusal = self._refusal(p, known)
        if refusal is not None:
            self._cancel(r, refusal)
        elif self.config.auto_confirm:
            # Without the entries we can only be notified (:meth:`_check_can_follow`).
            self.confirm(p.request_id, None if r.holds else NOTIFY)

    @staticmethod
    def _refusal(p: Propose, known: Snapshot) -> Cancel | None:
        """A cancellation answering ``p`` at once, or None if we take part."""
        # With a starting offset, "prior to the start" (spec, cancellations 134/135).
        lower = p.lower_certpool if p.lower_certpool is not None else p.start
        end = known.end_of_log
        if end is not None and end < lower:
            return Cancel(p.request_id, CancelReason.END_OF_LOG, seq_num=end)
        proof = known.fork_proof
        if proof is not None and min(e.seq_num for e in proof) < lower:
            return Cancel(p.request_id, CancelReason.FORKED, entry=proof[0], other_entry=proof[1])
        if p.offset is not None:
            # Spec, "expected starting hash": with an offset, the hash of the start entry.
            start = known.entries.get(p.start)
            if start is not None and start.hash != p.expected_hash:
                return Cancel(p.request_id, CancelReason.HASH_MISMATCH, entry=start)
            if start is not None and p.offset > start.payload_size:
                raise RangeViolation(
                    f"offset {p.offset} past the end of the {start.payload_size}-byte payload"
                )
        elif p.expected_hash is not None and lower > 1:
            anchor = known.entries.get(lipmaa(lower))
            if anchor is not None and anchor.hash != p.expected_hash:
                return Cancel(p.request_id, CancelReason.HASH_MISMATCH, entry=anchor)
        return None

    def _apply_adjust(self, r: _Request, m: Adjust, *, mine: bool) -> None:
        """Check and apply an adjustment sent by us (``mine``) or by the peer; the
        first by the side that did not propose confirms the request."""
        confirming = r.ours != mine and not r.confirmed
        if confirming and m.eagerness is None:
            raise AdjustmentViolation("the confirmation must set an eagerness")
        seq = r.seq
        if m.end is not None and m.end < r.proposal.start:
            raise RangeViolation(f"adjusted end {m.end} below start {r.proposal.start}")
        new_end = m.end if m.end is not None and (seq.end is None or m.end < seq.end) else None
        end_after = new_end if new_end is not None else seq.end
        upper = m.upper_certpool
        if upper is not None and end_after is not None and upper < end_after:
            raise RangeViolation(f"adjusted upper certpool info below the end {end_after}")
        if upper == 0:
            raise RangeViolation("sequence numbers are nonzero: upper certpool info 0")
        if upper is not None and (end_after is None or seq.upper is None or upper >= seq.upper):
            upper = None  # not less than the old one, or no end it could follow
        wishes = r.my if mine else r.peer
        low, high = m.min_payload, m.max_payload
        if low is not None and low < wishes.min:
            raise AdjustmentViolation(f"minimum payload size down from {wishes.min} to {low}")
        if high is not None and high > wishes.max:
            raise AdjustmentViolation(f"maximum payload size up from {wishes.max} to {high}")
        seq.truncate(new_end, upper)
        if m.eagerness is not None:
            if mine and wishes.eager is not None and not confirming:
                r.my_eager_changed = True
            wishes.eager = m.eagerness
        wishes.min = wishes.min if low is None else low
        wishes.max = wishes.max if high is None else high
        if m.allow_skip:
            wishes.mandatory = False
        if confirming:
            if mine:
                r.my_loose = (wishes.min, wishes.max)
            r.confirmed = True
            self._emit(ProposalConfirmed(r.request_id))

    def _on_cancel(self, r: _Request, m: Cancel) -> None:
        r.peer_cancelled = True
        if m.reason is CancelReason.HASH_MISMATCH and m.entry is not None:
            self._emit(StartingHashMismatch(r.request_id, m.entry))
        elif m.reason is CancelReason.END_OF_LOG and m.seq_num is not None:
            self._emit(EndOfLogDetected(r.log, m.seq_num, reported=True))
        elif m.reason is CancelReason.FORKED and m.entry is not None and m.other_entry is not None:
            # The proof's signatures are checked (and it is recorded) by the store.
            proof = ForkProof(r.log, (m.entry, m.other_entry))
            self._write_now(proof, lambda: self._cancelled(r, m))
            return
        self._cancelled(r, m)

    def _cancelled(self, r: _Request, m: Cancel) -> None:
        self._emit(RequestCancelled(r.request_id, m.reason))
        if not r.i_cancelled:
            self._cancel(r, Cancel(r.request_id, CancelReason.CONFIRM))
        self._maybe_release(r)

    # ---- data channel

    def _backlink_expected(self) -> bool:
        r = self._requests.get(self._peer_current) if self._peer_current is not None else None
        if r is None or r.theirs >= r.seq.proposed_count:
            return False
        return self._needs_backlink(r, r.seq.piece(r.theirs)[0])

    @staticmethod
    def _needs_backlink(r: _Request, seq_num: int) -> bool:
        # Spec, data byte 128: the backlink travels if it is distinct from the lipmaa
        # link, unless its target's metadata is part of this request's data.
        return (
            seq_num > 1 and lipmaa(seq_num) != seq_num - 1 and not r.seq.has_metadata(seq_num - 1)
        )

    def _decompress(self, m: CompressedPayload) -> PayloadChunk:
        """Decompressed as soon as it is read (the backlog is shared across requests and
        must see every compressed byte); then it is payload bytes like byte 8."""
        if self._decompressor is None:
            raise CompressionViolation("compressed payload with a compression window of 0")
        if m.uncompressed_length > self.config.max_payload:
            raise PayloadSizeViolation(
                f"{m.uncompressed_length} uncompressed bytes: more than any payload we take"
            )
        return PayloadChunk(self._decompressor.decompress(m.data, m.uncompressed_length))

    def _on_data(self, m: DataMessage) -> None:
        if isinstance(m, SwitchRequest):
            if m.request_id not in self._requests:
                raise UnknownRequest(f"switch to inactive request {m.request_id}")
            self._peer_current = m.request_id
            return
        if isinstance(m, CancelMarker):
            r = self._peer_request(m.request_id, "cancellation marker for")
            if r is None:
                return
            if r.peer_marker:
                raise DataOrderViolation(f"second cancellation marker for {m.request_id}")
            r.peer_marker = True
            self._maybe_release(r)
            return
        if self._peer_current is None:
            raise DataOrderViolation("data before switching to a request")
        r = self._requests[self._peer_current]
        if r.peer_marker:
            raise DataOrderViolation("after a cancellation marker only a switch may follow")
        if not r.confirmed:
            raise DataOrderViolation(f"data for unconfirmed request {r.request_id}")
        if r.i_cancelled:
            self._discard(r, m)
            return
        if isinstance(m, Apology):
            self._on_apology(r)
            return
        if r.pending_invalid:
            raise ApologyViolation("invalid data was not apologised for")
        self._within(r, 1, "data")
        seq_num, kind = r.seq.piece(r.theirs)
        if isinstance(m, Notify):
            self._on_notify(r, m.count)
        elif isinstance(m, Metadata):
            if kind is not PieceKind.METADATA:
                raise DataOrderViolation("metadata where a payload is due")
            if r.strict is not None and not r.strict.wants_metadata():
                raise EagernessViolation("metadata sent where only notifications were asked for")
            r.their_meta = (seq_num, m.payload_size, m.payload_hash)
            self._received(r, ReceivedEntry(r.request_id, r.log, seq_num, m))
        else:
            if kind is not PieceKind.PAYLOAD:
                raise DataOrderViolation("payload data where metadata is due")
            self._on_payload_message(r, seq_num, m)

    def _discard(self, r: _Request, m: DataMessage) -> None:
        """Data the peer sent before it learnt we cancelled: follow its cursor, keep nothing."""
        self._within(r, 1, "data")
        if isinstance(m, Notify):
            self._within(r, m.count, "notify")
            self._advance(r, _PEER, m.count, _Pass.HAD)
        elif isinstance(m, Metadata):
            r.their_meta = (r.seq.piece(r.theirs)[0], m.payload_size, m.payload_hash)
            self._advance(r, _PEER, 1, _Pass.HAD)
        elif isinstance(m, PayloadChunk | SkipBytes):
            known = self._payload_size(r, r.seq.piece(r.theirs)[0])
            r.their_offset += len(m.data) if isinstance(m, PayloadChunk) else m.count
            if known is None or r.their_offset >= known[0] - self._piece_base(r, r.theirs):
                self._end_their_payload(r, _Pass.HAD)
        elif isinstance(m, SkipTooSmall | SkipTooLarge | SkipUnavailable):
            self._end_their_payload(r, _Pass.SKIPPED)
        elif isinstance(m, Apology):
            r.their_offset = 0
            if r.pending_invalid:
                self._on_apology(r)
        r.their_buffer.clear()

    @staticmethod
    def _within(r: _Request, count: int, what: str) -> None:
        """The peer's ``count`` next pieces are in the request (``what`` moves past them)."""
        if r.theirs + count > r.seq.proposed_count:
            raise RangeViolation(f"{what} past the end of the request")

    def _advance(self, r: _Request, me: bool, count: int, how: _Pass) -> int | None:
        """Move one side's cursor ``count`` pieces, ``how``; return how the other side
        passed the first of them (``None`` if it was not ahead)."""
        take = min(count, max(0, (r.theirs - r.mine) if me else (r.mine - r.theirs)))
        first = r.lead[0][0] if take else None
        left = take
        while left:
            run = r.lead[0]
            n = min(run[1], left)
            run[1] -= n
            left -= n
            if not run[1]:
                r.lead.popleft()
        if count > take:
            if r.lead and r.lead[-1][0] == how:
                r.lead[-1][1] += count - take
            else:
                r.lead.append([how, count - take])
        if me:
            r.mine += count
        else:
            r.theirs += count
        return first

    def _payload_size(self, r: _Request, seq_num: int) -> tuple[int, bytes] | None:
        """The size and hash of a payload: from the metadata the peer just sent, or what
        the store said (:class:`_Missing` when it was not asked yet)."""
        if r.their_meta is not None and r.their_meta[0] == seq_num:
            return r.their_meta[1], r.their_meta[2]
        known = self._known.get((r.log, seq_num))
        if known is not None and (known[0] is not None or known[1] == self._gen):
            return known[0]
        # Ask for the payloads ahead too: one read for many pieces.
        seq, end = r.seq, min(r.theirs + READ_PIECES, r.seq.proposed_count)
        ahead = [seq.piece(i)[0] for i in range(r.theirs, end)]
        raise _Missing(r.log, [seq_num, *ahead])

    def _notify_allowed(self, r: _Request, eager: Eagerness, piece: int) -> bool:
        seq_num, kind = r.seq.piece(piece)
        if kind is PieceKind.METADATA:
            return not eager.wants_metadata()
        known = self._payload_size(r, seq_num)
        return known is None or not eager.wants_payload(known[0])

    def _on_notify(self, r: _Request, count: int) -> None:
        if r.their_offset:
            raise DataOrderViolation("notify inside a payload")
        self._within(r, count, "notify")
        start = r.theirs
        eager = r.strict
        if eager is not None:
            # The pieces to check, before anything moves (checking may need a read):
            # those our cursor passed other than by having them, then, when we asked for
            # metadata, the rest.
            skipped: list[int] = []
            index, left = start, min(count, max(0, r.mine - start))
            for how, n in r.lead:
                if not left:
                    break
                n = min(n, left)
                if how != _Pass.HAD:
                    skipped += range(index, index + n)
                index, left = index + n, left - n
            rest = range(index, start + count) if eager.wants_metadata() else range(0)
            if rest and r.seq.metadata_pieces_between(rest.start, rest.stop):
                raise EagernessViolation("notified metadata where data was asked for")
            if not all(self._notify_allowed(r, eager, piece) for piece in skipped):
                raise EagernessViolation("notified a piece we skipped and asked for")
            # No metadata piece in the rest: one payload piece, or payloads of a
            # payload-only range (each of them is moved past by this notification).
            if not all(self._notify_allowed(r, eager, piece) for piece in rest):
                raise EagernessViolation("notified a payload where data was asked for")
        self._advance(r, _PEER, count, _Pass.HAD)

    def _received(self, r: _Request, item: ReceivedEntry | ReceivedPayload) -> None:
        """The peer's piece at its cursor is whole: write it; the cursor moves now,
        unless receiving greedily (then an invalid piece awaits an apology)."""
        r.unwritten += 1
        if self.params is not None and self.params.receive_greedy:
            self._write_now(item)
        else:
            self._end_their_payload(r, _Pass.HAD)
            self._write(item)

    def _unwritten(self, request_id: int) -> _Request | None:
        """One piece of the request is written: send a cancellation that waited for it."""
        r = self._requests.get(request_id)
        if r is not None:
            r.unwritten -= 1
            if r.deferred is not None and not r.unwritten and not r.i_cancelled:
                deferred, r.deferred, sink = r.deferred, None, self._sink
                self._sink = self._events  # after the events that came with it
                self._cancel(r, deferred)  # on an error, _written resets the sink itself
                self._sink = sink
        return r

    def _piece_written(
        self, item: ReceivedEntry | ReceivedPayload, w: Written, greedy: bool
    ) -> None:
        """What the store made of a piece the peer sent (``greedy``: written on its own,
        the peer's cursor waited for it)."""
        r = self._unwritten(item.request_id)
        outcome, log, seq_num = w.outcome, item.log, item.seq_num
        ended = r is None or r.i_cancelled
        if outcome is Outcome.SKIPPED or (outcome is Outcome.INVALID and ended):
            return  # data the peer sent after the request ended for us
        if outcome is Outcome.INVALID:
            if not greedy or r is None:
                raise InvalidData(w.detail)
            # Received greedily: the peer's cursor passes the piece, an apology must follow.
            self._leave_their_payload(r)
            r.pending_invalid = True
            r.pending_popped = self._advance(r, _PEER, 1, _Pass.PENDING)
            return
        if greedy and r is not None:
            self._end_their_payload(r, _Pass.HAD)
        if outcome is Outcome.STORED and isinstance(item, ReceivedPayload):
            self.stats.payloads_received += 1
            self._emit(PayloadReceived(log, seq_num, item.size))
        elif outcome is Outcome.UNVERIFIABLE:  # (never a payload, nor is FORK)
            self.stats.unverifiable += 1
            self._emit(EntryUnverifiable(log, seq_num))
        elif outcome is Outcome.FORK:
            assert w.proof is not None
            self._emit(LogForkDetected(log, w.proof))
            if r is not None and not r.i_cancelled:
                a, b = w.proof
                self._cancel(r, Cancel(r.request_id, CancelReason.FORKED, entry=a, other_entry=b))
        elif outcome is Outcome.STORED:
            entry = w.entry
            assert entry is not None
            self.stats.entries_received += 1
            self._emit(EntryReceived(entry))
            if is_end_of_log(entry):
                self._eol[log] = seq_num
                self._emit(EndOfLogDetected(log, seq_num, reported=False))

    def _on_apology(self, r: _Request) -> None:
        if r.pending_invalid:
            r.pending_invalid = False
            r.theirs -= 1
            if r.pending_popped is not None:
                r.lead.appendleft([r.pending_popped, 1])
            else:
                run = r.lead[-1]
                run[1] -= 1
                if not run[1]:
                    r.lead.pop()
            return
        if not r.their_offset:
            raise ApologyViolation("apology for valid data, or for nothing")
        self._leave_their_payload(r)  # an apology after a proper prefix of a payload is allowed

    def _on_payload_message(self, r: _Request, seq_num: int, m: DataMessage) -> None:
        known = self._payload_size(r, seq_num)
        if isinstance(m, SkipUnavailable):
            if r.my.mandatory:
                raise SkipViolation("skipped a mandatory payload")
            self._end_their_payload(r, _Pass.SKIPPED)
            return
        eager = r.strict
        if isinstance(m, PayloadChunk) and eager is not None and eager.mode is EagerMode.NOTIFY:
            raise EagernessViolation("payload bytes sent where only notifications were asked for")
        if isinstance(m, SkipTooSmall | SkipTooLarge):
            if r.their_offset:
                raise SkipViolation("payload skip inside a payload")
            size = None if known is None else known[0]  # None: nothing proves the skip wrong
            if size is not None and isinstance(m, SkipTooSmall) and not size < r.my.min:
                raise SkipViolation(f"payload of {size} bytes is not below the minimum {r.my.min}")
            if size is not None and isinstance(m, SkipTooLarge) and not size > r.my.max:
                raise SkipViolation(f"payload of {size} bytes is not above the maximum {r.my.max}")
            self._end_their_payload(r, _Pass.SKIPPED)
            return
        if known is None:
            raise PayloadSizeViolation(f"payload of entry {seq_num} whose metadata we lack")
        size, payload_hash = known
        # Bytes of this piece still to move (a range with an offset starts inside it).
        remaining = size - self._piece_base(r, r.theirs)
        if remaining < 0:
            raise PayloadSizeViolation(f"the offset is past the {size}-byte payload")
        if isinstance(m, SkipBytes):
            # Only to catch up with bytes we transmitted ourselves: our cursor is past.
            ahead = r.mine > r.theirs and r.lead and r.lead[0][0] == _Pass.HAD
            if not ahead or r.their_offset + m.count > remaining:
                raise SkipViolation("skipped payload bytes we did not transmit")
            r.their_offset += m.count
            r.their_skipped_bytes = True
            if r.their_offset == remaining:
                self._end_their_payload(r, _Pass.HAD)
            return
        assert isinstance(m, PayloadChunk)
        if eager is not None and not eager.wants_payload(size):
            raise EagernessViolation(f"payload of {size} bytes sent where a notification was due")
        if not r.my_loose[0] <= size <= r.my_loose[1]:
            raise PayloadSizeViolation(f"payload of {size} bytes outside the sizes asked for")
        if r.their_offset + len(m.data) > remaining:
            raise PayloadSizeViolation(f"more than the {size} payload bytes the metadata says")
        r.their_buffer += m.data
        r.their_offset += len(m.data)
        self.stats.payload_bytes_received += len(m.data)
        if r.their_offset < remaining:
            return
        if r.their_skipped_bytes:  # nothing to check against the hash, nothing kept
            self._end_their_payload(r, _Pass.HAD)
            return
        # A resumed payload (``remaining < size``): the store completes it with the prefix
        # it kept of the cut transfer (without it nothing can be checked).
        base = size - remaining
        data = bytes(r.their_buffer)
        item = ReceivedPayload(r.request_id, r.log, seq_num, size, payload_hash, data, base)
        self._received(r, item)

    @staticmethod
    def _leave_their_payload(r: _Request) -> None:
        """Forget where the peer is inside a payload (it ended, or was apologised for)."""
        r.their_offset = 0
        r.their_buffer.clear()
        r.their_skipped_bytes = False

    def _end_their_payload(self, r: _Request, how: _Pass) -> None:
        self._leave_their_payload(r)
        self._advance(r, _PEER, 1, how)

    # ------------------------------------------------------------------- sending

    def _switch_to(self, r: _Request) -> None:
        if self._my_current != r.request_id:
            self._emit_data(SwitchRequest(r.request_id))
            self._my_current = r.request_id

    def _notify(self, r: _Request, count: int) -> None:
        self._switch_to(r)
        self._pending_notify += count
        self._advance(r, _ME, count, _Pass.HAD)

    def _pump(self, limit: int) -> None:
        active = [r for _, r in sorted(self._requests.items()) if r.confirmed and not r.i_cancelled]
        if not active:
            return
        self._rotation = (self._rotation + 1) % len(active)
        for r in active[self._rotation :] + active[: self._rotation]:
            if self._data_out_size >= limit:
                return
            self._stop_at_end_of_log(r)
            self._pump_request(r, limit)
            total = r.seq.count()
            through = total < INFINITE and min(r.mine, r.theirs) >= total
            if through and not (r.their_offset or r.pending_invalid or r.i_cancelled):
                self._cancel(r, Cancel(r.request_id, CancelReason.END_OF_RANGE))

    def _stop_at_end_of_log(self, r: _Request) -> None:
        """No entry follows an end-of-log entry: a request that reaches past it (an open
        range above all) ends there, so both cursors can reach its end and it closes.

        Both sides truncate the same sequence at the same place, each once it holds the
        end-of-log entry (the receiver as soon as its metadata arrived), and what either
        sent before is a prefix of the truncated sequence (``docs/bamboo-p2p.md``,
        "Decisions", 13).
        """
        end = self._eol.get(r.log)
        if end is not None and (r.seq.limit is None or r.seq.limit > end):
            r.seq.truncate(end, None)

    def _read_ahead(self, r: _Request, index: int) -> None:
        """Read the pieces from ``index`` on (see :class:`StoreRead`), unless a read is under
        way: more than last time when the cursor passed all the last read was for, else
        a few."""
        if r.reading:
            return
        r.reading = True
        at = index - r.ahead_from
        used_up = at >= len(r.ahead)
        r.ahead_size = min(2 * r.ahead_size, READ_PIECES) if used_up else READ_FIRST
        ahead = [] if used_up or at < 0 else r.ahead[at : at + r.ahead_size]
        seq, end = r.seq, min(index + r.ahead_size, r.seq.count())
        pieces = map(seq.piece, range(index + len(ahead), end))
        ahead += [(n, k is PieceKind.PAYLOAD) for n, k in pieces]
        r.ahead_from, r.ahead = index, ahead
        read = StoreRead(r.log, [], ahead, READ_BYTES, request_id=r.request_id, gen=self._gen)
        self._todo.append(read)

    def _window_read(self, read: StoreRead, snapshot: Snapshot) -> None:
        self._learn(read.log, snapshot, gen=read.gen)
        r = self._requests.get(read.request_id) if read.request_id is not None else None
        if r is not None:
            r.window, r.payloads = snapshot.entries, snapshot.payloads
            r.window_gen, r.reading = read.gen, False

    def _piece(
        self, r: _Request, index: int
    ) -> tuple[int, bool, Entry | None, bytes | None] | None:
        """Piece ``index`` (its sequence number, whether a payload piece), and the entry and
        (for a payload piece) payload we hold of it; ``None`` while they are being read."""
        at = index - r.ahead_from
        if 0 <= at < len(r.ahead):
            seq_num, payload_piece = r.ahead[at]
        else:
            seq_num, kind = r.seq.piece(index)
            payload_piece = kind is PieceKind.PAYLOAD
        # Not in the window: not read yet (``None`` in it: read, and not in the store).
        entry = r.window.get(seq_num)
        payload = r.payloads.get(seq_num) if payload_piece else None
        unread = seq_num not in r.window or (
            payload_piece and entry is not None and seq_num not in r.payloads
        )
        # Absent when read, but the store changed since.
        stale = (entry is None or (payload_piece and payload is None)) and r.window_gen != self._gen
        if unread or stale:
            self._read_ahead(r, index)
            return None
        return seq_num, payload_piece, entry, payload

    def _pump_request(self, r: _Request, limit: int) -> None:
        peer_eager = r.peer.eager or ALL
        total = r.seq.count()
        if r.my_offset:
            # Inside a payload we began: finish it first (even past an adjusted end: the
            # peer follows it, and its cursor then moves as ours does).
            seq_num = r.seq.piece(r.mine)[0]
            payload = r.payloads.get(seq_num)
            if payload is None:
                raise LocalProtocolError(f"payload {seq_num} left the window while being sent")
            if not self._send_payload(r, payload, limit):
                return
        while self._data_out_size < limit and r.mine < total:
            g = r.mine
            if r.theirs > g:
                how, run = r.lead[0]
                if how == _Pass.HAD:
                    self._notify(r, min(run, r.theirs - g, total - g))
                    continue
                if how == _Pass.PENDING:
                    return
            elif r.theirs == g and r.their_offset:
                return  # the peer is inside this payload: let it finish
            held = self._piece(r, g)
            if held is None:
                return
            seq_num, payload_piece, entry, payload = held
            if not payload_piece:
                if entry is None:
                    return
                if not peer_eager.wants_metadata():
                    self._notify(r, 1)
                    continue
                backlink = entry.backlink if self._needs_backlink(r, seq_num) else None
                size, payload_hash = entry.payload_size, entry.payload_hash
                meta = Metadata(entry_tag(entry), backlink, size, payload_hash, entry.signature)
                self._transmit(r, meta, _Pass.HAD)
                self.stats.entries_sent += 1
                r.my_meta_sent = seq_num
            elif entry is not None and entry.payload_size < r.peer.min:
                self._transmit(r, SkipTooSmall(), _Pass.SKIPPED)
            elif entry is not None and entry.payload_size > r.peer.max:
                self._transmit(r, SkipTooLarge(), _Pass.SKIPPED)
            elif payload is None:
                if r.peer.mandatory:
                    if self.config.cancel_on_missing_mandatory:
                        self._cancel(r, Cancel(r.request_id, CancelReason.MANDATORY_PAYLOAD))
                    return
                self._transmit(r, SkipUnavailable(), _Pass.SKIPPED)
            elif not peer_eager.wants_payload(len(payload)) or (
                r.my_meta_sent != seq_num and r.theirs < g and r.seq.has_metadata(seq_num)
            ):
                # Notified, or the peer may lack the metadata (we only notified it before
                # its eagerness changed): a payload it cannot check would be useless.
                # (Payloads whose metadata is not in the request: the peer asked for
                # them, so it holds their entries, decision 15.)
                self._notify(r, 1)
            elif not self._send_payload(r, payload, limit):
                return

    def _transmit(self, r: _Request, message: DataMessage, how: _Pass) -> None:
        """Send ``message`` for the piece at our cursor, which it passes ``how``."""
        self._switch_to(r)
        self._emit_data(message)
        self._advance(r, _ME, 1, how)

    def _send_payload(self, r: _Request, payload: bytes, limit: int) -> bool:
        """Transmit the payload at our cursor from where we are, chunk by chunk, until it is
        through (cursor moved: True) or the data produced reached ``limit`` (False; the
        next call goes on from there)."""
        self._switch_to(r)
        chunk = self.config.chunk_size
        data = payload[self._piece_base(r, r.mine) :]
        if not data:
            self._emit_data(PayloadChunk(b""))
        compressor = self._compressor
        i = r.my_offset
        while i < len(data):
            if i > r.my_offset and self._data_out_size >= limit:
                r.my_offset = i
                return False
            part = data[i : i + chunk]
            self.stats.payload_bytes_sent += len(part)
            packed = compressor.compress(part) if compressor is not None else None
            if packed is not None and compressor is not None and len(packed) < len(part):
                compressor.commit(part)  # raw bytes do not join the backlog
                self._emit_data(CompressedPayload(len(part), packed))
            else:
                self._emit_data(PayloadChunk(part))
            i += len(part)
        r.my_offset = 0
        self.stats.payloads_sent += 1
        self._advance(r, _ME, 1, _Pass.HAD)
        return True


__all__ = [
    "MAX_WRITES",
    "READ_BYTES",
    "READ_FIRST",
    "READ_PIECES",
    "BambooMachine",
    "EndpointConfig",
    "EndpointStats",
]
