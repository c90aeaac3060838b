"""SDS-R repair of an old message on an encrypted channel: the repairer sends the envelope
the message arrived in (its sender's signature), kept on disk, even once its handle has
forgotten it; a member never seals another member's message as its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk.encryption import DecryptionFailed, NotOurMessage
from sdk.runtime import Node
from tests.encryption.helpers import Group, sds
from tests.runtime.helpers import FAST, Collector, eventually
from transports.memory import MemoryNetwork


async def test_a_late_member_gets_an_old_message_repaired_from_disk(tmp_path: Path) -> None:
    net = MemoryNetwork()
    group = Group("room", ["alice", "bob", "carol"])
    alice = Node(net.transport("alice"), "alice", config=FAST)
    a_room = await alice.join("room", encryption=group.handle("alice"))
    bob = Node(net.transport("bob"), "bob", config=FAST, db=tmp_path / "bob.db")
    b_room = await bob.join("room", encryption=group.handle("bob"))
    b_events = Collector(b_room)
    await (await a_room.send(b"old news")).acknowledged(timeout=10)
    assert await eventually(lambda: [d.content for d in b_events.delivered] == [b"old news"])
    await b_events.stop()
    await alice.close()  # the sender is gone: only bob can repair its message
    await bob.close()

    # bob again, with a new handle: it remembers no envelope, its database does.
    bob = Node(net.transport("bob-again"), "bob", config=FAST, db=tmp_path / "bob.db")
    b_room = await bob.join("room", encryption=group.handle("bob"))
    carol = Node(net.transport("carol"), "carol", config=FAST)
    c_room = await carol.join("room", encryption=group.handle("carol"))
    c_events = Collector(c_room)
    try:
        await b_room.send(b"did you see that?")  # its causal history names alice's message
        assert await eventually(
            lambda: (
                sorted(d.content for d in c_events.delivered) == [b"did you see that?", b"old news"]
            ),
            timeout=20,
        )
        old = next(d for d in c_events.delivered if d.content == b"old news")
        assert old.sender_id == "alice"
        # bob answered carol's repair (SDS-R, or its chain request for what the
        # history names) from disk, with alice's envelope.
        assert b_room.stats["repairs_sent"] + b_room.stats["rebroadcast_chain"] >= 1
        assert b_room.counters["repair_unsealed"] == 0
        assert not [e for e in c_events.events if isinstance(e, DecryptionFailed)]
    finally:
        await c_events.stop()
        await carol.close()
        await bob.close()


def test_a_member_does_not_seal_another_members_message() -> None:
    group = Group("room", ["alice", "bob"])
    bob = group.handle("bob")
    with pytest.raises(NotOurMessage) as info:
        bob.encrypt(sds("alice", "m1"))
    assert (info.value.sender_id, info.value.message_id) == ("alice", "m1")
    # Once it arrived in alice's envelope, that envelope is what bob sends.
    envelope = group.handle("alice").encrypt(sds("alice", "m1"))
    assert bob.decrypt(envelope) == sds("alice", "m1")
    assert bob.encrypt(sds("alice", "m1")) == envelope
    # What bob keeps on disk rebuilds alice's envelope byte for byte, in a new handle too.
    record = bob.seal_record(sds("alice", "m1"))
    assert record is not None and len(record) == 103
    assert group.handle("bob").envelope_from(sds("alice", "m1"), record) == envelope
    assert bob.seal_record(sds("bob", "m2")) is None


def test_a_seal_record_comes_from_the_open_that_checked_the_envelope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = Group("room", ["alice", "bob"])
    alice, bob = group.handle("alice"), group.handle("bob")
    lone = alice.encrypt(sds("alice", "m1"))
    batched = [alice.encrypt(sds("alice", f"b{i}")) for i in range(4)]
    assert bob.decrypt(lone) == sds("alice", "m1")
    assert bob.open_batch(batched).results() == [sds("alice", f"b{i}") for i in range(4)]

    # The record is what the first open found: no second AEAD open per received message.
    def no_second_open(*args: object) -> None:
        raise AssertionError("seal_record opened the envelope again")

    monkeypatch.setattr("sdk.encryption.envelope.aead_open", no_second_open)
    for mid, envelope in [("m1", lone)] + [(f"b{i}", e) for i, e in enumerate(batched)]:
        record = bob.seal_record(sds("alice", mid))
        assert record is not None
        assert group.handle("bob").envelope_from(sds("alice", mid), record) == envelope
