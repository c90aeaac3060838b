"""Every listener of the store node as an operator meets it (issue 30.1).

A busy port for any of the sync listeners is one ``store-node:`` line and exit 1 (it
was a 39-line ``OSError`` traceback for ``[store_sync]``, ``[collection]`` and
``[bamboo_p2p]``); two listeners on one port are refused by ``check-config`` (and so
by ``serve``) before anything starts; ``check-config`` lists every section it checked;
the example configuration and the docs give every listener its own port.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from store_node.config import SECTIONS, check_listeners, load_config
from store_node.errors import ConfigError
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]

#: A section that turns each sync listener on (``{port}`` filled in), without a broker.
SYNC_SECTIONS = {
    "replication": 'listen = "127.0.0.1:{port}"\nschemas = ["x"]\npath = "documents.db"',
    "collection": 'listen = "127.0.0.1:{port}"\npath = "documents.db"',
    "bamboo_p2p": 'listen = "127.0.0.1:{port}"\npath = "bamboo.db"',
    "store_sync": 'listen = "127.0.0.1:{port}"',
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "store_node.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _config(tmp_path: Path, **sections: str) -> Path:
    text = {
        "archive": 'path = "archive.db"',
        "grpc": f'listen = "127.0.0.1:{free_port()}"',
        "metrics": 'listen = ""',
        **sections,
    }
    path = tmp_path / "node.toml"
    path.write_text("".join(f"[{k}]\n{v}\n" for k, v in text.items()))
    return path


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The last stderr line, which must be the one error; the rest JSON log lines."""
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("store-node: "), result.stderr[-3000:]
    for line in lines[:-1]:
        assert isinstance(json.loads(line), dict), line
    return lines[-1]


@pytest.mark.parametrize("section", sorted(SYNC_SECTIONS))
def test_a_busy_sync_listener_port_is_one_line_and_exit_1(tmp_path: Path, section: str) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        path = _config(tmp_path, **{section: SYNC_SECTIONS[section].format(port=port)})
        result = _cli("serve", "--config", str(path))
    finally:
        busy.close()
    assert result.returncode == 1, result.stderr[-3000:]
    assert _error_line(result) == (
        f"store-node: {section}: cannot listen on 127.0.0.1:{port}: address already in use"
    )
    assert "Traceback" not in result.stderr


def test_check_config_refuses_two_listeners_on_one_port(tmp_path: Path) -> None:
    port = free_port()
    path = _config(
        tmp_path,
        collection=SYNC_SECTIONS["collection"].format(port=port),
        bamboo_p2p=SYNC_SECTIONS["bamboo_p2p"].format(port=port),
    )
    for command in ("check-config", "serve"):
        result = _cli(command, "--config", str(path))
        assert result.returncode == 2
        assert _error_line(result) == (
            f"store-node: bamboo_p2p.listen 127.0.0.1:{port} and collection.listen "
            f"127.0.0.1:{port} are the same port: give each listener its own"
        )


def test_which_listeners_clash() -> None:
    check_listeners({"a.listen": "127.0.0.1:1", "b.listen": "127.0.0.2:1"})  # other host
    check_listeners({"a.listen": "127.0.0.1:0", "b.listen": "127.0.0.1:0"})  # any free port
    for other in ("127.0.0.1:7", "localhost:7", "0.0.0.0:7", "[::]:7"):
        with pytest.raises(ConfigError, match="are the same port"):
            check_listeners({"a.listen": "127.0.0.1:7", "b.listen": other})


