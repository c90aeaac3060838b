"""The store node serving replication: config, a client catching up, two nodes replicating."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sdk.sync.driver import sync
from store_node.config import parse_config
from store_node.errors import ConfigError
from store_node.replication import ReplicationService, parse_replication
from tests.conftest import free_port
from tests.documents.helpers import TODO_SCHEMA
from tests.sync.helpers import TODO, closed_subset, entry_ids, history, make_store, views
from transports.stream import connect_tcp

REPO = Path(__file__).resolve().parents[2]
HISTORY = history(seed=21, operations=200)


def schema_file(folder: Path) -> Path:
    path = folder / "schemas.json"
    view_id = TODO_SCHEMA.id.partition("_")[2]
    fields = {name: str(kind) for name, kind in TODO_SCHEMA.fields.items()}
    path.write_text(
        json.dumps(
            [{"name": "todo", "view_id": [view_id], "description": TODO_SCHEMA.description,
              "fields": fields}]
        )
    )  # fmt: skip
    return path


def node_config(folder: Path, port: int, peers: list[str] | None = None) -> Path:
    schema_file(folder)
    path = folder / "node.toml"
    peer_list = json.dumps(peers or [])
    path.write_text(
        f"""
[replication]
listen = "127.0.0.1:{port}"
path = "documents.db"
schemas = ["{TODO}"]
schema_file = "schemas.json"
peers = {peer_list}
interval_s = 3600
"""
    )
    return path


def test_replication_section_is_validated(tmp_path: Path) -> None:
    config = parse_config({"replication": {"listen": "127.0.0.1:1", "schemas": [TODO]}}, tmp_path)
    assert config.replication.enabled and config.replication.schemas == (TODO,)
    assert config.replication.path == tmp_path / "documents.db"
    assert not parse_config({}).replication.enabled
    for bad in (
        {"listen": "nowhere"},
        {"listen": "127.0.0.1:1"},  # no schemas
        {"schemas": [TODO], "peers": ["x"]},
        {"schemas": [TODO], "listen": "127.0.0.1:1", "mode": "magic"},
        {"schemas": [TODO], "listen": "127.0.0.1:1", "interval_s": 0},
        {"schemas": "todo"},
        {"typo": 1},
    ):
        with pytest.raises(ConfigError):
            parse_replication(bad, tmp_path)


def start_node(config: Path, command: str = "replicate") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", command, "--config", str(config)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


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


async def test_a_participant_catches_up_from_the_store_node(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    served = make_store(HISTORY, str(node_dir / "documents.db"))
    expected_ids, expected_views = entry_ids(served), views(served)
    served.close()
    port = free_port()
    proc = start_node(node_config(node_dir, port))
    try:
        await wait_listening(port, proc)
        phone = make_store(closed_subset(HISTORY, random.Random(1), 0.2))
        done = await sync(phone, await connect_tcp("127.0.0.1", port), [TODO])
        assert (
            done.entries_received
            == len(expected_ids) - done.entries_sent - len(entry_ids(phone) - expected_ids)
            or done.entries_received > 0
        )
        assert entry_ids(phone) == expected_ids
        assert views(phone) == expected_views
    finally:
        proc.terminate()
        proc.wait(10)


async def test_two_store_nodes_replicate_with_the_cli(tmp_path: Path) -> None:
    rng = random.Random(2)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = make_store(closed_subset(HISTORY, rng, 0.5), str(a_dir / "documents.db"))
    b = make_store(closed_subset(HISTORY, rng, 0.5), str(b_dir / "documents.db"))
    union = entry_ids(a) | entry_ids(b)
    assert entry_ids(a) != union and entry_ids(b) != union
    a.close()
    b.close()
    port_a = free_port()
    proc = start_node(node_config(a_dir, port_a))
    try:
        await wait_listening(port_a, proc)
        config_b = node_config(b_dir, free_port())
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "store_node.cli", "sync", f"127.0.0.1:{port_a}",
             "--config", str(config_b)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["received"] > 0 and summary["sent"] > 0
        assert "done" in result.stderr  # the progress bar's last phase
    finally:
        proc.terminate()
        proc.wait(10)
    a, b = make_store([], str(a_dir / "documents.db")), make_store([], str(b_dir / "documents.db"))
    assert entry_ids(a) == entry_ids(b) == union
    assert views(a) == views(b)


async def test_the_service_syncs_with_its_peers_in_process(tmp_path: Path) -> None:
    rng = random.Random(3)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    make_store(closed_subset(HISTORY, rng, 0.5), str(a_dir / "documents.db")).close()
    make_store(closed_subset(HISTORY, rng, 0.5), str(b_dir / "documents.db")).close()
    config_a = parse_config(
        {"replication": {"listen": "127.0.0.1:0", "schemas": [TODO],
                         "schema_file": str(schema_file(a_dir))}}, a_dir,
    ).replication  # fmt: skip
    service_a = ReplicationService(config_a)
    port = await service_a.start()
    config_b = parse_config(
        {"replication": {"peers": [f"127.0.0.1:{port}"], "schemas": [TODO],
                         "schema_file": str(schema_file(b_dir))}}, b_dir,
    ).replication  # fmt: skip
    service_b = ReplicationService(config_b)
    runner = asyncio.ensure_future(service_b.run())
    try:
        for _ in range(300):
            if entry_ids(service_a.store) == entry_ids(service_b.store):
                break
            await asyncio.sleep(0.05)
        assert entry_ids(service_a.store) == entry_ids(service_b.store)
        assert views(service_a.store) == views(service_b.store)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await service_a.close()


async def test_store_node_serve_runs_replication_beside_the_archive(tmp_path: Path) -> None:
    """``store-node serve`` with ``[replication]`` listens, reports it ready, serves a
    client over TCP, and stops cleanly on SIGTERM (exit 0, the store closed)."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    served = make_store(HISTORY, str(node_dir / "documents.db"))
    expected_ids, expected_views = entry_ids(served), views(served)
    served.close()
    port, metrics_port = free_port(), free_port()
    config = node_config(node_dir, port)
    config.write_text(
        f"""
[archive]
path = "archive.db"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:{metrics_port}"
"""
        + config.read_text()
    )
    proc = start_node(config, "serve")
    try:
        await wait_listening(port, proc)
        for _ in range(100):
            status, body = await asyncio.to_thread(readyz, metrics_port)
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200, body
        assert body["checks"]["replication_serving"] is True  # type: ignore[index]
        phone = make_store(closed_subset(HISTORY, random.Random(4), 0.3))
        done = await sync(phone, await connect_tcp("127.0.0.1", port), [TODO])
        assert done.entries_received > 0
        assert entry_ids(phone) == expected_ids | entry_ids(phone)
        assert views(phone) == expected_views
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "replication started" in stderr and "replication stopped" in stderr
    assert (node_dir / "archive.db").exists()
    # The node closed its document store: it opens again, with what the phone sent.
    reopened = make_store([], str(node_dir / "documents.db"))
    assert entry_ids(reopened) == entry_ids(phone)


def test_a_schema_file_registers_its_schemas_and_a_bad_one_is_a_config_error(
    tmp_path: Path,
) -> None:
    from sdk.documents import application_schemas
    from store_node.replication import ReplicationConfig, open_store

    (schema,) = application_schemas(schema_file(tmp_path))
    assert schema == TODO_SCHEMA
    store = open_store(
        ReplicationConfig(path=tmp_path / "a.db", schema_file=tmp_path / "schemas.json")
    )
    try:
        assert store.schema(TODO_SCHEMA.id) == TODO_SCHEMA
    finally:
        store.close()
    for text in ("[{}]", "not json", '{"name": 1}'):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ConfigError, match=r"replication\.schema_file"):
            open_store(ReplicationConfig(path=tmp_path / "b.db", schema_file=tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match=r"replication\.schema_file"):
        open_store(ReplicationConfig(path=tmp_path / "c.db", schema_file=tmp_path / "absent.json"))
