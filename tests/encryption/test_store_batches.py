"""What the store returns on an encrypted channel (a catch-up page, fetched missing
messages) is opened as one batch, its signatures checked on a worker thread, with the
same outcome as opening each envelope alone (``docs/encryption.md``, "Costs")."""

from __future__ import annotations

from sdk.encryption import DecryptionFailed
from sdk.encryption._wire import channel_bytes
from sdk.encryption.envelope import seal
from sdk.runtime import Node, RuntimeOptions
from sdk.sds.message import HistoryEntry, Message, encode_message
from sdk.store.client import InMemoryStore
from tests.encryption.helpers import Group, sds
from tests.runtime.helpers import FAST, Collector, eventually
from transports.base import message_hash, topic_for_channel
from transports.memory import MemoryNetwork

TOPIC = topic_for_channel("room")
OPTIONS = RuntimeOptions(store_timeout=0.25)


def _archive(store: InMemoryStore, envelope: bytes) -> bytes:
    """Archive ``envelope`` as a store node does (under its transport hash); return it."""
    digest = message_hash(TOPIC, envelope)
    store.archive("room", digest.hex(), envelope, digest)
    return digest


async def test_a_catch_up_page_is_opened_as_a_batch() -> None:
    group = Group("room", ["alice", "bob"])
    alice = group.handle("alice")
    store = InMemoryStore()
    bad: dict[int, str] = {}
    for i in range(24):
        if i == 7:  # sealed as bob (the seal opens), signed by alice
            bob_index = group.epoch.index_of("bob")
            assert bob_index is not None
            envelope = seal(
                channel_bytes("room"),
                group.epoch,
                bob_index,
                group.ids["alice"],
                sds("bob", "f"),
                1,
            )
            bad[i] = "forged_signature"
        elif i == 15:
            tampered = bytearray(alice.encrypt(sds("alice", "t")))
            tampered[40] ^= 1
            envelope = bytes(tampered)
            bad[i] = "authentication"
        else:
            envelope = alice.encrypt(sds("alice", f"m{i:02d}", content=f"text {i}".encode()))
        _archive(store, envelope)
    bob = Node(MemoryNetwork().transport("bob"), "bob", store=store, config=FAST, options=OPTIONS)
    room = await bob.join("room", encryption=group.handle("bob"))
    events = Collector(room)
    try:
        assert await room.catch_up(since=0) == 24
        good = [i for i in range(24) if i not in bad]
        assert await eventually(lambda: len(events.delivered) == len(good))
        assert sorted(d.content for d in events.delivered) == sorted(
            f"text {i}".encode() for i in good
        )
        failures = [e for e in events.events if isinstance(e, DecryptionFailed)]
        assert sorted(f.reason for f in failures) == sorted(bad.values())
        assert room.counters["batches_opened"] == 1  # the page, in one hand-over
    finally:
        await events.stop()
        await bob.close()


async def test_missing_messages_fetched_from_the_store_are_opened_as_a_batch() -> None:
    group = Group("room", ["alice", "bob"])
    alice = group.handle("alice")
    store = InMemoryStore()
    history = []
    for i in range(6):
        envelope = alice.encrypt(
            encode_message(Message("alice", f"old{i}", "room", 1 + i, content=f"old {i}".encode()))
        )
        history.append(HistoryEntry(f"old{i}", _archive(store, envelope)))
    last = alice.encrypt(
        encode_message(Message("alice", "last", "room", 10, tuple(history), content=b"last"))
    )
    net = MemoryNetwork()
    bob = Node(net.transport("bob"), "bob", store=store, config=FAST, options=OPTIONS)
    room = await bob.join("room", encryption=group.handle("bob"))
    events = Collector(room)
    try:
        await net.transport("alice").publish(TOPIC, last)
        assert await eventually(lambda: len(events.delivered) == 7)
        assert [d.content for d in events.delivered][-1] == b"last"
        assert room.stats["store_retrieved"] == 6
        assert room.counters["batches_opened"] >= 1  # fetched together, one hand-over each
    finally:
        await events.stop()
        await bob.close()
