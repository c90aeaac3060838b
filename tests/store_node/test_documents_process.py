"""``[replication] process = "separate"``: a real ``store-node serve`` serving replication
from a supervised child process (store_node.documents_process)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdk.sync.driver import sync
from store_node.config import parse_config
from store_node.errors import ConfigError
from tests.conftest import free_port
from tests.sync.helpers import TODO, closed_subset, entry_ids, history, make_store
from tests.sync.test_store_node import node_config, readyz
from transports.stream import connect_tcp

REPO = Path(__file__).resolve().parents[2]
HISTORY = history(seed=29, operations=120)


def test_process_is_node_or_separate(tmp_path: Path) -> None:
    table = {"listen": "127.0.0.1:0", "schemas": [TODO]}
    assert parse_config({"replication": table}, tmp_path).replication.process == "node"
    separate = parse_config({"replication": {**table, "process": "separate"}}, tmp_path)
    assert separate.replication.process == "separate"
    with pytest.raises(ConfigError, match=r"replication\.process must be node or separate"):
        parse_config({"replication": {**table, "process": "thread"}}, tmp_path)


def test_a_separate_process_takes_every_document_service_on_the_same_file(
    tmp_path: Path,
) -> None:
    """Once refused (the child had the store to itself): the child now serves
    [collection] and [bamboo_p2p] too, so they may name the replicated file."""
    table = {"listen": "127.0.0.1:0", "schemas": [TODO], "process": "separate"}
    shared = {"listen": "127.0.0.1:0", "path": "documents.db"}
    bamboo = {"listen": "127.0.0.1:0", "documents": "documents.db"}
    config = parse_config(
        {"replication": table, "collection": shared, "bamboo_p2p": bamboo}, tmp_path
    )
    assert config.collection.path == config.replication.path == config.bamboo_p2p.documents


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


async def _until(
    what: str, check: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 60
) -> None:
    """Poll ``check`` (off the loop) until it holds; fail if the node exits first."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert proc.poll() is None, f"the node exited waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _catch_up(port: int, seed: int) -> set[bytes]:
    phone = make_store(closed_subset(HISTORY, random.Random(seed), 0.3))
    done = await sync(phone, await connect_tcp("127.0.0.1", port), [TODO])
    assert done.entries_received > 0
    return entry_ids(phone)


def _serve(node_dir: Path, port: int, metrics_port: int) -> subprocess.Popen[str]:
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
        + config.read_text().replace("[replication]", '[replication]\nprocess = "separate"')
    )
    return subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def test_serve_runs_replication_in_a_supervised_child(tmp_path: Path) -> None:
    """The child serves a peer; kill -9 of it makes the node not ready until a new child
    serves on the same port; stopping the node stops the child."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    served = make_store(HISTORY, str(node_dir / "documents.db"))
    expected = entry_ids(served)
    served.close()
    port, metrics_port = free_port(), free_port()
    proc = _serve(node_dir, port, metrics_port)
    seen: dict[str, object] = {}

    def child(ready: bool, *, other_than: object = None) -> bool:
        status, body = readyz(metrics_port)
        seen.update(status=status, body=body)
        if not body:
            return False
        info = body.get("details", {}).get("documents_process", {})  # type: ignore[union-attr]
        serving = body["checks"].get("replication_serving")  # type: ignore[index]
        assert body["checks"].get("documents_serving") is serving, body  # type: ignore[index]
        if ready:
            return status == 200 and serving is True and info["pid"] not in (None, other_than)
        return status == 503 and serving is False and info["pid"] is None

    try:
        await _until("the child serving", lambda: child(True), proc)
        first = seen["body"]["details"]["documents_process"]  # type: ignore[index]
        assert first["port"] == port and first["restarts"] == 0
        pid = first["pid"]
        assert pid != proc.pid and os.getppid() != pid
        assert await _catch_up(port, 1) <= expected

        os.kill(pid, signal.SIGKILL)
        await _until("the node to see the child gone", lambda: child(False), proc)
        await _until("a new child serving", lambda: child(True, other_than=pid), proc)
        second = seen["body"]["details"]["documents_process"]  # type: ignore[index]
        assert second["port"] == port and second["restarts"] == 1
        assert await _catch_up(port, 2) <= expected
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    left = second["pid"]
    if not _gone(left):
        os.kill(left, signal.SIGKILL)
        raise AssertionError("the child outlived the node")
    assert proc.returncode == 0, stderr
    assert "documents process exited" in stderr


async def test_a_child_whose_node_dies_stops(tmp_path: Path) -> None:
    """kill -9 of the node: the child sees its standard input end and exits."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    make_store(HISTORY, str(node_dir / "documents.db")).close()
    port, metrics_port = free_port(), free_port()
    proc = _serve(node_dir, port, metrics_port)
    pid: list[int] = []

    def serving() -> bool:
        status, body = readyz(metrics_port)
        if status != 200:
            return False
        pid.append(body["details"]["documents_process"]["pid"])  # type: ignore[index]
        return True

    try:
        await _until("the child serving", serving, proc)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    try:
        while not _gone(pid[-1]):
            assert time.monotonic() < deadline, "the child outlived its node"
            await asyncio.sleep(0.02)
    finally:
        if not _gone(pid[-1]):
            os.kill(pid[-1], signal.SIGKILL)


