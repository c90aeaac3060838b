"""Replication message codec: aquadoggo's bytes, round trips, and typed errors for bad input."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.sync import rbsr
from sdk.sync.errors import MalformedMessage
from sdk.sync.messages import (
    Announce,
    EntryMessage,
    Have,
    Message,
    Mode,
    RangeSync,
    SyncDone,
    SyncRequest,
    decode,
    encode,
    item_key,
    key_item,
    schema_id_set,
)

VECTORS = json.loads((Path(__file__).parent / "aquadoggo_vectors.json").read_text())["vectors"]
APP = "venue_0020c65567ae37efea293e34a9c7d13f8f2bf23dbdc3b5c7b9ab46293111c48fc78b"


def vector(name: str) -> bytes:
    return bytes.fromhex(next(v["cbor_hex"] for v in VECTORS if v["name"] == name))


def test_vectors_are_what_aquadoggo_encodes(vectors_dir: Path) -> None:
    shared = json.loads((vectors_dir / "p2panda-operation-entry.json").read_text())
    entry = bytes.fromhex(shared["entry"]["encoded_hex"])
    operation = bytes.fromhex(shared["operation"]["cbor_hex"])
    public_key = bytes.fromhex(shared["public_key"])
    expected: dict[str, Message] = {
        "announce": Announce(12345678, ("schema_field_definition_v1", APP)),
        "sync_request_set_reconciliation": SyncRequest(
            51, Mode.SET_RECONCILIATION, ("schema_definition_v1", APP)
        ),
        "sync_request_log_height": SyncRequest(12, Mode.LOG_HEIGHT, (APP,)),
        "entry": EntryMessage(7, entry, operation),
        "sync_done": SyncDone(7, True),
        "have": Have(51, ((public_key, ((0, 1),)),)),
        "have_empty": Have(12, ()),
    }
    assert {v["name"] for v in VECTORS} == set(expected)
    for name, message in expected.items():
        assert encode(message) == vector(name), name
        assert decode(vector(name)) == message, name


KEY = item_key(b"\x01" * 32, 3, 9)
UPPER = item_key(b"\x02" * 32, 0, 1)
RANGE_VECTORS: list[tuple[rbsr.RangeMessage, list[object]]] = [
    (rbsr.EmptySet(True), [20, 5, True]),
    (rbsr.LowerBound(KEY), [21, 5, [b"\x01" * 32, 3, 9]]),
    (rbsr.Payload(KEY), [22, 5, [b"\x01" * 32, 3, 9]]),
    (rbsr.Payload(KEY, True, UPPER), [22, 5, [b"\x01" * 32, 3, 9], True, [b"\x02" * 32, 0, 1]]),
    (rbsr.EmptyPayload(UPPER), [23, 5, [b"\x02" * 32, 0, 1]]),
    (rbsr.Done(UPPER), [24, 5, [b"\x02" * 32, 0, 1]]),
    (rbsr.Fingerprint(b"\xaa" * 16, UPPER), [25, 5, b"\xaa" * 16, [b"\x02" * 32, 0, 1]]),
    (rbsr.Terminal(), [26, 5]),
    # A bound between two public keys: the shortest prefix that separates them.
    (rbsr.Fingerprint(b"\xaa" * 16, b"\x02\x07"), [25, 5, b"\xaa" * 16, [b"\x02\x07", 0, 0]]),
    (rbsr.LowerBound(b"\x01"), [21, 5, [b"\x01", 0, 0]]),
    (rbsr.Payload(KEY, False, b"\x03"), [22, 5, [b"\x01" * 32, 3, 9], False, [b"\x03", 0, 0]]),
]


@pytest.mark.parametrize(("message", "plain"), RANGE_VECTORS)
def test_set_reconciliation_messages_are_the_spec_arrays(message, plain) -> None:
    data = encode(RangeSync(5, message))
    assert data == cbor2.dumps(plain)
    assert decode(data) == RangeSync(5, message)


def test_item_keys_sort_like_the_items() -> None:
    items = [(b"\x00" * 31 + b"\x01", 0, 2), (b"\x00" * 32, 5, 1), (b"\x00" * 32, 1, 300)]
    keys = sorted(item_key(*i) for i in items)
    assert [key_item(k) for k in keys] == sorted(items)


def test_schema_id_sets_put_system_schemas_first() -> None:
    ids = schema_id_set([APP, "schema_field_definition_v1", "schema_definition_v1", APP])
    assert ids == ("schema_definition_v1", "schema_field_definition_v1", APP)


BAD = [
    b"",
    b"\xff",
    cbor2.dumps({"a": 1}),
    cbor2.dumps([]),
    cbor2.dumps([99, 1]),  # unknown type
    cbor2.dumps(["1", 1]),
    cbor2.dumps([1]),  # missing session id
    cbor2.dumps([1, 0, 0, []]),  # empty target set (aquadoggo rejects it)
    cbor2.dumps([1, 0, 2, [APP]]),  # unknown mode
    cbor2.dumps([1, 0, 0, ["schema_field_definition_v1", "schema_definition_v1"]]),  # unsorted
    cbor2.dumps([1, 0, 0, [APP], "too much"]),
    cbor2.dumps([2, 0, b"entry", None]),  # no operation: cannot be validated
    cbor2.dumps([3, 0, 1]),
    cbor2.dumps([10, 0, [[b"short", [[0, 1]]]]]),
    cbor2.dumps([10, 0, [[b"\x00" * 32, [[0]]]]]),
    cbor2.dumps([22, 0, [b"\x00" * 32, 0, 1], True]),
    cbor2.dumps([25, 0, b"\x00" * 15, [b"\x00" * 32, 0, 1]]),
    cbor2.dumps([26, -1]),
    cbor2.dumps([22, 0, [b"\x01", 0, 0]]),  # an item (not a bound) is never short
    cbor2.dumps([0, 1, 2**64, []]),
]


@pytest.mark.parametrize("data", BAD)
def test_bad_bytes_raise_malformed_message(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_only_raise_malformed_message(data: bytes) -> None:
    with contextlib.suppress(MalformedMessage):
        decode(data)


cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.binary(max_size=40)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 30), cbor_values)
def test_fuzz_message_shaped_arrays(kind: int, rest: object) -> None:
    items = rest if isinstance(rest, list) else [rest]
    for data in (cbor2.dumps([kind, *items]), cbor2.dumps([kind, 1, *items])):
        try:
            message = decode(data)
        except MalformedMessage:
            continue
        assert decode(encode(message)) == message


item_st = st.tuples(
    st.binary(min_size=32, max_size=32), st.integers(0, 2**64 - 1), st.integers(1, 2**64 - 1)
)


@settings(max_examples=200, deadline=None)
@given(item_st, item_st)
def test_short_bounds_sit_between_neighbours_and_survive_the_wire(x, y) -> None:
    from sdk.sync.messages import short_bound

    prev, key = sorted({item_key(*x), item_key(*y)}) * (1 if x != y else 2)
    if prev == key:
        return
    bound = short_bound(prev, key)
    assert prev < bound <= key
    # Shorter than a public key only when the public keys differ; else a whole item.
    assert len(bound) < 32 or bound == key
    message = RangeSync(3, rbsr.Fingerprint(b"\x01" * 16, bound))
    assert decode(encode(message)) == message
    if len(bound) < 32:
        full = RangeSync(3, rbsr.Fingerprint(b"\x01" * 16, key))
        assert len(encode(message)) < len(encode(full))


@pytest.mark.parametrize(
    "bound",
    [[b"\x01\x02", 1, 0], [b"\x01\x02", 0, 7], [b"\x01", False, 0], [b"\x01" * 33, 0, 0]],
)
def test_a_short_bound_is_a_prefix_with_zero_log_and_seq(bound) -> None:
    with pytest.raises(MalformedMessage):
        decode(cbor2.dumps([25, 0, b"\x00" * 16, bound]))
