"""Bamboo point-to-point in the machine shape (:class:`BambooMachine`), pumped by hand
with a manual clock: the bounded wait is its timer."""

from __future__ import annotations

from sdk.sync.bamboo_p2p import Endpoint, MemoryLogStore, RequestStalled, Role
from sdk.sync.bamboo_p2p.machine import BambooMachine
from tests.sync.test_bamboo_p2p_streams import LOG, fill

STALL_MS = 1000


def pump(a: BambooMachine, b: BambooMachine, now: int) -> None:
    """Carry bytes both ways until neither has more."""
    moved = True
    while moved:
        moved = False
        for src, dst in ((a, b), (b, a)):
            data = src.data_to_send()
            if data:
                dst.receive_data(data, now)
                moved = True


def stalled(machine: BambooMachine) -> list[RequestStalled]:
    events = []
    while (event := machine.next_event()) is not None:
        events.append(event)
    return [e for e in events if isinstance(e, RequestStalled)]


def test_a_finite_request_without_progress_is_given_up_after_the_stall_timeout() -> None:
    server, phone = fill(MemoryLogStore(), 10), MemoryLogStore()
    served = BambooMachine(
        Endpoint(Role.REACTIVE, server), write_limit=1 << 16, stall_timeout_ms=None, now=0
    )
    client = BambooMachine(
        Endpoint(Role.PROACTIVE, phone), write_limit=1 << 16, stall_timeout_ms=STALL_MS, now=0
    )
    assert served.get_timer() is None
    pump(client, served, 0)
    # The upper certificate pool of 10 reaches 13: nobody has 11..13.
    finite = client.endpoint.propose(LOG, 1, end=10, upper=13)
    pump(client, served, 0)
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 11))
    now = 0
    while (timer := client.get_timer()) is not None and timer < STALL_MS:
        now = timer
        client.handle_timer(now)
        assert not stalled(client), now  # waiting less than the stall timeout is fine
    given_up: list[RequestStalled] = []
    while not given_up and now <= 3 * STALL_MS:
        timer = client.get_timer()
        assert timer is not None and timer > now
        now = timer
        client.handle_timer(now)
        given_up = stalled(client)
    assert [(e.request_id, e.seq_num) for e in given_up] == [(finite, 11)]
    assert now <= 2 * STALL_MS  # first seen stuck at the first scan, given up a timeout later
