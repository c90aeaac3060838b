"""Fuzzing the request path: any request yields a plan or InvalidQuery, nothing else."""

from __future__ import annotations

import contextlib
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from sdk._proto.store.v1 import store_pb2
from store_node.archive.base import Criteria
from store_node.cursor import CURSOR_SIZE, CursorCodec, query_fingerprint
from store_node.errors import InvalidCursor, InvalidQuery
from store_node.query import QueryLimits, plan_query

CODEC = CursorCodec(os.urandom(32))
LIMITS = QueryLimits(max_ids_per_request=8, default_page_size=5, max_page_size=20)

requests = st.builds(
    store_pb2.StoreQueryRequest,
    request_id=st.text(max_size=5),
    include_data=st.booleans(),
    channel_id=st.none() | st.text(max_size=300),
    time_start=st.none() | st.integers(-(2**63), 2**63 - 1),
    time_end=st.none() | st.integers(-(2**63), 2**63 - 1),
    message_ids=st.lists(st.text(max_size=300), max_size=10),
    message_hashes=st.lists(st.binary(max_size=40), max_size=10),
    pagination_cursor=st.none() | st.binary(max_size=40),
    pagination_forward=st.booleans(),
    pagination_limit=st.none() | st.integers(0, 2**64 - 1),
)


@settings(max_examples=150, deadline=None)
@given(requests)
def test_any_request_is_planned_or_invalid(request: store_pb2.StoreQueryRequest) -> None:
    try:
        plan = plan_query(request, LIMITS, CODEC)
    except InvalidQuery:
        return
    assert 1 <= plan.limit <= LIMITS.max_page_size
    assert len(plan.criteria.message_ids) + len(plan.criteria.message_hashes) <= 8
    assert not (plan.criteria.is_lookup and plan.criteria.time_start is not None)
    # A cursor only opens when it is one we sealed for exactly this query.
    assert plan.after is None or len(request.pagination_cursor) == CURSOR_SIZE


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64))
def test_undecodable_bytes_never_escape_as_anything_but_invalid(data: bytes) -> None:
    try:
        request = store_pb2.StoreQueryRequest.FromString(data)
    except Exception:
        return  # the service answers INVALID_ARGUMENT (test_store_grpc)
    with contextlib.suppress(InvalidQuery):
        plan_query(request, LIMITS, CODEC)


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
