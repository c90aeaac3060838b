"""Beelay message codec: vectors written byte by byte from the grammar, bad input, fuzzing.

Each vector is spelled out from ``beelay.txt`` (Messages) with the corrections
Beelay's code makes (automerge/beelay c817e9e): notification type 3, document
ids as 16 raw bytes, coded symbols followed by a big-endian u64 checksum and a
signed-LEB128 count, sedimentree summaries as strata and loose commits.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.sync.collection.errors import (
    LimitExceeded,
    MalformedMessage,
    UnsupportedRequest,
)
from sdk.sync.collection.messages import (
    BlobMeta,
    BlobRef,
    CommitPart,
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    ErrorResponse,
    FetchBlobPartRequest,
    FetchBlobPartResponse,
    FetchSedimentreeRequest,
    FetchSedimentreeResponse,
    ListenRequest,
    ListenResponse,
    LooseCommit,
    Message,
    MessageLimits,
    Notification,
    Request,
    Response,
    SedimentreeSummary,
    SnapshotSymbolsRequest,
    SnapshotSymbolsResponse,
    StratumMeta,
    StratumPart,
    UploadItem,
    decode_message,
    encode_message,
)
from sdk.sync.errors import RemoteProtocolError
from sdk.sync.riblt import CodedSymbol

RID = bytes([0x11]) * 16
SID = bytes([0x22]) * 16
DOC = bytes([0xAA]) * 16


def h(byte: int) -> bytes:
    return bytes([byte]) * 32


VECTORS: list[tuple[str, Message, bytes]] = [
    (
        "create_snapshot request",
        Request(RID, CreateSnapshotRequest(DOC)),
        b"\x00" + RID + b"\x04" + DOC,
    ),
    (
        "snapshot_symbols request",
        Request(RID, SnapshotSymbolsRequest(SID)),
        b"\x00" + RID + b"\x05" + SID,
    ),
    (
        "fetch_sedimentree request",
        Request(RID, FetchSedimentreeRequest(DOC)),
        b"\x00" + RID + b"\x01" + DOC,
    ),
    ("listen request", Request(RID, ListenRequest(SID)), b"\x00" + RID + b"\x06" + SID),
    (
        "fetch_blob_part request",
        Request(RID, FetchBlobPartRequest(h(0x42), 0, 300)),
        b"\x00" + RID + b"\x02" + h(0x42) + b"\x00" + b"\xac\x02",
    ),
    (
        "fetch_blob_part response",
        Response(RID, FetchBlobPartResponse(b"blob")),
        b"\x01" + RID + b"\x03\x04blob",
    ),
    (
        "create_snapshot response with four symbols",
        Response(
            RID,
            CreateSnapshotResponse(
                SID,
                (
                    CodedSymbol(b"\x01" * 48, 0x0102030405060708, 1),
                    CodedSymbol(b"\x00" * 48, 0, -1),
                    CodedSymbol(b"\xff" * 48, 0xFFFFFFFFFFFFFFFF, 64),
                    CodedSymbol(b"\x02" * 48, 1, -65),
                ),
            ),
        ),
        b"\x01"
        + RID
        + b"\x04"
        + SID
        + b"\x04"
        + (b"\x01" * 48 + bytes.fromhex("0102030405060708") + b"\x01")
        + (b"\x00" * 48 + bytes(8) + b"\x7f")
        + (b"\xff" * 48 + b"\xff" * 8 + b"\xc0\x00")
        + (b"\x02" * 48 + bytes(7) + b"\x01" + b"\xbf\x7f"),
    ),
    (
        "snapshot_symbols response, empty",
        Response(RID, SnapshotSymbolsResponse(())),
        b"\x01" + RID + b"\x05\x00",
    ),
    (
        "fetch_sedimentree response, not found",
        Response(RID, FetchSedimentreeResponse(None)),
        b"\x01" + RID + b"\x02\x00",
    ),
    (
        "fetch_sedimentree response, found",
        Response(
            RID,
            FetchSedimentreeResponse(
                SedimentreeSummary(
                    (StratumMeta(None, h(0x33), BlobMeta(h(0x44), 300)),),
                    (LooseCommit(h(0x55), (h(0x66),), BlobMeta(h(0x77), 5)),),
                ),
                SedimentreeSummary((StratumMeta(h(0x01), h(0x02), BlobMeta(h(0x03), 0)),), ()),
            ),
        ),
        b"\x01"
        + RID
        + b"\x02\x01"
        + (b"\x01" + b"\x00" + h(0x33) + h(0x44) + b"\xac\x02")
        + (b"\x01" + h(0x55) + b"\x01" + h(0x66) + h(0x77) + b"\x05")
        + (b"\x01" + b"\x01" + h(0x01) + h(0x02) + h(0x03) + b"\x00")
        + b"\x00",
    ),
    ("listen response", Response(RID, ListenResponse()), b"\x01" + RID + b"\x06"),
    (
        "error response",
        Response(RID, ErrorResponse("nope!")),
        b"\x01" + RID + b"\x00\x05nope!",
    ),
    (
        "notification: inline blob, one commit",
        Notification("alice", DOC, UploadItem(BlobRef(data=b"abc"), CommitPart(h(0x88), ()))),
        b"\x03\x05alice" + DOC + b"\x01\x03abc" + b"\x01" + h(0x88) + b"\x00",
    ),
    (
        "notification: blob by hash, a stratum",
        Notification(
            "", DOC, UploadItem(BlobRef(hash=h(0x99)), StratumPart(h(0x01), h(0x02), (h(0x03),)))
        ),
        b"\x03\x00"
        + DOC
        + b"\x00"
        + h(0x99)
        + b"\x00"
        + b"\x01"
        + h(0x01)
        + h(0x02)
        + b"\x01"
        + h(0x03),
    ),
]


@pytest.mark.parametrize(("name", "message", "wire"), VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors(name: str, message: Message, wire: bytes) -> None:
    assert encode_message(message) == wire
    assert decode_message(wire) == message


@pytest.mark.parametrize(("name", "message", "wire"), VECTORS, ids=[v[0] for v in VECTORS])
def test_every_truncation_is_malformed(name: str, message: Message, wire: bytes) -> None:
    for cut in range(len(wire)):
        with pytest.raises(MalformedMessage):
            decode_message(wire[:cut])


def test_trailing_bytes_are_malformed() -> None:
    with pytest.raises(MalformedMessage):
        decode_message(b"\x01" + RID + b"\x06" + b"\x00")


def test_the_specs_notification_type_2_is_not_a_message() -> None:
    # beelay.txt says 2; Beelay's code says 3 and rejects 2.
    with pytest.raises(MalformedMessage):
        decode_message(b"\x02\x05alice" + DOC + b"\x01\x03abc\x01" + h(0x88) + b"\x00")


@pytest.mark.parametrize("request_type", [0, 3])
def test_unserved_requests_carry_their_request_id(request_type: int) -> None:
    with pytest.raises(UnsupportedRequest) as info:
        decode_message(b"\x00" + RID + bytes([request_type]) + b"\x00" * 40)
    assert info.value.request_id == RID


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00" + RID + b"\x07" + DOC,  # unknown request type
        b"\x01" + RID + b"\x07",  # unknown response type
        b"\x01" + RID + b"\x05\x80\x00",  # overlong count
        b"\x01" + RID + b"\x05\x05",  # 5 symbols announced, none there
        b"\x01" + RID + b"\x05\x01" + bytes(56) + b"\x80\x00",  # overlong signed count
        b"\x01" + RID + b"\x05\x01" + bytes(56) + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x00",
        b"\x01" + RID + b"\x02\x02",  # unknown found tag
        b"\x01" + RID + b"\x00\x02\xff\xfe",  # error text not UTF-8
        b"\x03\x00" + DOC + b"\x02",  # unknown blob ref tag
        b"\x03\x00" + DOC + b"\x01\x00\x02",  # unknown tree part tag
        b"\x03\x00" + DOC + b"\x01\x00\x00\x02" + h(1) + h(2) + b"\x00",  # option tag 2
        b"\x01" + RID + b"\x05\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02",  # uleb over 64 bits
        b"",
    ],
)
def test_malformed(wire: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode_message(wire)


def test_counts_over_the_limits() -> None:
    limits = MessageLimits(max_symbols=2)
    three = encode_message(
        Response(
            RID, SnapshotSymbolsResponse(tuple(CodedSymbol(bytes(48), 0, 0) for _ in range(3)))
        )
    )
    with pytest.raises(LimitExceeded):
        decode_message(three, limits)
    with pytest.raises(LimitExceeded):
        decode_message(three, MessageLimits(max_message_bytes=100))
    with pytest.raises(LimitExceeded):
        decode_message(b"\x01" + RID + b"\x00\xff\x7f" + b"x" * 16383, MessageLimits())


# -- fuzzing and round trips ------------------------------------------------------------

hashes = st.binary(min_size=32, max_size=32)
ids = st.binary(min_size=16, max_size=16)
symbols = st.builds(
    CodedSymbol,
    st.binary(min_size=48, max_size=48),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1),
)
blob_meta = st.builds(BlobMeta, hashes, st.integers(0, 2**64 - 1))
summaries = st.builds(
    SedimentreeSummary,
    st.lists(st.builds(StratumMeta, st.none() | hashes, hashes, blob_meta), max_size=3).map(tuple),
    st.lists(
        st.builds(LooseCommit, hashes, st.lists(hashes, max_size=3).map(tuple), blob_meta),
        max_size=3,
    ).map(tuple),
)
upload_items = st.builds(
    UploadItem,
    st.builds(BlobRef, hash=hashes) | st.builds(BlobRef, data=st.binary(max_size=40)),
    st.builds(StratumPart, st.none() | hashes, hashes, st.lists(hashes, max_size=3).map(tuple))
    | st.builds(CommitPart, hashes, st.lists(hashes, max_size=3).map(tuple)),
)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Request, ids, st.builds(CreateSnapshotRequest, ids)),
    st.builds(Request, ids, st.builds(SnapshotSymbolsRequest, ids)),
    st.builds(Request, ids, st.builds(FetchSedimentreeRequest, ids)),
    st.builds(Request, ids, st.builds(ListenRequest, ids)),
    st.builds(
        Request,
        ids,
        st.builds(
            FetchBlobPartRequest, hashes, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)
        ),
    ),
    st.builds(Response, ids, st.builds(FetchBlobPartResponse, st.binary(max_size=50))),
    st.builds(
        Response,
        ids,
        st.builds(CreateSnapshotResponse, ids, st.lists(symbols, max_size=4).map(tuple)),
    ),
    st.builds(
        Response, ids, st.builds(SnapshotSymbolsResponse, st.lists(symbols, max_size=4).map(tuple))
    ),
    st.builds(Response, ids, st.builds(FetchSedimentreeResponse, st.none() | summaries)),
    st.builds(Response, ids, st.builds(FetchSedimentreeResponse, summaries, summaries)),
    st.builds(Response, ids, st.just(ListenResponse())),
    st.builds(Response, ids, st.builds(ErrorResponse, st.text(max_size=30))),
    st.builds(Notification, st.text(max_size=20), ids, upload_items),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_round_trip(message: Message) -> None:
    wire = encode_message(message)
    assert decode_message(wire) == message


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        decode_message(data)


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_mutated_messages_raise_only_protocol_errors(message: Message, data: st.DataObject) -> None:
    wire = bytearray(encode_message(message))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    try:
        decoded = decode_message(bytes(wire))
    except RemoteProtocolError:
        return
    assert encode_message(decoded) == bytes(wire)
