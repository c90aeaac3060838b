"""wire.pack: a Ranges or a Messages cut into messages that fit a frame."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.sync import rbsr
from store_node.store_sync import wire

KEY = bytes(range(wire.KEY_SIZE))
SOME: list[rbsr.RangeMessage] = [
    rbsr.Payload(KEY),
    rbsr.Fingerprint(bytes(16), KEY),
    rbsr.Terminal(),
    rbsr.EmptySet(True),
]
RANGES = st.lists(st.sampled_from(SOME), max_size=40).map(lambda items: wire.Ranges(tuple(items)))
MESSAGES = st.lists(
    st.tuples(st.sampled_from(["c", "channel"]), st.binary(min_size=1, max_size=120)),
    max_size=20,
).map(lambda items: wire.Messages(tuple(items)))


@settings(max_examples=200, deadline=None)
@given(message=st.one_of(RANGES, MESSAGES), max_bytes=st.integers(1, 400))
def test_pack_keeps_every_item_in_order_within_the_bound(
    message: wire.Ranges | wire.Messages, max_bytes: int
) -> None:
    parts = [wire.decode(data) for data in wire.pack(message, max_bytes)]
    assert all(type(part) is type(message) for part in parts)
    assert tuple(item for part in parts for item in part.items) == message.items  # type: ignore[union-attr]
    for data, part in zip(wire.pack(message, max_bytes), parts, strict=True):
        # Over the bound only as a message of one item; else the next item did not fit.
        assert len(data) <= max_bytes or len(part.items) == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("max_bytes", [1 + 2 * (1 + wire.KEY_SIZE), 3 * (1 + wire.KEY_SIZE)])
def test_pack_fills_a_message_before_starting_the_next(max_bytes: int) -> None:
    message = wire.Ranges((rbsr.Payload(KEY),) * 5)
    sizes = [len(data) for data in wire.pack(message, max_bytes)]
    assert sizes == [1 + 2 * (1 + wire.KEY_SIZE)] * 2 + [1 + (1 + wire.KEY_SIZE)]
