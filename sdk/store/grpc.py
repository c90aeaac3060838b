"""The store client the runtime uses against a real store node, over gRPC.

:class:`GrpcStoreClient` implements :class:`sdk.store.client.StoreClient`
(``get_messages`` by id and retrieval hint) on the ``chorus.store.v1.Store``
API (``proto/store/v1/store.proto``), plus the API's other queries: presence
checks, channel + time-range pages and an async iterator that follows the
cursor. Lookups larger than the server's per-request limit are split, and
every query follows pagination to the end, so callers never see a cursor
unless they ask for pages.

Errors: every failure is a :class:`StoreQueryError` carrying the gRPC status
code name (``INVALID_ARGUMENT``, ``UNAUTHENTICATED``, ``UNAVAILABLE``, ...);
a query naming a channel the node does not archive (``NOT_FOUND``) is its
subclass :class:`~sdk.store.errors.NotArchived`, never an empty page.
Requires the ``store`` extra (grpcio).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from sdk._proto.store.v1 import store_pb2, store_pb2_grpc
from sdk.store.errors import NOT_ARCHIVED_CODE, NotArchived, StoreError, StoreQueryError

__all__ = [
    "ArchivedMessage",
    "GrpcStoreClient",
    "NotArchived",
    "StoreError",
    "StoreHealth",
    "StorePage",
    "StoreQueryError",
]

#: Responses carry up to a page of raw messages; gRPC's 4 MiB default is too tight.
_MAX_RECEIVE_BYTES = 64 * 1024 * 1024
#: gRPC waits up to 120 s between reconnection attempts by default, failing every query
#: meanwhile: a store node back after an outage would go unnoticed that long.
_MAX_RECONNECT_BACKOFF_MS = 5_000


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """One archived message as the store returns it (named apart from the store node's
    own ``store_node.archive.base.StoredMessage`` row)."""

    message_id: str
    channel_id: str
    sender_id: str
    #: Transport hash (retrieval hint) of the first copy the store received.
    message_hash: bytes
    #: When the store first received it, Unix epoch ms.
    first_arrival: int
    lamport_timestamp: int | None
    #: Raw SDS bytes; ``None`` for keys-only queries.
    data: bytes | None


@dataclass(frozen=True, slots=True)
class StorePage:
    """One page: messages oldest first, and the cursor for the next page (``None`` = last)."""

    messages: list[ArchivedMessage]
    cursor: bytes | None


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """The node's Health answer."""

    serving: bool
    message_count: int
    max_ids_per_request: int
    max_page_size: int
    max_request_bytes: int


def _stored(m: Any) -> ArchivedMessage:
    return ArchivedMessage(
        message_id=m.message_id,
        channel_id=m.channel_id,
        sender_id=m.sender_id,
        message_hash=m.message_hash,
        first_arrival=m.first_arrival,
        lamport_timestamp=m.lamport_timestamp if m.HasField("lamport_timestamp") else None,
        data=m.message if m.HasField("message") else None,
    )


