"""The gRPC boundary (issue 19.2, 19.7, 16.3), on SQLite and on the real PostgreSQL.

- a query holding NUL (or any value no archive can hold) is INVALID_ARGUMENT, never
  UNAVAILABLE, and a flood of them writes a bounded number of log lines;
- authentication comes before the request body is decoded;
- a token may be limited to some channels;
- TLS and mutual TLS with a throwaway CA made here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sdk._proto.store.v1 import store_pb2
from sdk.sds.message import decode_message
from sdk.store.errors import StoreQueryError
from sdk.store.grpc import GrpcStoreClient
from store_node.config import GrpcConfig, NodeConfig, parse_config
from store_node.node import StoreNode
from store_node.service import exposure_warning
from tests.store_node.store_node_helpers import (
    FeedTransport,
    new_schema,
    postgres_dsn,
    sds_message,
    wait_for,
)
from tests.store_node.tls_certs import make_certs
from transports.base import topic_for_channel

Q = store_pb2.StoreQueryRequest


def _archive_section(backend: str) -> dict[str, Any]:
    if backend == "sqlite":
        return {"path": "archive.db"}
    return {"backend": "postgresql", "dsn": postgres_dsn(), "schema": new_schema()}


async def _node(
    tmp_path: Path, backend: str, **grpc_options: Any
) -> tuple[StoreNode, FeedTransport]:
    config = parse_config(
        {
            "archive": _archive_section(backend),
            "ingest": {"channels": ["a", "b"], "batch_interval_ms": 5},
            "grpc": {"listen": "127.0.0.1:0", **grpc_options},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    assert isinstance(config, NodeConfig)
    transport = FeedTransport()
    node = StoreNode(config, transport=transport)
    await node.start()
    return node, transport


async def _stop(node: StoreNode) -> None:
    await node.stop()
    cfg = node.config.archive
    if cfg.backend == "postgresql":
        from store_node.archive.postgres import PostgresArchive

        PostgresArchive(cfg.dsn, schema=cfg.schema).drop_schema()


async def _fill(node: StoreNode, transport: FeedTransport) -> dict[str, list[bytes]]:
    out = {c: [sds_message(c, i) for i in range(5)] for c in ("a", "b")}
    for channel, payloads in out.items():
        for p in payloads:
            await transport.publish(topic_for_channel(channel), p)
    await wait_for(lambda: node.metrics.value("chorus_store_ingest_archived_total") >= 10)
    return out


async def _code(target: str, request: Q | bytes, **kw: Any) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(
            "/chorus.store.v1.Store/Query",
            request_serializer=lambda r: r if isinstance(r, bytes) else r.SerializeToString(),
        )
        try:
            await call(request, **kw)
        except grpc.aio.AioRpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture(params=["sqlite", "postgresql"])
async def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[StoreNode, dict[str, list[bytes]]]]:
    node, transport = await _node(tmp_path, request.param)
    try:
        yield node, await _fill(node, transport)
    finally:
        await _stop(node)


async def test_nul_and_invalid_values_are_invalid_argument_and_logs_are_bounded(
    served: tuple[StoreNode, dict[str, list[bytes]]], caplog: pytest.LogCaptureFixture
) -> None:
    node, payloads = served
    target = f"127.0.0.1:{node.grpc_port}"
    bad = {
        "NUL in channel": Q(channel_id="evil\x00"),
        "NUL in id": Q(channel_id="a", message_ids=["evil\x00"]),
        "control character": Q(channel_id="a\x07"),
        "wildcard": Q(channel_id="a/#"),
        "channel too long": Q(channel_id="x" * 257),
    }
    for name, request in bad.items():
        assert await _code(target, request) == grpc.StatusCode.INVALID_ARGUMENT, name
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="store_node.service"):
        for _ in range(60):
            assert await _code(target, Q(channel_id="evil\x00")) == grpc.StatusCode.INVALID_ARGUMENT
    lines = [r for r in caplog.records if r.name == "store_node.service"]
    assert 0 < len(lines) <= 10, "a client must not be able to flood the log"
    assert all(r.levelno < logging.ERROR for r in lines), "a client's mistake is not an error"
    assert node.metrics.value("chorus_store_rpc_total", method="Query", code="UNAVAILABLE") == 0
    # and the node keeps serving good requests
    ids = [decode_message(p).message_id for p in payloads["a"]]
    async with GrpcStoreClient(target) as client:
        assert sorted(await client.get_messages("a", ids)) == sorted(payloads["a"])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_auth_comes_before_decoding_and_tokens_can_be_limited_to_channels(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHORUS_TEST_ADMIN", "admin-token")
    monkeypatch.setenv("CHORUS_TEST_READER", "reader-token")
    node, transport = await _node(
        tmp_path,
        backend,
        token_env="CHORUS_TEST_ADMIN",
        access=[{"token_env": "CHORUS_TEST_READER", "channels": ["a"]}],
    )
    try:
        payloads = await _fill(node, transport)
        target = f"127.0.0.1:{node.grpc_port}"
        garbage = b"\xff\xff\xff\xff\x0f"
        # Without a token even undecodable bytes are UNAUTHENTICATED: nothing is parsed first.
        assert await _code(target, garbage) == grpc.StatusCode.UNAUTHENTICATED
        reader = (("authorization", "Bearer reader-token"),)
        assert await _code(target, garbage, metadata=reader) == grpc.StatusCode.INVALID_ARGUMENT
        for request in (Q(channel_id="b"), Q(), Q(message_hashes=[b"x" * 32])):
            code = await _code(target, request, metadata=reader)
            assert code == grpc.StatusCode.PERMISSION_DENIED, request
        ids = {c: [decode_message(p).message_id for p in payloads[c]] for c in "ab"}
        async with GrpcStoreClient(target, "reader-token") as client:
            assert sorted(await client.get_messages("a", ids["a"])) == sorted(payloads["a"])
            with pytest.raises(StoreQueryError) as err:
                await client.get_messages("b", ids["b"])
            assert err.value.code == "PERMISSION_DENIED"
        async with GrpcStoreClient(target, "admin-token") as client:
            assert sorted(await client.get_messages("b", ids["b"])) == sorted(payloads["b"])
            assert len((await client.query(page_size=100)).messages) == 10
    finally:
        await _stop(node)


def test_exposed_without_tls_or_token_warns() -> None:
    config = GrpcConfig()
    assert exposure_warning(config, "127.0.0.1:50051") is None
    assert exposure_warning(config, "[::1]:50051") is None
    warning = exposure_warning(config, "0.0.0.0:50051")
    assert warning is not None and "without TLS or a token" in warning
    assert "reads every channel" in warning


# -- TLS --------------------------------------------------------------------------------------


def _pki(folder: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    certs = make_certs(folder)
    return {
        "ca.crt": certs.ca,
        "server.crt": certs.server.cert,
        "server.key": certs.server.key,
        "client.crt": certs.client.cert,
        "client.key": certs.client.key,
    }


@pytest.mark.parametrize("mutual", [False, True])
async def test_tls_and_mutual_tls(tmp_path: Path, mutual: bool) -> None:
    pki = _pki(tmp_path)
    options: dict[str, Any] = {
        "tls_cert_file": str(pki["server.crt"]),
        "tls_key_file": str(pki["server.key"]),
    }
    if mutual:
        options["tls_client_ca_file"] = str(pki["ca.crt"])
    node, transport = await _node(tmp_path, "sqlite", **options)
    try:
        payloads = await _fill(node, transport)
        ids = [decode_message(p).message_id for p in payloads["a"]]
        target = f"127.0.0.1:{node.grpc_port}"
        ca = pki["ca.crt"].read_bytes()
        client_cert = pki["client.crt"].read_bytes(), pki["client.key"].read_bytes()
        good = grpc.ssl_channel_credentials(ca, client_cert[1], client_cert[0])
        async with GrpcStoreClient(target, credentials=good) as client:
            assert sorted(await client.get_messages("a", ids)) == sorted(payloads["a"])
        # Plaintext to a TLS server fails.
        assert await _code(target, Q(channel_id="a"), timeout=5) == grpc.StatusCode.UNAVAILABLE
        # Without a client certificate: refused only under mutual TLS.
        anonymous = grpc.ssl_channel_credentials(ca)
        async with GrpcStoreClient(target, credentials=anonymous) as client:
            if mutual:
                with pytest.raises(StoreQueryError) as err:
                    await client.get_messages("a", ids)
                assert err.value.code == "UNAVAILABLE"
            else:
                assert sorted(await client.get_messages("a", ids)) == sorted(payloads["a"])
    finally:
        await _stop(node)
