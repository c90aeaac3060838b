"""decode_archive_fields (the store's fast decode) against decode_message: the same
verdict, the same rejection reason, the same fields, for valid, edge-case, mutated
and random bytes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sdk.sds.message as message_module
from sdk.sds import RemoteProtocolError, decode_message, encode_message
from sdk.sds.limits import DEFAULT_LIMITS, Limits
from sdk.sds.message import HistoryEntry, Message, _len_field, decode_archive_fields

# Small bounds make every limit reachable with small examples; equal-verdict checks
# run against these and the defaults.
TIGHT = Limits(
    max_message_size=600,
    max_id_length=12,
    max_causal_history=4,
    max_repair_request=2,
    max_bloom_filter_size=8,
    max_retrieval_hint_size=6,
)


def verdict(fn: object, data: bytes, limits: Limits) -> object:
    try:
        return fn(data, limits)  # type: ignore[operator]
    except RemoteProtocolError as exc:
        return ("rejected", exc.reason)


def projected(data: bytes, limits: Limits) -> object:
    m = decode_message(data, limits)
    return (
        m.sender_id,
        m.message_id,
        m.channel_id,
        m.lamport_timestamp,
        tuple(e.message_id for e in m.causal_history),
        m.content,
    )


def assert_same(data: bytes) -> None:
    for limits in (TIGHT, DEFAULT_LIMITS):
        assert verdict(decode_archive_fields, data, limits) == verdict(projected, data, limits)


# Ids: mostly short ASCII, sometimes empty, multi-byte or around the tight bound.
ids = st.one_of(
    st.text(alphabet="abc", max_size=4),
    st.text(max_size=14),
    st.sampled_from(["", "a" * 12, "a" * 13, "é" * 6, "é" * 7, "\x00"]),
)
hints = st.one_of(st.none(), st.binary(max_size=8))
entries = st.builds(HistoryEntry, ids, hints, st.one_of(st.none(), ids))
messages = st.builds(
    Message,
    ids,
    ids,
    ids,
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    st.lists(entries, max_size=6).map(tuple),
    st.one_of(st.none(), st.binary(max_size=10)),
    st.one_of(st.none(), st.binary(max_size=4)),
    st.lists(entries, max_size=3).map(tuple),
)
# Raw entry bytes the encoder cannot produce: ids that are not UTF-8, unknown fields,
# truncations.
raw_entries = st.one_of(
    st.binary(max_size=12),
    st.builds(lambda b: _len_field(b"\x0a", b), st.binary(max_size=6)),
    st.builds(
        lambda a, b: _len_field(b"\x0a", a) + _len_field(b"\x1a", b),
        st.binary(min_size=1, max_size=4),
        st.binary(max_size=4),
    ),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_same_as_decode_message_for_encoded_messages(message: Message) -> None:
    assert_same(encode_message(message))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages,
    st.lists(st.tuples(st.sampled_from([b"\x5a", b"\x6a"]), raw_entries), max_size=4),
)
def test_same_with_raw_entries(message: Message, extra: list[tuple[bytes, bytes]]) -> None:
    data = encode_message(message) + b"".join(_len_field(tag, raw) for tag, raw in extra)
    assert_same(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.integers(0, 10_000), st.binary(max_size=3), st.integers(0, 3))
def test_same_for_mutated_messages(message: Message, where: int, insert: bytes, cut: int) -> None:
    data = encode_message(message)
    pos = where % (len(data) + 1)
    assert_same(data[:pos] + insert + data[pos + cut :])


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_same_for_random_bytes(data: bytes) -> None:
    assert_same(data)


def test_fields_of_a_valid_message() -> None:
    m = Message(
        "alice",
        "m2",
        "ch",
        5,
        (HistoryEntry("m1", b"h", "bob"), HistoryEntry("m0")),
        b"\x01",
        b"hi",
        (HistoryEntry("m9"),),
    )
    assert decode_archive_fields(encode_message(m)) == ("alice", "m2", "ch", 5, ("m1", "m0"), b"hi")


def test_a_valid_message_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Message:
        raise AssertionError("fell back to decode_message")

    monkeypatch.setattr(message_module, "decode_message", fail)
    m = Message("a", "m", "c", 1, (HistoryEntry("x", b"h", "s"),), b"b", b"c")
    assert decode_archive_fields(encode_message(m)) == ("a", "m", "c", 1, ("x",), b"c")


def test_an_entry_with_a_non_utf8_id_is_dropped_as_decode_message_drops_it() -> None:
    good = encode_message(Message("a", "m", "c", 1, (HistoryEntry("x"),), None, b"c"))
    data = good + _len_field(b"\x5a", _len_field(b"\x0a", b"\xff"))
    assert decode_archive_fields(data) == ("a", "m", "c", 1, ("x",), b"c")
    assert_same(data)


def test_rejections_carry_decode_message_reasons() -> None:
    too_many = Message("a", "m", "c", 1, tuple(HistoryEntry(f"e{i}") for i in range(5)))
    for data in (
        b"",
        b"\xff",
        encode_message(Message("a", "", "c", 1)),
        encode_message(Message("a", "m", "c")),
        encode_message(too_many),
        encode_message(Message("a" * 13, "m", "c", 1)),
        encode_message(Message("a", "m", "c", 1, bloom_filter=b"x" * 9)),
        encode_message(Message("a", "m", "c", 1, (HistoryEntry("x", b"h" * 7),))),
        encode_message(Message("a", "m", "c", 1, repair_request=(HistoryEntry("é" * 7),))),
        b"x" * 601,
    ):
        assert verdict(decode_archive_fields, data, TIGHT)[0] == "rejected"  # type: ignore[index]
        assert_same(data)
