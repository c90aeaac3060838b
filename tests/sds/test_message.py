from __future__ import annotations

import pytest

from sdk.sds.errors import RejectReason, RemoteProtocolError
from sdk.sds.limits import Limits
from sdk.sds.message import HistoryEntry, Message, MessageKind, decode_message, encode_message


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


# Hand-built per the spec's field numbers: nothing here comes from the generated code.
HISTORY = field(1, 2, b"m0") + field(2, 2, b"\x01\x02") + field(3, 2, b"bob")
REPAIR = field(1, 2, b"mx")
WIRE = (
    field(1, 2, b"alice")
    + field(2, 2, b"m1")
    + field(3, 2, b"room")
    + field(10, 0, varint(1_700_000_000_000))
    + field(11, 2, HISTORY)
    + field(12, 2, b"\xff\x00")
    + field(13, 2, REPAIR)
    + field(20, 2, b"hi")
)
MESSAGE = Message(
    sender_id="alice",
    message_id="m1",
    channel_id="room",
    lamport_timestamp=1_700_000_000_000,
    causal_history=(HistoryEntry("m0", b"\x01\x02", "bob"),),
    bloom_filter=b"\xff\x00",
    content=b"hi",
    repair_request=(HistoryEntry("mx"),),
)


def test_encode_matches_hand_built_bytes() -> None:
    assert encode_message(MESSAGE) == WIRE


def test_decode_hand_built_bytes() -> None:
    assert decode_message(WIRE) == MESSAGE


def test_content_field_uses_two_byte_tag() -> None:
    # content is field 20: tag (20 << 3 | 2) = 162 = varint a2 01
    assert encode_message(Message("s", "i", "c", content=b"x")).endswith(b"\xa2\x01\x01x")


def test_kinds() -> None:
    assert MESSAGE.kind is MessageKind.CONTENT
    assert Message("s", "i", "c", lamport_timestamp=1).kind is MessageKind.SYNC
    assert Message("s", "i", "c", lamport_timestamp=1, content=b"").kind is MessageKind.SYNC
    assert Message("s", "i", "c", content=b"x").kind is MessageKind.EPHEMERAL
    with pytest.raises(RemoteProtocolError) as exc:
        Message("s", "i", "c").kind  # noqa: B018
    assert exc.value.reason is RejectReason.INVALID_KIND


