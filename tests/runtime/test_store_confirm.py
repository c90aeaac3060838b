"""The sender checks that the store holds what it published and publishes again what it
lacks (``RuntimeOptions.store_confirm_interval``), also for messages published before
a restart. The broker-crash case that needs it runs for real in
``tests/reliability/test_broker_restart_archive.py``."""

from __future__ import annotations

from pathlib import Path

from sdk.runtime import Node, RuntimeOptions
from sdk.store.client import InMemoryStore
from tests.runtime.helpers import FAST, ArchivingTransport, Collector, eventually
from transports.memory import MemoryNetwork

#: FAST asks peers to repair after 300 ms: the store must answer sooner.
CONFIRM = RuntimeOptions(store_timeout=0.25, store_confirm_interval=0.1)


async def test_a_message_the_store_lacks_is_published_again_until_it_holds_it() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()  # nothing archives into it: the store node "missed" everything
    alice = Node(net.transport("alice"), "alice", store=store, config=FAST, options=CONFIRM)
    bob = Node(net.transport("bob"), "bob", config=FAST)
    a_room, b_room = await alice.join("room"), await bob.join("room")
    b_events = Collector(b_room)
    handle = await a_room.send(b"keep me")
    await handle.acknowledged(timeout=10)  # Bob has it: SDS is done with it
    assert await eventually(lambda: a_room.stats["store_republished"] >= 2, timeout=10)
    assert [e.content for e in b_events.delivered] == [b"keep me"]  # duplicates dropped

    data = a_room._unconfirmed[handle.message_id][1]  # the bytes it publishes again
    store.archive("room", handle.message_id, data)
    assert await eventually(lambda: a_room.stats["store_confirmed"] == 1, timeout=10)
    republished = a_room.stats["store_republished"]
    assert await eventually(lambda: not a_room._unconfirmed, timeout=1)
    await b_events.stop()
    await alice.close()
    await bob.close()
    assert a_room.stats["store_republished"] == republished


async def test_a_message_the_store_holds_is_confirmed_and_not_published_again() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()
    alice = Node(
        ArchivingTransport(net.transport("alice"), store),
        "alice",
        store=store,
        config=FAST,
        options=CONFIRM,
    )
    a_room = await alice.join("room")
    for k in range(3):
        await a_room.send(f"m{k}".encode())
    assert await eventually(lambda: a_room.stats["store_confirmed"] == 3, timeout=10)
    assert a_room.stats["store_republished"] == 0
    await alice.close()


async def test_messages_published_before_a_restart_are_checked_after_it(tmp_path: Path) -> None:
    net = MemoryNetwork()
    store = InMemoryStore()
    db = tmp_path / "alice.db"
    off = RuntimeOptions(store_timeout=0.25, store_confirm_interval=0)
    alice = Node(net.transport("alice"), "alice", store=store, db=db, config=FAST, options=off)
    a_room = await alice.join("room")
    sent = [(await a_room.send(f"m{k}".encode())).message_id for k in range(3)]
    await alice.close()
    assert len(store) == 0

    again = Node(
        ArchivingTransport(net.transport("alice-again"), store),
        "alice",
        store=store,
        db=db,
        config=FAST,
        options=CONFIRM,
    )
    room = await again.join("room")
    assert await eventually(lambda: len(store) == 3, timeout=10), room.stats
    assert len(store.lookup("room", sent)) == 3
    assert await eventually(lambda: room.stats["store_confirmed"] == 3, timeout=10)
    await again.close()
