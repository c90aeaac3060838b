"""The core-level hook: a bare MessageChannel wrapped in SealedChannel, no runtime."""

from __future__ import annotations

from sdk.encryption import DecryptionFailed, SealedChannel
from sdk.sds import MessageChannel
from sdk.sds import events as ev
from tests.encryption.helpers import Group

NOW = 1_700_000_000_000


def _drain(channel: SealedChannel) -> list[ev.Event]:
    out = []
    while (event := channel.next_event()) is not None:
        out.append(event)
    return out


def test_sealed_datagrams_deliver_and_garbage_is_an_event() -> None:
    group = Group("room", ["alice", "bob"])
    alice = SealedChannel(MessageChannel("room", "alice", NOW), group.handle("alice"))
    bob = SealedChannel(MessageChannel("room", "bob", NOW), group.handle("bob"))
    alice.core.send(b"sealed hello", NOW)
    datagrams = alice.datagrams_to_send()
    assert datagrams and all(b"sealed hello" not in d.data for d in datagrams)
    bob.receive(b"not an envelope at all, long enough to have a header and a tag....", NOW)
    for d in datagrams:
        bob.receive(d.data, NOW + 1)
    events = _drain(bob)
    assert isinstance(events[0], DecryptionFailed) and events[0].reason == "malformed"
    delivered = [e for e in events if isinstance(e, ev.MessageDelivered)]
    assert [(e.sender_id, e.content) for e in delivered] == [("alice", b"sealed hello")]
    assert bob.stats["decrypt_failed.malformed"] == 1
    assert len(bob.core.log) == 1
