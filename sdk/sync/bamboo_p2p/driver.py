"""The asyncio driver of Bamboo point-to-point: one :class:`~sdk.sync.bamboo_p2p.Endpoint`
over one :class:`~transports.stream.Stream` (TCP, a libp2p stream of protocol
:data:`BAMBOO_P2P_PROTOCOL`, an in-memory pipe).

Thin on purpose: the endpoint's machine (:class:`~sdk.sync.bamboo_p2p.machine.BambooMachine`,
whose docstring says how a violation cuts the peer off, why nothing is reported
before the store's ``flush``, where backpressure goes and how a stalled finite
request is given up) runs on the one driver of every sync machine,
:class:`~sdk.sync.run.MachineRun`, and its requests are carried out on the
endpoint's store (:meth:`BambooConnection._perform` says where). This module adds
proposals and their outcomes (:meth:`BambooConnection.replicate`), the end of the
connection (a payload it cut is not lost: :meth:`BambooConnection._ended`) and the
store listener (:meth:`BambooConnection.wake`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdk.sync.bamboo_p2p import (
    CancelReason,
    Endpoint,
    EndpointConfig,
    EndpointStats,
    Event,
    LogKey,
    LogStore,
    ProposalDropped,
    RemoteProtocolError,
    RequestCancelled,
    RequestClosed,
    RequestStalled,
    Role,
)
from sdk.sync.bamboo_p2p.machine import BambooMachine
from sdk.sync.bamboo_p2p.store import carry_out
from sdk.sync.errors import ConnectionLost
from sdk.sync.run import MachineConnection, now_ms, store_step
from transports.stream import Stream

#: The libp2p protocol id to open Bamboo point-to-point streams with
#: (:meth:`transports.libp2p.Libp2pTransport.open_stream` / ``handle_streams``).
BAMBOO_P2P_PROTOCOL = "/chorus/bamboo-p2p/1"
#: Data bytes the endpoint produces per write (its backpressure unit).
WRITE_LIMIT = 256 * 1024
#: Seconds a finite request may make no progress before it is given up.
STALL_TIMEOUT = 30.0


@dataclass
class RequestOutcome:
    """How one request ended: by whom and why it was cancelled, or that it stalled."""

    request_id: int
    #: The peer's cancellation reason (``END_OF_RANGE`` for a completed range;
    #: ``CONFIRM`` when we cancelled first, e.g. we reached the end before it did).
    peer_reason: CancelReason | None = None
    stalled: RequestStalled | None = None
    #: Dropped by overlap resolution: the peer's concurrent proposal won (propose again).
    dropped: bool = False

    @property
    def complete(self) -> bool:
        """Whether the range was transferred in full (neither given up nor refused)."""
        through = (CancelReason.END_OF_RANGE, CancelReason.CONFIRM)
        return self.stalled is None and not self.dropped and self.peer_reason in through


class BambooConnection(MachineConnection[BambooMachine]):
    """Drive ``endpoint`` over ``stream`` until either side closes.

    Use as an async context manager (or :meth:`start` / :meth:`aclose`); :attr:`error`
    is the peer's violation that cut the connection, if any.
    """

    peer_errors = (RemoteProtocolError,)
    error: RemoteProtocolError | None

    def __init__(
        self,
        endpoint: Endpoint,
        stream: Stream,
        *,
        stall_timeout: float | None = STALL_TIMEOUT,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._on_event = on_event
        #: Our proposals' outcomes so far, each with the future it is handed to once the
        #: request is closed (kept until :meth:`wait_request` returned it).
        self._requests: dict[int, tuple[RequestOutcome, asyncio.Future[RequestOutcome]]] = {}
        machine = endpoint.machine
        machine.write_limit = WRITE_LIMIT
        machine.set_stall_timeout(None if stall_timeout is None else stall_timeout * 1000, now_ms())
        store: Any = endpoint.store  # a WorkerStore when it has a lock and a worker
        on_worker = None not in (getattr(store, "lock", None), getattr(store, "worker", None))
        self._step = store_step(store) if on_worker else None
        self._store_changed = False
        super().__init__(machine, stream, self._perform, on_event=self._dispatch)
        self._unlisten = endpoint.store.add_listener(self.wake)

    @property
    def stats(self) -> EndpointStats:
        """The endpoint's counters (bytes, entries and payloads each way)."""
        return self.endpoint.stats

    def wake(self) -> None:
        """The store changed: let the writer look again. The store's listener
        (``LogStore.add_listener``) calls it on every put, so whatever reaches the store
        while the connection runs (appended locally, or received on another connection)
        goes out on the peer's open ranges; safe from any thread, the machine learns on
        the loop."""
        self._store_changed = True
        super().wake()

    def _on_change(self) -> None:
        if self._store_changed:
            self._store_changed = False
            self.machine.store_changed()  # on the loop, before the run's loops look again
        super()._on_change()

    async def propose(self, log: LogKey, start: int, **options: Any) -> int:
        """Propose a range (see :meth:`Endpoint.propose`) once the peer granted credit."""
        known = await self._perform(self.machine.proposal_read(log, start, **options))
        while self.endpoint.credit < 1:  # read first: no await between this and proposing
            if self.closed.is_set():
                raise ConnectionLost("the connection closed before the peer granted credit")
            await self._wait_change()
        request_id = self.machine.propose(log, start, known=known, **options)
        done = asyncio.get_running_loop().create_future()
        self._requests[request_id] = (RequestOutcome(request_id), done)
        super().wake()
        return request_id

    async def wait_request(self, request_id: int) -> RequestOutcome:
        """Wait until our request ``request_id`` is fully cancelled (or dropped by overlap
        resolution); raise :class:`ConnectionLost` (or the peer's violation) if the
        connection ends first. Once it returned, the outcome is forgotten."""
        if request_id not in self._requests:
            raise ValueError(f"{request_id} is not a request proposed on this connection")
        done = self._requests[request_id][1]
        try:
            return await asyncio.shield(done)
        finally:
            if done.done():
                self._requests.pop(request_id, None)

    async def replicate(self, log: LogKey, start: int, **options: Any) -> RequestOutcome:
        """Propose a range and wait until it is through."""
        return await self.wait_request(await self.propose(log, start, **options))

    # -- internals ---------------------------------------------------------------------

    async def _perform(self, request: Any) -> Any:
        """Carry out a request of the machine on the store
        (:func:`~sdk.sync.bamboo_p2p.store.carry_out`): on its worker holding its lock
        when it has both (a :class:`~sdk.sync.bamboo_p2p.document_store.DocumentLogStore`:
        its document store's, shared with replication), off the event loop
        (:func:`~sdk.sync.run.store_step`); else (in memory, a bare SQLite log store) here."""
        call = functools.partial(carry_out, self.endpoint.store, request)
        return call() if self._step is None else await self._step(call)

    async def _ended(self) -> None:
        # Keep the prefix of a payload the peer was inside (:meth:`BambooMachine.connection_lost`;
        # a proposal with ``offset=resume_offset(store, log, seq)`` resumes it on the next
        # connection), and carry out what the machine still has to write: stored (and the
        # connection ended) before the peer sees the stream close.
        machine = self.machine
        machine.connection_lost()
        with contextlib.suppress(Exception):
            while (request := machine.next_request()) is not None:
                machine.request_done(request, await self._perform(request), now_ms())
        while (event := machine.next_event()) is not None:
            self._dispatch(event)
        self._finish()
        await self._close_stream()

    def _dispatch(self, event: Event) -> None:
        if self._on_event is not None:
            self._on_event(event)
        entry = self._requests.get(getattr(event, "request_id", -1))  # -1: not a request id
        if entry is None or entry[1].done():
            return  # not ours, or closed
        outcome, done = entry
        if isinstance(event, RequestCancelled):
            outcome.peer_reason = event.reason
        elif isinstance(event, RequestStalled):
            outcome.stalled = event
        elif isinstance(event, RequestClosed | ProposalDropped) and event.ours:
            outcome.dropped = isinstance(event, ProposalDropped)
            done.set_result(outcome)

    def _closing(self) -> None:
        self._unlisten()
        self._fail_waiting(
            (done for _, done in self._requests.values()),
            self.error or ConnectionLost("the connection closed"),
        )


