"""p2panda replication as a :class:`~sdk.sync.machine.Machine`, for :mod:`sdk.sync.run`.

:class:`ReplicationMachine` wraps one :class:`~sdk.sync.session.Replication`
(which holds every protocol rule and takes and gives whole messages) and adds
what a stream needs, nothing more:

* framing: the peer's bytes are cut into frames (:class:`~sdk.sync.framing.FrameDecoder`;
  a frame that does not decode or is too large closes the connection), and the
  messages to send go out length-prefixed, joined into writes of up to
  :data:`WRITE_CHUNK` bytes (a catch-up's thousands of small Entry frames cost a
  write each otherwise);
* backpressure: the machine does not want data while replies to what it read wait
  to be taken (entries a session streams go out in between reads);
* the stall timer is the replication's; the end of the peer's stream, or of the
  replication, finishes the machine, after what is queued went out;
* :meth:`ReplicationMachine.close` finishes it once everything queued (entries
  of sessions included) went out.

The machine is not pure: the replication reads and writes its store in its
steps (a read's entries are checked and committed in one transaction, the
chunks to send are read), so the driver runs every step on the store's worker
holding its lock (the ``step`` hook of :class:`~sdk.sync.run.MachineRun`). It has
no requests. :attr:`ReplicationMachine.timer` and the events are taken at the
end of each step, so what the driver reads on the loop's thread is never a
structure a step is changing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from sdk.sds.varint import encode_uvarint
from sdk.sync.errors import LimitExceeded, MalformedMessage
from sdk.sync.events import SyncEvent
from sdk.sync.framing import MAX_FRAME, FrameDecoder
from sdk.sync.session import Replication

#: Bytes of frames joined into one write (and taken from the replication per step).
WRITE_CHUNK = 64 * 1024


@dataclass
class WireStats:
    """Bytes and frames a connection moved (frame prefixes included)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    frames_sent: int = 0
    frames_received: int = 0


class ReplicationMachine:
    """One replication connection in the machine shape (see the module docstring)."""

    def __init__(self, replication: Replication, *, max_frame: int = MAX_FRAME) -> None:
        self.replication = replication
        self.stats = WireStats()
        #: Replication reports its errors as events; the connection never raises one.
        self.error: Exception | None = None
        #: When the replication's stall timer is due, as of the last step.
        self.timer: int | None = replication.get_timer()
        self._decoder = FrameDecoder(max_frame)
        self._events: deque[SyncEvent] = deque()
        self._closing = False
        #: Messages taken from the replication that did not fit in the last write.
        self._queued: deque[bytes] = deque()

    @property
    def wants_data(self) -> bool:
        """Read while the replies to what was read have been taken."""
        return not (self._queued or self.replication.replies_pending)

    @property
    def finished(self) -> bool:
        """True once the replication is closed (the peer closed, it failed, or :meth:`close`)."""
        return self.replication.closed

    def close(self) -> None:
        """Finish once everything queued went out (a step: hold the store's lock)."""
        self._closing = True

    def receive_data(self, data: bytes, now: int) -> None:
        """Take the peer's bytes (``b""``: it closed): one read's entries, one transaction."""
        replication = self.replication
        self.stats.bytes_received += len(data)
        try:
            if not data:
                replication.close()
                return
            try:
                frames = self._decoder.feed(data)
            except (MalformedMessage, LimitExceeded) as exc:
                replication.fail(exc)
                return
            self.stats.frames_received += len(frames)
            replication.receive_many(frames, now)
        finally:
            self.collect()

    def data_to_send(self) -> bytes:
        """Frames of what the replication has to send, about :data:`WRITE_CHUNK` bytes."""
        replication, queued = self.replication, self._queued
        pieces: list[bytes] = []
        size = 0
        try:
            while True:
                if not queued:
                    queued.extend(replication.data_to_send())
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
                replication.close()
            self.stats.bytes_sent += size
            self.stats.frames_sent += len(pieces) // 2
            return b"".join(pieces)
        finally:
            self.collect()

    def next_event(self) -> SyncEvent | None:
        """The next event of the replication, or ``None``."""
        return self._events.popleft() if self._events else None

    def collect(self) -> None:
        """Take the replication's events and timer: at the end of every step, including
        the application's calls of the replication (``request``, ``end_live``)."""
        replication, events = self.replication, self._events
        while (event := replication.next_event()) is not None:
            events.append(event)
        self.timer = replication.get_timer()

    def get_timer(self) -> int | None:
        """When the replication's stall timer is due, or ``None``."""
        return self.timer

    def handle_timer(self, now: int) -> None:
        """Abort the sessions that waited too long."""
        try:
            self.replication.handle_timer(now)
        finally:
            self.collect()

    def next_request(self) -> Any | None:
        """None: the replication uses its store itself, inside its steps."""
        return None

    def request_done(self, request: Any, result: Any, now: int) -> None:
        """Never called: this machine makes no requests."""
        raise AssertionError("ReplicationMachine makes no requests")


__all__ = ["WRITE_CHUNK", "ReplicationMachine", "WireStats"]
