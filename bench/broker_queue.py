"""A store-node outage of the documented budget through a real Mosquitto.

Starts Mosquitto the way ``scripts/services`` does (``examples/mosquitto.conf``, on a
free port, its database in a temporary folder), makes an in-process store node
(SQLite, the node's MQTT defaults: persistent session, QoS 1, acknowledgement after
commit) subscribe and stop, publishes the outage while it is down, restarts it and
waits until it has archived everything or nothing more comes for ``--settle``
seconds. Then ten "live" messages follow, each naming the two before it in its
causal history, as a participant's next messages would: when the broker dropped the
end of the outage, they reference ids the archive lacks, and
``chorus_store_referenced_missing`` says so.

Messages are shaped like the SDK's default (``waku``) bloom-filter profile: each
carries an 18,752-byte filter, about 19 KB in all. The default outage is the byte
budget (:data:`store_node.node.BROKER_QUEUE_BYTES`, 1 GiB) divided by that size, in
whole thousands: 56,000 messages.

Figures (JSON lines, appended to ``bench/results/broker_queue.jsonl``), tagged with
``config`` (``shipped`` or ``stock``: Mosquitto's own queue defaults, 1000 messages):

* ``broker_queue.published`` / ``.archived`` / ``.lost`` (messages);
* ``broker_queue.publish_s`` (publishing the outage), ``.drain_s`` (restart to the
  last archived message);
* ``broker_queue.broker_rss_mb``: Mosquitto's resident memory holding the queue;
* ``broker_queue.referenced_missing``: the node's count after the live messages.

Usage: ``python bench/broker_queue.py [--stock] [--messages N] [--quick]``
(quick: a tenth of the budget).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from _common import Recorder, ensure_repo_on_path

ensure_repo_on_path()

from sdk.sds.bloom import WAKU
from sdk.sds.message import HistoryEntry, Message, encode_message
from sdk.sds.message_id import compute_message_id
from store_node.config import parse_config
from store_node.node import BROKER_QUEUE_BYTES, StoreNode
from transports.base import topic_for_channel
from transports.mqtt import MqttTransport

ROOT = Path(__file__).resolve().parent.parent
BASE_MS = 1_760_000_000_000
FILTER = bytes(WAKU.size_bytes)


def payload(channel: str, n: int, history: tuple[str, ...]) -> tuple[str, bytes]:
    """Message ``n``: its id and bytes, with a default-profile-sized bloom filter."""
    body = b"a chat line of about fifty bytes, message %d" % n
    mid = compute_message_id(channel, "alice", BASE_MS + n, body)
    data = encode_message(
        Message(
            sender_id="alice",
            message_id=mid,
            channel_id=channel,
            lamport_timestamp=BASE_MS + n,
            causal_history=tuple(HistoryEntry(h) for h in history),
            bloom_filter=FILTER,
            content=body,
        )
    )
    return mid, data


def start_broker(state: Path, stock: bool) -> tuple[int, int]:
    """Mosquitto via ``scripts/services`` on a free port; ``(port, pid)``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **os.environ,
        "CHORUS_SERVICES_MQTT_PORT": str(port),
        "CHORUS_SERVICES_DIR": str(state),
        "CHORUS_SERVICES_ONLY": "mosquitto",
    }
    if stock:
        # The same script and file, minus the two queue limits: Mosquitto's defaults.
        conf = state / "examples-stock.conf"
        lines = (ROOT / "examples" / "mosquitto.conf").read_text().splitlines()
        conf.write_text(
            "\n".join(line for line in lines if not line.startswith("max_queued_")) + "\n"
        )
        script = (ROOT / "scripts" / "services").read_text()
        script = script.replace('"$root/examples/mosquitto.conf"', f'"{conf}"')
        runner = ["bash", "-c", script, "services"]
    else:
        runner = [str(ROOT / "scripts" / "services")]
    subprocess.run(runner, env=env, check=True, timeout=60)
    pid_file = state / "mosquitto" / "mosquitto.pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"mosquitto did not start on port {port}")
        time.sleep(0.05)
    return port, int(pid_file.read_text())


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def outage(
    port: int, pid: int, messages: int, settle: float, folder: Path
) -> dict[str, float]:
    """Subscribe a node, stop it, publish ``messages``, restart it; the figures."""
    channel = f"outage-{uuid.uuid4().hex[:8]}"
    topic = topic_for_channel(channel)
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel]},
            "transport": {"kind": "mqtt", "host": "127.0.0.1", "port": port},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        folder,
    )
    node = StoreNode(config)
    await node.start()
    await node.stop()
    ids: list[str] = []
    started = time.perf_counter()
    async with MqttTransport("127.0.0.1", port, max_inflight=1000) as publisher:
        for n in range(messages):
            mid, data = payload(channel, n, tuple(ids[-2:]))
            ids.append(mid)
            await publisher.publish(topic, data)
        await publisher.flush()
        publish_s = time.perf_counter() - started
        broker_rss = rss_mb(pid)
        node = StoreNode(config)
        started = time.perf_counter()
        await node.start()
        try:
            archived = "chorus_store_ingest_archived_total"
            last, last_change = 0.0, time.perf_counter()
            while node.metrics.value(archived) < messages:
                now = node.metrics.value(archived)
                if now != last:
                    last, last_change = now, time.perf_counter()
                elif time.perf_counter() - last_change > settle:
                    break
                await asyncio.sleep(0.05)
            drain_s = last_change - started
            got = node.metrics.value(archived)
            for n in range(messages, messages + 10):
                mid, data = payload(channel, n, tuple(ids[-2:]))
                ids.append(mid)
                await publisher.publish(topic, data)
            await publisher.flush()
            deadline = time.monotonic() + 30
            while node.metrics.value(archived) < got + 10 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            missing = node.metrics.value("chorus_store_referenced_missing")
            # Counted in the archive at the end, so a slow commit is not taken for a loss.
            assert node.archive is not None
            kept = len(node.archive.existing_ids({channel: ids[:messages]}))
        finally:
            await node.stop()
    return {
        "published": messages,
        "archived": kept,
        "lost": messages - kept,
        "publish_s": publish_s,
        "drain_s": drain_s,
        "broker_rss_mb": broker_rss,
        "referenced_missing": missing,
    }


