"""The deployment files (issue 16.4): Dockerfile, compose file, Mosquitto config, systemd unit.

What runs here and what does not:

- **Docker build and start** is not a test here: it needs a Docker daemon and the image
  registry, which this project's machines do not have. ``deploy/smoke-test`` builds and
  starts the compose file and waits for the store node to be healthy; ``.ci/run`` runs it
  whenever ``docker info`` answers.
- Everything else runs for real, without Docker: the configurations the image and the
  compose file ship are loaded by the real config loader; the image's HEALTHCHECK command
  is run against a real store node (ready and not ready); the compose file's Mosquitto
  configuration is loaded by a real ``mosquitto``; the systemd unit passes
  ``systemd-analyze verify`` with no warning.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from store_node.config import parse_config
from tests.conftest import REQUIRE_SERVICES, free_port, service_available

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, args = line.partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def test_dockerfile_is_slim_non_root_with_a_readiness_healthcheck() -> None:
    steps = _instructions(DEPLOY / "Dockerfile")
    stages = [args for op, args in steps if op == "FROM"]
    assert len(stages) == 2 and all(s.startswith("python:3.11-slim") for s in stages)
    final = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][-1] :]
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    health = [args for op, args in final if op == "HEALTHCHECK"]
    assert len(health) == 1 and "/readyz" in health[0]
    assert ("ENTRYPOINT", '["store-node"]') in final
    for op, args in steps:
        if op == "COPY" and "--from" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def _healthcheck_command() -> list[str]:
    health = next(a for op, a in _instructions(DEPLOY / "Dockerfile") if op == "HEALTHCHECK")
    exec_form = health[health.index("CMD") + 3 :].strip()
    command: list[str] = json.loads(exec_form)
    return [sys.executable if command[0] == "python" else command[0], *command[1:]]


def _image_config(tmp_path: Path, broker_port: int) -> Path:
    """deploy/store-node.toml with what differs outside a container: paths, broker, ports."""
    data = tomllib.loads((DEPLOY / "store-node.toml").read_text())
    data["archive"]["path"] = str(tmp_path / "store.db")
    data["ingest"]["channels"] = [f"deploy-{uuid.uuid4().hex[:8]}"]
    data["transport"].update(host="127.0.0.1", port=broker_port)
    data["grpc"]["listen"] = f"127.0.0.1:{free_port()}"
    metrics_port = free_port()
    data["metrics"]["listen"] = f"127.0.0.1:{metrics_port}"
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path = tmp_path / "store-node.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_shipped_configurations_load(monkeypatch: pytest.MonkeyPatch) -> None:
    image = tomllib.loads((DEPLOY / "store-node.toml").read_text())
    config = parse_config({**image, "archive": {"path": "store.db"}}, ROOT)
    assert config.grpc.listen == "0.0.0.0:50051" and config.metrics.listen == "0.0.0.0:9464"
    monkeypatch.setenv("CHORUS_STORE_TOKEN", "t")
    compose = parse_config(tomllib.loads((DEPLOY / "compose" / "store-node.toml").read_text()))
    assert compose.archive.backend == "postgresql" and compose.grpc.tokens == ("t",)
    assert "password" not in compose.archive.dsn


@pytest.mark.integration
def test_the_image_healthcheck_command_follows_readiness(
    tmp_path: Path, private_mosquitto: Any
) -> None:
    broker = private_mosquitto()
    config = _image_config(tmp_path, broker.port)
    metrics = tomllib.loads(config.read_text())["metrics"]["listen"]
    port = int(metrics.rpartition(":")[2])
    command = _healthcheck_command()
    command[-1] = command[-1].replace("127.0.0.1:9464", f"127.0.0.1:{port}")
    node = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(command, capture_output=True).returncode != 0:
            assert node.poll() is None, node.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "never healthy"
            time.sleep(0.3)
        broker.kill()  # not ready without its broker: the check must fail
        deadline = time.monotonic() + 30
        while subprocess.run(command, capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "still healthy without a broker"
            time.sleep(0.3)
    finally:
        node.terminate()
        node.wait(30)
    assert node.returncode == 0


def test_compose_file_binds_loopback_and_waits_for_healthy_services() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"mosquitto", "postgres", "store-node"}
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        assert "healthcheck" in service or name == "store-node"  # the image has its own
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / "compose" / source).exists(), source
    node = services["store-node"]
    assert node["depends_on"] == {
        "mosquitto": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
    }
    build = node["build"]
    assert (DEPLOY / "compose" / build["context"] / build["dockerfile"]).is_file()
    assert node["read_only"] is True and node["cap_drop"] == ["ALL"]
    text = (DEPLOY / "compose" / "compose.yaml").read_text()
    secrets = list(re.finditer(r"(PASSWORD|TOKEN): *(\S+)", text))
    assert len(secrets) >= 2  # the database password and the store token, at least
    for match in secrets:
        assert match.group(2).startswith("${"), f"secret inline: {match.group(0)}"


@pytest.mark.integration
def test_compose_mosquitto_config_is_accepted_by_mosquitto(tmp_path: Path) -> None:
    if shutil.which("mosquitto") is None:
        message = "the mosquitto binary is not installed"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    port = free_port()
    text = (DEPLOY / "compose" / "mosquitto.conf").read_text()
    text = text.replace("listener 1883", f"listener {port} 127.0.0.1")
    text = text.replace("/mosquitto/data/", f"{tmp_path}/")
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(text)
    proc = subprocess.Popen(
        ["mosquitto", "-c", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 10
        while not service_available(port):
            assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0].decode()
    # (Saving the database at exit may fail: mosquitto drops root to its own user.)
    assert "running" in output and "Unknown configuration" not in output, output
    assert "Error found at" not in output, output


def test_systemd_unit_verifies_without_warnings(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        message = "systemd-analyze is not installed (apt install systemd)"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    unit = (DEPLOY / "systemd" / "chorus-store-node.service").read_text()
    for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n"):
        assert key in unit
    assert re.search(r"^User=chorus$", unit, re.M)
    # verify checks that ExecStart exists: point it at this environment's store-node.
    store_node = shutil.which("store-node", path=str(Path(sys.executable).parent))
    assert store_node is not None
    local = tmp_path / "chorus-store-node.service"
    local.write_text(unit.replace("/opt/chorus/bin/store-node", store_node))
    result = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, timeout=60
    )
    own = [line for line in result.stderr.splitlines() if str(local) in line]
    assert result.returncode == 0 and not own, result.stderr


def _usage_commands(path: Path) -> list[list[str]]:
    """The commands in a file's usage comment (lines ``#   ...``), continuations joined."""
    commands, current = [], ""
    for line in path.read_text().splitlines():
        if not line.startswith("#   "):
            continue
        current += line[4:].strip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        commands.append(shlex.split(current))
        current = ""
    assert not current, f"{path.name}: a usage line ends in a continuation"
    return commands


def test_commands_in_the_deploy_files_parse() -> None:
    # The usage lines at the top of each file are commands a user copies: they must
    # parse, and the files they name (``-f``) must exist.
    expected = {DEPLOY / "Dockerfile": 2, DEPLOY / "compose" / "compose.yaml": 1}
    for path, count in expected.items():
        commands = _usage_commands(path)
        assert len(commands) == count, (path.name, commands)
        for argv in commands:
            assert "docker" in argv, argv
            named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-f"]
            assert all((ROOT / f).is_file() for f in named), argv
