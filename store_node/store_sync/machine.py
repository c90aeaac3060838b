"""The store-sync protocol as a sans-I/O machine (:class:`sdk.sync.machine.Machine`).

Theory of operation
-------------------
Both sides send :class:`~store_node.store_sync.wire.Hello`. The initiator opens
range-based set reconciliation (:class:`sdk.sync.rbsr.Reconciler`, the sync
layer's primitive: lifting-monoid fingerprints over XXH3) of the two archives'
sync keys; rounds go back and forth as :class:`~store_node.store_sync.wire.Ranges`
frames until neither side has a range left to ask about. As soon as a round
tells a side which keys its peer lacks, it *pushes* those messages
(:class:`~store_node.store_sync.wire.Messages`), right after its own answer in
its output, so the peer has always learned that it lacks a key before the message
arrives. This is Waku Sync's split into reconciliation and transfer, where
transfer also sends each side what the other lacks (waku-org/nwaku
``waku/waku_store_sync/reconciliation.nim`` ``processRequest`` queues
``hashToSend`` for the transfer protocol; ``transfer.nim``), run here on one
stream so a session needs no second connection.

Each Hello carries the sender's *floor*, the oldest timestamp it still syncs
(its retention cutoff or sync window; Waku Sync reconciles a sliding "sync
range" the same way); both sides reconcile only keys at or above the later of
the two floors, so a message one node has already deleted by age is neither
offered to it nor fetched back.

The machine touches neither the archive nor its index: what needs them leaves as
requests (:class:`Start`, :class:`Round`, :class:`Load`, :class:`Accept`,
:class:`Commit`), carried out in order off the event loop
(:mod:`store_node.store_sync.session`). While a request about what it read is
out, the machine reads nothing more (backpressure on the peer); pushes are
loaded only while the output is nearly written, and meanwhile the machine goes
on reading the peer's pushes, so two sides pushing more than the stream holds
never both wait.

A side that has finished reconciling and pushing sends
:class:`~store_node.store_sync.wire.Finished`; the session ends when both have,
and once everything received has been *committed* to the archive, so a session
that ends has lost nothing it was sent. The responder sends its Finished only
after the initiator's and after committing everything the initiator pushed: a
session that ends on the initiator also means the peer holds what it was sent
(done means stored). The initiator never waits for the responder's Finished
before its own, so neither waits for the other.

Received messages must be ones this side learned it lacks (their hash was a
key the peer sent): anything else is :class:`sdk.sync.errors.UnexpectedEntry`
and ends the session. Bad bytes are :class:`sdk.sync.errors.MalformedMessage`,
a bound crossed or a peer silent while we wait to read from it
:class:`sdk.sync.errors.LimitExceeded`; nothing is stored from a session beyond
what was received before the error, and what was stored is complete, validated
messages (ingest decides).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from sdk.sds.limits import DEFAULT_LIMITS
from sdk.sync import rbsr
from sdk.sync.errors import LimitExceeded, MalformedMessage, RemoteProtocolError, UnexpectedEntry
from sdk.sync.framing import FrameDecoder, encode_frame
from store_node.store_sync import wire
from transports.base import message_hash, topic_for_channel

#: Keys loaded per :class:`Load` request.
LOAD_KEYS = 500


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Bounds on what a peer can make a session hold or wait for."""

    #: One frame (checked on its length prefix).
    max_frame: int = 1024 * 1024
    #: Range messages in one reconciliation round (keys of 41 bytes each).
    max_round_messages: int = 1_000_000
    #: Seconds of silence from the peer, while we wait to read, before the session is aborted.
    idle_timeout_s: float = 60.0
    #: Largest SDS message accepted.
    max_message_size: int = DEFAULT_LIMITS.max_message_size


@dataclass(slots=True)
class SessionStats:
    """What one session did, for logs, metrics and the benchmark."""

    #: Reconciliation rounds this side sent (the initiator's count is the round trips).
    rounds_sent: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Messages pushed to the peer / received from it.
    messages_sent: int = 0
    messages_received: int = 0
    #: Raw SDS bytes inside those (the rest of the bytes is protocol overhead).
    message_bytes_sent: int = 0
    message_bytes_received: int = 0

    @property
    def overhead_bytes(self) -> int:
        """Bytes both ways that were not SDS message bytes."""
        wire_bytes = self.bytes_sent + self.bytes_received
        return wire_bytes - self.message_bytes_sent - self.message_bytes_received


