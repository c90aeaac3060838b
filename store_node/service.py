"""The ``chorus.store.v1.Store`` gRPC service on :mod:`grpc.aio`.

Archive reads run on a small thread pool (one database connection per thread)
so the event loop, which also drives ingest, never blocks on a query. Limits:
request bytes (gRPC's own ``max_receive_message_length``: RESOURCE_EXHAUSTED),
concurrent requests (``maximum_concurrent_rpcs``: RESOURCE_EXHAUSTED), ids per
request and page size (:mod:`store_node.query`).

The boundary, in the order a request meets it:

1. **Authentication** before the body is even decoded: when tokens are
   configured, ``authorization: Bearer <token>`` metadata, else
   UNAUTHENTICATED. Health stays open for probes.
2. **Decoding and validation**: undecodable bytes, a NUL or any other value the
   archive cannot hold are INVALID_ARGUMENT (:mod:`store_node.query`).
3. **Permission**: a token limited to some channels (``[[grpc.access]]``) must
   name one of them in ``channel_id``, else PERMISSION_DENIED.
4. **What the node archives**: a query naming a channel outside ``[ingest]
   channels`` is NOT_FOUND with a detail saying so, never an empty page (a
   client must not take "nothing archived" for "nothing sent"; the runtime
   reports it as ``ChannelNotArchived``). Lookups by hash alone, in every
   channel, are answered as they are.
5. **The archive**: only its own failures (connection lost, ...) are
   UNAVAILABLE. A client's mistake is never reported as the server's.

Lines a client can cause are rate-limited (:class:`store_node.log.RateLimitedLog`).
The standard ``grpc.health.v1`` service runs next to Store; the node sets it
from its readiness (:mod:`store_node.health`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sqlite3
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sdk._proto.store.v1 import store_pb2, store_pb2_grpc
from store_node.addresses import is_loopback, parse_listen
from store_node.archive.base import Archive, Page
from store_node.config import GrpcConfig
from store_node.cursor import CursorCodec
from store_node.errors import InvalidQuery, StoreNodeError
from store_node.log import RateLimitedLog
from store_node.metrics import NodeMetrics
from store_node.query import PlannedQuery, QueryLimits, plan_query

log = logging.getLogger("store_node.service")

#: Room for protobuf framing around a page of raw bytes in a response.
_RESPONSE_OVERHEAD = 1024 * 1024
#: The service name grpc.health.v1 reports for the query API ("" is the whole server).
SERVICE_NAME = "chorus.store.v1.Store"


def _client_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a database raises for a value it cannot take: the request's fault."""
    errors: list[type[BaseException]] = [InvalidQuery, sqlite3.DataError]
    try:
        import psycopg

        errors.append(psycopg.DataError)
    except ImportError:  # pragma: no cover - psycopg ships with the store extra
        pass
    return tuple(errors)


