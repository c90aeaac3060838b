"""The store-sync machine without a driver: time passed in by hand."""

from __future__ import annotations

import pytest

from sdk.sync.errors import LimitExceeded
from store_node.store_sync.machine import RoundResult, SessionLimits, Start, StoreSyncMachine


def test_the_idle_timer_runs_only_while_the_machine_waits_for_the_peer() -> None:
    machine = StoreSyncMachine(initiator=False, now=1000, limits=SessionLimits(idle_timeout_s=1))
    assert machine.get_timer() == 2000
    hello = machine.data_to_send()  # ours, sent at creation
    assert hello
    machine.receive_data(hello, 1500)  # the peer's Hello is the same bytes
    request = machine.next_request()
    assert request == Start(0, False)
    # Reconciliation is being opened off the loop: the peer is not being waited for.
    assert not machine.wants_data and machine.get_timer() is None
    machine.handle_timer(10_000)
    assert machine.error is None
    machine.request_done(request, RoundResult([], [], [], False), 1700)
    assert machine.wants_data and machine.get_timer() == 2700
    machine.handle_timer(2699)
    assert machine.error is None
    machine.handle_timer(2700)
    assert isinstance(machine.error, LimitExceeded)
    assert not machine.wants_data and machine.get_timer() is None


def test_a_peer_closing_mid_session_is_an_error() -> None:
    machine = StoreSyncMachine(initiator=True, now=0)
    machine.receive_data(b"", 5)
    with pytest.raises(Exception, match="closed the stream"):
        raise machine.error  # type: ignore[misc]
