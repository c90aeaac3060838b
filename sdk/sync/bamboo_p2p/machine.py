"""Bamboo point-to-point as a :class:`~sdk.sync.machine.Machine`, for :mod:`sdk.sync.run`.

:class:`BambooMachine` wraps one :class:`~sdk.sync.bamboo_p2p.Endpoint` (which holds
every protocol rule) and adds the driver's policy, nothing more:

* after each batch of the peer's bytes the store is flushed before any event of
  that batch comes out, so nothing is reported received before it is durable;
* a violation by the peer is the machine's :attr:`~BambooMachine.error` (the
  driver cuts the peer off);
* the end of the peer's stream is a normal close (:attr:`~BambooMachine.finished`);
* output is taken ``write_limit`` bytes of data at a time (the endpoint makes no
  more while the last is being written: backpressure);
* bounded wait, as the machine's timer: every quarter of ``stall_timeout_ms`` the
  finite requests are scanned, and one whose cursors have not moved for
  ``stall_timeout_ms`` is given up (:meth:`Endpoint.give_up
  <sdk.sync.bamboo_p2p.endpoint.Endpoint.give_up>`). Open ranges wait.

The machine is not pure: the endpoint reads and writes its store in its steps,
which the driver therefore runs where the store must be used (the ``step`` hook
of :func:`sdk.sync.run.run_machine`). It has no requests.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from sdk.sync.bamboo_p2p.endpoint import Endpoint
from sdk.sync.bamboo_p2p.errors import RemoteProtocolError
from sdk.sync.bamboo_p2p.events import Event


class BambooMachine:
    """One Bamboo point-to-point connection in the machine shape (see the module docstring)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        write_limit: int,
        stall_timeout_ms: float | None,
        now: int,
    ) -> None:
        self.endpoint = endpoint
        #: The peer's violation that cut the connection, if any.
        self.error: RemoteProtocolError | None = None
        self._write_limit = write_limit
        self._stall_timeout = stall_timeout_ms
        self._scan_every = None if stall_timeout_ms is None else max(1, int(stall_timeout_ms / 4))
        self._next_scan = None if self._scan_every is None else now + self._scan_every
        #: Each finite request's last progress and when (ms) it was first seen there.
        self._seen: dict[int, tuple[tuple[int, int, int, int], int]] = {}
        self._events: deque[Event] = deque()
        self._eof = False

    @property
    def wants_data(self) -> bool:
        """Always: the endpoint takes what comes (it is cut off on a violation)."""
        return True

    @property
    def finished(self) -> bool:
        """True once the peer closed its stream."""
        return self._eof

    def receive_data(self, data: bytes, now: int) -> None:
        """Feed the peer's bytes to the endpoint and flush the store (``b""``: closed)."""
        if not data:
            self._eof = True
            return
        try:
            self.endpoint.receive_data(data)
        except RemoteProtocolError as exc:
            self.error = exc
        finally:
            try:
                self.endpoint.store.flush()
            finally:
                self.collect()

    def data_to_send(self) -> bytes:
        """The endpoint's next output (data up to ``write_limit``); nothing once closed."""
        if self._eof or self.error is not None:
            return b""
        try:
            return self.endpoint.data_to_send(self._write_limit)
        finally:
            self.collect()

    def next_event(self) -> Event | None:
        """The next event the endpoint emitted in a step, or ``None``."""
        return self._events.popleft() if self._events else None

    def collect(self) -> None:
        """Keep the events the endpoint emitted; call after using the endpoint directly
        (``propose``, ``connection_lost``), in the same step."""
        endpoint, events = self.endpoint, self._events
        while (event := endpoint.next_event()) is not None:
            events.append(event)

    def get_timer(self) -> int | None:
        """When the next stall scan is due, or ``None`` without a stall timeout."""
        return self._next_scan

    def handle_timer(self, now: int) -> None:
        """Scan for stalled requests, give them up, and set the next scan."""
        if self._next_scan is None or self._scan_every is None or now < self._next_scan:
            return
        self._next_scan = now + self._scan_every
        try:
            self._scan(now)
        finally:
            self.collect()

    def _scan(self, now: int) -> None:
        endpoint, seen, timeout = self.endpoint, self._seen, self._stall_timeout
        assert timeout is not None
        ids = endpoint.request_ids()
        for request_id in ids:
            progress = endpoint.progress(request_id)
            if progress is None or endpoint.is_open_range(request_id):
                continue
            last = seen.get(request_id)
            if last is None or last[0] != progress:
                seen[request_id] = (progress, now)
            elif now - last[1] >= timeout:
                endpoint.give_up(request_id)
        for request_id in set(seen) - set(ids):
            del seen[request_id]

    def next_request(self) -> Any | None:
        """None: the endpoint uses its store itself, inside its steps."""
        return None

    def request_done(self, request: Any, result: Any, now: int) -> None:
        """Never called: this machine makes no requests."""
        raise AssertionError("BambooMachine makes no requests")


__all__ = ["BambooMachine"]
