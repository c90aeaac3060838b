"""The real ``store-node`` command as an operator meets it (issue 16.1, 19.3, 19.5).

Every case runs the CLI in its own process and checks the exit code and that stderr is
exactly one ``store-node:`` line: two nodes on one archive, a busy gRPC or metrics port,
a mistyped archive for ``export``, ``--version``, ``check-config``, a config that is not
UTF-8 and a channel with NUL (which used to make a node that never started and ignored
SIGTERM).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from tests.conftest import free_port, require_service
from tests.store_node.store_node_helpers import new_schema, postgres_dsn

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "store_node.toml"
_GRPC_CORE_LINE = re.compile(r"^[DIWE]\d{4} \d\d:\d\d:\d\d")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "store_node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line; anything before it must be the node's JSON log lines."""
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("store-node: "), result.stderr[-2000:]
    for line in lines[:-1]:
        # gRPC's C core logs a failed bind itself ("E1123 09:11:01.64 ... add_port.cc").
        assert _GRPC_CORE_LINE.match(line) or isinstance(json.loads(line), dict), line
    return lines[-1]


def _write_config(tmp_path: Path, name: str = "store.toml", **sections: str) -> Path:
    channel = f"ops-{uuid.uuid4().hex[:10]}"
    defaults = {
        "archive": 'path = "archive.db"',
        "ingest": f'channels = ["{channel}"]',
        "transport": 'kind = "mqtt"\nhost = "127.0.0.1"\nport = 1883',
        "grpc": f'listen = "127.0.0.1:{free_port()}"',
        "metrics": 'listen = ""',
    }
    defaults.update(sections)
    path = tmp_path / name
    path.write_text("".join(f"[{k}]\n{v}\n" for k, v in defaults.items()))
    return path


def _grpc_port(config: Path) -> int:
    listen = tomllib.loads(config.read_text())["grpc"]["listen"]
    return int(listen.rpartition(":")[2])