def test_lamport_zero_is_present_not_absent() -> None:
    # proto3 "optional": 0 is a set value, so a content message with Lamport 0 stays content.
    m = Message("s", "i", "c", lamport_timestamp=0, content=b"x")
    assert decode_message(encode_message(m)).kind is MessageKind.CONTENT


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xff\xff", RejectReason.DECODE),
        (field(1, 2, b"\xff\xfe") + field(2, 2, b"id") + field(20, 2, b"x"), RejectReason.DECODE),
        (field(1, 2, b"s") + field(20, 2, b"x"), RejectReason.MISSING_ID),
        (field(1, 2, b"s") + field(2, 2, b"id"), RejectReason.INVALID_KIND),
        (
            field(2, 2, b"id") + field(11, 2, field(2, 2, b"h")) + field(20, 2, b"x"),
            RejectReason.MISSING_ID,
        ),
    ],
)
def test_bad_bytes_raise_typed_error(data: bytes, reason: RejectReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        decode_message(data)
    assert exc.value.reason is reason


def test_bounds() -> None:
    limits = Limits(
        max_message_size=2_000,
        max_id_length=8,
        max_causal_history=2,
        max_repair_request=1,
        max_bloom_filter_size=4,
        max_retrieval_hint_size=2,
    )

    def reason(m: Message) -> RejectReason:
        with pytest.raises(RemoteProtocolError) as exc:
            decode_message(encode_message(m), limits)
        return exc.value.reason

    base = Message("s", "i", "c", lamport_timestamp=1, content=b"x")
    assert decode_message(encode_message(base), limits) == base
    assert reason(Message("s", "i", "c", 1, content=b"x" * 3_000)) is RejectReason.TOO_LARGE
    assert reason(Message("s" * 9, "i", "c", 1, content=b"x")) is RejectReason.FIELD_TOO_LONG
    assert reason(Message("s", "i", "c", 1, content=b"x", bloom_filter=b"12345")) is (
        RejectReason.FILTER_TOO_LARGE
    )
    hist = tuple(HistoryEntry(f"h{i}") for i in range(3))
    assert reason(Message("s", "i", "c", 1, hist, content=b"x")) is RejectReason.HISTORY_TOO_LONG
    rr = (HistoryEntry("a"), HistoryEntry("b"))
    assert reason(Message("s", "i", "c", 1, content=b"x", repair_request=rr)) is (
        RejectReason.REPAIR_REQUEST_TOO_LONG
    )
    hint = (HistoryEntry("a", b"123"),)
    assert reason(Message("s", "i", "c", 1, hint, content=b"x")) is RejectReason.FIELD_TOO_LONG
    # Multi-byte UTF-8 counts in bytes, not characters.
    assert reason(Message("ééééé", "i", "c", 1, content=b"x")) is RejectReason.FIELD_TOO_LONG


def test_unknown_fields_are_tolerated() -> None:
    # Forward compatibility: a future field number must not break decoding.
    data = WIRE + field(99, 2, b"future")
    assert decode_message(data) == MESSAGE


def test_hand_written_encoder_matches_protobuf_for_many_shapes() -> None:
    from sdk._proto.sds.v1 import sds_pb2

    shapes = [
        MESSAGE,
        Message("s", "i", "c", content=b"x"),
        Message("s", "i", "c", lamport_timestamp=0),
        Message("", "i", "", lamport_timestamp=2**64 - 1, bloom_filter=b""),
        Message(
            "é",
            "i" * 300,
            "c",
            1,
            tuple(HistoryEntry(f"h{i}") for i in range(200)),
            content=b"y" * 200,
        ),
    ]
    for m in shapes:
        pb = sds_pb2.Message()
        pb.ParseFromString(encode_message(m))
        assert pb.SerializeToString(deterministic=True) == encode_message(m)


def test_a_history_entry_with_an_invalid_utf8_id_is_dropped_not_the_message() -> None:
    # @waku/sds echoes ids byte for byte in later histories (issue 20).
    from sdk.sds.message import encode_fields

    raw = encode_fields(
        "js",
        "abc",
        "room",
        5,
        (HistoryEntry("zz"), HistoryEntry("ok")),
        None,
        b"hi",
        (HistoryEntry("zz"),),
    )
    bad = raw.replace(b"zz", b"\xff\xfe")
    message = decode_message(bad)
    assert [e.message_id for e in message.causal_history] == ["ok"]
    assert message.repair_request == () and message.content == b"hi"
    with pytest.raises(RemoteProtocolError) as info:  # a bad id of the message itself
        decode_message(raw.replace(b"abc", b"a\xffc"))
    assert info.value.reason is RejectReason.DECODE


def test_entries_decoded_once_are_still_checked_against_each_limits() -> None:
    # Entries are decoded through a cache keyed by their bytes; a cache filled under
    # generous limits must not let an entry past tighter ones.
    entry = HistoryEntry("m" * 20, b"h" * 10)
    data = encode_message(Message("s", "i", "c", 1, (entry,), content=b"x"))
    assert decode_message(data).causal_history == (entry,)
    assert decode_message(data).causal_history == (entry,)  # the cached path
    for tight in (Limits(max_id_length=16), Limits(max_retrieval_hint_size=8)):
        with pytest.raises(RemoteProtocolError) as info:
            decode_message(data, tight)
        assert info.value.reason is RejectReason.FIELD_TOO_LONG


@pytest.mark.parametrize(
    "entry",
    [
        field(1, 2, b"m0")[:-1],  # truncated inside the entry
        field(2, 2, b"hint"),  # no message_id
        field(1, 0, b"\x05"),  # message_id with the wrong wire type
    ],
)
def test_a_malformed_entry_rejects_the_message(entry: bytes) -> None:
    data = (
        field(1, 2, b"s")
        + field(2, 2, b"i")
        + field(3, 2, b"c")
        + field(10, 0, varint(1))
        + field(11, 2, field(1, 2, b"ok"))
        + field(11, 2, entry)
        + field(20, 2, b"x")
    )
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(data)
    assert info.value.reason in (RejectReason.DECODE, RejectReason.MISSING_ID)
