"""The ``chorus.store.v1.Store`` gRPC service on :mod:`grpc.aio`.

Archive reads run on a small thread pool (one database connection per thread)
so the event loop, which also drives ingest, never blocks on a query. Limits:
request bytes (gRPC's own ``max_receive_message_length``: RESOURCE_EXHAUSTED),
concurrent requests (``maximum_concurrent_rpcs``: RESOURCE_EXHAUSTED), ids per
request and page size (:mod:`store_node.query`). Authentication, when tokens
are configured, is ``authorization: Bearer <token>`` metadata on every Query;
Health stays open for probes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sdk._proto.store.v1 import store_pb2, store_pb2_grpc
from store_node.archive.base import Archive, Page
from store_node.config import GrpcConfig
from store_node.cursor import CursorCodec
from store_node.errors import InvalidQuery, StoreNodeError
from store_node.metrics import NodeMetrics
from store_node.query import PlannedQuery, QueryLimits, plan_query

log = logging.getLogger("store_node.service")

#: Room for protobuf framing around a page of raw bytes in a response.
_RESPONSE_OVERHEAD = 1024 * 1024


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
    ) -> None:
        self.archive = archive
        self.config = config
        self.cursors = cursors
        self.metrics = metrics or NodeMetrics()
        self.limits = QueryLimits(
            max_ids_per_request=config.max_ids_per_request,
            default_page_size=config.default_page_size,
            max_page_size=config.max_page_size,
            max_response_bytes=config.max_response_bytes,
        )
        self._tokens = [t.encode() for t in config.tokens]
        self._executor = ThreadPoolExecutor(
            max_workers=readers, thread_name_prefix="archive-reader"
        )
        #: Refreshed by the node's housekeeping; Health reports it without a scan.
        self.cached_count = 0

    def _authorized(self, context: Any) -> bool:
        if not self._tokens:
            return True
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                presented = value[len("Bearer ") :].encode()
                # compare_digest against every token: timing does not reveal which matched.
                if any(hmac.compare_digest(presented, t) for t in self._tokens):
                    return True
        return False

    async def Query(
        self, request: store_pb2.StoreQueryRequest, context: Any
    ) -> store_pb2.StoreQueryResponse:
        """See ``proto/store/v1/store.proto``."""
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            if not self._authorized(context):
                code = grpc.StatusCode.UNAUTHENTICATED
                await context.abort(code, "missing or invalid bearer token")
            try:
                plan = plan_query(request, self.limits, self.cursors)
            except InvalidQuery as exc:
                code = grpc.StatusCode.INVALID_ARGUMENT
                await context.abort(code, str(exc))
            loop = asyncio.get_running_loop()
            try:
                page = await loop.run_in_executor(self._executor, self._find, plan)
            except Exception as exc:  # the driver's own errors: connection lost, ...
                code = grpc.StatusCode.UNAVAILABLE
                log.error("archive query failed", extra={"error": repr(exc)})
                await context.abort(code, "archive unavailable")
            return self._response(request.request_id, plan, page)
        finally:
            self.metrics.rpcs.labels("Query", code.name).inc()
            self.metrics.rpc_seconds.labels("Query").observe(time.perf_counter() - started)

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

    async def query_bytes(self, data: bytes, context: Any) -> store_pb2.StoreQueryResponse:
        """Query from raw request bytes: undecodable bytes are INVALID_ARGUMENT.

        gRPC's own deserializer would turn them into UNKNOWN with a traceback
        in the server log; a client's garbage is a bad argument, not our bug.
        """
        try:
            request = store_pb2.StoreQueryRequest.FromString(data)
        except DecodeError:
            self.metrics.rpcs.labels("Query", grpc.StatusCode.INVALID_ARGUMENT.name).inc()
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "request is not a StoreQueryRequest"
            )
        return await self.Query(request, context)

    async def Health(
        self, request: store_pb2.HealthRequest, context: Any
    ) -> store_pb2.HealthResponse:
        """Serving when the archive answers; reports the cached size and the limits."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.archive.schema_version)
            status = store_pb2.HealthResponse.SERVING
        except Exception as exc:
            log.warning("health check: archive unavailable", extra={"error": repr(exc)})
            status = store_pb2.HealthResponse.NOT_SERVING
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


async def start_server(service: StoreService, listen: str) -> tuple[Any, int]:
    """Start a grpc.aio server for ``service`` on ``listen``; return it and the bound port."""
    server = grpc.aio.server(
        options=list(server_options(service.config)),
        maximum_concurrent_rpcs=service.config.max_concurrent_rpcs,
    )
    # Registered by hand rather than with add_StoreServicer_to_server so Query sees raw
    # bytes and can answer undecodable ones itself (see StoreService.query_bytes).
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
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("chorus.store.v1.Store", handlers),)
    )
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise StoreNodeError(f"cannot listen on {listen}: {exc}") from exc
    if port == 0:
        raise StoreNodeError(f"cannot listen on {listen}")
    await server.start()
    return server, port
