"""Issue 20, item 1: acknowledgement thresholds that fit the group.

Measured before the fix (COMPACT, no loss, a fast sender and peers replying
every 10th message): with 2 participants most messages expired although the
peer delivered every one, with 3 about half.
"""

from __future__ import annotations

import pytest

from sdk.sds import COMPACT, ChannelConfig, MessageChannel, MessageSendExpired
from tests.sds.helpers import T0, drain, make

CFG = ChannelConfig(bloom=COMPACT)


def _chat(participants: int, messages: int) -> tuple[MessageChannel, int, int]:
    """One fast sender, the others reply to every 10th message; no loss.

    Returns the sender, its expired count and its resend count.
    """
    sender = make("sender", CFG)
    peers = [make(f"peer{i}", CFG) for i in range(participants - 1)]
    group = [sender, *peers]
    now = T0
    expired = 0

    def pump() -> None:
        nonlocal expired
        for src in group:
            for dg in src.datagrams_to_send():
                for dst in group:
                    if dst is not src:
                        dst.receive(dg.data, now)
        for ch in group:
            for event in drain(ch):
                if ch is sender and isinstance(event, MessageSendExpired):
                    expired += 1

    def tick(until: int) -> None:
        nonlocal now
        while now < until:
            now += 100
            for ch in group:
                timer = ch.get_timer()
                if timer is not None and timer <= now:
                    ch.handle_timer(now)
            pump()

    for i in range(messages):
        sender.send(f"m{i}".encode(), now)
        pump()
        if i % 10 == 9:
            for peer in peers:
                peer.send(f"reply to m{i}".encode(), now)
            pump()
        tick(now + 20)
    tick(now + 15 * 60_000)
    return sender, expired, sender.stats["resent"]


@pytest.mark.parametrize("participants", [2, 3])
def test_no_false_expiry_in_small_groups(participants: int) -> None:
    sender, expired, resent = _chat(participants, 1_500)
    assert expired == 0
    assert len(sender.outgoing) == 0
    assert resent < 1_500 // 10


def test_a_resent_duplicate_is_added_to_the_filter_again() -> None:
    alice, bob = make("alice", CFG), make("bob", CFG)
    first = alice.send(b"first", T0)
    (dg,) = alice.datagrams_to_send()
    bob.receive(dg.data, T0)
    for i in range(COMPACT.capacity):  # roll ``first`` out of bob's filter
        bob.bloom.insert(f"other {i}")
    assert first not in bob.bloom
    bob.receive(dg.data, T0 + 1)  # the resend: a duplicate
    assert first in bob.bloom
