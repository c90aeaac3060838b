"""The store node's start and MQTT durability: bad channels, a hanging start, acks.

The real CLI in a subprocess where the issue named the process behaviour
(one-line error, SIGTERM during start), private Mosquitto brokers otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk.testing.waiting import eventually_blocking
from store_node.config import parse_config
from store_node.errors import ConfigError
from store_node.node import StoreNode, durable_mqtt_options
from tests.conftest import PrivateMosquitto
from tests.store_node.store_node_helpers import node_config, sds_message, wait_for
from transports.base import topic_for_channel
from transports.mqtt import MqttTransport

ROOT = Path(__file__).resolve().parents[2]


def _serve(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("bad", ["a\\u0000b", "a/+", "room/#", "x\\ny"])
def test_a_bad_channel_in_the_config_fails_at_start_with_one_line(tmp_path: Path, bad: str) -> None:
    config = tmp_path / "store.toml"
    config.write_text(
        f'[ingest]\nchannels = ["good", "{bad}"]\n'
        # Nothing listens here: the node must fail before it even tries to connect.
        '[transport]\nkind = "mqtt"\nhost = "127.0.0.1"\nport = 9\n'
        '[grpc]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = ""\n'
    )
    proc = _serve(config)
    _, err = proc.communicate(timeout=60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2, err.decode()
    assert len(lines) == 1 and lines[0].startswith(
        "store-node: ingest.channels: invalid channel id"
    )
    assert not (tmp_path / "store.db").exists()


async def test_start_rejects_a_bad_channel_before_opening_anything(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    import dataclasses

    bad = dataclasses.replace(config, ingest=dataclasses.replace(config.ingest, channels=("a/+",)))  # type: ignore[attr-defined]
    node = StoreNode(bad)
    with pytest.raises(ConfigError, match="wildcard"):
        await node.start()
    assert node.archive is None
    await node.stop()


def test_sigterm_during_a_hanging_start_exits(tmp_path: Path) -> None:
    # A "broker" that accepts TCP and never answers CONNECT: start() hangs in connect.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        config = tmp_path / "store.toml"
        config.write_text(
            f'[archive]\npath = "a.db"\n[ingest]\nchannels = ["c"]\n'
            f'[transport]\nkind = "mqtt"\nhost = "127.0.0.1"\nport = {port}\n'
            "connect_timeout = 600\n"
            '[grpc]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = ""\n'
        )
        proc = _serve(config)
        try:
            # Wait until start() is inside the connect: the node's TCP connection comes in.
            silent.settimeout(0.2)
            accepted: list[socket.socket] = []

            def connected() -> bool:
                assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
                with contextlib.suppress(TimeoutError):
                    accepted.append(silent.accept()[0])
                return bool(accepted)

            assert eventually_blocking(connected, timeout=60)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
            accepted[0].close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "start cancelled" in proc.stderr.read().decode()  # type: ignore[union-attr]


def test_durable_mqtt_defaults_can_be_overridden() -> None:
    opts = durable_mqtt_options({"host": "h"}, "abc")
    assert opts == {
        "host": "h",
        "manual_ack": True,
        "persistent_session": True,
        "client_id": "chorus-store-abc",
        "session_expiry": 7 * 86_400,
        "receive_maximum": 20_000,
    }
    off = durable_mqtt_options({"manual_ack": False, "persistent_session": False}, "abc")
    assert off["manual_ack"] is False and "session_expiry" not in off


async def test_node_acknowledges_what_it_committed_and_keeps_its_session(
    tmp_path: Path, private_mosquitto: Callable[..., PrivateMosquitto]
) -> None:
    broker = private_mosquitto("max_queued_messages 100000\n")
    channel = f"durable-{uuid.uuid4().hex[:8]}"
    topic = topic_for_channel(channel)
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel], "batch_interval_ms": 5},
            "transport": {"kind": "mqtt", "host": "127.0.0.1", "port": broker.port},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    node = StoreNode(config)
    await node.start()
    try:
        transport = node.transport
        assert isinstance(transport, MqttTransport)
        async with MqttTransport("127.0.0.1", broker.port) as publisher:
            for i in range(300):
                await publisher.publish(topic, sds_message(channel, i))
            await publisher.publish(topic, b"not sds")
            await publisher.flush()
        m = node.metrics
        await wait_for(lambda: m.value("chorus_store_ingest_archived_total") == 300)
        await wait_for(lambda: transport.stats.acks_sent == 301)
        first_client = transport.client_id
    finally:
        await node.stop()
    # While the node is down the broker queues for its session; the restarted node
    # (same archive, so the same client id) receives it.
    async with MqttTransport("127.0.0.1", broker.port) as publisher:
        for i in range(300, 400):
            await publisher.publish(topic, sds_message(channel, i))
        await publisher.flush()
    node = StoreNode(config)
    await node.start()
    try:
        assert isinstance(node.transport, MqttTransport)
        assert node.transport.client_id == first_client
        await wait_for(lambda: node.metrics.value("chorus_store_ingest_archived_total") == 100)
        assert node.archive is not None and node.archive.count() == 400
    finally:
        await node.stop()
    await asyncio.sleep(0)
