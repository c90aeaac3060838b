"""The Entry-frame fast path of ``messages.decode`` and of the session's receive.

``messages.entry_parts`` reads ``[2, session_id, entry, operation]`` from its CBOR
heads; everything else goes to the general decoder (``messages._decode``). For
valid and mutated frames, ``decode`` must answer as the general decoder does:
the same message or the same error text.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.documents import cbor
from sdk.sync.errors import MalformedMessage, UnknownSession
from sdk.sync.events import PeerMessageRejected
from sdk.sync.messages import (
    Announce,
    EntryMessage,
    SyncDone,
    _decode,
    decode,
    encode,
    entry_parts,
)
from tests.sync.helpers import TODO, history, make_store, pair

HISTORY = history(seed=3, operations=12)


def outcome(decoder, data: bytes) -> tuple[object, ...]:
    try:
        return ("ok", repr(decoder(data)))
    except Exception as exc:
        return ("error", type(exc), str(exc))


def same_as_general(data: bytes) -> None:
    expected = outcome(lambda d: _decode(d, None), data)
    assert outcome(decode, data) == expected
    parts = entry_parts(data)
    if parts is not None:
        assert expected == ("ok", repr(EntryMessage(*parts)))
        assert all(type(p) is bytes for p in parts[1:])


session_ids = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1))
blobs = st.one_of(
    st.binary(max_size=40),
    st.binary(min_size=200, max_size=300),
    st.sampled_from([b"x" * 23, b"x" * 24, b"x" * 255, b"x" * 256, b"x" * 65535, b"x" * 65536]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(session_ids, blobs, blobs)
def test_entry_frames_decode_to_their_message(sid: int, entry: bytes, operation: bytes) -> None:
    data = encode(EntryMessage(sid, entry, operation))
    assert decode(data) == EntryMessage(sid, entry, operation)
    same_as_general(data)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    entry, operation = draw(st.sampled_from(HISTORY))
    sid = draw(session_ids)
    out = bytearray(encode(EntryMessage(sid, entry, operation)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        # Mostly near the heads, where the fast path reads.
        pos = draw(st.one_of(st.integers(0, 12), st.integers(0, max(0, len(out) - 1))))
        pos = min(pos, max(0, len(out) - 1))
        if kind == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and out:
            out[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            out.insert(pos, draw(st.integers(0, 255)))
        elif kind == "delete" and out:
            del out[pos]
        elif kind == "truncate":
            del out[pos:]
    return bytes(out)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_frames())
def test_mutated_entry_frames_decode_as_the_general_decoder_does(data: bytes) -> None:
    same_as_general(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=12), st.binary(max_size=40))
def test_frames_starting_like_an_entry_decode_as_the_general_decoder_does(
    head: bytes, rest: bytes
) -> None:
    same_as_general(b"\x84\x02" + head + rest)


ENTRY, OPERATION = b"e" * 30, b"o" * 30
BODY = b"\x58\x1e" + ENTRY + b"\x58\x1e" + OPERATION


@pytest.mark.parametrize(
    ("data", "fast"),
    [
        # Every branch taken: session ids in the head, with 1 or 2 bytes; strings
        # with their length in the head or in 1, 2 or 4 bytes.
        (b"\x84\x02\x05" + BODY, True),
        (b"\x84\x02\x18\x18" + BODY, True),
        (b"\x84\x02\x19\x01\x00" + BODY, True),
        (b"\x84\x02\x00\x43abc\x40", True),
        (b"\x84\x02\x00\x43abc\x59\x01\x00" + b"o" * 256, True),
        (b"\x84\x02\x00\x43abc\x5a\x00\x01\x00\x00" + b"o" * 65536, True),
        # Valid, left to the general decoder: larger session ids or entries.
        (encode(EntryMessage(2**32, ENTRY, OPERATION)), False),
        (encode(EntryMessage(1, b"e" * 256, OPERATION)), False),
        (bytearray(b"\x84\x02\x05" + BODY), False),
        # Not canonical, cut short, too long or not an Entry: the general decoder's error.
        (b"\x84\x02\x18\x05" + BODY, False),
        (b"\x84\x02\x19\x00\x05" + BODY, False),
        (b"\x84\x02\x00\x58\x03abc\x40", False),
        (b"\x84\x02\x00\x43abc\x58\x03ooo", False),
        (b"\x84\x02\x00\x43abc\x59\x00\x03ooo", False),
        (b"\x84\x02\x00\x43abc\x5a\x00\x00\x00\x03ooo", False),
        (b"\x84\x02\x00\x43abc\x5b" + b"\x00" * 7 + b"\x03ooo", False),
        (b"\x84\x02\x00\x43abc\x43oo", False),
        (b"\x84\x02\x00\x43abc\x42ooo", False),
        (b"\x84\x02\x00\x43abc", False),
        (b"\x84\x02\x00\x43ab", False),
        (b"\x84\x02\x00", False),
        (b"\x84\x02", False),
        (b"\x84\x02\x20" + BODY, False),
        (b"\x84\x02\xf5" + BODY, False),
        (b"\x84\x02\x00\x63abc\x40", False),
        (b"\x84\x02\x00\x43abc\xf6", False),
        (b"\x85\x02\x00\x43abc\x40\x40", False),
        (b"\x84\x03\x00\x43abc\x40", False),
        (b"\x84\x18\x02\x00\x43abc\x40", False),
        (encode(SyncDone(3, True)), False),
        (encode(Announce(1, ())), False),
    ],
)
def test_fast_path_branches(data: bytes, fast: bool) -> None:
    assert (entry_parts(data) is not None) is fast
    same_as_general(data)
    if not fast and isinstance(data, bytes) and data[:2] == b"\x84\x02":
        try:
            _decode(data, None)
        except MalformedMessage:
            with pytest.raises(MalformedMessage):
                decode(data)


def open_session():
    a = make_store(HISTORY)
    b = make_store([])
    wire = pair(a, b)
    sid = wire.b.request([TODO], 0)
    wire.collect()
    return wire, sid


def test_entry_frames_in_either_form_are_received_and_counted_alike() -> None:
    """A frame the fast path takes and one it leaves (a bytearray) end up the same."""
    results = []
    for as_bytearray in (False, True):
        wire, sid = open_session()
        b = wire.b
        before = b.payload_received, b.overhead_received
        frames = [encode(EntryMessage(sid, e, o)) for e, o in HISTORY]
        if as_bytearray:
            frames = [bytearray(f) for f in frames]  # type: ignore[misc]
        b.receive_many(frames, 0)
        wire.collect()
        results.append(
            (
                b.payload_received - before[0],
                b.overhead_received - before[1],
                b.store.entry_count(),
                b.sessions()[sid].entries_received,
            )
        )
    payload = sum(len(e) + len(o) for e, o in HISTORY)
    framed = sum(len(encode(EntryMessage(0, e, o))) for e, o in HISTORY)
    assert results[0] == results[1] == (payload, framed - payload, len(HISTORY), len(HISTORY))


@pytest.mark.parametrize("as_bytearray", [False, True])
def test_an_entry_frame_for_an_unknown_session_is_rejected(as_bytearray: bool) -> None:
    wire, sid = open_session()
    entry, operation = HISTORY[0]
    data = encode(EntryMessage(sid + 300, entry, operation))
    wire.b.receive(bytearray(data) if as_bytearray else data, 0)
    wire.collect()
    rejected = [e for e in wire.events_b if isinstance(e, PeerMessageRejected)]
    assert len(rejected) == 1 and isinstance(rejected[0].error, UnknownSession)
    assert wire.b.store.entry_count() == 0


def test_the_session_id_of_a_fast_frame_is_read_in_full() -> None:
    wire, sid = open_session()
    entry, operation = HISTORY[0]
    # Session id sid + 256 in two bytes: not sid, so rejected.
    data = b"\x84\x02\x19" + (sid + 256).to_bytes(2, "big") + cbor.encode(entry)
    data += cbor.encode(operation)
    assert entry_parts(data) == (sid + 256, entry, operation)
    wire.b.receive(data, 0)
    wire.collect()
    assert any(isinstance(e, PeerMessageRejected) for e in wire.events_b)
