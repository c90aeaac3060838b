"""The broker queue holds a store-node outage (issue 27.4).

``examples/mosquitto.conf`` is what ``scripts/services`` runs and what
docs/store-node.md ("Outage budget") documents: its queue limits are the budget
(:data:`store_node.node.BROKER_QUEUE_MESSAGES` / :data:`~store_node.node.BROKER_QUEUE_BYTES`).
The real-broker test publishes the issue's outage (6,000 messages while the node
is down; a stock Mosquitto kept 1,000 of them) through a broker that
``scripts/services`` itself started on a free port; the full budget is
``bench/broker_queue.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store_node.config import parse_config
from store_node.node import BROKER_QUEUE_BYTES, BROKER_QUEUE_MESSAGES, StoreNode
from tests.conftest import free_port, service_available, skip_or_fail
from tests.store_node.store_node_helpers import sds_message, wait_for
from transports.base import topic_for_channel

ROOT = Path(__file__).resolve().parents[2]
#: The outage of issue 27: 6,000 messages published while the store node was down.
OUTAGE = 6_000


def _settings(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition(" ")
            out[key] = value.strip()
    return out


@pytest.mark.parametrize("conf_file", ["examples/mosquitto.conf", "deploy/compose/mosquitto.conf"])
def test_the_shipped_broker_config_is_sized_to_the_documented_budget(conf_file: str) -> None:
    conf = _settings(ROOT / conf_file)
    assert int(conf["max_queued_messages"]) == BROKER_QUEUE_MESSAGES
    assert int(conf["max_queued_bytes"]) == BROKER_QUEUE_BYTES
    assert conf["persistence"] == "true"
    # Mosquitto parses both as a C int.
    assert 0 < BROKER_QUEUE_BYTES < 2**31 and 0 < BROKER_QUEUE_MESSAGES < 2**31
    docs = (ROOT / "docs" / "store-node.md").read_text()
    assert f"{BROKER_QUEUE_MESSAGES:,}" in docs and "1 GiB" in docs
    services = (ROOT / "scripts" / "services").read_text()
    assert "examples/mosquitto.conf" in services


@pytest.fixture
def services_broker() -> Iterator[int]:
    """A Mosquitto that ``scripts/services`` starts on a free port; stopped afterwards."""
    if shutil.which("mosquitto") is None:
        skip_or_fail("the mosquitto binary is not installed")
    port = free_port()
    # Not under pytest's tmp_path: run as root, Mosquitto drops to its own user, which
    # cannot enter pytest's private (0700) base directory.
    state = Path(tempfile.mkdtemp(prefix="chorus-services-"))
    state.chmod(0o755)
    env = {
        **os.environ,
        "CHORUS_SERVICES_MQTT_PORT": str(port),
        "CHORUS_SERVICES_DIR": str(state),
        "CHORUS_SERVICES_ONLY": "mosquitto",
    }
    done = subprocess.run(
        [str(ROOT / "scripts" / "services")], env=env, capture_output=True, text=True, timeout=60
    )
    pid_file = state / "mosquitto" / "mosquitto.pid"
    try:
        assert service_available(port), done.stdout + done.stderr
        yield port
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.integration
async def test_the_broker_queue_holds_an_outage_for_the_store_node(
    tmp_path: Path, services_broker: int
) -> None:
    from transports.mqtt import MqttTransport

    channel = f"outage-{uuid.uuid4().hex[:8]}"
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel], "batch_interval_ms": 10},
            # The node's own MQTT defaults: persistent session, QoS 1, ack after commit.
            "transport": {"kind": "mqtt", "host": "127.0.0.1", "port": services_broker},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    node = StoreNode(config)
    await node.start()  # subscribes: the broker now keeps a session for it
    await node.stop()
    topic = topic_for_channel(channel)
    async with MqttTransport("127.0.0.1", services_broker, max_inflight=1000) as publisher:
        for i in range(OUTAGE):
            await publisher.publish(topic, sds_message(channel, i))
        await publisher.flush()
    node = StoreNode(config)
    await node.start()
    try:
        archived = "chorus_store_ingest_archived_total"
        await wait_for(lambda: node.metrics.value(archived) >= OUTAGE, timeout=60)
        assert node.archive is not None and node.archive.count() == OUTAGE
    finally:
        await node.stop()
