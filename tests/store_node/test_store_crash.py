"""The real ``store-node serve`` process: SIGKILL mid-ingest, restart, SIGTERM flush."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdk.sds.message import decode_message
from store_node.archive import open_archive
from store_node.archive.base import Archive
from store_node.config import load_config
from tests.store_node.store_node_helpers import new_schema, postgres_dsn, sds_message

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _config(tmp_path: Path, backend: str, **transport: object) -> Path:
    if backend == "sqlite":
        archive = 'path = "archive.db"\nsynchronous = "normal"'
    else:
        archive = f'backend = "postgresql"\ndsn = "{postgres_dsn()}"\nschema = "{new_schema()}"'
    options = "\n".join(
        f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in transport.items()
    )
    path = tmp_path / "store.toml"
    path.write_text(
        f"""
[archive]
{archive}

[ingest]
channels = ["c", "d"]
batch_size = 200
batch_interval_ms = 20

[transport]
kind = "factory"
factory = "tests.store_node.synthetic_transport:create"
{options}

[grpc]
listen = "127.0.0.1:0"

[metrics]
listen = ""
"""
    )
    return path


def _serve(config: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _open(config: Path) -> Archive:
    return open_archive(load_config(config).archive, migrate=False)


def _count(config: Path) -> int:
    try:
        with _open(config) as archive:
            return archive.count() if archive.schema_version() else 0
    except Exception:
        return 0


def _wait(predicate: object, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"store-node exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def _expected_ids(channel: str, n: int) -> set[str]:
    return {decode_message(sds_message(channel, i)).message_id for i in range(n)}


def _drop(config: Path) -> None:
    cfg = load_config(config).archive
    if cfg.backend == "postgresql":
        from store_node.archive.postgres import PostgresArchive

        PostgresArchive(cfg.dsn, schema=cfg.schema).drop_schema()


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sigkill_during_ingest_leaves_a_consistent_archive(tmp_path: Path, backend: str) -> None:
    config = _config(tmp_path, backend, count=0, duplicate_every=7, malformed_every=50)
    try:
        proc = _serve(config)
        try:
            _wait(lambda: _count(config) > 3000, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        with _open(config) as archive:
            assert archive.check_integrity() == []
            stats = archive.stats()
            killed_at = stats.message_count
            assert killed_at > 3000
            # Each channel holds a prefix of the generator's messages (batches commit in
            # arrival order, whole or not at all), once each: the first n, no gap.
            exported: dict[str, list[str]] = {}
            for batch in archive.iter_export():
                for r in batch:
                    exported.setdefault(r.channel_id, []).append(r.message_id)
            assert {c: len(ids) for c, ids in exported.items()} == stats.channels
            for channel, n in stats.channels.items():
                assert set(exported[channel]) == _expected_ids(channel, n)
        # Restart: the generator replays from 0, so everything archived comes back as
        # rebroadcasts (merged, counted), then new messages; then a graceful stop.
        proc = _serve(config)
        try:
            _wait(lambda: _count(config) > killed_at + 2000, proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        with _open(config) as archive:
            assert archive.check_integrity() == []
            stats = archive.stats()
            assert stats.message_count > killed_at + 2000
            assert stats.total_arrivals > stats.message_count  # replays were counted, not stored
    finally:
        _drop(config)


@pytest.mark.integration
def test_sigterm_flushes_every_received_message(tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    config = _config(tmp_path, "sqlite", count=1500, duplicate_every=10, done_dir=str(done))
    # Batches far larger than the traffic and a long interval: only the flush writes.
    text = config.read_text().replace("batch_size = 200", "batch_size = 100000")
    config.write_text(text.replace("batch_interval_ms = 20", "batch_interval_ms = 600000"))
    proc = _serve(config)
    try:
        _wait(lambda: (done / "c.done").exists() and (done / "d.done").exists(), proc)
        assert _count(config) == 0
    finally:
        # Twice, as tools that signal the process and its group do: the repeat must
        # not cut the flush short.
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    with _open(config) as archive:
        stats = archive.stats()
        assert stats.channels == {"c": 1500, "d": 1500}
        assert stats.total_arrivals == 2 * (1500 + 150)
        assert archive.check_integrity() == []