# -- requests (carried out off the event loop) -----------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Open reconciliation of the keys at or above ``floor_ms``; with ``initiate``,
    also its first round. Result: a :class:`RoundResult`."""

    floor_ms: int
    initiate: bool


@dataclass(frozen=True, slots=True)
class Round:
    """Answer the peer's round (without its Terminal). Result: a :class:`RoundResult`."""

    messages: tuple[rbsr.RangeMessage, ...]


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What a reconciler step gave: the answer and the differences it found."""

    reply: list[rbsr.RangeMessage]
    #: Keys the peer lacks (to push).
    local: list[bytes]
    #: Message hashes of the keys we lack (the peer will push them).
    remote_hashes: list[bytes]
    #: The reconciler has no range left to ask about.
    finished: bool
    #: Why the peer's round could not be answered (a bad peer), if it could not.
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """Read these keys' messages from the archive. Result: ``[(channel_id, data)]``
    for those still archived (and the peer may see)."""

    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Accept:
    """Hand received ``(channel_id, data, digest)`` to ingest, in order. Result: ignored."""

    items: tuple[tuple[str, bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class Commit:
    """Wait until everything accepted is committed (once, after the peer's Finished:
    nothing more comes). Result: ignored."""


Request: TypeAlias = Start | Round | Load | Accept | Commit


class StoreSyncMachine:
    """One side of one store-sync session; see the module docstring."""

    def __init__(
        self,
        *,
        initiator: bool,
        now: int,
        floor_ms: int = 0,
        limits: SessionLimits | None = None,
    ) -> None:
        self.limits = limits or SessionLimits()
        self.stats = SessionStats()
        self.initiator = initiator
        self._floor_ms = floor_ms
        self._decoder = FrameDecoder(self.limits.max_frame)
        self._idle_ms = int(self.limits.idle_timeout_s * 1000)
        self._last_input = now
        # Room for a frame's type byte and length prefix.
        self._frame_room = self.limits.max_frame - 8
        # Hashes we learned we lack and expect the peer to push. At most about two
        # rounds' worth are outstanding (the peer pushes right after each answer).
        self._expected: set[bytes] = set()
        self._max_expected = 2 * self.limits.max_round_messages
        self._frames: deque[bytes] = deque()
        self._out = bytearray()
        self._requests: deque[Request] = deque()
        #: Requests out about what we read: nothing more is read until they are done.
        self._blocking = 0
        self._hello = False
        self._pending: list[rbsr.RangeMessage] = []
        self._reconciled = False
        self._to_push: deque[bytes] = deque()
        self._loading = False
        self._finished_sent = False
        self._peer_done = False
        self._committed = False
        #: Both Finished exchanged and everything received committed.
        self.finished = False
        #: Why the session failed.
        self.error: Exception | None = None
        self._send(wire.encode(wire.Hello(wire.VERSION, floor_ms)))

    # -- the Machine interface -----------------------------------------------------

    @property
    def wants_data(self) -> bool:
        """True while waiting for the peer (no request about what we read is out)."""
        return not (
            self.error or self.finished or self._peer_done or self._blocking or self._frames
        )

    def receive_data(self, data: bytes, now: int) -> None:
        """Take bytes read from the peer (``b""``: it closed the stream)."""
        if self.error is not None or self.finished:
            return
        if not data:
            self._fail(MalformedMessage("the peer closed the stream mid-session"))
            return
        self.stats.bytes_received += len(data)
        self._last_input = now
        self._step(lambda: self._frames.extend(self._decoder.feed(data)))

    def data_to_send(self) -> bytes:
        """The frames to write (emptying the output buffer: pushes may load again)."""
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._advance()
        return data

    def next_event(self) -> Any | None:
        """Store sync has no events: the session's outcome is :attr:`stats` or :attr:`error`."""
        return None

    def get_timer(self) -> int | None:
        """The idle deadline while we wait to read from the peer."""
        return self._last_input + self._idle_ms if self.wants_data else None

    def handle_timer(self, now: int) -> None:
        """The peer has been silent for ``idle_timeout_s``: fail."""
        timer = self.get_timer()
        if timer is not None and now >= timer:
            self._fail(LimitExceeded(f"peer silent for {self.limits.idle_timeout_s} s"))

    def next_request(self) -> Request | None:
        """The next request to carry out, or ``None``."""
        return self._requests.popleft() if self._requests else None

    def request_done(self, request: Any, result: Any, now: int) -> None:
        """Take the result of a request."""
        if not isinstance(request, Load):
            self._blocking -= 1
            self._last_input = now
        self._step(lambda: self._request_done(request, result))

    # -- internals ---------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc

    def _ask(self, request: Request) -> None:
        if not isinstance(request, Load):
            self._blocking += 1
        self._requests.append(request)

    def _send(self, message: bytes) -> None:
        """Queue one encoded message, framed."""
        data = encode_frame(message)
        self.stats.bytes_sent += len(data)
        self._out += data

    def _step(self, step: Callable[[], object]) -> None:
        """Run ``step``, handle the frames read, advance; a peer's error fails the session."""
        try:
            step()
            self._dispatch()
        except RemoteProtocolError as exc:
            self._fail(exc)
        self._advance()

    def _dispatch(self) -> None:
        """Handle the frames read, up to the first that needs a request."""
        while self._frames and not self._blocking and not self._peer_done and self.error is None:
            frame = self._frames.popleft()
            self._handle(wire.decode(frame, max_message_size=self.limits.max_message_size))

    def _handle(self, message: wire.WireMessage) -> None:
        if not self._hello:
            if not isinstance(message, wire.Hello):
                raise MalformedMessage(f"expected Hello, got {type(message).__name__}")
            if message.version != wire.VERSION:
                raise MalformedMessage(f"peer speaks store-sync version {message.version}")
            self._hello = True
            # Both sides leave out what either has given up on (the later floor).
            self._ask(Start(max(self._floor_ms, message.floor_ms), self.initiator))
        elif isinstance(message, wire.Ranges):
            if self._reconciled:
                raise MalformedMessage("a reconciliation round after the end")
            if len(self._pending) + len(message.items) > self.limits.max_round_messages:
                raise LimitExceeded(f"round longer than {self.limits.max_round_messages} messages")
            pending = self._pending
            pending.extend(message.items)
            if not isinstance(pending[-1], rbsr.Terminal):
                return
            if any(isinstance(m, rbsr.Terminal) for m in pending[:-1]):
                raise MalformedMessage("a Terminal inside a round")
            self._pending = []
            self._ask(Round(tuple(pending[:-1])))
        elif isinstance(message, wire.Messages):
            items = []
            for channel_id, data in message.items:
                digest = message_hash(topic_for_channel(channel_id), data)
                if digest not in self._expected:
                    raise UnexpectedEntry("a message whose key was not offered")
                self._expected.discard(digest)
                self.stats.messages_received += 1
                self.stats.message_bytes_received += len(data)
                items.append((channel_id, data, digest))
            self._ask(Accept(tuple(items)))
        elif isinstance(message, wire.Finished):
            if not self._reconciled:
                raise MalformedMessage("Finished before reconciliation finished")
            self._peer_done = True
            self._ask(Commit())  # the responder's Finished waits for it
        else:
            raise MalformedMessage("a second Hello")

    def _request_done(self, request: Request, result: Any) -> None:
        if isinstance(request, Start | Round):
            outcome: RoundResult = result
            if outcome.error is not None:
                raise MalformedMessage(f"reconciliation: {outcome.error}")
            if outcome.reply:  # a responder's Start has none
                for data in wire.pack(wire.Ranges(tuple(outcome.reply)), self._frame_room):
                    self._send(data)
                self.stats.rounds_sent += 1
            # After our answer: the peer learns what it lacks before it arrives.
            self._expected.update(outcome.remote_hashes)
            if len(self._expected) > self._max_expected:
                raise LimitExceeded(
                    f"more than {self._max_expected} messages outstanding from the peer"
                )
            self._to_push.extend(outcome.local)
            self._reconciled = outcome.finished
        elif isinstance(request, Load):
            self._loading = False
            for data in wire.pack(wire.Messages(tuple(result)), self._frame_room):
                self._send(data)
            self.stats.messages_sent += len(result)
            self.stats.message_bytes_sent += sum(len(data) for _, data in result)
        elif isinstance(request, Commit):
            self._committed = True

    def _advance(self) -> None:
        """Load the next pushes while the output is small; then Finished; then the end."""
        if self.error is not None or self.finished or self._loading:
            return
        if self._to_push:
            if len(self._out) < self._frame_room:
                n = min(LOAD_KEYS, len(self._to_push))
                keys = tuple(self._to_push.popleft() for _ in range(n))
                self._loading = True
                self._ask(Load(keys))
            return
        # When each side sends Finished: see the module docstring.
        done = self._reconciled if self.initiator else self._committed
        if done and not self._finished_sent:
            # Everything learned is pushed: the peer may now finish.
            self._send(wire.encode(wire.Finished()))
            self._finished_sent = True
        if self._finished_sent and self._committed:
            self.finished = True


__all__ = [
    "LOAD_KEYS",
    "Accept",
    "Commit",
    "Load",
    "Request",
    "Round",
    "RoundResult",
    "SessionLimits",
    "SessionStats",
    "Start",
    "StoreSyncMachine",
]
