"""``[replication] process = "separate"``: a real ``store-node serve`` serving replication
from a supervised child process (store_node.documents_process)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

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
        info = body.get("details", {}).get("replication_process", {})  # type: ignore[union-attr]
        serving = body["checks"].get("replication_serving")  # type: ignore[index]
        if ready:
            return status == 200 and serving is True and info["pid"] not in (None, other_than)
        return status == 503 and serving is False and info["pid"] is None

    try:
        await _until("the child serving", lambda: child(True), proc)
        first = seen["body"]["details"]["replication_process"]  # type: ignore[index]
        assert first["port"] == port and first["restarts"] == 0
        pid = first["pid"]
        assert pid != proc.pid and os.getppid() != pid
        assert await _catch_up(port, 1) <= expected

        os.kill(pid, signal.SIGKILL)
        await _until("the node to see the child gone", lambda: child(False), proc)
        await _until("a new child serving", lambda: child(True, other_than=pid), proc)
        second = seen["body"]["details"]["replication_process"]  # type: ignore[index]
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
        pid.append(body["details"]["replication_process"]["pid"])  # type: ignore[index]
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
