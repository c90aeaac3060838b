"""One endpoint of a Bamboo point-to-point connection over a store, synchronous.

:class:`Endpoint` is a :class:`~sdk.sync.bamboo_p2p.machine.BambooMachine` with
a :class:`~sdk.sync.bamboo_p2p.store.LogStore` beside it: every request the
machine makes is carried out on that store at once, inside the call that made it
(:func:`~sdk.sync.bamboo_p2p.store.carry_out`). So bytes go in and out as with a
plain state machine, with no driver, for tests, tools and in-memory pairs
(:mod:`.pair`); a peer's violation raises from :meth:`Endpoint.receive_data`.
The asyncio driver (:mod:`.driver`) runs the machine itself and carries its
requests out on the store's worker instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sdk.sync.bamboo_p2p.errors import LocalProtocolError, RemoteProtocolError
from sdk.sync.bamboo_p2p.events import Event, RequestStalled
from sdk.sync.bamboo_p2p.machine import BambooMachine, EndpointConfig, EndpointStats
from sdk.sync.bamboo_p2p.setup import Role, SessionParams
from sdk.sync.bamboo_p2p.store import LogKey, LogStore, carry_out

_T = TypeVar("_T")


class _Machine(Generic[_T]):
    """The machine's attribute of the same name, read through the endpoint; with
    ``settle``, a method whose requests are carried out as soon as it returns."""

    def __init__(self, *, settle: bool = False) -> None:
        self.settle = settle

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, endpoint: Any, owner: type | None = None) -> _T:
        if endpoint is None:  # read on the class (documentation tools do)
            return self  # type: ignore[return-value]
        found = getattr(endpoint.machine, self.name)
        if not self.settle:
            return found  # type: ignore[no-any-return]

        def settled(*args: Any, **kwargs: Any) -> Any:
            result = found(*args, **kwargs)
            endpoint.settle()
            return result

        return settled  # type: ignore[return-value]


class Endpoint:
    """A Bamboo machine whose requests are carried out on ``store`` at once.

    Most of its API is the machine's, read through :attr:`machine` (:class:`BambooMachine`
    documents each: same names and arguments); a method that makes requests
    (``settle=True``) returns once they are carried out.
    """

    def __init__(self, role: Role, store: LogStore, config: EndpointConfig | None = None) -> None:
        self.store = store
        #: The machine (the driver runs it; its requests go to :attr:`store`).
        self.machine = BambooMachine(role, config)

    #: Counters of the connection.
    stats: _Machine[EndpointStats] = _Machine()
    #: The negotiated session parameters, once both setups are known.
    params: _Machine[SessionParams | None] = _Machine()
    #: The peer's violation that dropped the connection, if any.
    error: _Machine[RemoteProtocolError | None] = _Machine()
    #: Proposal credit the peer granted us and we have not spent.
    credit: _Machine[int] = _Machine()
    #: The next event, or None.
    next_event: _Machine[Callable[[], Event | None]] = _Machine()
    #: Ids of the requests not yet fully cancelled.
    request_ids: _Machine[Callable[[], list[int]]] = _Machine()
    #: A read-only summary of one request.
    request_state: _Machine[Callable[[int], dict[str, object]]] = _Machine()
    #: Where an active request stands (see :meth:`BambooMachine.progress`).
    progress: _Machine[Callable[[int], tuple[int, int, int, int] | None]] = _Machine()
    #: Allow the peer ``amount`` more proposals.
    grant_credit: _Machine[Callable[[int], None]] = _Machine()
    #: Cancel a stalled request (see :meth:`BambooMachine.give_up`).
    give_up: _Machine[Callable[[int], RequestStalled | None]] = _Machine(settle=True)
    #: The connection ended: keep the prefix of every payload the peer was inside.
    connection_lost: _Machine[Callable[[], None]] = _Machine(settle=True)
    #: Adjust a request (see :meth:`BambooMachine.adjust`).
    adjust: _Machine[Callable[..., None]] = _Machine(settle=True)
    #: Confirm a peer proposal (``eagerness``: the configuration's by default).
    confirm: _Machine[Callable[..., None]] = _Machine(settle=True)
    #: Cancel a request (reason :attr:`CancelReason.DO_NOT_RETRY` by default).
    cancel: _Machine[Callable[..., None]] = _Machine(settle=True)

    def settle(self) -> bool:
        """Carry out every request the machine has; whether there was any."""
        machine, any_done = self.machine, False
        while (request := machine.next_request()) is not None:
            machine.request_done(request, carry_out(self.store, request))
            any_done = True
        return any_done

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer. Raises the peer's violation (and closes) if any."""
        machine = self.machine
        if machine.error is not None:
            raise LocalProtocolError("the connection was dropped; open a new one")
        machine.store_changed()
        machine.receive_data(data)
        self.settle()
        if machine.error is not None:
            raise machine.error

    def data_to_send(self, limit: int = 1 << 20) -> bytes:
        """Bytes to write to the peer (data up to about ``limit``): see
        :meth:`BambooMachine.data_to_send`."""
        machine = self.machine
        machine.store_changed()
        parts = [machine.data_to_send(limit)]
        while self.settle():
            parts.append(machine.data_to_send(limit))
        return b"".join(parts)

    def propose(self, log: LogKey, start: int, **options: Any) -> int:
        """Propose a range (see :meth:`BambooMachine.propose`); what it needs of the
        store is read here."""
        known = carry_out(self.store, self.machine.proposal_read(log, start, **options))
        assert not isinstance(known, list)
        request_id = self.machine.propose(log, start, known=known, **options)
        self.settle()
        return request_id


__all__ = ["Endpoint", "EndpointConfig", "EndpointStats"]
