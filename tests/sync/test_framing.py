"""FrameDecoder against the byte-at-a-time reading it replaced, on any stream and chunking."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.sync.errors import LimitExceeded, MalformedMessage
from sdk.sync.framing import FrameDecoder, encode_frame


class ReferenceDecoder:
    """The previous FrameDecoder: a bytearray buffer, the prefix read byte by byte."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        frames: list[bytes] = []
        while True:
            size = shift = pos = 0
            while True:
                if pos >= len(self.buffer):
                    if pos > 4:
                        raise MalformedMessage("frame length prefix too long")
                    return frames
                byte = self.buffer[pos]
                pos += 1
                size |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
                if pos >= 5:
                    raise MalformedMessage("frame length prefix too long")
            if size > self.max_frame:
                raise LimitExceeded(f"frame of {size} bytes, limit {self.max_frame}")
            if len(self.buffer) < pos + size:
                return frames
            frames.append(bytes(self.buffer[pos : pos + size]))
            del self.buffer[: pos + size]


def outcome(decoder, chunks: list[bytes]) -> tuple[object, ...]:
    out: list[object] = []
    for chunk in chunks:
        try:
            out.append(decoder.feed(chunk))
        except Exception as exc:
            return ("error", out, type(exc), str(exc))
    held = len(decoder.buffer) if isinstance(decoder, ReferenceDecoder) else decoder.buffered
    return ("ok", out, held)


def chunked(draw: st.DrawFn, stream: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


payloads = st.lists(
    st.one_of(st.binary(max_size=200), st.binary(min_size=16_380, max_size=16_390)), max_size=6
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[int, list[bytes]]:
    stream = b"".join(encode_frame(p) for p in draw(payloads))
    if draw(st.booleans()):
        # Junk, long or cut-off prefixes and lengths over the limit.
        stream += draw(st.one_of(st.binary(max_size=12), st.just(b"\x80" * 6)))
    max_frame = draw(st.sampled_from([1024 * 1024, 16_384, 100]))
    return max_frame, chunked(draw, stream)


@settings(max_examples=500, deadline=None)
@given(streams())
def test_frames_are_those_of_the_byte_at_a_time_reader(case: tuple[int, list[bytes]]) -> None:
    max_frame, chunks = case
    assert outcome(FrameDecoder(max_frame), chunks) == outcome(ReferenceDecoder(max_frame), chunks)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=6), st.sampled_from([1024 * 1024, 200, 0]))
def test_random_bytes_split_as_the_byte_at_a_time_reader_does(chunks, max_frame) -> None:
    assert outcome(FrameDecoder(max_frame), chunks) == outcome(ReferenceDecoder(max_frame), chunks)


@pytest.mark.parametrize(
    "data",
    [
        encode_frame(b"a" * 5),  # 1-byte prefix
        encode_frame(b"a" * 300),  # 2-byte prefix, read inline
        encode_frame(b"a" * 20_000),  # 3-byte prefix, read in the loop
        b"\x80\x00",  # a zero length in two bytes is a zero length
    ],
)
def test_each_prefix_length_in_one_feed_and_byte_by_byte(data: bytes) -> None:
    whole = FrameDecoder().feed(data)
    decoder = FrameDecoder()
    pieces = [decoder.feed(data[i : i + 1]) for i in range(len(data))]
    assert whole == [f for piece in pieces for f in piece] and len(whole) == 1
    assert decoder.buffered == 0


def test_a_bytearray_or_memoryview_is_read_as_bytes() -> None:
    data = encode_frame(b"abc") + encode_frame(b"de")[:1]
    for chunk in (bytearray(data), memoryview(data)):
        decoder = FrameDecoder()
        frames = decoder.feed(chunk)
        assert frames == [b"abc"] and type(frames[0]) is bytes and decoder.buffered == 1
        assert decoder.feed(memoryview(b"de")) == [b"de"]


@pytest.mark.parametrize("max_frame", [100, 300, 20_000])
def test_the_limit_is_a_frames_largest_size(max_frame: int) -> None:
    assert FrameDecoder(max_frame).feed(encode_frame(b"x" * max_frame)) == [b"x" * max_frame]
    over = encode_frame(b"x" * (max_frame + 1))
    prefix = len(over) - max_frame - 1
    with pytest.raises(LimitExceeded):
        FrameDecoder(max_frame).feed(over[:prefix])
