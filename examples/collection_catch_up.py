"""A device catches up a collection of 1,000 linked documents after editing offline.

The store node serves collection sync (``store_node.collection``, the
``[collection]`` section of ``store-node serve``). The collection is a tree of
1,000 ``folder`` documents linked by ``relation_list`` fields from one root.
While the phone was offline, Bob renamed 20 folders and added two new ones at
the node, and the phone renamed 3 folders itself. When it comes back, one TCP
connection does the rest: the phone asks for a snapshot of the collection;
the node first pulls back the phone's own changes (the phone serves its store
on the same connection), then answers with RIBLT coded symbols from which the
phone learns, in one round trip, which of the 1,000 documents it lacks or
holds an older state of; it fetches only those. Then it listens, and hears
Bob's next edit as it is stored. Run with ``python examples/collection_catch_up.py``.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
from pathlib import Path

if not __package__:
    # Run as a file (`python examples/collection_catch_up.py`, from any folder): this
    # checkout's packages come first. (`python -m examples.collection_catch_up` works only in the
    # checkout's root: elsewhere `examples` is py-libp2p's package of that name.)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.documents import KeyPair, Schema
from sdk.documents.operation import RelationList
from sdk.sync import SyncStore
from sdk.sync.collection import connect_collection
from store_node.collection import CollectionNodeConfig, CollectionNodeService

_VIEW = "0020" + "33" * 32
FOLDER = Schema.application(
    "folder",
    (_VIEW,),
    "a folder in a linked collection",
    {"title": "str", "children": f"relation_list(folder_{_VIEW})"},
)


def title(store: SyncStore, document_id: str) -> str:
    view = store.document(document_id)
    assert view is not None
    return str(view.fields["title"])


def build_tree(node: SyncStore, phone: SyncStore, alice: KeyPair, n: int) -> list[str]:
    """n folders, folder i's children are 8i+1 ... 8i+8; both stores hold them all."""
    ids: list[str] = [""] * n
    for i in reversed(range(n)):
        children = RelationList(tuple(ids[c] for c in range(8 * i + 1, min(n, 8 * i + 9))))
        made = node.create(alice, FOLDER.id, {"title": f"folder {i}", "children": children})
        phone.ingest(made.entry, made.operation)
        ids[i] = made.document_id
    return ids


def add_folder(node: SyncStore, bob: KeyPair, parent: str, name: str) -> str:
    made = node.create(bob, FOLDER.id, {"title": name, "children": RelationList(())})
    view = node.document(parent)
    assert view is not None
    children = view.fields["children"]
    assert isinstance(children, RelationList)
    node.update(bob, parent, {"children": RelationList((*children.document_ids, made.document_id))})
    return made.document_id


async def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="chorus-collection-"))
    rng = random.Random(7)
    alice, bob, phone_key = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    node = SyncStore(str(folder / "node.db"))
    phone = SyncStore(str(folder / "phone.db"))
    for store in (node, phone):
        store.add_schema(FOLDER)
    ids = build_tree(node, phone, alice, 1000)
    root = ids[0]
    print(f"collection: {len(ids)} linked folders, both sides in sync")

    # Offline: Bob edits at the node, the phone edits its own copy.
    for i, doc in enumerate(rng.sample(ids, 20)):
        node.update(bob, doc, {"title": f"renamed by bob {i}"})
    added = [add_folder(node, bob, rng.choice(ids), f"new folder {i}") for i in range(2)]
    offline = rng.sample(ids, 3)
    offline_ops = [
        phone.update(phone_key, doc, {"title": f"renamed offline {i}"}).operation_id
        for i, doc in enumerate(offline)
    ]
    print("phone edited offline:", sorted(title(phone, d) for d in offline))

    service = CollectionNodeService(CollectionNodeConfig(listen="127.0.0.1:0"), store=node)
    port = await service.start()
    try:
        async with await connect_collection(phone, "127.0.0.1", port, serve=True) as connection:
            pulled: list[int] = []
            snapshot = await connection.snapshot(
                root, on_progress=lambda done, total: pulled.append(done)
            )
            found = snapshot.out_of_sync
            wire = connection.stats.bytes_sent + connection.stats.bytes_received
            print(
                f"out of sync: {len(found.changed)} changed, {len(found.missing)} missing "
                f"of {len(found.snapshot_keys)} documents, found in {snapshot.round_trips} "
                f"round trip(s); {snapshot.operations_applied} operations pulled; "
                f"{wire} bytes on the wire in all"
            )
            print("node has the phone's offline edits:", all(map(node.has_entry, offline_ops)))
            print("phone has the new folders:", all(phone.document(d) for d in added))

            changes = connection.listen(snapshot)
            listening = asyncio.ensure_future(anext(changes))
            while not service.service.server.listener_count:
                await asyncio.sleep(0.01)
            node.update(bob, root, {"title": "the root, renamed live"})
            async with asyncio.timeout(30):
                change = await listening
            print("phone heard:", title(phone, change.document_id), "from", change.from_peer[:8])
            await changes.aclose()
    finally:
        await service.close()

    same = all(
        (node.document(d) or phone.document(d)) and node.document(d) == phone.document(d)
        for d in [*ids, *added]
    )
    print(f"phone and node agree on all {len(ids) + len(added)} documents: {same}")
    node.close()
    phone.close()


if __name__ == "__main__":
    asyncio.run(main())
