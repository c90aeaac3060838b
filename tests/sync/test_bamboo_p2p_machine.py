"""Bamboo point-to-point in the machine shape (:class:`BambooMachine`), pumped by hand:
bytes between two machines, their store requests carried out by the test
(:func:`carry`, the driver's job), a manual clock for the bounded wait (its timer)."""

from __future__ import annotations

from sdk.sync.bamboo_p2p import (
    EntryReceived,
    MemoryLogStore,
    PayloadReceived,
    RequestClosed,
    RequestStalled,
    Role,
)
from sdk.sync.bamboo_p2p.events import Event
from sdk.sync.bamboo_p2p.machine import BambooMachine
from sdk.sync.bamboo_p2p.requests import StoreRead, Write
from sdk.sync.bamboo_p2p.store import carry_out
from tests.sync.test_bamboo_p2p_streams import LOG, fill, same_entries

STALL_MS = 1000


class Side:
    """A machine, its store, the requests it made and the events it reported."""

    def __init__(self, role: Role, store: MemoryLogStore, stall_ms: float | None = None) -> None:
        self.machine = BambooMachine(role, write_limit=1 << 16, stall_timeout_ms=stall_ms)
        self.store = store
        self.requests: list[StoreRead | Write] = []
        self.events: list[Event] = []

    def carry(self, now: int) -> int:
        """Carry out the machine's requests on the store (as a driver would, off the loop)."""
        done = 0
        while (request := self.machine.next_request()) is not None:
            self.requests.append(request)
            self.machine.request_done(request, carry_out(self.store, request), now)
            done += 1
        self.drain()
        return done

    def drain(self) -> list[Event]:
        new = []
        while (event := self.machine.next_event()) is not None:
            new.append(event)
        self.events += new
        return new

    def propose(self, start: int, **options: object) -> int:
        machine = self.machine
        known = carry_out(self.store, machine.proposal_read(LOG, start, **options))
        assert not isinstance(known, list)
        return machine.propose(LOG, start, known=known, **options)  # type: ignore[arg-type]


def pump(a: Side, b: Side, now: int) -> None:
    """Carry bytes both ways, and each side's requests, until nothing moves."""
    moved = True
    while moved:
        moved = False
        for src, dst in ((a, b), (b, a)):
            moved = src.carry(now) > 0 or moved
            data = src.machine.data_to_send()
            if data:
                dst.machine.receive_data(data, now)
                moved = True


def test_two_machines_replicate_with_the_store_work_done_outside() -> None:
    server = Side(Role.REACTIVE, fill(MemoryLogStore(), 40))  # type: ignore[arg-type]
    phone = Side(Role.PROACTIVE, MemoryLogStore())
    pump(phone, server, 0)
    request_id = phone.propose(1, end=40)
    pump(phone, server, 0)
    assert phone.store.sequence_numbers(LOG) == list(range(1, 41))
    assert phone.store.payload_sequence_numbers(LOG) == list(range(1, 41))
    same_entries(phone.store, server.store, list(range(1, 41)))
    received = [e for e in phone.events if isinstance(e, EntryReceived)]
    assert [e.entry.seq_num for e in received] == list(range(1, 41))
    assert len([e for e in phone.events if isinstance(e, PayloadReceived)]) == 40
    assert RequestClosed(request_id, True) in phone.events
    # Batched: the 40 entries and payloads arrive in a few writes, are sent from a
    # few reads, not one request per piece.
    assert 0 < sum(isinstance(r, Write) for r in phone.requests) < 10
    assert 0 < sum(isinstance(r, StoreRead) for r in server.requests) < 10
    assert phone.machine.error is None and server.machine.error is None


def test_nothing_is_reported_received_nor_the_range_through_before_its_write() -> None:
    server = Side(Role.REACTIVE, fill(MemoryLogStore(), 5))  # type: ignore[arg-type]
    phone = Side(Role.PROACTIVE, MemoryLogStore())
    pump(phone, server, 0)
    phone.propose(1, end=5)
    write = None
    for _ in range(20):  # the phone's requests wait: only the server's are carried out
        server.machine.receive_data(phone.machine.data_to_send(), 0)
        server.carry(0)
        phone.machine.receive_data(server.machine.data_to_send(), 0)
        if (request := phone.machine.next_request()) is None:
            continue
        if isinstance(request, Write):
            write = request
            break
        phone.machine.request_done(request, carry_out(phone.store, request), 0)
    assert write is not None and len(write.items) == 10  # 5 entries, 5 payloads: one write
    assert phone.store.sequence_numbers(LOG) == []
    assert not any(isinstance(e, EntryReceived) for e in phone.drain())
    for _ in range(5):  # the server sees its range through only once the phone stored it
        server.machine.receive_data(phone.machine.data_to_send(), 0)
        server.carry(0)
        phone.machine.receive_data(server.machine.data_to_send(), 0)
    assert not any(isinstance(e, RequestClosed) for e in server.events)
    phone.machine.request_done(write, carry_out(phone.store, write), 0)
    assert phone.store.sequence_numbers(LOG) == [1, 2, 3, 4, 5]
    received = [e.entry.seq_num for e in phone.drain() if isinstance(e, EntryReceived)]
    assert received == [1, 2, 3, 4, 5]
    pump(phone, server, 0)
    assert any(isinstance(e, RequestClosed) for e in server.events)
    assert any(isinstance(e, RequestClosed) for e in phone.events)


def test_a_finite_request_without_progress_is_given_up_after_the_stall_timeout() -> None:
    server = Side(Role.REACTIVE, fill(MemoryLogStore(), 10))  # type: ignore[arg-type]
    phone = Side(Role.PROACTIVE, MemoryLogStore(), stall_ms=STALL_MS)
    assert server.machine.get_timer() is None
    pump(phone, server, 0)
    # The upper certificate pool of 10 reaches 13: nobody has 11..13.
    finite = phone.propose(1, end=10, upper=13)
    pump(phone, server, 0)
    assert phone.store.payload_sequence_numbers(LOG) == list(range(1, 11))

    def stalled() -> list[RequestStalled]:
        return [e for e in phone.drain() if isinstance(e, RequestStalled)]

    now = 0
    while (timer := phone.machine.get_timer()) is not None and timer < STALL_MS:
        now = timer
        phone.machine.handle_timer(now)
        assert not stalled(), now  # waiting less than the stall timeout is fine
    given_up: list[RequestStalled] = []
    while not given_up and now <= 3 * STALL_MS:
        timer = phone.machine.get_timer()
        assert timer is not None and timer > now
        now = timer
        phone.machine.handle_timer(now)
        given_up = stalled()
    assert [(e.request_id, e.seq_num) for e in given_up] == [(finite, 11)]
    assert now <= 2 * STALL_MS  # first seen stuck at the first scan, given up a timeout later
