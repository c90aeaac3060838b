"""A participant that was offline catches up its todo list from the store node.

The store node serves p2panda replication (``store_node.replication``) for the
``todo`` schema. Alice and Bob edit the list while the phone is offline (the
phone saw only the first few items); when it comes back it opens one TCP
stream to the node and catches up with set reconciliation: only the
differing logs cross the wire, every entry is validated before it is stored.
Then it stays connected in live mode and receives Bob's next edit as it is
published. Run with ``python examples/sync_catch_up.py``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

if not __package__:
    # Run as a file (`python examples/sync_catch_up.py`, from any folder): this
    # checkout's packages come first. (`python -m examples.sync_catch_up` works only in the
    # checkout's root: elsewhere `examples` is py-libp2p's package of that name.)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.documents import KeyPair, Schema
from sdk.sync import Mode, Replication, SyncConfig, SyncConnection, SyncStore
from sdk.sync.events import Phase, Progress
from store_node.replication import ReplicationConfig, ReplicationService
from transports.stream import connect_tcp

TODO = Schema.application(
    "todo", ("0020" + "42" * 32,), "A shared todo item", {"title": "str", "done": "bool"}
)


def todo_list(store: SyncStore) -> list[str]:
    return sorted(
        f"[{'x' if view.fields['done'] else ' '}] {view.fields['title']}"
        for view in store.documents(TODO.id)
    )


async def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="chorus-sync-"))
    alice, bob = KeyPair.generate(), KeyPair.generate()

    # The store node's document store; Alice and Bob published through it.
    node_store = SyncStore(str(folder / "node.db"))
    node_store.add_schema(TODO)
    phone = SyncStore(str(folder / "phone.db"))
    phone.add_schema(TODO)
    milk = node_store.create(alice, TODO.id, {"title": "milk", "done": False})
    phone.ingest(milk.entry, milk.operation)  # the phone saw this before going offline
    node_store.update(bob, milk.document_id, {"done": True})
    for title in ("bread", "eggs", "coffee"):
        node_store.create(alice, TODO.id, {"title": title, "done": False})
    print("phone before:", todo_list(phone))

    node = ReplicationService(
        ReplicationConfig(listen="127.0.0.1:0", schemas=(TODO.id,)), store=node_store
    )
    port = await node.start()

    # The phone comes back online: catch up, then stay in live mode.
    stream = await connect_tcp("127.0.0.1", port)
    replication = Replication([TODO.id], now=0, config=SyncConfig(live_mode=True))
    async with SyncConnection(replication, stream, store=phone) as connection:
        session = await connection.request([TODO.id], mode=Mode.SET_RECONCILIATION)
        async for event in connection.events():
            if isinstance(event, Progress):
                print(f"  {event.phase.value}: received {event.entries_received}")
                if event.phase in (Phase.LIVE, Phase.DONE):
                    break
        print("phone after catch-up:", todo_list(phone))
        node_store.create(bob, TODO.id, {"title": "tea", "done": False})
        for _ in range(100):
            if len(todo_list(phone)) == 5:
                break
            await asyncio.sleep(0.02)
        print("phone in live mode:", todo_list(phone))
        await connection.end_live(session)
    await node.close()
    assert len(todo_list(phone)) == 5, "the phone did not catch up"
    phone.close()


if __name__ == "__main__":
    asyncio.run(main())
