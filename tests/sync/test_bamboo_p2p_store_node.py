"""The store node serving Bamboo point-to-point: its config section, and a client
syncing a log from a running ``store-node serve`` over TCP, then a clean shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import Endpoint, Role, SqliteLogStore, append_entry, lower_pool
from sdk.sync.bamboo_p2p.driver import BambooConnection, replicate_range
from store_node.bamboo_p2p import BambooP2PService, parse_bamboo_p2p
from store_node.config import parse_config
from store_node.errors import ConfigError
from tests.conftest import free_port
from transports.stream import connect_tcp

REPO = Path(__file__).resolve().parents[2]
KEY = KeyPair.from_private_key(bytes(range(32)))
LOG = (KEY.public_key, 0)


def test_bamboo_p2p_section_is_validated(tmp_path: Path) -> None:
    config = parse_config({"bamboo_p2p": {"listen": "127.0.0.1:0"}}, tmp_path).bamboo_p2p
    assert config.enabled and config.path == tmp_path / "bamboo.db"
    assert (config.initial_credit, config.stall_timeout_s) == (16, 30.0)
    assert not parse_config({}).bamboo_p2p.enabled
    for bad in (
        {"listen": "nowhere"},
        {"listen": 2024},
        {"listen": "127.0.0.1:1", "initial_credit": 0},
        {"listen": "127.0.0.1:1", "initial_credit": True},
        {"listen": "127.0.0.1:1", "stall_timeout_s": 0},
        {"listen": "127.0.0.1:1", "stall_timeout_s": float("inf")},
        {"listen": "127.0.0.1:1", "path": ""},
        {"listen": "127.0.0.1:1", "path": "no/such/folder/bamboo.db"},
        {"lisen": "127.0.0.1:1"},
    ):
        with pytest.raises(ConfigError):
            parse_bamboo_p2p(bad, tmp_path)
    with pytest.raises(ConfigError):
        parse_bamboo_p2p([], tmp_path)


def served_log(path: Path, n: int) -> SqliteLogStore:
    store = SqliteLogStore(str(path))
    for i in range(n):
        append_entry(store, KEY, 0, b"archived entry %d" % i)
    store.flush()
    return store


async def test_the_service_serves_and_closes_with_a_client_connected(tmp_path: Path) -> None:
    served_log(tmp_path / "bamboo.db", 20).close()
    service = BambooP2PService(parse_bamboo_p2p({"listen": "127.0.0.1:0"}, tmp_path))
    port = await service.start()
    phone = SqliteLogStore(":memory:")
    outcome = await replicate_range(phone, await connect_tcp("127.0.0.1", port), LOG, 1, end=20)
    assert outcome.complete
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 21))
    idle = await connect_tcp("127.0.0.1", port)  # a client that never speaks
    await asyncio.sleep(0)
    await service.close()
    while await idle.read():  # the node's setup and credit, then the end of the stream
        pass
    await idle.close()
    assert service.store is None


async def test_what_one_client_brings_reaches_another_clients_open_range(tmp_path: Path) -> None:
    service = BambooP2PService(parse_bamboo_p2p({"listen": "127.0.0.1:0"}, tmp_path))
    port = await service.start()
    try:
        follower_store = SqliteLogStore(":memory:")
        follower = BambooConnection(
            Endpoint(Role.PROACTIVE, follower_store), await connect_tcp("127.0.0.1", port)
        )
        async with follower:
            live = await follower.propose(LOG, 1)  # the node has nothing of this log yet
            author = served_log(tmp_path / "author.db", 12)
            pushed = await replicate_range(
                author, await connect_tcp("127.0.0.1", port), LOG, 1, end=12
            )
            assert pushed.complete
            while len(follower_store.payload_sequence_numbers(LOG)) < 12:
                await asyncio.sleep(0.01)
            assert follower.endpoint.request_ids() == [live]  # still following
        assert follower_store.sequence_numbers(LOG) == list(range(1, 13))
    finally:
        await service.close()


def node_config(folder: Path, port: int) -> Path:
    path = folder / "store.toml"
    path.write_text(
        f"""
[archive]
path = "archive.db"

[ingest]
channels = ["c"]

[transport]
kind = "factory"
factory = "tests.store_node.synthetic_transport:create"
count = 5

[grpc]
listen = "127.0.0.1:0"

[metrics]
listen = ""

