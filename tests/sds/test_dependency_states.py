"""Issue 18: an id that has arrived is never missing or lost, and the sweep never raises.

Both repros use ``causal_history_size=1`` so every message names only the
previous one; the bugs are reachable with any history size under loss and
reordering, a small history only makes them quick to hit.
"""

from __future__ import annotations

from sdk.sds import ChannelConfig, MessageDelivered, MessageLost, MessageMissing
from tests.sds.helpers import T0, drain, make

CFG = ChannelConfig(causal_history_size=1, sync_interval_ms=0, lost_timeout_ms=60_000)


def _sent(channel_name: str, contents: list[bytes]) -> dict[bytes, tuple[str, bytes]]:
    alice = make(channel_name, CFG)
    out: dict[bytes, tuple[str, bytes]] = {}
    for i, content in enumerate(contents):
        mid = alice.send(content, T0 + i)
        (dg,) = alice.datagrams_to_send()
        out[content] = (mid, dg.data)
    return out


def test_a_held_message_is_not_missing_and_never_lost() -> None:
    # Alice sends A, B, C; Bob receives C, then B; A is lost.
    m = _sent("alice", [b"A", b"B", b"C"])
    bob = make("bob", CFG)
    bob.receive(m[b"C"][1], T0 + 10)
    assert bob.missing() == [m[b"B"][0]]
    bob.receive(m[b"B"][1], T0 + 20)
    assert bob.missing() == [m[b"A"][0]]
    assert m[b"B"][0] in bob.incoming
    assert bob.repair is not None
    assert m[b"B"][0] not in bob.repair.outgoing_requests()
    drain(bob)
    now = T0 + 20
    reported: list[str] = []
    lost: list[str] = []
    while now < T0 + 2 * CFG.lost_timeout_ms:
        now += CFG.sweep_interval_ms
        bob.handle_timer(now)
        for event in drain(bob):
            if isinstance(event, MessageMissing):
                reported.append(event.message_id)
            elif isinstance(event, MessageLost):
                lost.append(event.message_id)
    assert set(reported) == {m[b"A"][0]}
    assert lost == [m[b"A"][0]]
    assert bob.log.ids() == [m[b"B"][0], m[b"C"][0]]


def test_sweep_survives_an_id_delivered_by_an_earlier_loss_in_the_same_sweep() -> None:
    # Alice sends A, D, B, C; Bob receives D (A missing), C (B missing), then B
    # (held behind D). Declaring A lost delivers D, B and C in one sweep.
    m = _sent("alice", [b"A", b"D", b"B", b"C"])
    bob = make("bob", CFG)
    bob.receive(m[b"D"][1], T0 + 10)
    bob.receive(m[b"C"][1], T0 + 10)
    bob.receive(m[b"B"][1], T0 + 10)
    drain(bob)
    bob.handle_timer(T0 + 10 + CFG.lost_timeout_ms)  # raised KeyError in _declare_lost
    events = drain(bob)
    assert [e.message_id for e in events if isinstance(e, MessageLost)] == [m[b"A"][0]]
    delivered = [e.content for e in events if isinstance(e, MessageDelivered)]
    assert delivered == [b"D", b"B", b"C"]
    assert bob.missing() == [] and bob.lost() == {m[b"A"][0]}


def test_a_lost_id_arriving_later_is_delivered() -> None:
    m = _sent("alice", [b"A", b"B"])
    bob = make("bob", CFG)
    bob.receive(m[b"B"][1], T0 + 10)
    bob.handle_timer(T0 + 10 + CFG.lost_timeout_ms)
    assert bob.lost() == {m[b"A"][0]}
    drain(bob)
    bob.receive(m[b"A"][1], T0 + 20 + CFG.lost_timeout_ms)
    assert [e.content for e in drain(bob) if isinstance(e, MessageDelivered)] == [b"A"]
    assert bob.lost() == set() and bob.missing() == []
    assert sorted(bob.log.ids()) == sorted([m[b"A"][0], m[b"B"][0]])


def test_resends_do_not_hold_back_the_sync_message_that_carries_repair_requests() -> None:
    # Found by the state machine: participants that keep resending to each other
    # never went idle, so no sync message carried the repair requests that would
    # have unblocked them.
    from sdk.sds import RepairConfig, decode_message

    cfg = ChannelConfig(
        causal_history_size=1,
        sync_interval_ms=2_000,
        sweep_interval_ms=100,
        resend_interval_ms=1_000,
        max_resends=None,
        repair=RepairConfig(t_min_ms=200, t_max_ms=2_000),
    )
    m = _sent("carol", [b"X", b"Y"])
    alice = make("alice", cfg)
    alice.send(b"unacknowledged", T0)
    alice.receive(m[b"Y"][1], T0 + 1)  # names X, which alice never got
    alice.datagrams_to_send()
    asked = False
    now = T0
    while now < T0 + 20_000 and not asked:
        now += 100
        alice.handle_timer(now)
        for dg in alice.datagrams_to_send():
            if m[b"X"][0] in [e.message_id for e in decode_message(dg.data).repair_request]:
                asked = True
    assert asked
