"""End to end over loopback gRPC: ingest from a transport, query with GrpcStoreClient."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sdk._proto.store.v1 import store_pb2, store_pb2_grpc
from sdk.sds.message import decode_message
from sdk.store.client import StoreClient
from sdk.store.grpc import GrpcStoreClient, StoreQueryError
from store_node.config import NodeConfig, parse_config
from store_node.node import StoreNode
from tests.store_node.store_node_helpers import FeedTransport, node_config, sds_message, wait_for
from transports.base import message_hash, topic_for_channel

ARCHIVED = "chorus_store_ingest_archived_total"


async def _publish(node: StoreNode, transport: FeedTransport, channel: str, n: int) -> list[bytes]:
    before = node.metrics.value(ARCHIVED)
    payloads = [sds_message(channel, i) for i in range(n)]
    for p in payloads:
        await transport.publish(topic_for_channel(channel), p)
    await wait_for(lambda: node.metrics.value(ARCHIVED) >= before + n)
    return payloads


async def _start(tmp_path: Path, **grpc_options: Any) -> tuple[StoreNode, FeedTransport]:
    transport = FeedTransport()
    config = node_config(tmp_path, **grpc_options)
    assert isinstance(config, NodeConfig)
    node = StoreNode(config, transport=transport)
    await node.start()
    return node, transport


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[StoreNode, FeedTransport]]:
    node, transport = await _start(tmp_path, max_page_size=50, max_ids_per_request=20)
    yield node, transport
    await node.stop()


async def test_client_implements_store_client_lookup_by_id_and_hint(
    running: tuple[StoreNode, FeedTransport],
) -> None:
    node, transport = running
    payloads = await _publish(node, transport, "c", 30)
    ids = [decode_message(p).message_id for p in payloads]
    async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}", max_ids_per_request=7) as client:
        assert isinstance(client, StoreClient)
        # More ids than one request may carry: the client splits; unknown ids are absent.
        got = await client.get_messages("c", [*ids[:25], "unknown"])
        assert sorted(got) == sorted(payloads[:25])
        hint = message_hash(topic_for_channel("c"), payloads[29])
        assert await client.get_messages("c", [], [hint]) == [payloads[29]]
        # id and hint for the same message: returned once.
        assert await client.get_messages(
            "c", [ids[3]], [message_hash("chorus/sds/v1/c", payloads[3])]
        ) == [payloads[3]]
        assert await client.get_messages("d", ids[:3]) == []
        assert await client.presence("c", [ids[0], "nope"]) == {ids[0]}
        found = await client.lookup_hashes([hint], include_data=False)
        assert [(m.message_id, m.data) for m in found] == [(ids[29], None)]
        health = await client.health()
        assert health.serving and health.max_ids_per_request == 20


@pytest.mark.parametrize("forward", [True, False])
async def test_paging_over_many_pages(
    running: tuple[StoreNode, FeedTransport], forward: bool
) -> None:
    node, transport = running
    payloads = await _publish(node, transport, "c", 230)
    await _publish(node, transport, "d", 10)
    async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
        got = [
            m.data
            async for m in client.iter_query("c", forward=forward, page_size=17, include_data=True)
        ]
        expected = payloads if forward else payloads[::-1]
        assert got == expected
        # Waku default direction (backward) with the server's page cap (50).
        first = await client.query("c", page_size=10_000)
        assert len(first.messages) == 50 and first.cursor is not None
        assert [m.data for m in first.messages] == payloads[-50:]
        # Time range: [start, end) on first_arrival.
        everything = [m async for m in client.iter_query("c", include_data=False)]
        mid = everything[100].first_arrival
        later = [m async for m in client.iter_query("c", time_start=mid, include_data=False)]
        assert later == [m for m in everything if m.first_arrival >= mid]
        assert all(m.data is None for m in later)


async def test_cursor_tampering_and_misuse_are_invalid_argument(
    running: tuple[StoreNode, FeedTransport],
) -> None:
    node, transport = running
    await _publish(node, transport, "c", 40)
    async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
        page = await client.query("c", page_size=10)
        assert page.cursor is not None
        for bad in (
            page.cursor[:-1] + bytes([page.cursor[-1] ^ 1]),
            bytes([page.cursor[0] ^ 0x80]) + page.cursor[1:],
            page.cursor[:5],
            b"",
        ):
            with pytest.raises(StoreQueryError) as err:
                await client.query("c", page_size=10, cursor=bad)
            assert err.value.code == "INVALID_ARGUMENT"
        # A valid cursor used with other criteria (another channel, the other direction).
        for kwargs in ({"channel_id": "d"}, {"channel_id": "c", "forward": True}):
            with pytest.raises(StoreQueryError) as err:
                await client.query(page_size=10, cursor=page.cursor, **kwargs)  # type: ignore[arg-type]
            assert err.value.code == "INVALID_ARGUMENT"
        nxt = await client.query("c", page_size=10, cursor=page.cursor)
        assert len(nxt.messages) == 10


async def _raw_query(port: int, request: store_pb2.StoreQueryRequest, **kw: Any) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = store_pb2_grpc.StoreStub(channel)  # type: ignore[no-untyped-call]
        return await stub.Query(request, **kw)


async def _code_of(port: int, request: store_pb2.StoreQueryRequest, **kw: Any) -> grpc.StatusCode:
    try:
        await _raw_query(port, request, **kw)
    except grpc.aio.AioRpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


async def test_malformed_and_oversized_requests_get_status_codes_and_service_keeps_serving(
    tmp_path: Path,
) -> None:
    node, transport = await _start(tmp_path, max_ids_per_request=20, max_request_bytes=4096)
    try:
        payloads = await _publish(node, transport, "c", 5)
        port = node.grpc_port
        Q = store_pb2.StoreQueryRequest
        cases = {
            "ids without channel": Q(message_ids=["a"]),
            "lookup with time range": Q(channel_id="c", message_ids=["a"], time_start=1),
            "too many ids": Q(channel_id="c", message_ids=[str(i) for i in range(21)]),
            "empty id": Q(channel_id="c", message_ids=[""]),
            "id too long": Q(channel_id="c", message_ids=["x" * 300]),
            "empty channel": Q(channel_id=""),
            "reversed range": Q(channel_id="c", time_start=10, time_end=5),
            "empty hash": Q(message_hashes=[b""]),
        }
        for name, request in cases.items():
            assert await _code_of(port, request) == grpc.StatusCode.INVALID_ARGUMENT, name
        oversized = Q(channel_id="c", message_ids=["x" * 250] * 19)
        assert oversized.ByteSize() > 4096
        assert await _code_of(port, oversized) == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Bytes that are not a StoreQueryRequest at all.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            raw = channel.unary_unary("/chorus.store.v1.Store/Query")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(b"\xff\xff\xff\xff\x0f")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Still serving.
        ids = [decode_message(p).message_id for p in payloads]
        ok = await _raw_query(port, Q(channel_id="c", message_ids=ids, include_data=True))
        assert sorted(m.message for m in ok.messages) == sorted(payloads)
        invalid = node.metrics.value(
            "chorus_store_rpc_total", method="Query", code="INVALID_ARGUMENT"
        )
        assert invalid == len(cases) + 1, "the undecodable request counts too"
    finally:
        await node.stop()


async def test_bearer_token_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORUS_TEST_STORE_TOKEN", "s3cret")
    node, transport = await _start(tmp_path, token_env="CHORUS_TEST_STORE_TOKEN")
    try:
        payloads = await _publish(node, transport, "c", 3)
        ids = [decode_message(p).message_id for p in payloads]
        target = f"127.0.0.1:{node.grpc_port}"
        for token in (None, "wrong"):
            async with GrpcStoreClient(target, token) as client:
                with pytest.raises(StoreQueryError) as err:
                    await client.get_messages("c", ids)
                assert err.value.code == "UNAUTHENTICATED"
                assert (await client.health()).serving, "health needs no token"
        async with GrpcStoreClient(target, "s3cret") as client:
            assert sorted(await client.get_messages("c", ids)) == sorted(payloads)
    finally:
        await node.stop()


async def test_metrics_endpoint_on_loopback(tmp_path: Path) -> None:
    transport = FeedTransport()
    base = node_config(tmp_path)
    assert isinstance(base, NodeConfig)
    from dataclasses import replace

    from store_node.config import MetricsConfig

    node = StoreNode(replace(base, metrics=MetricsConfig("127.0.0.1:0")), transport=transport)
    await node.start()
    try:
        await _publish(node, transport, "c", 3)
        await transport.publish(topic_for_channel("c"), b"\x00garbage")
        await wait_for(
            lambda: node.metrics.value("chorus_store_ingest_rejected_total", reason="decode") == 1
        )
        assert node.metrics_address is not None
        host, port = node.metrics_address
        assert host == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "chorus_store_ingest_archived_total 3.0" in body
        assert 'chorus_store_ingest_rejected_total{reason="decode"} 1.0' in body
    finally:
        await node.stop()


async def test_cursor_survives_a_restart(tmp_path: Path) -> None:
    node, transport = await _start(tmp_path)
    try:
        await _publish(node, transport, "c", 30)
        async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
            first = await client.query("c", page_size=10)
            whole = await client.query("c", page_size=30)
    finally:
        await node.stop()
    oldest_first = [m.data for m in whole.messages]
    assert len(set(oldest_first)) == 30
    # The 30 messages may share one arrival time: compare the pages' messages, not times.
    # Paging goes from the newest; a page lists its messages oldest first.
    assert [m.data for m in first.messages] == oldest_first[20:]
    node, _ = await _start(tmp_path)  # same archive file, so the same cursor secret
    try:
        async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
            second = await client.query("c", page_size=10, cursor=first.cursor)
        assert [m.data for m in second.messages] == oldest_first[10:20]
    finally:
        await node.stop()


async def test_end_to_end_on_postgresql(pg_schema: tuple[str, str], tmp_path: Path) -> None:
    dsn, schema = pg_schema
    config = parse_config(
        {
            "archive": {"backend": "postgresql", "dsn": dsn, "schema": schema},
            "ingest": {"channels": ["c"], "batch_interval_ms": 5},
            "grpc": {"listen": "127.0.0.1:0", "max_page_size": 25},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    transport = FeedTransport()
    node = StoreNode(config, transport=transport)
    await node.start()
    try:
        payloads = await _publish(node, transport, "c", 120)
        await transport.publish(topic_for_channel("c"), payloads[7])  # a rebroadcast
        async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
            ids = [decode_message(p).message_id for p in payloads]
            assert sorted(await client.get_messages("c", ids[::3])) == sorted(payloads[::3])
            forward = [m.data async for m in client.iter_query("c", forward=True)]
            backward = [m.data async for m in client.iter_query("c", forward=False)]
            assert forward == payloads and backward == payloads[::-1]
    finally:
        await node.stop()


async def test_health_reports_the_nodes_archive_probe_without_asking_the_archive(
    running: tuple[StoreNode, FeedTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store.Health answers from the node's last archive probe: polling it takes no
    reader thread from lookups, and it says NOT_SERVING when the probe failed."""
    node, _ = running
    asked: list[str] = []
    real = node.archive.schema_version

    def schema_version() -> int:
        asked.append(threading.current_thread().name)
        return real()

    # The node's own probes (every second) may ask too; only the service's readers count.
    monkeypatch.setattr(node.archive, "schema_version", schema_version)
    monkeypatch.setattr(node.health, "probe", lambda *args: asyncio.sleep(0))
    async with GrpcStoreClient(f"127.0.0.1:{node.grpc_port}") as client:
        for _ in range(5):
            assert (await client.health()).serving
        node.health.archive_ok = False
        assert not (await client.health()).serving
        node.health.archive_ok = None  # no probe yet: the archive is asked
        assert (await client.health()).serving
    assert len([name for name in asked if name.startswith("archive-reader")]) == 1