UNITS = {"publish_s": "s", "drain_s": "s", "broker_rss_mb": "MB"}


def main() -> None:
    """Run one outage and record its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stock", action="store_true", help="Mosquitto's default queue limits")
    parser.add_argument("--messages", type=int, help="outage size (default: the byte budget)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the budget")
    parser.add_argument("--settle", type=float, default=20.0, help="s without progress = done")
    args = parser.parse_args()
    size = len(payload("outage-00000000", 0, ("x" * 64, "y" * 64))[1])
    # The documented budget: the byte limit in whole thousands of messages (Mosquitto
    # counts a few bytes more per message than its payload; at the exact limit,
    # 56,408 of these, it dropped the last 10).
    budget = BROKER_QUEUE_BYTES // size // 1000 * 1000
    messages = args.messages or budget // (10 if args.quick else 1)
    if shutil.which("mosquitto") is None:
        raise SystemExit("the mosquitto binary is not installed")
    state = Path(tempfile.mkdtemp(prefix="chorus-broker-queue-"))
    state.chmod(0o755)  # Mosquitto, dropping root, must reach its database folder
    pid = 0
    try:
        port, pid = start_broker(state, args.stock)
        figures = asyncio.run(outage(port, pid, messages, args.settle, state))
    finally:
        if pid:
            os.kill(pid, signal.SIGTERM)
        shutil.rmtree(state, ignore_errors=True)
    rec = Recorder("broker_queue")
    config = "stock" if args.stock else "shipped"
    for name, value in figures.items():
        unit = UNITS.get(name, "messages")
        rec.record(f"broker_queue.{name}", value, unit, config=config, message_bytes=size)


if __name__ == "__main__":
    main()
