"""Byte-exact encodings of every control and data message, setup and framing.

The expected bytes are written by hand from ``specs/bamboo-point-2-point.md``,
"Encodings" (bit 1 = 0x80 of the first byte), not produced by the encoder; the
comment on each vector spells the fields out. Entries inside cancellations come
from ``vectors/bamboo-ed25519-yasmf.json``.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.documents.hashing import yasmf_hash
from sdk.sync.bamboo_p2p import (
    ALL,
    NOTIFY,
    Adjust,
    Apology,
    Cancel,
    CancelMarker,
    CancelReason,
    Channel,
    ChannelFrameDecoder,
    CompressedPayload,
    EagerMode,
    Eagerness,
    FramingError,
    GrantCredit,
    MalformedMessage,
    Metadata,
    Notify,
    PayloadChunk,
    Propose,
    SetupInfo,
    SkipBytes,
    SkipTooLarge,
    SkipTooSmall,
    SkipUnavailable,
    SwitchRequest,
    decode_control,
    decode_data,
    decode_setup,
    encode_control,
    encode_data,
    encode_frame,
    negotiate,
)
from sdk.sync.bamboo_p2p.codec import decode_all_control, entry_from_cancel_bytes
from sdk.sync.bamboo_p2p.entries import is_end_of_log
from tests.conftest import VECTORS as SHARED_VECTORS

VECTORS = json.loads((SHARED_VECTORS / "bamboo-ed25519-yasmf.json").read_text())
FIVE = VECTORS["fiveValidEntries"]
AUTHOR = bytes.fromhex(FIVE["author"]["public"])
ENTRY1_HEX = FIVE["entries"][0]["encoded"]
ENTRY2_HEX = FIVE["entries"][1]["encoded"]
ENTRY1 = entry_from_cancel_bytes(bytes.fromhex(ENTRY1_HEX))
ENTRY2 = entry_from_cancel_bytes(bytes.fromhex(ENTRY2_HEX))
H = "0020" + "ab" * 32  # a YASMF-BLAKE3 hash
MAXU64 = "ff" + "ff" * 8  # VarU64 of 2^64 - 1: 247 + 8, then 8 bytes
SIG = "5a" * 64

CONTROL_VECTORS: list[tuple[str, object, str]] = [
    ("credit 5", GrantCredit(5), "00 05"),
    ("credit 300: VarU64 two bytes", GrantCredit(300), "00 f9012c"),
    ("credit 2^64-1", GrantCredit((1 << 64) - 1), "00" + MAXU64),
    # adjust: 0 | eagerness 11 | 0000, id 3
    ("confirm with eagerness all", Adjust(3, eagerness=ALL), "60 03"),
    ("adjust eagerness notify", Adjust(2, eagerness=NOTIFY), "20 02"),
    # 0 | 10 | skip | end | upper | min | max = 0101 1111, id 7, limit 1000, 50, 52, 10, 2000
    (
        "adjust everything",
        Adjust(
            7,
            eagerness=Eagerness(EagerMode.UP_TO, 1000),
            allow_skip=True,
            end=50,
            upper_certpool=52,
            min_payload=10,
            max_payload=2000,
        ),
        "5f 07 f903e8 32 34 0a f907d0",
    ),
    ("adjust allow skip only", Adjust(9, allow_skip=True), "10 09"),
    ("adjust end only", Adjust(9, end=4), "08 09 04"),
    ("adjust upper only", Adjust(9, upper_certpool=5), "04 09 05"),
    ("adjust min only", Adjust(9, min_payload=1), "02 09 01"),
    ("adjust max only", Adjust(9, max_payload=255), "01 09 f8ff"),
    ("cancel 128 do not retry", Cancel(4, CancelReason.DO_NOT_RETRY), "80 04"),
    ("cancel 129 resource limit", Cancel(4, CancelReason.RESOURCE_LIMIT), "81 04"),
    ("cancel 130 end of range", Cancel(4, CancelReason.END_OF_RANGE), "82 04"),
    ("cancel 131 confirm", Cancel(4, CancelReason.CONFIRM), "83 04"),
    ("cancel 132 mandatory payload", Cancel(4, CancelReason.MANDATORY_PAYLOAD), "84 04"),
    (
        "cancel 133 hash mismatch + entry",
        Cancel(4, CancelReason.HASH_MISMATCH, entry=ENTRY1),
        "85 04 " + ENTRY1_HEX,
    ),
    ("cancel 134 end of log at 9", Cancel(4, CancelReason.END_OF_LOG, seq_num=9), "86 04 09"),
    (
        "cancel 135 forked + two entries",
        Cancel(4, CancelReason.FORKED, entry=ENTRY1, other_entry=ENTRY2),
        "87 04 " + ENTRY1_HEX + ENTRY2_HEX,
    ),
    # 1 | 11 | finite | no offset | no payload-only | sparse | mandatory = 1111 0011
    # id 6, author, log 0, start 1, lower 1, min 0, max 2^64-1, (no hash: lower is 1),
    # end 100, upper 121
    (
        "propose finite sparse mandatory, lower 1",
        Propose(
            request_id=6,
            author=AUTHOR,
            log_id=0,
            start=1,
            lower_certpool=1,
            min_payload=0,
            max_payload=(1 << 64) - 1,
            expected_hash=None,
            eagerness=ALL,
            end=100,
            upper_certpool=121,
            sparse=True,
            mandatory=True,
        ),
        "f3 06" + AUTHOR.hex() + "00 01 01 00" + MAXU64 + "64 79",
    ),
    # 1 | 01 | 0 0 0 0 0 = a0: notify, infinite; id 1, log 300, start 5, lower 4, min 1,
    # max 70000 (fa 01 11 70), hash of entry lipmaa(4) = 1
    (
        "propose infinite notify, lower 4 with hash",
        Propose(
            request_id=1,
            author=AUTHOR,
            log_id=300,
            start=5,
            lower_certpool=4,
            min_payload=1,
            max_payload=70000,
            expected_hash=bytes.fromhex(H),
            eagerness=NOTIFY,
        ),
        "a0 01" + AUTHOR.hex() + "f9012c 05 04 01 fa011170" + H,
    ),
    # 1 | 10 | 0 | offset | payload-only | 0 | 0 = 1100 1100: up-to 500, offset 17;
    # no lower; hash of the start entry; then limit, then offset
    (
        "propose up-to, offset, payload only",
        Propose(
            request_id=8,
            author=AUTHOR,
            log_id=1,
            start=3,
            lower_certpool=None,
            min_payload=0,
            max_payload=10,
            expected_hash=bytes.fromhex(H),
            eagerness=Eagerness(EagerMode.UP_TO, 500),
            offset=17,
            payload_only=True,
        ),
        "cc 08" + AUTHOR.hex() + "01 03 00 0a" + H + "f901f4 11",
    ),
]

DATA_VECTORS: list[tuple[str, object, str]] = [
    ("switch to request 5", SwitchRequest(5), "00 05"),
    ("notify one", Notify(1), "02"),
    ("notify 10", Notify(10), "03 0a"),
    ("notify 1000", Notify(1000), "03 f903e8"),
    ("skip too small", SkipTooSmall(), "04"),
    ("skip too large", SkipTooLarge(), "05"),
    ("skip unavailable", SkipUnavailable(), "06"),
    ("skip 3 bytes", SkipBytes(3), "07 03"),
    ("payload abc", PayloadChunk(b"abc"), "08 03 616263"),
    ("empty payload chunk", PayloadChunk(b""), "08 00"),
    ("compressed 5 from 2 bytes", CompressedPayload(5, b"xy"), "09 05 02 7879"),
    ("apology", Apology(), "10"),
    ("cancelled 9", CancelMarker(9), "20 09"),
    (
        "metadata tag 0, no backlink",
        Metadata(0, None, 16, bytes.fromhex(H), bytes.fromhex(SIG)),
        "80 10" + H + SIG,
    ),
    (
        "metadata tag 1 with backlink",
        Metadata(1, bytes.fromhex(H), 300, bytes.fromhex(H), bytes.fromhex(SIG)),
        "81" + H + "f9012c" + H + SIG,
    ),
]


@pytest.mark.parametrize(("name", "message", "hex_bytes"), CONTROL_VECTORS)
def test_control_vectors(name: str, message: object, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes.replace(" ", ""))
    assert encode_control(message) == data, name  # type: ignore[arg-type]
    decoded, end = decode_control(data)
    assert end == len(data)
    assert decoded == message


@pytest.mark.parametrize(("name", "message", "hex_bytes"), DATA_VECTORS)
def test_data_vectors(name: str, message: object, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes.replace(" ", ""))
    assert encode_data(message) == data, name  # type: ignore[arg-type]
    has_backlink = isinstance(message, Metadata) and message.backlink is not None
    decoded, end = decode_data(data, 0, lambda: has_backlink)
    assert end == len(data)
    assert decoded == message


def test_every_cancel_reason_has_a_vector() -> None:
    reasons = {m.reason for _, m, _ in CONTROL_VECTORS if isinstance(m, Cancel)}
    assert reasons == set(CancelReason)


def test_notify_n_with_count_one_decodes_as_notify() -> None:
    assert decode_data(bytes.fromhex("0301"))[0] == Notify(1)


def test_entries_in_cancellations_keep_their_tag_and_verify() -> None:
    assert not is_end_of_log(ENTRY1)
    ENTRY1.verify_signature()
    assert ENTRY1.encoded.hex() == ENTRY1_HEX


@pytest.mark.parametrize("first", [*range(136, 160)])
def test_unused_control_bytes_are_malformed(first: int) -> None:
    with pytest.raises(MalformedMessage, match="unused control byte"):
        decode_control(bytes((first, 0)))


def test_byte_160_is_a_proposal_with_eagerness_notify() -> None:
    message = Propose(0, AUTHOR, 0, 1, 1, 0, 0, None, NOTIFY)
    assert encode_control(message)[0] == 160


@pytest.mark.parametrize("first", [1, *range(10, 16), *range(17, 32), *range(33, 128), 130, 255])
def test_unused_data_bytes_are_malformed(first: int) -> None:
    with pytest.raises(MalformedMessage, match="unused data byte"):
        decode_data(bytes((first,)))


@pytest.mark.parametrize(
    "hex_bytes",
    [
        "00",  # credit without amount
        "00f9",  # truncated VarU64
        "00f80a",  # non-canonical VarU64 (10 in two bytes)
        "6003f9",  # adjust with truncated id
        "5f07f903e8",  # adjust missing appended values
        "85 04 00",  # hash mismatch with a truncated entry
        "85 04 02" + "00" * 40,  # entry tag 2
        "f306" + "00" * 10,  # proposal with truncated author
        "a001" + AUTHOR.hex() + "00 05 04 00 00" + "0120" + "00" * 32,  # hash type 1
    ],
)
def test_control_decoder_typed_errors(hex_bytes: str) -> None:
    with pytest.raises(MalformedMessage):
        decode_all_control(bytes.fromhex(hex_bytes.replace(" ", "")))


def test_control_decoder_needs_a_message() -> None:
    with pytest.raises(MalformedMessage):
        decode_control(b"")


@pytest.mark.parametrize(
    "hex_bytes", ["", "00", "03", "07f9", "0805ab", "0905", "090502", "80", "8010" + H, "20"]
)
def test_data_decoder_typed_errors(hex_bytes: str) -> None:
    with pytest.raises(MalformedMessage):
        decode_data(bytes.fromhex(hex_bytes))


@given(st.binary(max_size=300))
@settings(max_examples=800, deadline=None)
def test_fuzz_control_decoder_raises_only_malformed(data: bytes) -> None:
    try:
        messages = decode_all_control(data)
    except MalformedMessage:
        return
    # What decodes encodes again, and that decodes to the same messages (the input
    # may spell a message another way: ignored bits, a longer varint).
    assert decode_all_control(b"".join(encode_control(m) for m in messages)) == messages


@given(st.binary(max_size=300), st.booleans())
@settings(max_examples=800, deadline=None)
def test_fuzz_data_decoder_raises_only_malformed(data: bytes, backlink: bool) -> None:
    pos = 0
    try:
        while pos < len(data):
            _, pos = decode_data(data, pos, lambda: backlink)
    except MalformedMessage:
        pass


u64 = st.integers(0, (1 << 64) - 1)
eagerness = st.one_of(
    st.sampled_from([ALL, NOTIFY]), u64.map(lambda n: Eagerness(EagerMode.UP_TO, n))
)


@given(
    u64,
    st.one_of(st.none(), eagerness),
    st.booleans(),
    *(st.one_of(st.none(), u64) for _ in range(4)),
)
@settings(max_examples=300, deadline=None)
def test_adjust_round_trip(rid, eager, skip, end, upper, low, high) -> None:  # type: ignore[no-untyped-def]
    message = Adjust(rid, eager, skip, end, upper, low, high)
    if message.is_empty():
        with pytest.raises(ValueError):
            encode_control(message)
        return
    assert decode_control(encode_control(message)) == (message, len(encode_control(message)))


@given(
    u64,
    st.binary(min_size=32, max_size=32),
    u64,
    u64,
    st.one_of(st.none(), u64),
    u64,
    u64,
    eagerness,
    st.one_of(st.none(), st.tuples(u64, u64)),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_propose_round_trip(  # type: ignore[no-untyped-def]
    rid, author, log_id, start, lower, low, high, eager, finite, payload_only, sparse, mandatory
) -> None:
    offset = 7 if lower is None else None
    expected = None if lower == 1 else yasmf_hash(b"anchor")
    message = Propose(
        rid,
        author,
        log_id,
        start,
        lower,
        low,
        high,
        expected,
        eager,
        None if finite is None else finite[0],
        None if finite is None else finite[1],
        offset,
        payload_only,
        sparse,
        mandatory,
    )
    data = encode_control(message)
    assert decode_control(data) == (message, len(data))


# ------------------------------------------------------------------ setup, framing


@pytest.mark.parametrize(
    ("info", "hex_bytes"),
    [
        (SetupInfo(), "00 00 00"),
        (SetupInfo(send_greedy=True), "02 00 00"),
        (SetupInfo(receive_greedy=True), "01 00 00"),
        (SetupInfo(True, True, 1000, 300), "03 f903e8 f9012c"),
    ],
)
def test_setup_vectors(info: SetupInfo, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes.replace(" ", ""))
    assert info.encode() == data
    assert decode_setup(data + b"\xff") == (info, len(data))
    assert decode_setup(data[:-1]) is None


def test_setup_ignores_the_first_six_bits() -> None:
    assert decode_setup(bytes.fromhex("fc0000")) == (SetupInfo(), 3)


def test_negotiation_is_symmetric() -> None:
    a = SetupInfo(send_greedy=True, receive_greedy=True, send_window=100, receive_window=5)
    b = SetupInfo(send_greedy=False, receive_greedy=True, send_window=7, receive_window=50)
    pa, pb = negotiate(a, b), negotiate(b, a)
    assert (pa.send_greedy, pa.receive_greedy) == (True, False)
    assert (pb.send_greedy, pb.receive_greedy) == (False, True)
    assert pa.compression_window == pb.decompression_window == 50
    assert pa.decompression_window == pb.compression_window == 5


def test_frame_vector_and_split_delivery() -> None:
    frame = encode_frame(Channel.CONTROL, b"\x00\x05")
    assert frame == bytes.fromhex("00 02 0005")
    data = frame + encode_frame(Channel.DATA, b"\x02" * 300)
    decoder = ChannelFrameDecoder()
    got = []
    for byte in data:
        got += decoder.feed(bytes((byte,)))
    assert got == [(Channel.CONTROL, b"\x00\x05"), (Channel.DATA, b"\x02" * 300)]
    assert decoder.buffered == 0


@pytest.mark.parametrize("hex_bytes", ["02 01 00", "00 00", "01 fa 10 00 01"])
def test_framing_errors(hex_bytes: str) -> None:
    with pytest.raises(FramingError):
        ChannelFrameDecoder().feed(bytes.fromhex(hex_bytes.replace(" ", "")))


@given(st.binary(max_size=200))
@settings(max_examples=1000, deadline=None)
def test_fuzz_frame_decoder(data: bytes) -> None:
    with contextlib.suppress(FramingError):
        ChannelFrameDecoder().feed(data)
