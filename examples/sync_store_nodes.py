"""Two store nodes replicate each other's documents.

Each node archives what its own clients published; node B is configured with
node A as a peer (``[replication] peers``), so on start (and every
``interval_s``) it runs a replication session with A and both end with the
same documents. The same thing from the command line: ``store-node replicate
--config a.toml`` on one side, ``store-node sync HOST:PORT --config b.toml``
(with a progress bar) on the other. Run with ``python examples/sync_store_nodes.py``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

if not __package__:
    # Run as a file (`python examples/sync_store_nodes.py`, from any folder): this
    # checkout's packages come first. (`python -m examples.sync_store_nodes` works only in the
    # checkout's root: elsewhere `examples` is py-libp2p's package of that name.)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.documents import KeyPair, Schema
from sdk.sync import SyncStore
from store_node.replication import ReplicationConfig, ReplicationService

TODO = Schema.application(
    "todo", ("0020" + "42" * 32,), "A shared todo item", {"title": "str", "done": "bool"}
)


def titles(store: SyncStore) -> list[str]:
    return sorted(str(v.fields["title"]) for v in store.documents(TODO.id))


def node_store(path: Path, author: KeyPair, items: list[str]) -> SyncStore:
    store = SyncStore(str(path))
    store.add_schema(TODO)
    for title in items:
        store.create(author, TODO.id, {"title": title, "done": False})
    return store


async def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="chorus-nodes-"))
    a = node_store(folder / "a.db", KeyPair.generate(), ["milk", "bread"])
    b = node_store(folder / "b.db", KeyPair.generate(), ["eggs"])
    print("A:", titles(a), " B:", titles(b))
    node_a = ReplicationService(
        ReplicationConfig(listen="127.0.0.1:0", schemas=(TODO.id,)), store=a
    )
    port = await node_a.start()
    node_b = ReplicationService(
        ReplicationConfig(peers=(f"127.0.0.1:{port}",), schemas=(TODO.id,), interval_s=3600),
        store=b,
    )
    done = await node_b.sync_with(f"127.0.0.1:{port}")
    print(f"B received {done.entries_received} entries, sent {done.entries_sent}")
    print("A:", titles(a), " B:", titles(b))
    assert titles(a) == titles(b)
    await node_b.close()
    await node_a.close()


if __name__ == "__main__":
    asyncio.run(main())