def test_check_config_lists_every_section_and_listener(tmp_path: Path) -> None:
    ports = {name: free_port() for name in SYNC_SECTIONS}
    path = _config(
        tmp_path,
        **{name: text.format(port=ports[name]) for name, text in SYNC_SECTIONS.items()},
    )
    result = _cli("check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["sections_checked"] == list(SECTIONS)
    assert set(SECTIONS) >= {"store_sync", "bamboo_p2p", "collection", "replication"}
    for name, port in ports.items():
        assert summary["listeners"][f"{name}.listen"] == f"127.0.0.1:{port}"
    assert summary["store_sync"]["listen"] == f"127.0.0.1:{ports['store_sync']}"
    assert summary["bamboo_p2p"]["listen"] == f"127.0.0.1:{ports['bamboo_p2p']}"


def _documented_listeners() -> dict[str, set[str]]:
    """Section -> every ``listen`` address the docs and the example config show for it
    (TOML blocks of README.md and docs/*.md, and examples/store_node.toml, commented
    lines included: they are what an operator uncomments)."""
    texts = [(ROOT / "examples" / "store_node.toml").read_text()]
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        texts += re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S)
    # The module docstrings show each section too.
    for module in ("replication.py", "collection.py", "bamboo_p2p.py", "store_sync/config.py"):
        texts.append((ROOT / "store_node" / module).read_text())
    found: dict[str, set[str]] = {}
    for text in texts:
        section = None
        for line in text.splitlines():
            line = line.strip().lstrip("#").strip()
            if m := re.fullmatch(r"\[(\w+)\].*", line):
                section = m.group(1)
            elif section and (m := re.match(r'listen\s*=\s*"([^"]+)"', line)):
                found.setdefault(section, set()).add(m.group(1))
    return found


def test_the_documented_listeners_each_have_their_own_port() -> None:
    found = _documented_listeners()
    assert {"grpc", "metrics", "replication", "collection", "bamboo_p2p", "store_sync"} <= set(
        found
    ), found
    owner: dict[int, str] = {}
    for section, addresses in sorted(found.items()):
        for address in addresses:
            port = int(address.rpartition(":")[2])
            assert owner.setdefault(port, section) == section, (
                f"port {port}: [{owner[port]}] and [{section}] in the docs"
            )


def test_the_example_config_with_every_listener_on_passes_check_config(tmp_path: Path) -> None:
    """Uncomment the example's sync sections (as an operator would): still valid, no clash."""
    text = (ROOT / "examples" / "store_node.toml").read_text()
    on = re.sub(r"^# (\[(?:store_sync|bamboo_p2p)\]|listen = )", r"\1", text, flags=re.M)
    assert len(re.findall(r"^\[bamboo_p2p\]", on, flags=re.M)) == 1 and "\nlisten = " in on
    path = tmp_path / "store.toml"
    path.write_text(on)
    config = load_config(path)
    assert config.bamboo_p2p.enabled and config.store_sync.enabled
    tomllib.loads(on)


def test_store_node_replicate_with_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        path = _config(tmp_path, replication=SYNC_SECTIONS["replication"].format(port=port))
        result = _cli("replicate", "--config", str(path))
    finally:
        busy.close()
    assert result.returncode == 1, result.stderr[-3000:]
    assert _error_line(result) == (
        f"store-node: replication: cannot listen on 127.0.0.1:{port}: address already in use"
    )


def test_the_peer_tls_context_is_built_once_and_again_when_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dialling a peer does not read the certificate files again (it did, on the event
    loop, for every connection); a renewed certificate is picked up by its mtime."""
    from store_node import listeners
    from store_node.listeners import ListenerConfig
    from tests.store_node.tls_certs import make_certs

    certs = make_certs(tmp_path / "pki")
    built: list[object] = []
    real = listeners.tls_client_context

    def counting(*args: Any) -> ssl.SSLContext:
        built.append(args)
        return real(*args)

    monkeypatch.setattr(listeners, "tls_client_context", counting)
    config = ListenerConfig(
        peer_tls_ca=certs.ca, peer_tls_cert=certs.client.cert, peer_tls_key=certs.client.key
    )
    first = config.peer_context()
    assert all(config.peer_context() is first for _ in range(5))
    assert len(built) == 1
    # Renewed in place: the other client's certificate and key, a later mtime.
    certs.client.cert.write_bytes(certs.other_client.cert.read_bytes())
    certs.client.key.write_bytes(certs.other_client.key.read_bytes())
    later = time.time() + 5
    os.utime(certs.client.cert, (later, later))
    os.utime(certs.client.key, (later, later))
    renewed = config.peer_context()
    assert renewed is not first and len(built) == 2
    assert config.peer_context() is renewed and len(built) == 2
    assert ListenerConfig(peer_tls_ca=certs.ca) == ListenerConfig(peer_tls_ca=certs.ca)
