"""The store node serving collection sync: ``[collection]``, ``store-node serve``, the CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdk.documents import KeyPair
from sdk.sync.collection import connect_collection
from sdk.testing.waiting import eventually
from store_node.collection import parse_collection
from store_node.config import parse_config
from store_node.errors import ConfigError
from tests.conftest import free_port

from .collection_fixtures import FOLDER, build_collection, new_sync_store, rename, views_of
from .test_store_node import readyz

REPO = Path(__file__).resolve().parents[2]


def folder_schema_file(folder: Path) -> Path:
    path = folder / "schemas.json"
    fields = {name: str(kind) for name, kind in FOLDER.fields.items()}
    view_id = FOLDER.id.partition("_")[2]
    item = {"name": "folder", "view_id": [view_id], "description": FOLDER.description}
    path.write_text(json.dumps([{**item, "fields": fields}]))
    return path


def node_toml(folder: Path, collection_port: int, metrics_port: int = 0) -> Path:
    folder_schema_file(folder)
    path = folder / "node.toml"
    path.write_text(
        f"""
[archive]
path = "archive.db"

[grpc]
listen = "127.0.0.1:0"

[metrics]
listen = "{f"127.0.0.1:{metrics_port}" if metrics_port else ""}"

[collection]
listen = "127.0.0.1:{collection_port}"
path = "documents.db"
schema_file = "schemas.json"
"""
    )
    return path


def test_the_collection_section_is_validated(tmp_path: Path) -> None:
    config = parse_config({"collection": {"listen": "127.0.0.1:1", "max_listeners": 3}}, tmp_path)
    assert config.collection.enabled and config.collection.max_listeners == 3
    assert config.collection.path == tmp_path / "documents.db"
    assert not parse_config({}).collection.enabled
    for bad in (
        {"listen": "nowhere"},
        {"listen": 2024},
        {"max_pending_notifications": 0},
        {"max_connections": True},
        {"path": 3},
        {"typo": 1},
    ):
        with pytest.raises(ConfigError):
            parse_collection(bad, tmp_path)


async def wait_listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.2)
    raise AssertionError("store node did not start listening")


@pytest.mark.timeout(180)
async def test_store_node_serve_serves_collections_and_the_cli_catches_up(
    tmp_path: Path,
) -> None:
    key = KeyPair.from_private_key(bytes(range(32)))
    node_dir, phone_dir = tmp_path / "node", tmp_path / "phone"
    node_dir.mkdir()
    phone_dir.mkdir()
    node_store = new_sync_store(str(node_dir / "documents.db"))
    phone = new_sync_store()
    cli_store = new_sync_store(str(phone_dir / "documents.db"))
    collection = build_collection([node_store, phone, cli_store], key, 60)
    for i in range(7):
        rename([node_store], key, collection.documents[i * 8], f"edited {i}")
    expected = views_of(node_store, collection.root)
    node_store.close()
    cli_store.close()

    port, metrics_port = free_port(), free_port()
    config = node_toml(node_dir, port, metrics_port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        await wait_listening(port, proc)
        # Collection alone runs in the documents child: readiness names that child, not a
        # replication listener the node does not have.
        seen: list[tuple[int, dict[str, object]]] = []

        async def probed() -> bool:
            seen.append(await asyncio.to_thread(readyz, metrics_port))
            return seen[-1][1].get("checks", {}).get("archive_reachable") is True  # type: ignore[union-attr]

        assert await eventually(probed), seen[-1]
        assert seen[-1][0] == 200 and seen[-1][1]["checks"] == {
            "broker_connected": None,
            "archive_reachable": True,
            "documents_serving": True,
        }, seen[-1]
        async with await connect_collection(phone, "127.0.0.1", port) as connection:
            snapshot = await connection.snapshot(collection.root)
        assert (len(snapshot.out_of_sync.changed), snapshot.operations_applied) == (7, 7)
        assert views_of(phone, collection.root) == expected

        folder_schema_file(phone_dir)
        (phone_dir / "phone.toml").write_text(
            '[collection]\npath = "documents.db"\nschema_file = "schemas.json"\n'
        )
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "store_node.cli", "collection", f"127.0.0.1:{port}",
             collection.root, "--config", str(phone_dir / "phone.toml")],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["documents"] == 60 and summary["changed"] == 7
        assert summary["operations_applied"] == 7
        assert "pulling" in done.stderr  # the progress bar
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, stderr
    assert "store node stopped" in stderr
    again = new_sync_store(str(phone_dir / "documents.db"))
    assert views_of(again, collection.root) == expected
    again.close()


def test_the_cli_reports_an_unreachable_peer(tmp_path: Path) -> None:
    (tmp_path / "phone.toml").write_text('[collection]\npath = "documents.db"\n')
    done = subprocess.run(
        [sys.executable, "-m", "store_node.cli", "collection", f"127.0.0.1:{free_port()}",
         "0020" + "00" * 32, "--config", str(tmp_path / "phone.toml"), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("store-node: collection sync with")


@pytest.mark.timeout(180)
async def test_replication_and_collection_share_one_document_store(tmp_path: Path) -> None:
    """With [replication] and [collection] on one file, what a peer replicates in
    reaches the phones listening to the collection (one store, one set of listeners)."""
    from sdk.sync.driver import sync
    from transports.stream import connect_tcp

    key = KeyPair.from_private_key(bytes(range(32)))
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    node_store = new_sync_store(str(node_dir / "documents.db"))
    phone, laptop = new_sync_store(), new_sync_store()
    collection = build_collection([node_store, phone, laptop], key, 10)
    node_store.close()
    collection_port, replication_port = free_port(), free_port()
    config = node_toml(node_dir, collection_port)
    config.write_text(
        config.read_text()
        + f"""
[replication]
listen = "127.0.0.1:{replication_port}"
path = "documents.db"
schema_file = "schemas.json"
schemas = ["{FOLDER.id}"]
"""
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        await wait_listening(collection_port, proc)
        await wait_listening(replication_port, proc)
        async with await connect_collection(phone, "127.0.0.1", collection_port) as connection:
            snapshot = await connection.snapshot(collection.root)
            changes = connection.listen(snapshot).__aiter__()
            listening = asyncio.ensure_future(changes.__anext__())
            # The node answered the listen request: it is registered.
            assert await eventually(lambda: getattr(connection._listener, "accepted", False))
            edited = collection.documents[3]
            rename([laptop], key, edited, "edited on the laptop")
            done = await sync(laptop, await connect_tcp("127.0.0.1", replication_port), [FOLDER.id])
            assert done.entries_sent >= 1
            async with asyncio.timeout(30):
                change = await listening
            assert change.document_id == edited
            await changes.aclose()
        assert views_of(phone, collection.root) == views_of(laptop, collection.root)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, stderr
