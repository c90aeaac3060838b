"""LZFoo (data byte 9): the encoding as its README describes it, written by hand; the
compressor against the decompressor; a window shared across payloads; malformed input
raising CompressionViolation only; and two endpoints that negotiated a window."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    Channel,
    CompressedPayload,
    CompressionViolation,
    EndpointConfig,
    MemoryLogStore,
    SwitchRequest,
    encode_data,
    encode_frame,
)
from sdk.sync.bamboo_p2p.lzfoo import (
    Compressor,
    Decompressor,
    encode_copy,
    encode_length,
    encode_literal,
)
from sdk.sync.bamboo_p2p.pair import EndpointPair

KEY = KeyPair.from_private_key(bytes(range(32)))
LOG = (KEY.public_key, 0)


def test_the_readme_example_copy_repeats_itself() -> None:
    # "abc", then "copy 5 bytes from 2 bytes back": abcbcbcb.
    data = bytes([0x03]) + b"abc" + bytes([0x80 | 5, 2])
    assert Decompressor(64).decompress(data, 8) == b"abcbcbcb"


def test_lengths_by_hand() -> None:
    assert encode_length(0, 0) == b"\x00"
    assert encode_length(0, 119) == bytes([119])
    assert encode_length(0, 120) == bytes([120, 120])  # 120: one more byte
    assert encode_length(0, 255) == bytes([120, 255])
    assert encode_length(0, 256) == bytes([121, 1, 0])  # two bytes, big-endian
    assert encode_length(0x80, 5) == bytes([0x85])
    assert encode_length(0x80, (1 << 64) - 1) == bytes([0x80 | 127]) + b"\xff" * 8
    assert encode_copy(300, 3) == bytes([0x83, 249, 1, 44])  # VarU64 300: 249, 0x012C
    literal = encode_literal(b"x" * 200)
    assert literal[:2] == bytes([120, 200]) and literal[2:] == b"x" * 200
    with pytest.raises(ValueError):
        encode_copy(0, 3)


def test_the_window_is_shared_across_calls_and_raw_data_is_not_in_it() -> None:
    sender, receiver = Compressor(1024), Decompressor(1024)
    first = b"the quick brown fox jumps over the lazy dog " * 4
    packed = sender.compress(first)
    assert receiver.decompress(packed, len(first)) == first
    sender.commit(first)
    second = b"the quick brown fox jumps over the lazy dog!"
    packed = sender.compress(second)
    assert len(packed) < 12  # one copy from the first payload and a literal
    assert receiver.decompress(packed, len(second)) == second
    # A copy past the window, past the known bytes, or the wrong length: violations.
    for data, length in (
        (encode_copy(1025, 4), 4),
        (encode_literal(b"ab") + encode_copy(2000, 1), 3),
        (encode_literal(b"abc"), 4),
        (encode_literal(b"abc"), 2),
        (bytes([0x05, 1]), 5),
        (bytes([0x85, 0xF8]), 5),
        (bytes([127]) + b"\xff" * 8, 10),
    ):
        with pytest.raises(CompressionViolation):
            Decompressor(1024).decompress(data, length)


@given(st.lists(st.binary(max_size=300), max_size=6), st.integers(1, 512))
@settings(max_examples=200, deadline=None)
def test_compress_then_decompress_gives_the_data_back(chunks: list[bytes], window: int) -> None:
    sender, receiver = Compressor(window), Decompressor(window)
    rng = random.Random(len(chunks))
    for chunk in chunks:
        chunk = chunk + chunk[: rng.randint(0, len(chunk))] * 3  # something to find
        packed = sender.compress(chunk)
        assert receiver.decompress(packed, len(chunk)) == chunk
        sender.commit(chunk)


@given(st.binary(max_size=200), st.integers(0, 300))
@settings(max_examples=500, deadline=None)
def test_garbage_raises_only_compression_violation(data: bytes, length: int) -> None:
    decompressor = Decompressor(128)
    try:
        out = decompressor.decompress(data, length)
    except CompressionViolation:
        return
    assert len(out) == length


def compressible_log(n: int) -> MemoryLogStore:
    store = MemoryLogStore()
    for i in range(n):
        store.append(KEY, 0, b'{"title": "todo item", "done": false, "n": %d}' % i * 20)
    return store


def test_endpoints_with_a_window_send_compressed_payloads() -> None:
    sizes = {}
    for window in (0, 64 * 1024):
        config = EndpointConfig(compression_window=window)
        server, phone = compressible_log(30), MemoryLogStore()
        pair = EndpointPair.create(server, phone, config, config)
        pair.exchange()
        pair.b.propose(LOG, 1, end=30)
        pair.run()
        assert pair.error is None
        assert phone.payload_sequence_numbers(LOG) == list(range(1, 31))
        for seq in range(1, 31):
            assert phone.payload(LOG, seq) == server.payload(LOG, seq)
        sizes[window] = pair.a.stats.data_bytes_sent
    assert sizes[64 * 1024] < sizes[0] / 4
    # One side without a window: nothing is compressed (the negotiated window is 0).
    server, phone = compressible_log(5), MemoryLogStore()
    pair = EndpointPair.create(server, phone, EndpointConfig(compression_window=4096), None)
    pair.exchange()
    pair.b.propose(LOG, 1, end=5)
    pair.run()
    assert pair.error is None and pair.a.params is not None
    assert pair.a.params.compression_window == 0


def test_a_copy_past_the_window_drops_the_connection() -> None:
    config = EndpointConfig(compression_window=16)
    source = compressible_log(1)
    entry = source.entry(LOG, 1)
    assert entry is not None
    pair = EndpointPair.create(MemoryLogStore(), MemoryLogStore(), config, config)
    pair.exchange()
    request = pair.b.propose(LOG, 1, end=1)
    pair.run()
    from sdk.sync.bamboo_p2p import Metadata

    meta = Metadata(0, None, entry.payload_size, entry.payload_hash, entry.signature)
    bad = CompressedPayload(8, encode_literal(b"abcd") + encode_copy(17, 4))
    body = b"".join(encode_data(m) for m in (SwitchRequest(request), meta, bad))
    with pytest.raises(CompressionViolation):
        pair.b.receive_data(encode_frame(Channel.DATA, body))
    assert isinstance(pair.b.error, CompressionViolation)
