"""Every shell command in README.md and docs/*.md is either run here or listed with the reason.

The commands are read from the fenced ``sh`` blocks and from inline spans that start with
``store-node``, ``docker``, ``python examples/`` or ``python -m sdk.`` (and
``.venv/bin/python`` ones). A command the docs gain later fails
:func:`test_every_documented_command_is_accounted_for` until it is added to :data:`RUN` or
:data:`NOT_RUN`. The runnable ones run as a reader types them, in a scratch folder: the
README's store-node section against the real Mosquitto on 127.0.0.1:1883 (the example
configuration's broker), the sync commands operators use (``store-node sync``,
``collection``, ``replicate``, ``python -m sdk.sync.bamboo_p2p``) against a node serving
every sync listener, and what those docs say of their output is checked.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
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
    # test_operator_sync_commands_run
    "store-node serve --config node.toml",
    "store-node sync HOST:PORT --config node.toml",
    "store-node replicate --config node.toml",
    "store-node collection HOST:PORT ROOT --config FILE",
    ".venv/bin/python -m sdk.sync.bamboo_p2p serve --db server.db",
    ".venv/bin/python -m sdk.sync.bamboo_p2p replicate --db phone.db --author HEX --start 1 "
    "--end 20 HOST:PORT",
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
    "store-node export --keys keys.json": (
        "needs an encrypted channel's keys: tests/analytics/test_sealed.py runs the CLI with them"
    ),
    "store-node export --keys FILE": "the option's synopsis; tests/analytics/test_sealed.py",
    "store-node analytics report": "named in prose; see the analytics commands above",
    "store-node serve": "named in prose; run with its --config above",
    "store-node sync PEER": "named in prose; tests/sync runs it through the real CLI",
    "store-node collection PEER ROOT": "named in prose; tests/sync runs it through the real CLI",
    "store-node collection": "named in prose; run with its arguments above",
    "store-node replicate": "named in prose; run with its --config above",
    "python -m sdk.sync serve": "named in prose; tests/sync runs the sdk.sync command line",
    "python -m sdk.sync serve|sync": "named in prose; tests/sync runs the sdk.sync command line",
    "python -m sdk.sync.bamboo_p2p serve --db FILE": "the synopsis; run concretely above",
    "python -m sdk.sync.bamboo_p2p replicate ... HOST:PORT": "a placeholder; run concretely above",
    "python -m sdk.sync.bamboo_p2p replicate --db FILE --author HEX --start N [--end N] "
    "[--sparse] [--payload-only] [--offset N | --resume] [--stall-timeout S] HOST:PORT": (
        "the synopsis; run concretely above, tests/sync/test_bamboo_p2p_cli.py runs the options"
    ),
    "python examples/chat.py --name alice --db alice.db": (
        "needs a second terminal: tests/runtime/test_examples.py chats between two of them, "
        "run by path from outside the checkout"
    ),
    "python examples/todo.py": "tests/test_docs_commands.py::test_examples_run_by_path_from_anywhere",
    "python examples/collection_catch_up.py": "tests/sync/test_examples.py, from outside the checkout",
    "python examples/sync_catch_up.py": "tests/sync/test_examples.py, from outside the checkout",
    "python examples/sync_store_nodes.py": "tests/sync/test_examples.py, from outside the checkout",
    "python examples/demo.py": "the demo: tests/runtime/test_examples.py and tests/e2e run it",
    "python ~/chorus/examples/chat.py ...": "a placeholder path; see the chat command above",
    "docker info": "named in prose: how .ci/run decides to run deploy/smoke-test",
    "python -m sdk.sync.bamboo_p2p replicate": "named in prose; run concretely above",
    "python -m sdk.sync sync ... --tls-ca CA --tls-cert CERT --tls-key KEY HOST:PORT": (
        "needs certificates: tests/store_node/test_listener_limits.py::"
        "test_the_sync_command_lines_dial_a_tls_listener_with_a_client_certificate runs it"
    ),
    "python -m sdk.sync sync --tls-ca CA --tls-cert CERT --tls-key KEY": (
        "the same command as above, named in docs/sync.md"
    ),
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
        lines += re.findall(
            r"`((?:store-node |docker |(?:\.venv/bin/)?python (?:examples/|~/|-m sdk\.[\w.]+ ))"
            r"[^`]*)`",
            " ".join(text.split("\n")),
        )
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


def test_every_listed_command_is_still_documented() -> None:
    """A command dropped from the docs is dropped here too, so the lists stay the docs'."""
    documented = documented_commands()
    stale = sorted(c for c in RUN | set(NOT_RUN) if c not in documented)
    assert not stale, f"no longer in README.md or docs/*.md: {stale}"


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


