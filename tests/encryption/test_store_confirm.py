"""Store confirmation on an encrypted channel: the sender asks the store for its messages
by their envelopes' hashes (a store node keys sealed messages by them), publishes again the
same envelope while the store lacks it, and stops once the store holds it."""

from __future__ import annotations

import asyncio

from sdk.runtime import Node, RuntimeOptions
from sdk.store.client import InMemoryStore
from tests.encryption.helpers import Group
from tests.runtime.helpers import FAST, Collector, eventually
from transports.base import Subscription, message_hash, topic_for_channel
from transports.memory import MemoryNetwork

CONFIRM = RuntimeOptions(store_timeout=0.25, store_confirm_interval=0.1)


async def test_a_sealed_message_the_store_lacks_is_published_again_until_it_holds_it() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()  # nothing archives into it: the store node "missed" everything
    group = Group("room", ["alice", "bob"])
    alice = Node(net.transport("alice"), "alice", store=store, config=FAST, options=CONFIRM)
    bob = Node(net.transport("bob"), "bob", config=FAST)
    handle_a = group.handle("alice")
    a_room = await alice.join("room", encryption=handle_a)
    b_room = await bob.join("room", encryption=group.handle("bob"))
    b_events = Collector(b_room)
    spy = await net.transport("spy").subscribe(topic_for_channel("room"))

    handle = await a_room.send(b"keep me")
    await handle.acknowledged(timeout=10)
    assert await eventually(lambda: a_room.stats["store_republished"] >= 2, timeout=10)
    assert [e.content for e in b_events.delivered] == [b"keep me"]  # duplicates dropped

    # What a store node archives: the envelope, under its hash (not the SDS id).
    data = a_room._unconfirmed[handle.message_id][1]
    envelope = handle_a.encrypt(data)
    digest = message_hash(topic_for_channel("room"), envelope)
    store.archive("room", digest.hex(), envelope, digest)
    assert await eventually(lambda: a_room.stats["store_confirmed"] == 1, timeout=10)
    assert await eventually(lambda: not a_room._unconfirmed, timeout=1)
    await b_events.stop()
    await alice.close()
    await bob.close()
    wire = await drain(spy)
    opener = group.handle("bob")
    copies = [w for w in wire if w and opener.decrypt(w) == data]
    # Every copy of the message is the one envelope (the store can dedupe them).
    assert len(copies) >= 3 and set(copies) == {envelope}


async def drain(subscription: Subscription) -> list[bytes]:
    """Every payload queued on ``subscription`` (until none arrives for 0.2 s)."""
    out: list[bytes] = []
    while True:
        try:
            async with asyncio.timeout(0.2):
                out.append((await anext(subscription)).payload)
        except (TimeoutError, StopAsyncIteration):
            return out
