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
    RoundContext,
    SyncDone,
    SyncRequest,
    decode,
    encode,
    encode_entry,
    item_key,
    key_item,
    schema_id_set,
)

VECTORS = json.loads((Path(__file__).parent / "aquadoggo_vectors.json").read_text())["vectors"]
APP = "venue_0020c65567ae37efea293e34a9c7d13f8f2bf23dbdc3b5c7b9ab46293111c48fc78b"


def vector(name: str) -> bytes:
    return bytes.fromhex(next(v["cbor_hex"] for v in VECTORS if v["name"] == name))


@pytest.mark.parametrize("session_id", [0, 1, 23, 24, 255, 256, 65_536, 2**32, 2**64 - 1])
@pytest.mark.parametrize("size", [0, 1, 23, 24, 255, 256, 65_535, 65_536])
def test_entry_messages_written_directly_are_the_cbor_array(session_id: int, size: int) -> None:
    """encode_entry joins a header and the two byte strings: the same bytes as encoding
    the array ``[2, session_id, entry, operation]``."""
    from sdk.documents import cbor

    entry, operation = bytes(range(256)) * (size // 256) + b"e" * (size % 256), b"o" * (size // 3)
    expected = cbor.encode([2, session_id, entry, operation])
    assert expected == cbor2.dumps([2, session_id, entry, operation])
    assert encode_entry(session_id, entry, operation) == expected
    assert encode(EntryMessage(session_id, entry, operation)) == expected
    assert decode(expected) == EntryMessage(session_id, entry, operation)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.lists(
        st.tuples(
            st.binary(min_size=32, max_size=32),
            st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=30),
        ),
        max_size=6,
    ),
)
def test_have_messages_written_directly_are_the_cbor_array(
    session_id: int, heights: list[tuple[bytes, list[tuple[int, int]]]]
) -> None:
    """A Have is written without walking it as a value: the same bytes as the array."""
    from sdk.documents import cbor

    message = Have(session_id, tuple((pk, tuple(logs)) for pk, logs in heights))
    plain = [10, session_id, [[pk, [[n, s] for n, s in logs]] for pk, logs in heights]]
    assert encode(message) == cbor.encode(plain) == cbor2.dumps(plain)
    assert decode(encode(message)) == message


@pytest.mark.parametrize("log", [(True, 1), (-5, 1), (3, -1), (1.0, 2)])
def test_a_have_the_direct_writer_cannot_write_is_left_to_cbor(log: tuple[object, object]) -> None:
    """Only bytes and u64 integers take the direct path: anything else is written as the
    array (so a bool stays a bool, a negative integer negative), never as other heights."""
    from sdk.documents import cbor

    message = Have(1, ((b"\x01" * 32, (log,)),))  # type: ignore[arg-type]
    assert encode(message) == cbor.encode([10, 1, [[b"\x01" * 32, [list(log)]]]])


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


A4 = b"\x0a" * 32
B4 = b"\x0b" * 32
#: One round of one session written with a RoundContext (compact forms), then the
#: next round: what each message is on the wire.
COMPACT_ROUNDS: list[tuple[rbsr.RangeMessage, list[object]]] = [
    (rbsr.Fingerprint(b"\xaa" * 16, b"\x0a"), [25, 5, b"\xaa" * 16, b"\x0a"]),
    (rbsr.Fingerprint(b"\xbb" * 16, item_key(A4, 3, 1)), [25, 5, b"\xbb" * 16, [A4, 3, 1]]),
    (rbsr.Fingerprint(b"\xcc" * 16, item_key(A4, 7, 1)), [25, 5, b"\xcc" * 16, [7, 1]]),
    (rbsr.LowerBound(item_key(A4, 9, 0)), [21, 5, [9, 0]]),
    (rbsr.Payload(item_key(A4, 9, 2)), [22, 5, [9, 2]]),
    (rbsr.Payload(item_key(A4, 12, 1), True, b"\x0b\x00"), [22, 5, [12, 1], True, b"\x0b\x00"]),
    (rbsr.Payload(item_key(B4, 0, 1)), [22, 5, [B4, 0, 1]]),
    (rbsr.Payload(item_key(B4, 0, 3), False, item_key(B4, 1, 1)), [22, 5, [0, 3], False, [1, 1]]),
    (rbsr.EmptyPayload(item_key(A4, 1, 1)), [23, 5, [A4, 1, 1]]),
    (rbsr.Done(item_key(A4, 2, 1)), [24, 5, [2, 1]]),
    (rbsr.Terminal(), [26, 5]),
    # A new round refers to nothing before it.
    (rbsr.Done(item_key(A4, 3, 1)), [24, 5, [A4, 3, 1]]),
    (rbsr.Terminal(), [26, 5]),
]


