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

from typing import Any

from sdk.sync.bamboo_p2p.errors import LocalProtocolError, RemoteProtocolError
from sdk.sync.bamboo_p2p.events import Event, RequestStalled
from sdk.sync.bamboo_p2p.machine import BambooMachine, EndpointConfig, EndpointStats
from sdk.sync.bamboo_p2p.messages import CancelReason, Eagerness
from sdk.sync.bamboo_p2p.setup import Role, SessionParams
from sdk.sync.bamboo_p2p.store import LogKey, LogStore, carry_out


class Endpoint:
    """A Bamboo machine whose requests are carried out on ``store`` at once."""

    def __init__(self, role: Role, store: LogStore, config: EndpointConfig | None = None) -> None:
        self.store = store
        #: The machine (the driver runs it; its requests go to :attr:`store`).
        self.machine = BambooMachine(role, config)

    @property
    def role(self) -> Role:
        """Which side of the connection this is."""
        return self.machine.role

    @property
    def config(self) -> EndpointConfig:
        """The machine's configuration."""
        return self.machine.config

    @property
    def stats(self) -> EndpointStats:
        """Counters of the connection."""
        return self.machine.stats

    @property
    def params(self) -> SessionParams | None:
        """The negotiated session parameters, once both setups are known."""
        return self.machine.params

    @property
    def closed(self) -> RemoteProtocolError | None:
        """The peer's violation that dropped the connection, if any."""
        return self.machine.closed

    @property
    def credit(self) -> int:
        """Proposal credit the peer granted us and we have not spent."""
        return self.machine.credit

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
        if machine.closed is not None:
            raise LocalProtocolError("the connection was dropped; open a new one")
        machine.store_changed()
        machine.receive_data(data)
        self.settle()
        if machine.closed is not None:
            raise machine.closed

    def data_to_send(self, limit: int = 1 << 20) -> bytes:
        """Bytes to write to the peer (data up to about ``limit``): see
        :meth:`BambooMachine.data_to_send`."""
        machine = self.machine
        machine.store_changed()
        parts = [machine.data_to_send(limit)]
        while self.settle():
            parts.append(machine.data_to_send(limit))
        return b"".join(parts)

    def next_event(self) -> Event | None:
        """The next event, or None."""
        return self.machine.next_event()

    def request_ids(self) -> list[int]:
        """Ids of the requests not yet fully cancelled."""
        return self.machine.request_ids()

    def request_state(self, request_id: int) -> dict[str, object]:
        """A read-only summary of one request."""
        return self.machine.request_state(request_id)

    def progress(self, request_id: int) -> tuple[int, int, int, int] | None:
        """Where an active request stands (see :meth:`BambooMachine.progress`)."""
        return self.machine.progress(request_id)

    def is_open_range(self, request_id: int) -> bool:
        """Whether the request follows its log live (no end)."""
        return self.machine.is_open_range(request_id)

    def give_up(self, request_id: int) -> RequestStalled | None:
        """Cancel a stalled request (see :meth:`BambooMachine.give_up`)."""
        stalled = self.machine.give_up(request_id)
        self.settle()
        return stalled

    def connection_lost(self) -> None:
        """The connection ended: keep the prefix of every payload the peer was inside."""
        self.machine.connection_lost()
        self.settle()

    def grant_credit(self, amount: int) -> None:
        """Allow the peer ``amount`` more proposals."""
        self.machine.grant_credit(amount)

    def propose(self, log: LogKey, start: int, **options: Any) -> int:
        """Propose a range (see :meth:`BambooMachine.propose`); what it needs of the
        store is read here."""
        known = carry_out(self.store, self.machine.proposal_read(log, start, **options))
        assert not isinstance(known, list)
        request_id = self.machine.propose(log, start, known=known, **options)
        self.settle()
        return request_id

    def adjust(self, request_id: int, **changes: Any) -> None:
        """Adjust a request (see :meth:`BambooMachine.adjust`)."""
        self.machine.adjust(request_id, **changes)
        self.settle()

    def confirm(self, request_id: int, eagerness: Eagerness | None = None) -> None:
        """Confirm a peer proposal."""
        self.machine.confirm(request_id, eagerness)
        self.settle()

    def cancel(self, request_id: int, reason: CancelReason = CancelReason.DO_NOT_RETRY) -> None:
        """Cancel a request."""
        self.machine.cancel(request_id, reason)
        self.settle()


__all__ = ["Endpoint", "EndpointConfig", "EndpointStats"]