[bamboo_p2p]
listen = "127.0.0.1:{port}"
path = "bamboo.db"
"""
    )
    return path


async def connect_when_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    while True:
        if proc.poll() is not None:
            assert proc.stderr is not None
            raise AssertionError(f"store-node exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            stream = await connect_tcp("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        await stream.close()
        return


async def test_a_client_syncs_a_log_from_store_node_serve(tmp_path: Path) -> None:
    n = 500
    served_log(tmp_path / "bamboo.db", n).close()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config",
         str(node_config(tmp_path, port))],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        await asyncio.wait_for(connect_when_up(port, proc), 120)
        full = SqliteLogStore(":memory:")
        outcome = await replicate_range(full, await connect_tcp("127.0.0.1", port), LOG, 1, end=n)
        assert outcome.complete
        phone = SqliteLogStore(":memory:")
        newest = await replicate_range(phone, await connect_tcp("127.0.0.1", port), LOG, n, end=n)
        assert newest.complete
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    assert code == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    source = SqliteLogStore(str(tmp_path / "bamboo.db"))
    assert full.payload_sequence_numbers(LOG) == list(range(1, n + 1))
    for seq in range(1, n + 1):
        entry, original = full.entry(LOG, seq), source.entry(LOG, seq)
        assert entry is not None and original is not None and entry.hash == original.hash
        assert full.payload(LOG, seq) == source.payload(LOG, seq)
    assert phone.sequence_numbers(LOG) == sorted([*lower_pool(n), n])


def todo_schema_file(folder: Path) -> Path:
    from tests.documents.helpers import TODO_SCHEMA

    path = folder / "schemas.json"
    fields = {name: str(kind) for name, kind in TODO_SCHEMA.fields.items()}
    view_id = TODO_SCHEMA.id.partition("_")[2]
    item = {"name": "todo", "view_id": [view_id], "description": TODO_SCHEMA.description}
    path.write_text(json.dumps([{**item, "fields": fields}]))
    return path


def test_the_documents_and_compression_keys_are_validated(tmp_path: Path) -> None:
    config = parse_bamboo_p2p(
        {"listen": "127.0.0.1:0", "documents": "documents.db", "schema_file": "s.json"}, tmp_path
    )
    assert config.documents == tmp_path / "documents.db"
    assert config.schema_file == tmp_path / "s.json"
    assert parse_bamboo_p2p({"listen": "127.0.0.1:0"}, tmp_path).documents is None
    window = {"listen": "127.0.0.1:0", "compression_window": 65536}
    assert parse_bamboo_p2p(window, tmp_path).compression_window == 65536
    for bad in (
        {"listen": "127.0.0.1:1", "documents": 3},
        {"listen": "127.0.0.1:1", "schema_file": "s.json"},
        {"listen": "127.0.0.1:1", "documents": "no/such/folder/documents.db"},
        {"listen": "127.0.0.1:1", "compression_window": -1},
        {"listen": "127.0.0.1:1", "compression_window": True},
    ):
        with pytest.raises(ConfigError):
            parse_bamboo_p2p(bad, tmp_path)


async def test_store_node_serve_serves_its_documents_over_bamboo_p2p(tmp_path: Path) -> None:
    """A node whose [replication] document store holds a document serves its log to a
    Bamboo p2p client, which ingests (verifies) it as a document; what a second client
    pushes lands in the node's document store through the same validation."""
    from sdk.documents import DocumentStore
    from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
    from tests.documents.helpers import TODO_SCHEMA, todo_fields

    docs = DocumentStore(str(tmp_path / "documents.db"))
    docs.add_schema(TODO_SCHEMA)
    created = docs.create(KEY, TODO_SCHEMA.id, todo_fields("served"))
    for i in range(9):
        docs.update(KEY, created.document_id, {"priority": i})
    [(author, log_id, height)] = docs.log_heights(TODO_SCHEMA.id)
    original = docs.document(created.document_id)
    docs.close()
    todo_schema_file(tmp_path)
    port = free_port()
    config = node_config(tmp_path, port).read_text()
    config = (
        config.split("[bamboo_p2p]")[0]
        + f"""
[replication]
listen = "127.0.0.1:0"
path = "documents.db"
schemas = ["{TODO_SCHEMA.id}"]
schema_file = "schemas.json"

[bamboo_p2p]
listen = "127.0.0.1:{port}"
path = "bamboo.db"
documents = "documents.db"
"""
    )
    (tmp_path / "store.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(tmp_path / "store.toml")],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    other = KeyPair.from_private_key(bytes(range(5, 37)))
    pusher_docs = DocumentStore()
    pusher_docs.add_schema(TODO_SCHEMA)
    pushed_doc = pusher_docs.create(other, TODO_SCHEMA.id, todo_fields("pushed"))
    [(p_author, p_log, _)] = pusher_docs.log_heights(TODO_SCHEMA.id)
    try:
        await asyncio.wait_for(connect_when_up(port, proc), 120)
        client_docs = DocumentStore()
        client_docs.add_schema(TODO_SCHEMA)
        client = DocumentLogStore(client_docs, SqliteLogStore(":memory:"))
        outcome = await replicate_range(
            client, await connect_tcp("127.0.0.1", port), (author, log_id), 1, end=height
        )
        assert outcome.complete
        assert client.ingested == height and client.kept_aside == 0
        view = client_docs.document(created.document_id)
        assert view is not None and original is not None and view.fields == original.fields
        pusher = DocumentLogStore(pusher_docs, SqliteLogStore(":memory:"))
        pushed = await replicate_range(
            pusher, await connect_tcp("127.0.0.1", port), (p_author, p_log), 1, end=1
        )
        assert pushed.complete
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    assert code == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    node_docs = DocumentStore(str(tmp_path / "documents.db"))
    node_docs.add_schema(TODO_SCHEMA)
    landed = node_docs.document(pushed_doc.document_id)
    assert landed is not None and landed.fields["title"] == "pushed"