def _wait_port(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    return stderr


def _json_after(doc: str, heading: str) -> dict[str, object]:
    """The first ```json block after ``heading`` in ``docs/<doc>``."""
    text = (ROOT / "docs" / doc).read_text().split(heading, 1)[1]
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block is not None
    return json.loads(block.group(1))  # type: ignore[no-any-return]


def _sync_node_toml(folder: Path, ports: dict[str, int]) -> Path:
    from tests.sync.helpers import TODO
    from tests.sync.test_store_node import schema_file

    schema_file(folder)
    path = folder / "node.toml"
    path.write_text(
        f"""
[archive]
path = "archive.db"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = ""
[replication]
listen = "127.0.0.1:{ports["replication"]}"
path = "documents.db"
schemas = ["{TODO}"]
schema_file = "schemas.json"
[collection]
listen = "127.0.0.1:{ports["collection"]}"
path = "documents.db"
schema_file = "schemas.json"
[bamboo_p2p]
listen = "127.0.0.1:{ports["bamboo_p2p"]}"
path = "bamboo.db"
[store_sync]
listen = "127.0.0.1:{ports["store_sync"]}"
"""
    )
    return path


@pytest.mark.timeout(300)
def test_operator_sync_commands_run(tmp_path: Path) -> None:
    """The sync commands of docs/sync.md, docs/collection-sync.md and docs/bamboo-p2p.md,
    typed as shown, against one node serving every sync listener; their output is what
    those docs say."""
    from sdk.documents import KeyPair
    from sdk.sync.bamboo_p2p import SqliteLogStore, append_entry

    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),  # the checkout's code, as the editable install gives
    }
    node_dir, phone_dir, p2p_dir = tmp_path / "node", tmp_path / "phone", tmp_path / "p2p"
    for folder in (node_dir, phone_dir, p2p_dir):
        folder.mkdir()
    ports = {
        name: free_port() for name in ("replication", "collection", "bamboo_p2p", "store_sync")
    }
    _sync_node_toml(node_dir, ports)
    phone_ports = {name: free_port() for name in ports}
    _sync_node_toml(phone_dir, phone_ports)

    result = _run("store-node check-config --config node.toml", node_dir, env)
    assert result.returncode == 0, result.stderr
    checked = json.loads(result.stdout)
    # docs/store-node.md: every section checked, every listener listed.
    assert {"store_sync", "bamboo_p2p", "collection", "replication"} <= set(
        checked["sections_checked"]
    )
    assert set(checked["listeners"]) == {f"{n}.listen" for n in ("grpc", *ports)}

    def serve(folder: Path, command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            shlex.split(command), cwd=folder, env=env, stderr=subprocess.PIPE, text=True
        )

    node = serve(node_dir, "store-node serve --config node.toml")
    try:
        for port in ports.values():
            _wait_port(port, node)
        # docs/sync.md: one session, {"peer", "received", "sent"} on stdout.
        command = "store-node sync HOST:PORT --config node.toml"
        result = _run(
            command.replace("HOST:PORT", f"127.0.0.1:{ports['replication']}"), phone_dir, env
        )
        assert result.returncode == 0, result.stderr
        assert set(json.loads(result.stdout.strip().splitlines()[-1])) == {
            "peer",
            "received",
            "sent",
        }
        # docs/collection-sync.md: both ways, pulled and pushed reported.
        command = "store-node collection HOST:PORT ROOT --config FILE"
        root = "0020" + "ab" * 32
        result = _run(
            command.replace("HOST:PORT", f"127.0.0.1:{ports['collection']}")
            .replace("ROOT", root)
            .replace("FILE", "node.toml"),
            phone_dir,
            env,
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert {"changed", "operations_pulled", "operations_pushed"} <= set(summary)
        # A root the node does not hold: nothing to pull back, and the command says so.
        assert summary["not_pushed"].startswith("the peer did not ask for this side's changes")
        assert "store-node: the peer did not ask" in result.stderr
        # docs/bamboo-p2p.md: a log the node lacks fails fast, in words.
        stranger = KeyPair.from_private_key(bytes(range(2, 34))).public_key.hex()
        command = (
            ".venv/bin/python -m sdk.sync.bamboo_p2p replicate --db phone.db --author HEX "
            "--start 1 --end 20 HOST:PORT"
        )
        result = _run(
            command.replace(".venv/bin/python", sys.executable)
            .replace("HEX", stranger)
            .replace("HOST:PORT", f"127.0.0.1:{ports['bamboo_p2p']}"),
            phone_dir,
            env,
        )
        assert result.returncode == 1
        assert "so the peer does not have log" in json.loads(result.stdout)["detail"]
        assert result.stderr.startswith("python -m sdk.sync.bamboo_p2p: replicate: no progress")
    finally:
        stderr = _stop(node)
    assert "store node stopped" in stderr

    # docs/sync.md: replication alone, until SIGTERM.
    alone = serve(phone_dir, "store-node replicate --config node.toml")
    try:
        _wait_port(phone_ports["replication"], alone)
    finally:
        _stop(alone)

    # docs/bamboo-p2p.md, "The command line": serve a log, replicate it, the JSON shown.
    key = KeyPair.from_private_key(bytes(range(32)))
    store = SqliteLogStore(str(p2p_dir / "server.db"))
    for i in range(20):
        append_entry(store, key, 0, b"entry %d of the served log" % i)
    store.flush()
    store.close()
    command = ".venv/bin/python -m sdk.sync.bamboo_p2p serve --db server.db"
    server = subprocess.Popen(
        shlex.split(command.replace(".venv/bin/python", sys.executable)),
        cwd=p2p_dir, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        listening = server.stdout.readline()
        assert listening.startswith("listening 127.0.0.1:"), listening
        command = (
            ".venv/bin/python -m sdk.sync.bamboo_p2p replicate --db phone.db --author HEX "
            "--start 1 --end 20 HOST:PORT"
        )
        result = _run(
            command.replace(".venv/bin/python", sys.executable)
            .replace("HEX", key.public_key.hex())
            .replace("HOST:PORT", listening.split()[1]),
            p2p_dir,
            env,
        )
    finally:
        server.terminate()
        server.wait(30)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    shown = _json_after("bamboo-p2p.md", "### The command line")
    assert set(out) == set(shown)
    same = ("complete", "stalled", "entries_received", "entries_sent", "payloads_received")
    same += ("payloads_sent", "payload_bytes_received", "payload_bytes_sent")
    assert {k: out[k] for k in same} == {k: shown[k] for k in same}
    assert out["peer_reason"] in (130, 131)


def test_examples_run_by_path_from_anywhere(tmp_path: Path) -> None:
    """README: every example runs by its file's path, from any folder (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "todo.py"), "--seed", "3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("chat", "collection_catch_up", "demo", "sync_catch_up", "sync_store_nodes"):
        assert (ROOT / "examples" / f"{name}.py").is_file()
    shown = re.findall(r"`python (examples/\w+\.py)", (ROOT / "README.md").read_text())
    assert shown and all((ROOT / path).is_file() for path in shown)


def test_the_sync_guide_is_near_the_top_and_its_figures_are_the_docs() -> None:
    """README's "Which sync do I need?": before the first part's section, one row per
    mechanism, and every figure in its cost column stated in the docs it comes from."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Which sync do I need?")
    assert start < readme.index("## For chat app developers")
    table = readme[start:].split("\n\n")[2]
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    names = [r.split("|")[1].strip() for r in rows]
    assert [n.split("**")[1] for n in names] == [
        "SDS store catch-up",
        "p2panda replication",
        "collection sync",
        "Bamboo point-to-point",
        "store-to-store sync",
    ]
    elsewhere = readme[:start] + readme[start + len(table) :]
    elsewhere += "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    elsewhere = " ".join(elsewhere.split())
    for row in rows:
        cost = row.split("|")[4]
        for bench in re.findall(r"python (bench/\w+\.py)", cost):
            assert (ROOT / bench).is_file(), bench
        for figure in re.findall(r"\d+(?:[,.]\d+)*(?:-\d+(?:[,.]\d+)*)?", cost):
            found = re.search(rf"(?<![\d,.]){re.escape(figure)}(?![\d,]|\.\d)", elsewhere)
            assert found, f"{figure!r} ({row.split('|')[1].strip()}) is in no doc"
