"""The core-level hook: a bare MessageChannel wrapped in SealedChannel, no runtime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

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


def test_a_repair_of_another_members_message_not_remembered_is_left_out() -> None:
    # The core rebroadcasts alice's message (an SDS-R repair) from bytes the handle
    # never saw: sealing it as bob would be refused by every member, so it is not sent.
    from sdk.sds.channel import Datagram
    from sdk.sds.message import MessageKind, decode_message
    from tests.encryption.helpers import sds

    group = Group("room", ["alice", "bob"])
    bob = MessageChannel("room", "bob", NOW)
    sealed = SealedChannel(bob, group.handle("bob"))
    repair = Datagram("room", sds("alice", "a1"), "", MessageKind.CONTENT)
    bob._outbox.append(repair)
    bob.send(b"mine", NOW)
    out = sealed.datagrams_to_send()
    opener = group.handle("alice")
    assert [decode_message(opener.decrypt(d.data)).content for d in out] == [b"mine"]
    assert sealed.stats["repair_unsealed"] == 1


def test_a_sealed_message_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The handle decodes the opened message to check its sender id; the core takes
    # that decoding (receive_message) instead of decoding the same bytes again.
    import sdk.encryption.channel as handle_module
    import sdk.sds.channel as core_module

    group = Group("room", ["alice", "bob"])
    alice = SealedChannel(MessageChannel("room", "alice", NOW), group.handle("alice"))
    bob = SealedChannel(MessageChannel("room", "bob", NOW), group.handle("bob"))
    alice.core.send(b"once", NOW)
    (sealed,) = alice.datagrams_to_send()
    clear = group.handle("bob").decrypt(sealed.data)
    decoded: Counter[bytes] = Counter()

    def counting(decode: Callable[..., Any]) -> Callable[..., Any]:
        def run(data: bytes, *args: Any) -> Any:
            decoded[bytes(data)] += 1
            return decode(data, *args)

        return run

    for module in (handle_module, core_module):
        monkeypatch.setattr(module, "decode_message", counting(module.decode_message))
    bob.receive(sealed.data, NOW + 1)
    assert [e.content for e in _drain(bob) if isinstance(e, ev.MessageDelivered)] == [b"once"]
    assert decoded[clear] == 1
