"""Every shell command in README.md and docs/*.md is either run here or listed with the reason.

The commands are read from the fenced ``sh`` blocks and from inline `store-node ...` spans.
A command the docs gain later fails :func:`test_every_documented_command_is_accounted_for`
until it is added to :data:`RUN` or :data:`NOT_RUN`. The runnable ones run in the order a
reader of the README's store-node section types them, in a scratch folder, against the real
Mosquitto on 127.0.0.1:1883 (the example configuration's broker).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, require_service

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Commands this test runs (see test_readme_store_node_commands_run).
RUN = {
    ". .venv/bin/activate",
    "cp examples/store_node.toml store.toml",
    "store-node check-config --config store.toml",
    "store-node check-config --config examples/store_node.toml",
    "store-node serve --config store.toml",
    "store-node stats --config store.toml --check",
    "store-node export --config store.toml --out export/",
    "store-node --version",
}

#: Commands not run here, and why.
NOT_RUN = {
    "scripts/demo": "the demo: run by tests/runtime and tests/e2e (it needs a minute and Java)",
    "scripts/test": "the test suite itself",
    "scripts/bootstrap": "creates .venv: every test already runs in it",
    "sudo apt install openjdk-17-jre-headless": "installs a system package (root, network)",
    "store-node serve --config examples/store_node.toml": (
        "the same as `serve --config store.toml`, which runs, but it would write store.db "
        "into examples/"
    ),
    "store-node serve --config node.toml": (
        "run with a [replication] section by tests/sync/test_store_node.py::"
        "test_store_node_serve_runs_replication_beside_the_archive"
    ),
    "store-node analytics ...": "a placeholder for the analytics commands below",
    "store-node analytics report --input export/ --out report/": (
        "Spark: the same CLI runs in tests/analytics/test_cli.py (local) and "
        "tests/analytics/test_cluster.py (standalone cluster)"
    ),
    "python -m store_node.analytics report --input export/ --out report/": (
        "the same entry point as `store-node analytics report` (tests/analytics)"
    ),
    "python -m store_node.analytics synth --out export/ --messages 1000000": (
        "1M rows: the same command runs at 2,000 rows in tests/analytics/test_cli.py"
    ),
    ".venv/bin/python -m pytest tests/interop": "part of the test suite",
    "CHORUS_REQUIRE_SERVICES=1 .venv/bin/python -m pytest tests/interop": "the test suite",
    ".venv/bin/python bench/compare_waku.py --quick": "a benchmark, run by hand (bench/)",
    ".venv/bin/python bench/compare_waku.py": "a benchmark, run by hand (bench/)",
    "docker build -f deploy/Dockerfile -t chorus-store-node .": (
        "no Docker daemon on this machine: tests/deploy/test_deploy.py builds it where one is"
    ),
    "docker compose -f deploy/compose/compose.yaml up -d --build": (
        "no Docker daemon on this machine: tests/deploy/test_deploy.py starts it where one is"
    ),
    "store-node check-config": "named in prose; run with its --config above",
    "store-node export": "named in prose; run with its options above",
    "store-node stats": "named in prose; run with its options above",
    "store-node analytics": "named in prose; see the analytics commands above",
    "store-node analytics report": "named in prose; see the analytics commands above",
    "store-node serve": "named in prose; run with its --config above",
    "store-node replicate": "named in prose; tests/sync runs it through the real CLI",
    "store-node sync PEER": "named in prose; tests/sync runs it through the real CLI",
    "store-node replicate --config node.toml": "tests/sync runs replicate through the real CLI",
    "store-node sync HOST:PORT --config node.toml": "tests/sync runs sync through the real CLI",
    "store-node collection HOST:PORT ROOT --config FILE": (
        "tests/sync/test_collection_store_node.py runs collection through the real CLI"
    ),
    "store-node collection PEER ROOT": "named in prose; tests/sync runs it through the real CLI",
    "docker info": "named in prose: how .ci/run decides to run deploy/smoke-test",
    "scripts/fuzz --only sds_message store_ingest bamboo_entry cbor operation document_payload document_channel grpc_request": "a long fuzz run (hours); tests/fuzz runs every target with a small budget",
    "scripts/fuzz --only store_config --inputs 100000": "a long fuzz run; tests/fuzz runs the target with a small budget",
}


def documented_commands() -> dict[str, list[str]]:
    """Command -> the docs that show it (fenced sh blocks and inline `store-node ...`)."""
    found: dict[str, list[str]] = {}
    for path in DOCS:
        text = path.read_text()
        lines = []
        for block in re.finditer(r"```(?:sh|bash|shell|console)\n(.*?)```", text, re.S):
            lines += block.group(1).splitlines()
        lines += re.findall(r"`((?:store-node|docker) [^`]*)`", text)
        for line in lines:
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            command = " ".join(stripped.split(" #")[0].split())
            found.setdefault(command, []).append(path.name)
    return found


def test_every_documented_command_is_accounted_for() -> None:
    unknown = {
        c: where for c, where in documented_commands().items() if c not in RUN | set(NOT_RUN)
    }
    assert not unknown, f"run these in this test or list them in NOT_RUN with a reason: {unknown}"


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.integration
def test_readme_store_node_commands_run(tmp_path: Path) -> None:
    require_service("mosquitto", 1883)
    venv_bin = str(Path(sys.executable).parent)
    assert shutil.which("store-node", path=venv_bin), "scripts/bootstrap installs store-node"
    # `. .venv/bin/activate`: what it does for these commands is put .venv/bin first on PATH.
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "store_node.toml", tmp_path / "examples")

    assert _run("cp examples/store_node.toml store.toml", tmp_path, env).returncode == 0
    # "... then edit it": free ports, so parallel runs on this machine do not collide.
    config = tmp_path / "store.toml"
    grpc_port, metrics_port = free_port(), free_port()
    text = config.read_text().replace("127.0.0.1:50051", f"127.0.0.1:{grpc_port}")
    config.write_text(text.replace("127.0.0.1:9464", f"127.0.0.1:{metrics_port}"))

    for command in ("store-node --version", "store-node check-config --config store.toml"):
        result = _run(command, tmp_path, env)
        assert result.returncode == 0, (command, result.stderr)
    result = _run("store-node check-config --config examples/store_node.toml", ROOT, env)
    assert result.returncode == 0, result.stderr

    serve = subprocess.Popen(
        shlex.split("store-node serve --config store.toml"),
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                url = f"http://127.0.0.1:{metrics_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert serve.poll() is None, serve.stderr.read()[-2000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "store-node serve never became ready"
            time.sleep(0.2)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    assert serve.returncode == 0

    for command in (
        "store-node stats --config store.toml --check",
        "store-node export --config store.toml --out export/",
    ):
        result = _run(command, tmp_path, env)
        assert result.returncode == 0, (command, result.stderr)
    assert (tmp_path / "export").is_dir()