def _serve(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"store-node exited: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError("store-node did not start listening")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("store-node ignored SIGTERM") from None


def test_version() -> None:
    result = _cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("store-node 0.")


def test_check_config_accepts_the_example_and_names_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _cli("check-config", "--config", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["ok"] is True and summary["channels"] == ["lobby", "general", "random"]
    path = _write_config(
        tmp_path,
        transport='kind = "mqtt"\nusername = "u"\npassword = "hunter2-secret"',
        grpc='listen = "0.0.0.0:50051"',
    )
    result = _cli("check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert summary["transport_options"] == ["password", "username"]
    assert any("without TLS or a token" in w for w in summary["warnings"])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"[grpc]\nlisten = '127.0.0.1:99999'\n", "grpc.listen port must be 1..65535"),
        (b"[transport]\nport = 'abc'\n", "transport.port must be int | None"),
        (b"[transport]\nhots = '127.0.0.1'\n", "transport (mqtt) has no option 'hots'"),
        (b"[retention]\nmax_age_days = -1\n", "retention.max_age_days must be a finite"),
        (b"[retention]\nmax_age_days = inf\n", "retention.max_age_days must be a finite"),
        (b"[grpc]\nmax_request_bytes = 2147483648\n", "grpc.max_request_bytes must be in"),
        (b'[ingest]\nchannels = ["a\\u0000b"]\n', "contains control character U+0000"),
        (b"[log]\nlevel = '\xff'\n", "is not UTF-8"),
        (b"x = " + b"[" * 3000 + b"]" * 3000, "nest too deeply"),
        (b"[archive]\npath = 'missing/store.db'\n", "folder"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_bad_config_is_one_line_and_exit_2(
    tmp_path: Path, raw: bytes, expected: str, command: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(raw)
    result = _cli(command, "--config", str(path))
    assert result.returncode == 2
    assert expected in _one_error_line(result)
    assert not (tmp_path / "missing").exists()


def test_export_refuses_a_missing_archive(tmp_path: Path) -> None:
    path = _write_config(tmp_path, archive='path = "typo.db"')
    out = tmp_path / "export"
    result = _cli("export", "--config", str(path), "--out", str(out), "--no-progress")
    assert result.returncode == 1
    assert _one_error_line(result) == f"store-node: no archive at {tmp_path / 'typo.db'}"
    assert not (tmp_path / "typo.db").exists(), "export must not create an archive"
    assert not out.exists(), "nor an empty export"


@pytest.mark.integration
def test_a_second_node_on_the_same_archive_refuses_to_start(tmp_path: Path) -> None:
    require_service("mosquitto", 1883)
    first = _write_config(tmp_path, "first.toml")
    second = _write_config(tmp_path, "second.toml")
    proc = _serve(first)
    try:
        _wait_listening(_grpc_port(first), proc)
        result = _cli("serve", "--config", str(second))
        assert result.returncode == 1
        line = _one_error_line(result)
        assert f"archive {tmp_path / 'archive.db'} is in use by another store node (pid " in line
    finally:
        _stop(proc)
    # Once the first node is gone the archive is free again.
    proc = _serve(second)
    try:
        _wait_listening(_grpc_port(second), proc)
    finally:
        _stop(proc)
    assert proc.returncode == 0


@pytest.mark.integration
def test_a_second_node_on_the_same_postgresql_schema_refuses_to_start(tmp_path: Path) -> None:
    require_service("mosquitto", 1883)
    dsn, schema = postgres_dsn(), new_schema()
    archive = f'backend = "postgresql"\ndsn = "{dsn}"\nschema = "{schema}"'
    first = _write_config(tmp_path, "first.toml", archive=archive)
    second = _write_config(tmp_path, "second.toml", archive=archive)
    proc = _serve(first)
    try:
        _wait_listening(_grpc_port(first), proc)
        result = _cli("serve", "--config", str(second))
        assert result.returncode == 1
        assert f"archive schema '{schema}' is in use" in _one_error_line(result)
    finally:
        _stop(proc)
        from store_node.archive.postgres import PostgresArchive

        PostgresArchive(dsn, schema=schema).drop_schema()


@pytest.mark.integration
@pytest.mark.parametrize("which", ["grpc", "metrics"])
def test_a_busy_port_is_an_error_not_a_shared_port(tmp_path: Path, which: str) -> None:
    # 16: with gRPC's port sharing on, a second server bound the busy port too.
    require_service("mosquitto", 1883)
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a sharing server would
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        path = _write_config(tmp_path, **{which: f'listen = "127.0.0.1:{port}"'})
        result = _cli("serve", "--config", str(path))
        assert result.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in _one_error_line(result)
    finally:
        busy.close()


@pytest.mark.parametrize("command", ["serve", "replicate"])
def test_a_serving_node_takes_the_short_switch_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """While ``serve`` or ``replicate`` runs, the GIL changes hands after
    ``SWITCH_INTERVAL_S``, not CPython's 5 ms: a catch-up's worker thread would otherwise
    keep every lookup, probe and poll waiting up to 5 ms each time it takes the GIL back."""
    from store_node import cli
    from store_node.node import StoreNode
    from store_node.replication import ReplicationService

    seen: list[float] = []

    async def run(self: object) -> None:
        seen.append(sys.getswitchinterval())

    monkeypatch.setattr(StoreNode, "run", run)
    monkeypatch.setattr(ReplicationService, "run", run)
    monkeypatch.setattr(ReplicationService, "__init__", lambda self, config: None)
    config = _write_config(
        tmp_path,
        replication=f'listen = "127.0.0.1:{free_port()}"\nschemas = ["s"]\npath = "d.db"',
    )
    before = sys.getswitchinterval()
    try:
        assert cli.main([command, "--config", str(config)]) == 0
    finally:
        sys.setswitchinterval(before)
    assert seen == [cli.SWITCH_INTERVAL_S]
    assert cli.SWITCH_INTERVAL_S < 0.005
