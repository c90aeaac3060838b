"""``store-node collection PEER ROOT`` brings both sides up to date (issue 30.2).

It used to pull only: with 10 folders edited on the node and 3 on the phone it printed
``{"changed": 13, "operations_applied": 10}`` and the 3 phone edits never reached the
node. Now the command serves its store on the connection, the node pulls back first,
and the JSON says what moved each way.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.documents import KeyPair
from store_node.collection import CollectionNodeConfig, CollectionNodeService

from .collection_fixtures import build_collection, new_sync_store, rename, views_of
from .test_collection_store_node import folder_schema_file

REPO = Path(__file__).resolve().parents[2]


async def _run_cli(phone_dir: Path, port: int, root: str, *extra: str) -> tuple[dict, str]:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "store_node.cli", "collection", f"127.0.0.1:{port}", root,
         "--config", str(phone_dir / "phone.toml"), "--no-progress", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pull_only", [False, True])
async def test_the_command_pushes_the_phones_edits_and_says_what_moved(
    tmp_path: Path, pull_only: bool
) -> None:
    node_key = KeyPair.from_private_key(bytes(range(32)))
    phone_key = KeyPair.from_private_key(bytes(range(1, 33)))
    node_dir, phone_dir = tmp_path / "node", tmp_path / "phone"
    node_dir.mkdir()
    phone_dir.mkdir()
    node_store = new_sync_store(str(node_dir / "documents.db"))
    phone = new_sync_store(str(phone_dir / "documents.db"))
    collection = build_collection([node_store, phone], node_key, 100)
    for i in range(10):
        rename([node_store], node_key, collection.documents[i * 9], f"node edit {i}")
    for i in range(3):
        rename([phone], phone_key, collection.documents[i * 9 + 4], f"phone edit {i}")
    node_store.close()
    phone.close()
    folder_schema_file(phone_dir)
    (phone_dir / "phone.toml").write_text(
        '[collection]\npath = "documents.db"\nschema_file = "schemas.json"\n'
    )

    schema = folder_schema_file(node_dir)
    node = CollectionNodeService(
        CollectionNodeConfig("127.0.0.1:0", node_dir / "documents.db", schema)
    )
    port = await node.start()
    try:
        extra = ("--pull-only",) if pull_only else ()
        summary, stderr = await _run_cli(phone_dir, port, collection.root, *extra)
        node_views = views_of(node.store, collection.root)
    finally:
        await node.close()
    phone = new_sync_store(str(phone_dir / "documents.db"))
    phone_views = views_of(phone, collection.root)
    phone.close()

    assert summary["operations_pulled"] == summary["operations_applied"] == 10
    if pull_only:
        assert summary["operations_pushed"] == 0
        assert summary["not_pushed"].startswith("--pull-only: nothing was pushed")
        assert "store-node: --pull-only: nothing was pushed" in stderr
        assert sum(node_views[d] != phone_views[d] for d in phone_views) == 3
    else:
        assert summary["operations_pushed"] == 3
        assert "not_pushed" not in summary and "store-node:" not in stderr
        # The node took the phone's edits first, so the phone saw only the node's 10.
        assert summary["changed"] == 10
        assert node_views == phone_views
