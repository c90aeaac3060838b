"""One collection-sync connection as a sans-I/O machine (:class:`sdk.sync.machine.Machine`).

Theory of operation
-------------------
Beelay messages go one per frame (:mod:`sdk.sync.framing`) both ways; each side
may send requests, several outstanding at once, and (when it serves) answers the
other side's. The stores and the :class:`~.server.CollectionServer` stay with the
driver (:mod:`.connection`).

* :meth:`CollectionMachine.send` sends a request of the application's; its
  :class:`~.messages.Response` comes out as an event, and must come within
  ``timeout_ms`` (else :class:`~.errors.ConnectionLost`). A response to no
  outstanding request is a :class:`~.errors.CollectionProtocolError`.
* A peer's :class:`~.messages.Request` is a request for the driver (its result:
  the server's response), answered in the order they came; with ``pull_back`` a
  ``create_snapshot`` comes out as an event, answered once the application calls
  :meth:`CollectionMachine.serve`. A side that does not serve, and a request type
  Chorus does not serve, get an error response.
* The peer's notifications are taken only while listening
  (:meth:`CollectionMachine.listen`), at most ``max_pending_notifications``
  unread (one more: :class:`~.errors.LimitExceeded`, the listener fell behind).

Backpressure: the peer's requests are taken on only while the output holds less
than :data:`OUTPUT_BUDGET` bytes, and with :data:`MAX_QUEUED_REQUESTS` waiting the
machine reads nothing more, so a peer that does not read stops being read. The
one timer is the earliest request deadline or, while listening, the keepalive:
after ``keepalive_ms`` without a byte either way the machine repeats the
``listen`` request (the server answers a repeat like the first), so a listener's
idle deadline does not cut a quiet listen, and a dead peer is found within
``timeout_ms``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdk.sync.collection.errors import (
    CollectionError,
    CollectionProtocolError,
    CollectionUsageError,
    ConnectionLost,
    LimitExceeded,
    NotInSnapshot,
    RemoteProtocolError,
    UnsupportedRequest,
)
from sdk.sync.collection.messages import (
    DEFAULT_LIMITS,
    CreateSnapshotRequest,
    ErrorResponse,
    ListenRequest,
    MessageLimits,
    Notification,
    Request,
    Response,
    decode_message,
    encode_message,
)
from sdk.sync.framing import FrameDecoder, WireStats, encode_frame

#: Peer requests waiting to be answered before the machine stops reading.
MAX_QUEUED_REQUESTS = 16
#: Output bytes below which the machine takes on more work for the peer.
OUTPUT_BUDGET = 256 * 1024


@dataclass(frozen=True, slots=True)
class Drain:
    """Request: the server's queued notifications for this peer; result:
    ``(encoded notifications, whether its listener was dropped)``."""


@dataclass
class ConnectionStats(WireStats):
    """Bytes and frames a connection moved (frame prefixes included), and requests."""

    requests_sent: int = 0
    requests_served: int = 0


class CollectionMachine:
    """Collection sync over one connection; see the module docstring."""

    def __init__(
        self,
        *,
        serving: bool = False,
        pull_back: bool = False,
        limits: MessageLimits = DEFAULT_LIMITS,
        timeout_ms: int | None = 60_000,
        keepalive_ms: int | None = 120_000,
        max_pending_notifications: int = 1000,
        new_id: Callable[[], bytes] | None = None,
        now: int = 0,
    ) -> None:
        self.serving = serving
        self.pull_back = pull_back and serving
        self.limits = limits
        self.timeout_ms = timeout_ms
        self.keepalive_ms = keepalive_ms
        self.max_pending_notifications = max_pending_notifications
        self.stats = ConnectionStats()
        self._new_id = new_id or (lambda: os.urandom(16))
        self._frames = FrameDecoder(limits.max_message_bytes)
        self._out = bytearray()
        #: Outstanding requests: id -> deadline (None: none); of those, the ones whose
        #: answers are nobody's (True: a keepalive, whose refusal ends the connection).
        self._outstanding: dict[bytes, int | None] = {}
        self._quiet: dict[bytes, bool] = {}
        self._work: deque[Request | Drain] = deque()
        self._pulling_back = 0
        self._drain = False
        self._notifications: deque[Notification] = deque()
        self._events: deque[Request | Response] = deque()
        self._listening: bytes | None = None
        self._last_traffic = now
        #: True once the peer closed its side.
        self.finished = False
        self.error: CollectionError | None = None

    # -- the application's side ------------------------------------------------------------

    def send(self, request: Request, now: int) -> None:
        """Send ``request``; its :class:`Response` comes out as an event."""
        if self.error is not None or self.finished:
            raise self.error or ConnectionLost("the collection-sync connection is closed")
        if request.request_id in self._outstanding:
            raise CollectionUsageError("a request id that is already outstanding")
        deadline = None if self.timeout_ms is None else now + self.timeout_ms
        self._outstanding[request.request_id] = deadline
        self.stats.requests_sent += 1
        self._write(request, now)

    def abandon(self, request_id: bytes) -> None:
        """Nobody waits for this request's answer any more: drop it when it comes, and
        do not time out waiting for it."""
        if request_id in self._outstanding:
            self._outstanding[request_id] = None
            self._quiet.setdefault(request_id, False)

    def serve(self, request: Request) -> None:
        """Answer a request that came out as an event (pull back first) now."""
        self._pulling_back -= 1
        self._work.append(request)

    def notify(self) -> None:
        """The server may hold notifications for this peer: drain them."""
        self._drain = self.serving

    def listen(self, snapshot_id: bytes | None, now: int) -> None:
        """Accept notifications (and keep the connection alive) for the snapshot this
        side listens to (``None``: stop)."""
        self._listening = snapshot_id
        self._last_traffic = now

    def take_notification(self) -> Notification | None:
        """The oldest notification not taken yet, or ``None``."""
        return self._notifications.popleft() if self._notifications else None

    # -- the driver's side ------------------------------------------------------------------

    @property
    def wants_data(self) -> bool:
        """True while the driver should read from the peer."""
        return len(self._work) + self._pulling_back < MAX_QUEUED_REQUESTS

    def receive_data(self, data: bytes, now: int) -> None:
        """Take bytes read from the peer (``b""``: the peer closed the stream)."""
        if not data:
            self.finished = True
            return
        self._last_traffic = now
        self.stats.bytes_received += len(data)
        try:
            for frame in self._frames.feed(data):
                self.stats.frames_received += 1
                self._dispatch(frame, now)
        except RemoteProtocolError as exc:
            self._fail(exc)

    def _dispatch(self, frame: bytes, now: int) -> None:
        try:
            message = decode_message(frame, self.limits)
        except UnsupportedRequest as exc:
            message = None
            self._write(Response(exc.request_id, ErrorResponse(f"UnsupportedRequest: {exc}")), now)
        if isinstance(message, Request):
            if not self.serving:
                refusal = ErrorResponse("this peer serves nothing")
                self._write(Response(message.request_id, refusal), now)
            elif self.pull_back and isinstance(message.body, CreateSnapshotRequest):
                self._pulling_back += 1
                self._events.append(message)
            else:
                self._work.append(message)
        elif isinstance(message, Response):
            if message.request_id not in self._outstanding:
                raise CollectionProtocolError("a response to no outstanding request")
            del self._outstanding[message.request_id]
            keepalive = self._quiet.pop(message.request_id, None)
            if keepalive is None:
                self._events.append(message)
            elif keepalive and isinstance(message.body, ErrorResponse):
                raise CollectionProtocolError(f"listen refused: {message.body.message}")
        elif isinstance(message, Notification):
            if self._listening is None:
                raise NotInSnapshot("a notification while not listening")
            if len(self._notifications) >= self.max_pending_notifications:
                raise LimitExceeded(
                    f"more than {self.max_pending_notifications} notifications unread"
                )
            self._notifications.append(message)

    def data_to_send(self) -> bytes:
        """The bytes to write to the peer."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Any | None:
        """The next event (a :class:`Response`, or a ``create_snapshot`` :class:`Request`
        to pull back for: see the module docstring), or ``None``."""
        return self._events.popleft() if self._events else None

    def next_request(self) -> Request | Drain | None:
        """The next peer's :class:`Request` to answer (the result: its :class:`Response`)
        or :class:`Drain`, while the output is small."""
        if len(self._out) >= OUTPUT_BUDGET:
            return None
        if self._drain:
            self._drain = False
            return Drain()
        return self._work.popleft() if self._work else None

    def request_done(self, request: Any, result: Any, now: int) -> None:
        """The server answered a request, or gave its notifications (:class:`Drain`)."""
        if self.error is not None:
            return
        if isinstance(request, Request):
            self.stats.requests_served += 1
            self._write(result, now)
            return
        frames, dropped = result
        for data in frames:
            self._write(data, now)
        if dropped:
            self._fail(ConnectionLost("the listener fell behind and was dropped"))

    def get_timer(self) -> int | None:
        """The earliest request deadline, or the keepalive while listening."""
        deadlines = (*self._outstanding.values(), self._keepalive_at())
        return min((d for d in deadlines if d is not None), default=None)

    def handle_timer(self, now: int) -> None:
        """Fail on a request past its deadline, or repeat a quiet listen (module docstring)."""
        if any(d is not None and d <= now for d in self._outstanding.values()):
            self._fail(ConnectionLost(f"no response within {self.timeout_ms} ms"))
            return
        keepalive_at = self._keepalive_at()
        if keepalive_at is not None and now >= keepalive_at and self._listening is not None:
            request = Request(self._new_id(), ListenRequest(self._listening))
            self._quiet[request.request_id] = True
            self.send(request, now)

    def _keepalive_at(self) -> int | None:
        """When a quiet listening connection repeats its listen request, or ``None``."""
        if self._listening is None or self.keepalive_ms is None:
            return None
        return self._last_traffic + self.keepalive_ms

    # -- internals -----------------------------------------------------------------------

    def _write(self, message: Request | Response | bytes, now: int) -> None:
        frame = encode_frame(message if isinstance(message, bytes) else encode_message(message))
        self._out += frame
        self._last_traffic = max(self._last_traffic, now)
        self.stats.bytes_sent += len(frame)
        self.stats.frames_sent += 1

    def _fail(self, error: CollectionError) -> None:
        if self.error is None:
            self.error = error


__all__ = ["MAX_QUEUED_REQUESTS", "OUTPUT_BUDGET", "CollectionMachine", "ConnectionStats", "Drain"]