async def serve_bamboo(
    store: LogStore,
    stream: Stream,
    config: EndpointConfig | None = None,
    *,
    stall_timeout: float | None = STALL_TIMEOUT,
    on_event: Callable[[Event], None] | None = None,
) -> BambooConnection:
    """Answer a peer (the reactive side) on ``stream`` until it closes; return the
    finished connection (its ``stats``, and ``error`` if the peer was cut off)."""
    endpoint = Endpoint(Role.REACTIVE, store, config)
    connection = BambooConnection(endpoint, stream, stall_timeout=stall_timeout, on_event=on_event)
    return await connection.until_closed()


async def replicate_range(
    store: LogStore,
    stream: Stream,
    log: LogKey,
    start: int,
    *,
    config: EndpointConfig | None = None,
    stall_timeout: float | None = STALL_TIMEOUT,
    **options: Any,
) -> RequestOutcome:
    """Connect as the proactive side, replicate one range of ``log`` into ``store``, close.

    ``options`` are :meth:`Endpoint.propose`'s (``end``, ``lower``, ``sparse``,
    ``payload_only``, ``offset``, ...). To resume a payload a cut connection left
    half-received, pass ``offset=resume_offset(store, log, seq)`` with ``start=seq``.
    """
    endpoint = Endpoint(Role.PROACTIVE, store, config)
    async with BambooConnection(endpoint, stream, stall_timeout=stall_timeout) as connection:
        return await connection.replicate(log, start, **options)


__all__ = [
    "BAMBOO_P2P_PROTOCOL",
    "STALL_TIMEOUT",
    "WRITE_LIMIT",
    "BambooConnection",
    "ConnectionLost",
    "RequestOutcome",
    "replicate_range",
    "serve_bamboo",
]
