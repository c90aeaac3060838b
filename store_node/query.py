"""From a ``StoreQueryRequest`` to an archive query: validation and limits.

The rules (``proto/store/v1/store.proto``, after Waku Store v3):

- a lookup lists ``message_ids`` and/or ``message_hashes``; ids need
  ``channel_id`` (ids are unique per channel); no time range with a lookup;
- ids plus hashes at most ``max_ids_per_request``; ids and hashes bounded like
  the SDS fields they name;
- ``channel_id`` follows :func:`transports.base.validate_channel_id` and no
  id holds NUL: nothing archived can match such a value, and PostgreSQL would
  refuse it (which must not surface as the server's failure);
- ``time_start <= time_end``;
- the page size is clamped to the server's maximum; unset or 0 means default.

Violations raise :class:`~store_node.errors.InvalidQuery` with a message meant
for the client.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdk._proto.store.v1 import store_pb2
from sdk.sds.limits import DEFAULT_LIMITS
from store_node.archive.base import Criteria, Key
from store_node.cursor import CursorCodec, query_fingerprint
from store_node.errors import InvalidQuery
from transports.base import InvalidChannelId, validate_channel_id


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """The server-side bounds a request is checked against."""

    max_ids_per_request: int = 500
    default_page_size: int = 100
    max_page_size: int = 1000
    max_response_bytes: int = 3 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """A validated request, ready for :meth:`store_node.archive.Archive.find`."""

    criteria: Criteria
    after: Key | None
    forward: bool
    limit: int
    include_data: bool
    fingerprint: bytes


def plan_query(
    request: store_pb2.StoreQueryRequest, limits: QueryLimits, cursors: CursorCodec
) -> PlannedQuery:
    """Validate ``request`` against ``limits``; open its cursor."""
    ids = tuple(request.message_ids)
    hashes = tuple(request.message_hashes)
    channel = request.channel_id if request.HasField("channel_id") else None
    start = request.time_start if request.HasField("time_start") else None
    end = request.time_end if request.HasField("time_end") else None
    if channel is not None:
        try:
            validate_channel_id(channel)
        except InvalidChannelId as exc:
            raise InvalidQuery(str(exc)) from None
    if len(ids) + len(hashes) > limits.max_ids_per_request:
        raise InvalidQuery(
            f"{len(ids) + len(hashes)} ids and hashes in one request; "
            f"the limit is {limits.max_ids_per_request}, split the lookup"
        )
    if ids or hashes:
        if start is not None or end is not None:
            raise InvalidQuery("a lookup by ids/hashes cannot have a time range")
        if ids and channel is None:
            raise InvalidQuery("a lookup by message_ids needs channel_id")
        for mid in ids:
            if not mid or len(mid.encode()) > DEFAULT_LIMITS.max_id_length:
                raise InvalidQuery(
                    f"message_ids must be 1..{DEFAULT_LIMITS.max_id_length} bytes each"
                )
            if "\x00" in mid:
                # No archived id can hold NUL (PostgreSQL text cannot); never a server error.
                raise InvalidQuery("message_ids must not contain NUL")
        for h in hashes:
            if not h or len(h) > DEFAULT_LIMITS.max_retrieval_hint_size:
                raise InvalidQuery(
                    f"message_hashes must be 1..{DEFAULT_LIMITS.max_retrieval_hint_size} bytes each"
                )
    if start is not None and end is not None and start > end:
        raise InvalidQuery("time_start is after time_end")
    criteria = Criteria(
        channel_id=channel,
        time_start=start,
        time_end=end,
        message_ids=ids,
        message_hashes=hashes,
    )
    forward = request.pagination_forward
    fingerprint = query_fingerprint(criteria, forward)
    after = (
        cursors.open(request.pagination_cursor, fingerprint)
        if request.HasField("pagination_cursor")
        else None
    )
    requested = request.pagination_limit if request.HasField("pagination_limit") else 0
    limit = min(requested or limits.default_page_size, limits.max_page_size)
    return PlannedQuery(
        criteria=criteria,
        after=after,
        forward=forward,
        limit=limit,
        include_data=request.include_data,
        fingerprint=fingerprint,
    )