class _Abort(Exception):
    """Internal: end the RPC with ``code`` and ``detail``."""

    def __init__(self, code: grpc.StatusCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class StoreService(store_pb2_grpc.StoreServicer):  # type: ignore[misc]
    """Answers Query and Health from an archive."""

    def __init__(
        self,
        archive: Archive,
        config: GrpcConfig,
        cursors: CursorCodec,
        *,
        metrics: NodeMetrics | None = None,
        readers: int = 4,
        archived: Collection[str] | None = None,
    ) -> None:
        self.archive = archive
        #: The channels the node archives (``[ingest] channels``); ``None``: any.
        self.archived = None if archived is None else frozenset(archived)
        self.config = config
        self.cursors = cursors
        self.metrics = metrics or NodeMetrics()
        self.limits = QueryLimits(
            max_ids_per_request=config.max_ids_per_request,
            default_page_size=config.default_page_size,
            max_page_size=config.max_page_size,
            max_response_bytes=config.max_response_bytes,
        )
        self._grants = [(g.token.encode(), g.channels) for g in config.grants]
        self._executor = ThreadPoolExecutor(
            max_workers=readers, thread_name_prefix="archive-reader"
        )
        self._client_errors = _client_errors()
        self._bad_request_log = RateLimitedLog(log)
        self._failure_log = RateLimitedLog(log)
        #: Refreshed by the node's housekeeping; Health reports it without a scan.
        self.cached_count = 0
        #: The node's last archive probe (``None``: none yet); when set and answered,
        #: Health reports it instead of asking the archive on each call.
        self.archive_reachable: Callable[[], bool | None] | None = None
        #: The standard grpc.health.v1 servicer; :func:`start_server` registers it.
        self.health = health.aio.HealthServicer()

    def _channels_allowed(self, context: Any) -> frozenset[str] | None:
        """The channels the caller may read (``None``: all); :class:`_Abort` if unauthenticated."""
        if not self._grants:
            return None
        presented = b""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                presented = value[len("Bearer ") :].encode()
        allowed: frozenset[str] | None = frozenset()
        matched = False
        # compare_digest against every token: timing does not reveal which one matched.
        for token, channels in self._grants:
            if hmac.compare_digest(presented, token):
                matched, allowed = True, channels
        if not matched or not presented:
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
        return allowed

    async def set_serving(self, serving: bool) -> None:
        """Report readiness over grpc.health.v1 (the whole server and the Store service)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def Query(
        self, request: store_pb2.StoreQueryRequest, context: Any
    ) -> store_pb2.StoreQueryResponse:
        """See ``proto/store/v1/store.proto``."""
        return await self._serve(request, context)

    async def query_bytes(self, data: bytes, context: Any) -> store_pb2.StoreQueryResponse:
        """Query from raw request bytes: authenticate first, then decode.

        Undecodable bytes are INVALID_ARGUMENT: gRPC's own deserializer would turn
        them into UNKNOWN with a traceback in the server log, and it would run
        before authentication.
        """
        return await self._serve(data, context)

    async def _serve(
        self, request: store_pb2.StoreQueryRequest | bytes, context: Any
    ) -> store_pb2.StoreQueryResponse:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await self._answer(request, context)
        except _Abort as abort:
            code = abort.code
            await context.abort(abort.code, abort.detail)
            raise  # unreachable: abort raises
        finally:
            self.metrics.rpcs.labels("Query", code.name).inc()
            self.metrics.rpc_seconds.labels("Query").observe(time.perf_counter() - started)

    async def _answer(
        self, request: store_pb2.StoreQueryRequest | bytes, context: Any
    ) -> store_pb2.StoreQueryResponse:
        allowed = self._channels_allowed(context)
        if isinstance(request, bytes):
            try:
                request = store_pb2.StoreQueryRequest.FromString(request)
            except DecodeError:
                self._bad_request("undecodable request")
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "request is not a StoreQueryRequest"
                ) from None
        try:
            plan = plan_query(request, self.limits, self.cursors)
        except InvalidQuery as exc:
            self._bad_request(str(exc))
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if allowed is not None and plan.criteria.channel_id not in allowed:
            raise _Abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "this token may read only some channels: set channel_id to one of them",
            )
        channel = plan.criteria.channel_id
        if self.archived is not None and channel is not None and channel not in self.archived:
            raise _Abort(
                grpc.StatusCode.NOT_FOUND,
                f"this store node does not archive channel {channel!r} "
                "(add it to [ingest] channels)",
            )
        loop = asyncio.get_running_loop()
        try:
            page = await loop.run_in_executor(self._executor, self._find, plan)
        except self._client_errors as exc:
            # A value validation let through but the database refuses: still the request's.
            self._bad_request(f"{type(exc).__name__}: {exc}")
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the archive cannot match this value"
            ) from None
        except Exception as exc:  # the driver's own errors: connection lost, ...
            self._failure_log.log(logging.ERROR, "archive query failed", error=repr(exc)[:300])
            raise _Abort(grpc.StatusCode.UNAVAILABLE, "archive unavailable") from None
        return self._response(request.request_id, plan, page)

    def _bad_request(self, why: str) -> None:
        self._bad_request_log.log(logging.INFO, "bad request", error=why[:200])

    def _find(self, plan: PlannedQuery) -> Page:
        return self.archive.find(
            plan.criteria,
            after=plan.after,
            forward=plan.forward,
            limit=plan.limit,
            max_bytes=self.limits.max_response_bytes,
            include_data=plan.include_data,
        )

    def _response(
        self, request_id: str, plan: PlannedQuery, page: Page
    ) -> store_pb2.StoreQueryResponse:
        response = store_pb2.StoreQueryResponse(request_id=request_id)
        for m in page.messages:
            entry = response.messages.add(
                message_hash=m.transport_hash or b"",
                message_id=m.message_id,
                channel_id=m.channel_id,
                first_arrival=m.first_arrival,
                sender_id=m.sender_id,
            )
            if m.data is not None:
                entry.message = m.data
            if m.lamport_timestamp is not None:
                entry.lamport_timestamp = m.lamport_timestamp
        if page.next_key is not None:
            response.pagination_cursor = self.cursors.seal(page.next_key, plan.fingerprint)
        return response

    async def Health(
        self, request: store_pb2.HealthRequest, context: Any
    ) -> store_pb2.HealthResponse:
        """Serving when the archive answers; reports the cached size and the limits.

        In a node, whether the archive answers is the node's last probe
        (:class:`store_node.health.NodeHealth`, every second), so a client polling
        Health takes no reader thread from lookups; without a probe yet, the archive
        is asked.
        """
        reachable = self.archive_reachable() if self.archive_reachable is not None else None
        if reachable is None:
            try:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, self.archive.schema_version)
                reachable = True
            except Exception as exc:
                log.warning("health check: archive unavailable", extra={"error": repr(exc)})
                reachable = False
        status = store_pb2.HealthResponse.NOT_SERVING
        if reachable:
            status = store_pb2.HealthResponse.SERVING
        self.metrics.rpcs.labels("Health", "OK").inc()
        return store_pb2.HealthResponse(
            status=status,
            message_count=self.cached_count,
            max_ids_per_request=self.config.max_ids_per_request,
            max_page_size=self.config.max_page_size,
            max_request_bytes=self.config.max_request_bytes,
        )

    def close(self) -> None:
        """Release the reader threads."""
        self._executor.shutdown(wait=True)


def server_options(config: GrpcConfig) -> Sequence[tuple[str, int]]:
    """gRPC channel options that enforce the configured message-size limits."""
    return [
        ("grpc.max_receive_message_length", config.max_request_bytes),
        ("grpc.max_send_message_length", config.max_response_bytes + _RESPONSE_OVERHEAD),
    ]


def server_credentials(config: GrpcConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from the configured PEM files, or ``None`` for plaintext.

    With ``tls_client_ca_file`` the server requires a client certificate signed
    by that CA (mutual TLS); without it any client may connect over TLS.
    """
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    try:
        chain = config.tls_cert_file.read_bytes()
        key = config.tls_key_file.read_bytes()
        roots = (
            config.tls_client_ca_file.read_bytes()
            if config.tls_client_ca_file is not None
            else None
        )
    except OSError as exc:
        raise StoreNodeError(f"grpc TLS: cannot read {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=roots, require_client_auth=roots is not None
    )


def exposure_warning(config: GrpcConfig, listen: str) -> str | None:
    """What is unsafe about serving ``config`` on ``listen``, or ``None``."""
    host, _ = parse_listen(listen, "grpc.listen")
    if is_loopback(host):
        return None
    missing = [
        what
        for what, present in (("TLS", config.tls), ("a token", bool(config.grants)))
        if not present
    ]
    if not missing:
        return None
    return (
        f"gRPC listens on {listen} beyond this machine without {' or '.join(missing)}: "
        "anyone who reaches the port "
        + ("reads every channel" if not config.grants else "can read the tokens on the wire")
    )


async def start_server(service: StoreService, listen: str) -> tuple[Any, int]:
    """Start a grpc.aio server for ``service`` on ``listen``; return it and the bound port.

    Port sharing (``SO_REUSEPORT``) is off: a second node on a busy port must fail
    to start, not split the queries between two archives. A port that cannot be
    bound is a :class:`StoreNodeError`.
    """
    server = grpc.aio.server(
        options=[*server_options(service.config), ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=service.config.max_concurrent_rpcs,
    )
    # Registered by hand rather than with add_StoreServicer_to_server so Query sees raw
    # bytes and can authenticate before decoding them (see StoreService.query_bytes).
    handlers = {
        "Query": grpc.unary_unary_rpc_method_handler(
            service.query_bytes,
            request_deserializer=None,
            response_serializer=store_pb2.StoreQueryResponse.SerializeToString,
        ),
        "Health": grpc.unary_unary_rpc_method_handler(
            service.Health,
            request_deserializer=store_pb2.HealthRequest.FromString,
            response_serializer=store_pb2.HealthResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_pb2_grpc.add_HealthServicer_to_server(service.health, server)
    await service.set_serving(True)
    warning = exposure_warning(service.config, listen)
    if warning:
        log.warning(warning, extra={"event": "grpc_exposed"})
    credentials = server_credentials(service.config)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as exc:
        raise StoreNodeError(f"grpc: cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise StoreNodeError(f"grpc: cannot listen on {listen} (address in use or not local)")
    await server.start()
    return server, port
