"""What every campaign of ``tests/reliability`` shares: the broker under the shipped
settings, the real store node as a killable process, reading and checking the
archive, and the results file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from sdk.sds.errors import RemoteProtocolError
from sdk.sds.message import Message, decode_message
from store_node.archive import open_archive
from store_node.archive.base import Archive, Criteria
from store_node.config import load_config
from tests.store_node.store_node_helpers import PG_DSN, new_schema
from transports.base import message_hash, topic_for_channel

ROOT = Path(__file__).resolve().parents[2]

#: The shipped broker configuration; the campaigns run under exactly these settings.
SAMPLE_BROKER_CONFIG = ROOT / "examples" / "mosquitto.conf"


def broker_config(persistence_dir: Path) -> str:
    """``examples/mosquitto.conf`` for a private broker: its listener lines dropped
    (:class:`~tests.conftest.PrivateMosquitto` writes its own) and persistence under
    ``persistence_dir``."""
    lines = []
    for line in SAMPLE_BROKER_CONFIG.read_text().splitlines():
        key = line.split(" ", 1)[0]
        if key in ("listener", "allow_anonymous"):
            continue
        if key == "persistence_location":
            line = f"persistence_location {persistence_dir}/"
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_store_config(
    path: Path,
    *,
    backend: Literal["sqlite", "postgresql"],
    broker_port: int,
    channels: list[str],
    protocol: Literal[5, "3.1.1"] = 5,
    transport_extra: str = "",
    grpc_listen: str = "127.0.0.1:0",
) -> str:
    """Write a ``store-node serve`` configuration to ``path``: the archive in
    ``path``'s folder (SQLite) or in a new PostgreSQL schema, MQTT ingest of
    ``channels``. Returns the schema ("" for SQLite), for :func:`drop_schema`."""
    if backend == "sqlite":
        archive = 'path = "archive.db"'
        schema = ""
    else:
        schema = new_schema()
        archive = f'backend = "postgresql"\ndsn = "{PG_DSN}"\nschema = "{schema}"'
    transport = f'kind = "mqtt"\nhost = "127.0.0.1"\nport = {broker_port}\n'
    transport += f"protocol = {json.dumps(protocol)}\n" + transport_extra
    path.write_text(
        f"[archive]\n{archive}\n\n"
        f"[ingest]\nchannels = {json.dumps(channels)}\nbatch_interval_ms = 50\n\n"
        f"[transport]\n{transport}\n"
        f'[grpc]\nlisten = "{grpc_listen}"\n\n[metrics]\nlisten = ""\n'
    )
    return schema


def drop_schema(schema: str) -> None:
    """Drop the PostgreSQL schema :func:`write_store_config` made (nothing for "")."""
    if schema:
        from store_node.archive.postgres import PostgresArchive

        PostgresArchive(PG_DSN, schema=schema).drop_schema()


class StoreNodeProcess:
    """The real ``store-node serve``; knows when it has started (its log line)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = threading.Event()
        self.starts = 0

    def start(self) -> None:
        """Start (or restart) the node; :meth:`wait_started` waits for it."""
        self.started.clear()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "store_node.cli", "serve", "--config", str(self.config)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.starts += 1
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        with self.log.open("ab") as out:
            for line in proc.stderr:
                out.write(line)
                out.flush()
                if b'"store node started"' in line:
                    self.started.set()

    async def wait_started(self, timeout: float = 300.0) -> None:
        """Wait for the node's "started" log line; raise if it exits or takes ``timeout`` s."""
        # Generous: a restarted node reads its session's backlog before the SUBACKs
        # that end its start, and CI machines are shared.
        deadline = time.monotonic() + timeout
        while not self.started.is_set():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"store node exited at start; see {self.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"store node did not start in {timeout} s; see {self.log}")
            await asyncio.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the node (if it runs) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM the node (a clean stop) and return its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def archive_count(config: Path) -> int:
    """Rows in the archive of the node configured by ``config`` (0 before its schema exists)."""
    try:
        with open_archive(load_config(config).archive, migrate=False) as archive:
            return archive.count() if archive.schema_version() else 0
    except Exception:
        return 0


def archive_rows(archive: Archive, channel: str) -> Iterator[tuple[str, bytes, int, bytes | None]]:
    """Every row of ``channel``, oldest first: message id, bytes, size, transport hash."""
    after = None
    while True:
        page = archive.find(
            Criteria(channel_id=channel),
            after=after,
            forward=True,
            limit=1000,
            max_bytes=64 * 1024 * 1024,
            include_data=True,
        )
        for m in page.messages:
            assert m.data is not None
            yield m.message_id, m.data, m.message_size, m.transport_hash
        if page.next_key is None:
            return
        after = page.next_key


def decode_row(
    channel: str, message_id: str, data: bytes, size: int, hint: bytes | None
) -> Message | None:
    """The SDS message a row holds, or None when the row is corrupt: bytes that do not
    decode, or to another id or channel, a wrong size or a wrong transport hash."""
    try:
        message = decode_message(data)
    except RemoteProtocolError:
        return None
    if (
        message.message_id != message_id
        or message.channel_id != channel
        or size != len(data)
        or hint != message_hash(topic_for_channel(channel), data)
    ):
        return None
    return message


def append_result(path: Path, line: str) -> None:
    """Append one JSON report line to ``path`` (``bench/results/...``) with a timestamp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({"ts": time.time(), **json.loads(line)}) + "\n")