def test_a_round_with_a_context_writes_same_author_items_and_prefixes_short() -> None:
    sent, received = RoundContext(), RoundContext()
    for message, plain in COMPACT_ROUNDS:
        data = encode(RangeSync(5, message), sent)
        assert data == cbor2.dumps(plain), message
        assert decode(data, received) == RangeSync(5, message)
        # The long form of every message still decodes, with a context or without.
        assert decode(encode(RangeSync(5, message)), RoundContext()) == RangeSync(5, message)


def test_a_same_author_item_needs_a_whole_item_earlier_in_the_round() -> None:
    same_author = cbor2.dumps([24, 5, [2, 1]])
    with pytest.raises(MalformedMessage):
        decode(same_author)  # no context
    with pytest.raises(MalformedMessage):
        decode(same_author, RoundContext())  # nothing before it
    context = RoundContext()
    decode(cbor2.dumps([24, 5, [A4, 1, 1]]), context)
    with pytest.raises(MalformedMessage):
        decode(cbor2.dumps([24, 6, [2, 1]]), context)  # another session's round
    assert decode(same_author, context) == RangeSync(5, rbsr.Done(item_key(A4, 2, 1)))
    decode(cbor2.dumps([26, 5]), context)
    with pytest.raises(MalformedMessage):
        decode(same_author, context)  # the round ended
    decode(cbor2.dumps([24, 5, [A4, 1, 1]]), context)
    decode(cbor2.dumps([20, 5, True]), context)
    with pytest.raises(MalformedMessage):
        decode(same_author, context)  # EmptySet ends a round too


@pytest.mark.parametrize(
    "bound", [b"\x01" * 32, b"\x01" * 40, [1], [1, 2, 3, 4], [-1, 0], [0, 2**64], [b"\x01", 0]]
)
def test_compact_bounds_are_checked(bound) -> None:
    context = RoundContext()
    decode(cbor2.dumps([24, 5, [A4, 1, 1]]), context)
    with pytest.raises(MalformedMessage):
        decode(cbor2.dumps([25, 5, b"\x00" * 16, bound]), context)


def test_a_context_remembers_a_bounded_number_of_sessions() -> None:
    context = RoundContext(max_sessions=2)
    for sid in range(3):
        decode(cbor2.dumps([24, sid, [A4, 1, 1]]), context)
    assert context.public_key(0) is None
    assert context.public_key(1) == context.public_key(2) == A4


range_message_st = st.one_of(
    st.builds(
        rbsr.LowerBound,
        st.builds(
            item_key, st.sampled_from([A4, B4]), st.integers(0, 300), st.integers(0, 2**64 - 1)
        ),
    ),
    st.builds(
        rbsr.Fingerprint,
        st.just(b"\x01" * 16),
        st.one_of(
            st.binary(max_size=31),
            st.builds(item_key, st.sampled_from([A4, B4]), st.integers(0, 3), st.integers(0, 3)),
        ),
    ),
    st.builds(
        rbsr.Payload,
        st.builds(item_key, st.sampled_from([A4, B4]), st.integers(0, 3), st.integers(0, 3)),
    ),
    st.just(rbsr.Terminal()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), range_message_st), max_size=30))
def test_compact_rounds_decode_to_what_was_sent_and_are_never_longer(messages) -> None:
    sent, received = RoundContext(), RoundContext()
    for sid, message in messages:
        data = encode(RangeSync(sid, message), sent)
        assert decode(data, received) == RangeSync(sid, message)
        assert len(data) <= len(encode(RangeSync(sid, message)))


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


def _reference_short_bound(prev: bytes, key: bytes) -> bytes:
    for i in range(32):
        if i >= len(prev) or prev[i] != key[i]:
            return key[: i + 1] if i + 1 < 32 else key
    return key


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=32), item_st, item_st, st.integers(0, 48))
def test_short_bound_is_the_shortest_public_key_prefix_above_prev(shared, x, y, cut) -> None:
    from sdk.sync.messages import short_bound

    # Public keys sharing a prefix (all 32 bytes: one author), as neighbours often do.
    x = ((shared + x[0])[:32], *x[1:])
    y = ((shared + y[0])[:32], *y[1:])
    prev, key = sorted([item_key(*x), item_key(*y)])
    if prev == key:
        return
    assert short_bound(prev, key) == _reference_short_bound(prev, key)
    # A shorter prev: the opening fingerprint's b"" or a bound.
    assert short_bound(prev[:cut], key) == _reference_short_bound(prev[:cut], key)


@pytest.mark.parametrize(
    "bound",
    [[b"\x01\x02", 1, 0], [b"\x01\x02", 0, 7], [b"\x01", False, 0], [b"\x01" * 33, 0, 0]],
)
def test_a_short_bound_is_a_prefix_with_zero_log_and_seq(bound) -> None:
    with pytest.raises(MalformedMessage):
        decode(cbor2.dumps([25, 0, b"\x00" * 16, bound]))
