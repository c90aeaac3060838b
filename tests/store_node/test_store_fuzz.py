"""Fuzzing the request path: any request yields a plan or InvalidQuery, nothing else."""

from __future__ import annotations

import os

from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk._proto.store.v1 import store_pb2
from store_node.archive.base import Criteria, Key
from store_node.cursor import CursorCodec, query_fingerprint
from store_node.errors import InvalidCursor, InvalidQuery
from store_node.query import PlannedQuery, QueryLimits, plan_query

CODEC = CursorCodec(os.urandom(32))
LIMITS = QueryLimits(max_ids_per_request=8, default_page_size=5, max_page_size=20)
I64 = st.integers(-(2**63), 2**63 - 1)
#: Channel ids the rules accept, beside arbitrary text (mostly refused).
CHANNELS = st.sampled_from(["c", "chat/room-1", "ünïcode room", "x" * 200])


@st.composite
def requests(draw: st.DrawFn) -> tuple[store_pb2.StoreQueryRequest, str, Key | None]:
    """A request most of whose fields pass validation, so the later rules (ids, time
    range, page size, the cursor) are reached; with how its cursor was made: ``none``,
    ``sealed`` for exactly this query (and the key in it), ``other`` (sealed for the
    same criteria in the other direction), ``flipped`` (one bit off) or ``junk``."""
    request = store_pb2.StoreQueryRequest(
        request_id=draw(st.text(max_size=5)),
        include_data=draw(st.booleans()),
        pagination_forward=draw(st.booleans()),
    )
    channel = draw(st.none() | CHANNELS | st.text(max_size=300))
    if channel is not None:
        request.channel_id = channel
    if draw(st.booleans()):  # a lookup
        ids = st.text(min_size=1, max_size=20) | st.text(max_size=300)
        request.message_ids.extend(draw(st.lists(ids, max_size=6)))
        request.message_hashes.extend(draw(st.lists(st.binary(max_size=40), max_size=6)))
    start, end = draw(st.none() | I64), draw(st.none() | I64)
    if start is not None and end is not None and draw(st.booleans()):
        start, end = min(start, end), max(start, end)
    if start is not None:
        request.time_start = start
    if end is not None:
        request.time_end = end
    limit = draw(st.none() | st.integers(0, 30) | st.integers(0, 2**64 - 1))
    if limit is not None:
        request.pagination_limit = limit
    kind = draw(st.sampled_from(["none", "sealed", "other", "flipped", "junk"]))
    key = (draw(I64), draw(I64))
    criteria = Criteria(
        channel_id=channel,
        time_start=start,
        time_end=end,
        message_ids=tuple(request.message_ids),
        message_hashes=tuple(request.message_hashes),
    )
    forward = request.pagination_forward
    if kind == "junk":
        request.pagination_cursor = draw(st.binary(max_size=40))
    elif kind != "none":
        cursor = CODEC.seal(key, query_fingerprint(criteria, forward != (kind == "other")))
        if kind == "flipped":
            i, bit = draw(st.integers(0, len(cursor) - 1)), draw(st.integers(0, 7))
            cursor = cursor[:i] + bytes([cursor[i] ^ (1 << bit)]) + cursor[i + 1 :]
        request.pagination_cursor = cursor
    return request, kind, key if kind == "sealed" else None


def _check(plan: PlannedQuery) -> None:
    """What holds of every plan, whatever the request."""
    assert 1 <= plan.limit <= LIMITS.max_page_size
    assert len(plan.criteria.message_ids) + len(plan.criteria.message_hashes) <= 8
    assert not (plan.criteria.is_lookup and plan.criteria.time_start is not None)
    if plan.criteria.time_start is not None and plan.criteria.time_end is not None:
        assert plan.criteria.time_start <= plan.criteria.time_end


@settings(max_examples=150, deadline=None)
@given(requests())
def test_any_request_is_planned_or_invalid(
    made: tuple[store_pb2.StoreQueryRequest, str, Key | None],
) -> None:
    request, kind, key = made
    try:
        plan = plan_query(request, LIMITS, CODEC)
    except InvalidCursor:
        assert kind in ("other", "flipped", "junk")
        return
    except InvalidQuery:
        return
    _check(plan)
    # A cursor opens exactly when it is one we sealed for this query, to its key.
    assert plan.after == key
    assert kind in ("none", "sealed")


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    """Bytes that mostly decode as a request: an encoded request, cut, extended or with
    a byte changed; sometimes arbitrary bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=64))
    data = bytearray(draw(requests())[0].SerializeToString())
    for _ in range(draw(st.integers(0, 3))):
        edit = draw(st.sampled_from(["cut", "append", "change"]))
        if edit == "cut":
            del data[draw(st.integers(0, len(data))) :]
        elif edit == "append":
            data += draw(st.binary(min_size=1, max_size=8))
        elif data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=150, deadline=None)
@given(request_bytes())
def test_undecodable_bytes_never_escape_as_anything_but_invalid(data: bytes) -> None:
    try:
        request = store_pb2.StoreQueryRequest.FromString(data)
    except DecodeError:
        return  # the service answers INVALID_ARGUMENT (test_store_grpc)
    try:
        plan = plan_query(request, LIMITS, CODEC)
    except InvalidQuery:
        return
    _check(plan)


@settings(max_examples=150, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1), st.data())
def test_cursor_round_trip_and_any_flip_is_rejected(
    first: int, seq: int, data: st.DataObject
) -> None:
    fp = query_fingerprint(Criteria(channel_id="c"), True)
    cursor = CODEC.seal((first, seq), fp)
    assert CODEC.open(cursor, fp) == (first, seq)
    i = data.draw(st.integers(0, len(cursor) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(cursor)
    flipped[i] ^= 1 << bit
    try:
        CODEC.open(bytes(flipped), fp)
    except InvalidCursor:
        pass
    else:
        raise AssertionError("a flipped cursor opened")
    other = query_fingerprint(Criteria(channel_id="c"), False)
    try:
        CODEC.open(cursor, other)
    except InvalidCursor:
        pass
    else:
        raise AssertionError("a cursor opened for another query")