class GrpcStoreClient:
    """A :class:`~sdk.store.client.StoreClient` for one store node at ``target`` (``host:port``).

    ``token`` is sent as ``authorization: Bearer <token>``. The channel is
    plaintext gRPC, meant for loopback or a private network; put TLS in front
    (or pass ``credentials``) across untrusted networks.
    """

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        max_ids_per_request: int = 500,
        page_size: int | None = None,
        credentials: Any = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.max_ids_per_request = max_ids_per_request
        self.page_size = page_size
        self._credentials = credentials
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel: Any = None
        self._stub: Any = None

    def _get_stub(self) -> Any:
        # Created on first use: a grpc.aio channel belongs to the running event loop.
        if self._stub is None:
            options = [
                ("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
                ("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS),
            ]
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options)
            self._stub = store_pb2_grpc.StoreStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    async def _query(self, request: store_pb2.StoreQueryRequest) -> store_pb2.StoreQueryResponse:
        request.request_id = request.request_id or uuid.uuid4().hex
        try:
            response: store_pb2.StoreQueryResponse = await self._get_stub().Query(
                request, timeout=self.timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            code, detail = exc.code().name, exc.details() or ""
            if code == NOT_ARCHIVED_CODE and request.HasField("channel_id"):
                raise NotArchived(request.channel_id, detail) from exc
            raise StoreQueryError(code, detail) from exc
        return response

    async def _lookup(
        self,
        channel_id: str | None,
        message_ids: Sequence[str],
        hashes: Sequence[bytes],
        include_data: bool,
    ) -> list[ArchivedMessage]:
        out: list[ArchivedMessage] = []
        keys: list[tuple[str, str | bytes]] = [("id", m) for m in dict.fromkeys(message_ids)]
        keys += [("hash", h) for h in dict.fromkeys(hashes)]
        for start in range(0, len(keys), self.max_ids_per_request):
            chunk = keys[start : start + self.max_ids_per_request]
            request = store_pb2.StoreQueryRequest(
                include_data=include_data,
                message_ids=[k for t, k in chunk if t == "id"],  # type: ignore[misc]
                message_hashes=[k for t, k in chunk if t == "hash"],  # type: ignore[misc]
                pagination_forward=True,
            )
            if channel_id is not None:
                request.channel_id = channel_id
            if self.page_size:
                request.pagination_limit = self.page_size
            while True:
                response = await self._query(request)
                out += [_stored(m) for m in response.messages]
                if not response.HasField("pagination_cursor"):
                    break
                request.pagination_cursor = response.pagination_cursor
        return out

    async def get_messages(
        self,
        channel_id: str,
        message_ids: Sequence[str],
        retrieval_hints: Sequence[bytes] = (),
    ) -> list[bytes]:
        """See :meth:`sdk.store.client.StoreClient.get_messages`."""
        if not message_ids and not retrieval_hints:
            return []
        found = await self._lookup(channel_id, message_ids, retrieval_hints, include_data=True)
        unique = {(m.channel_id, m.message_id): m.data for m in found if m.data is not None}
        return list(unique.values())

    async def presence(self, channel_id: str, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` the store holds (keys only, no message bytes sent)."""
        if not message_ids:
            return set()
        found = await self._lookup(channel_id, message_ids, (), include_data=False)
        return {m.message_id for m in found}

    async def lookup_hashes(
        self, message_hashes: Sequence[bytes], *, include_data: bool = True
    ) -> list[ArchivedMessage]:
        """Messages by transport hash in any channel."""
        return await self._lookup(None, (), message_hashes, include_data)

    async def query(
        self,
        channel_id: str | None = None,
        *,
        time_start: int | None = None,
        time_end: int | None = None,
        forward: bool = False,
        page_size: int | None = None,
        include_data: bool = True,
        cursor: bytes | None = None,
    ) -> StorePage:
        """One page of ``channel_id`` (all channels if ``None``) in ``[time_start, time_end)``.

        Times are the store's arrival times, epoch ms. ``forward=False`` (the
        Waku default) pages from the newest; messages within a page are always
        oldest first. Pass the returned ``cursor`` back, with the same other
        arguments, for the next page.
        """
        request = store_pb2.StoreQueryRequest(include_data=include_data, pagination_forward=forward)
        if channel_id is not None:
            request.channel_id = channel_id
        if time_start is not None:
            request.time_start = time_start
        if time_end is not None:
            request.time_end = time_end
        if page_size or self.page_size:
            request.pagination_limit = page_size or self.page_size or 0
        if cursor is not None:
            request.pagination_cursor = cursor
        response = await self._query(request)
        return StorePage(
            messages=[_stored(m) for m in response.messages],
            cursor=response.pagination_cursor if response.HasField("pagination_cursor") else None,
        )

    async def iter_query(
        self,
        channel_id: str | None = None,
        *,
        time_start: int | None = None,
        time_end: int | None = None,
        forward: bool = True,
        page_size: int | None = None,
        include_data: bool = True,
    ) -> AsyncIterator[ArchivedMessage]:
        """Every matching message, following the cursor page after page.

        ``forward=True`` yields oldest first; ``False`` yields newest first.
        """
        cursor: bytes | None = None
        while True:
            page = await self.query(
                channel_id,
                time_start=time_start,
                time_end=time_end,
                forward=forward,
                page_size=page_size,
                include_data=include_data,
                cursor=cursor,
            )
            for message in page.messages if forward else reversed(page.messages):
                yield message
            if page.cursor is None:
                return
            cursor = page.cursor

    async def messages_between(
        self, channel_id: str, time_start: int, time_end: int | None = None
    ) -> AsyncIterator[list[bytes]]:
        """See :meth:`sdk.store.client.StoreClient.messages_between`: the time-range
        query, oldest first, one list of raw messages per page (the runtime's catch-up)."""
        cursor: bytes | None = None
        while True:
            page = await self.query(
                channel_id, time_start=time_start, time_end=time_end, forward=True, cursor=cursor
            )
            yield [m.data for m in page.messages if m.data is not None]
            if page.cursor is None:
                return
            cursor = page.cursor

    async def health(self) -> StoreHealth:
        """The node's health and limits."""
        try:
            r = await self._get_stub().Health(store_pb2.HealthRequest(), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise StoreQueryError(exc.code().name, exc.details() or "") from exc
        return StoreHealth(
            serving=r.status == store_pb2.HealthResponse.SERVING,
            message_count=r.message_count,
            max_ids_per_request=r.max_ids_per_request,
            max_page_size=r.max_page_size,
            max_request_bytes=r.max_request_bytes,
        )

    async def close(self) -> None:
        """Close the gRPC channel."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    async def __aenter__(self) -> GrpcStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
