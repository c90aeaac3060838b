"""Health and metrics scraped over HTTP and gRPC, through a broker outage (issue 16.2).

A node on a private Mosquitto: ``/healthz``, ``/readyz`` and ``/metrics`` are apart (any
other path is 404), ``chorus_store_archive_message_bytes`` is the archive's real size,
``grpc.health.v1`` follows readiness, and killing then restarting the broker moves the
connected gauge and the disconnect/reconnect counters and writes a JSON log line for each
state change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import socketserver
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from store_node.config import parse_config
from store_node.log import JsonFormatter
from store_node.metrics import NodeMetrics, _ProbeServer
from store_node.node import StoreNode
from tests.conftest import PrivateMosquitto, free_port
from tests.store_node.store_node_helpers import sds_message, wait_for
from transports.base import topic_for_channel
from transports.mqtt import MqttTransport


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _sample(body: str, name: str) -> float:
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the exposition")


async def _grpc_health(port: int, service: str = "") -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return reply.status


async def _until_grpc_health(port: int, status: Any, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await _grpc_health(port) != status:
        assert loop.time() < deadline, f"grpc.health.v1 never reported {status}"
        await asyncio.sleep(0.02)


@pytest.mark.integration
async def test_probes_metrics_and_a_broker_outage(
    tmp_path: Path,
    private_mosquitto: Callable[..., PrivateMosquitto],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = private_mosquitto()
    channel = f"probe-{uuid.uuid4().hex[:8]}"
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel], "batch_interval_ms": 5},
            "transport": {"port": broker.port, "reconnect_min": 0.05, "reconnect_max": 0.2},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": "127.0.0.1:0"},
        },
        tmp_path,
    )
    node = StoreNode(config)
    node.health.interval = 0.05
    caplog.set_level(logging.INFO, logger="store_node")
    await node.start()
    try:
        assert node.metrics_address is not None
        base = f"http://127.0.0.1:{node.metrics_address[1]}"
        status, body = await asyncio.to_thread(_get, base + "/healthz")
        assert (status, body) == (200, "ok\n")
        status, body = await asyncio.to_thread(_get, base + "/readyz")
        assert status == 200
        assert json.loads(body) == {
            "ready": True,
            "checks": {"broker_connected": True, "archive_reachable": True},
            "details": {"referenced_missing": 0},
        }
        for path in ("/", "/health", "/metrics/x", "/readyz/"):
            assert (await asyncio.to_thread(_get, base + path))[0] == 404, path
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await _grpc_health(node.grpc_port) == serving
        assert await _grpc_health(node.grpc_port, "chorus.store.v1.Store") == serving

        # chorus_store_archive_message_bytes is the archive's size, not 0.
        payloads = [sds_message(channel, i) for i in range(20)]
        async with MqttTransport(port=broker.port) as publisher:
            for p in payloads:
                await publisher.publish(topic_for_channel(channel), p)
        await wait_for(lambda: node.metrics.value("chorus_store_ingest_archived_total") >= 20)
        await asyncio.to_thread(node.run_retention)
        _, body = await asyncio.to_thread(_get, base + "/metrics")
        assert _sample(body, "chorus_store_archive_message_bytes") == sum(map(len, payloads))
        assert _sample(body, "chorus_store_archive_messages") == 20
        assert _sample(body, "chorus_store_broker_connected") == 1
        assert _sample(body, "chorus_store_archive_reachable") == 1
        # Every declared labelled series exists before its first event.
        assert 'chorus_store_retention_deleted_total{reason="age"} 0.0' in body
        assert _sample(body, "chorus_store_broker_reconnects_total") == 0

        broker.kill()
        await wait_for(lambda: _get(base + "/readyz")[0] == 503, timeout=20)
        _, body = await asyncio.to_thread(_get, base + "/readyz")
        assert json.loads(body)["checks"]["broker_connected"] is False
        _, body = await asyncio.to_thread(_get, base + "/metrics")
        assert _sample(body, "chorus_store_broker_connected") == 0
        assert _sample(body, "chorus_store_broker_disconnects_total") == 1
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        await _until_grpc_health(node.grpc_port, not_serving)

        broker.start()
        await wait_for(lambda: _get(base + "/readyz")[0] == 200, timeout=30)
        _, body = await asyncio.to_thread(_get, base + "/metrics")
        assert _sample(body, "chorus_store_broker_connected") == 1
        assert _sample(body, "chorus_store_broker_reconnects_total") >= 1
        await _until_grpc_health(node.grpc_port, serving)
    finally:
        await node.stop()

    events = [getattr(r, "event", None) for r in caplog.records]
    for event in ("broker_connected", "archive_reachable", "broker_disconnected"):
        assert event in events, event
    assert "broker_reconnected" in events
    # Each of those lines is one JSON object with the event as a field.
    formatter = JsonFormatter()
    for record in caplog.records:
        if getattr(record, "event", None) == "broker_reconnected":
            line = formatter.format(record)
            assert "\n" not in line and json.loads(line)["event"] == "broker_reconnected"


async def test_readiness_without_a_transport_needs_only_the_archive(tmp_path: Path) -> None:
    from store_node.archive.sqlite import SqliteArchive
    from store_node.health import NodeHealth
    from store_node.metrics import NodeMetrics

    archive = SqliteArchive(tmp_path / "a.db")
    archive.migrate()
    metrics = NodeMetrics()
    health = NodeHealth(metrics)
    changes: list[bool] = []

    async def record(ready: bool) -> None:
        changes.append(ready)

    health.on_change(record)
    assert health.ready()[0] is False, "not ready before the first probe"
    await health.probe(archive, None)
    assert health.ready() == (True, {"broker_connected": None, "archive_reachable": True})
    archive.close()
    assert changes == [True]
    assert metrics.value("chorus_store_archive_reachable") == 1


async def test_an_unreachable_archive_is_not_ready(caplog: pytest.LogCaptureFixture) -> None:
    from store_node.archive.postgres import PostgresArchive
    from store_node.health import NodeHealth
    from store_node.metrics import NodeMetrics

    # A PostgreSQL server that is not there: the driver's own connection error.
    archive = PostgresArchive(f"host=127.0.0.1 port={free_port()} dbname=x connect_timeout=2")
    metrics = NodeMetrics()
    health = NodeHealth(metrics)
    caplog.set_level(logging.INFO, logger="store_node")
    await health.probe(archive, None)
    ready, checks = health.ready()
    assert not ready and checks["archive_reachable"] is False
    assert metrics.value("chorus_store_archive_reachable") == 0
    assert [getattr(r, "event", None) for r in caplog.records] == ["archive_unreachable"]


def _raw_get(port: int, request: bytes, accept: threading.Semaphore) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        accept.release()  # the whole request is at the server before it accepts
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply


def _without_date(reply: bytes) -> bytes:
    return b"\r\n".join(line for line in reply.split(b"\r\n") if not line.startswith(b"Date:"))


def test_healthz_is_answered_on_the_listening_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each blocking call of a probe hands the GIL over (a switch interval each while a
    # catch-up keeps the interpreter busy): a complete liveness probe is answered without
    # starting a handler thread, with the bytes that thread would have written.
    handed_off: list[bytes] = []
    threaded = socketserver.ThreadingMixIn.process_request
    accept = threading.Semaphore(0)
    get_request = _ProbeServer.get_request

    def record(server: Any, request: Any, address: Any) -> None:
        handed_off.append(request.recv(64, socket.MSG_PEEK))
        threaded(server, request, address)

    def gated_accept(server: Any) -> Any:
        assert accept.acquire(timeout=10)
        return get_request(server)

    monkeypatch.setattr(socketserver.ThreadingMixIn, "process_request", record)
    monkeypatch.setattr(_ProbeServer, "get_request", gated_accept)
    metrics = NodeMetrics()
    _, port = metrics.serve("127.0.0.1:0")
    try:
        inline = _raw_get(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", accept)
        head_only = _raw_get(port, b"HEAD /healthz HTTP/1.1\r\n\r\n", accept)
        assert handed_off == []
        # The same path with a query string goes through the handler: same answer.
        handled = _raw_get(port, b"GET /healthz?probe=1 HTTP/1.1\r\n\r\n", accept)
        assert len(handed_off) == 1
        assert _without_date(inline) == _without_date(handled)
        assert inline.endswith(b"\r\n\r\nok\n") and inline.startswith(b"HTTP/1.0 200 OK\r\n")
        assert _without_date(head_only) == _without_date(handled)[: -len(b"ok\n")]
        ready = _raw_get(port, b"GET /readyz HTTP/1.1\r\n\r\n", accept)
        assert ready.startswith(b"HTTP/1.0 200 OK")
        assert len(handed_off) == 2
    finally:
        metrics.close()