def _metric(text: str, name: str, listener: str) -> float:
    """The value of ``name{listener=...}`` in a Prometheus exposition (0 when absent)."""
    found = re.search(rf'^{name}\{{listener="{listener}"\}} (\S+)$', text, flags=re.M)
    return float(found.group(1)) if found else 0.0


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


async def test_serve_runs_every_document_service_in_one_child(tmp_path: Path) -> None:
    """The default of ``store-node serve``: [replication], [collection] and [bamboo_p2p]
    on one document file, all served by the child; a peer syncs through each, /metrics
    counts what the child's listeners accepted; after kill -9 of the child all three
    come back on their ports and the counts go on from where they were."""
    from sdk.documents import DocumentStore, KeyPair
    from sdk.sync.bamboo_p2p import SqliteLogStore
    from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
    from sdk.sync.bamboo_p2p.driver import replicate_range
    from sdk.sync.collection import connect_collection
    from tests.sync.collection_fixtures import FOLDER, build_collection, new_sync_store, views_of
    from tests.sync.test_collection_store_node import folder_schema_file

    node_dir = tmp_path / "node"
    node_dir.mkdir()
    node_store = new_sync_store(str(node_dir / "documents.db"))
    collection = build_collection([node_store], KeyPair.from_private_key(bytes(range(32))), 10)
    expected = views_of(node_store, collection.root)
    author, log_id, height = node_store.log_heights(FOLDER.id)[0]
    node_store.close()
    folder_schema_file(node_dir)
    ports = {name: free_port() for name in ("replication", "collection", "bamboo_p2p")}
    metrics_port = free_port()
    config = node_dir / "node.toml"
    config.write_text(
        f"""
[archive]
path = "archive.db"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:{metrics_port}"
[replication]
listen = "127.0.0.1:{ports["replication"]}"
path = "documents.db"
schema_file = "schemas.json"
schemas = ["{FOLDER.id}"]
[collection]
listen = "127.0.0.1:{ports["collection"]}"
path = "documents.db"
schema_file = "schemas.json"
[bamboo_p2p]
listen = "127.0.0.1:{ports["bamboo_p2p"]}"
path = "bamboo.db"
documents = "documents.db"
schema_file = "schemas.json"
"""
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def child(ready: bool, *, other_than: object = None) -> bool:
        status, body = readyz(metrics_port)
        info = body.get("details", {}).get("documents_process", {})  # type: ignore[attr-defined]
        seen.update(info=info)
        if ready:
            return status == 200 and info.get("pid") not in (None, other_than)
        return status == 503 and info.get("pid") is None

    async def sync_through_each() -> None:
        phone = new_sync_store()
        done = await sync(phone, await connect_tcp("127.0.0.1", ports["replication"]), [FOLDER.id])
        assert done.entries_received > 0
        laptop = new_sync_store()
        async with await connect_collection(laptop, "127.0.0.1", ports["collection"]) as connection:
            await connection.snapshot(collection.root)
        assert views_of(laptop, collection.root) == expected
        documents = DocumentStore()
        documents.add_schema(FOLDER)
        client = DocumentLogStore(documents, SqliteLogStore(":memory:"))
        stream = await connect_tcp("127.0.0.1", ports["bamboo_p2p"])
        outcome = await replicate_range(client, stream, (author, log_id), 1, end=height)
        assert outcome.complete and client.ingested == height

    def accepted(at_least: int) -> bool:
        text = _scrape(metrics_port)
        seen.update(metrics=text)
        name = "chorus_store_listener_accepted_total"
        return all(_metric(text, name, listener) >= at_least for listener in ports)

    try:
        await _until("the child serving", lambda: child(True), proc)
        first = seen["info"]
        assert first["ports"] == ports and first["pid"] != proc.pid
        await sync_through_each()
        await _until("/metrics counting the child's listeners", lambda: accepted(1), proc)

        os.kill(first["pid"], signal.SIGKILL)
        await _until("the node to see the child gone", lambda: child(False), proc)
        for listener in ports:  # nothing is open on a listener whose process is gone
            assert (
                _metric(_scrape(metrics_port), "chorus_store_listener_connections", listener) == 0
            )
        await _until("a new child", lambda: child(True, other_than=first["pid"]), proc)
        assert seen["info"]["ports"] == ports and seen["info"]["restarts"] == 1
        await sync_through_each()
        # The first child's counts are kept: a new child alone would say 1.
        await _until("/metrics adding up both children", lambda: accepted(2), proc)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


async def test_restarts_back_off_while_they_fail_and_reset_after_a_child_serves_a_while(
    tmp_path: Path,
) -> None:
    """A child that cannot start again (its port taken) is retried after delays that
    double up to the cap, /readyz saying 503 all along; a restarted child that exits at
    once keeps the long delay (a crash loop slows down); one that served
    ``restart_stable`` seconds resets it. The supervisor's clocks are the test's: each
    wait ends when released, and the served time is what the test says."""
    from store_node.node import StoreNode

    port, metrics_port = free_port(), free_port()
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
            "replication": {
                "listen": f"127.0.0.1:{port}",
                "schemas": [TODO],
                "process": "separate",
            },
        },
        tmp_path,
    )
    node = StoreNode(config)
    await node.start()
    process = node.documents_process
    assert process is not None
    delays: list[float] = []
    release: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await release.get()

    now = [0.0]
    process.sleep = sleep
    process.clock = lambda: now[0]
    process.restart_delay_max = 2.0
    blocker = socket.socket()

    async def until(what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def ready() -> int:
        status, body = await asyncio.to_thread(readyz, metrics_port)
        serving = body["checks"]["replication_serving"]  # type: ignore[index]
        assert serving is (status == 200), body
        return status

    try:
        assert await ready() == 200
        os.kill(process.pid or 0, signal.SIGKILL)
        await until("the first wait", lambda: len(delays) == 1)
        assert not process.serving and await ready() == 503
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        for failed in range(1, 5):
            release.put_nowait(None)
            await until(f"restart {failed} to fail", lambda n=failed + 1: len(delays) == n)
            assert process.failed_restarts == failed and await ready() == 503
        assert delays == [0.5, 1.0, 2.0, 2.0, 2.0]
        blocker.close()
        release.put_nowait(None)
        await until("a restart that serves", lambda: process.serving)
        assert process.restarts == 1 and process.port == port and await ready() == 200

        os.kill(process.pid or 0, signal.SIGKILL)
        await until("the next wait", lambda: len(delays) == 6)
        assert delays[-1] == 2.0  # it served no time: still the long wait
        release.put_nowait(None)
        await until("a restart that serves", lambda: process.serving)
        assert process.restarts == 2 and await ready() == 200

        now[0] += process.restart_stable  # this child serves long enough
        os.kill(process.pid or 0, signal.SIGKILL)
        await until("the wait after a child that served", lambda: len(delays) == 7)
        assert delays[-1] == 0.5
        release.put_nowait(None)
        await until("a restart that serves", lambda: process.serving)
        assert process.restarts == 3 and await ready() == 200
    finally:
        blocker.close()
        await node.stop()
