"""The one LEB128 varint codec (sdk/sds/varint.py) every wire uses."""

from __future__ import annotations

import pytest

from sdk.sds.varint import (
    UVARINTS,
    VarintError,
    encode_uvarint,
    read_canonical_uvarint,
    read_uvarint,
    write_uvarint,
)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (32_767, b"\xff\xff\x01"),
        (32_768, b"\x80\x80\x02"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
    ],
)
def test_round_trip(value: int, encoded: bytes) -> None:
    assert encode_uvarint(value) == encoded
    out = bytearray(b"x")
    write_uvarint(out, value)
    assert bytes(out) == b"x" + encoded
    assert read_uvarint(b"x" + encoded + b"y", 1) == (value, 1 + len(encoded))


def test_table_matches_the_loop() -> None:
    for n in (0, 1, 127, 128, 16_383, 16_384, 32_767):
        out = bytearray()
        write_uvarint(out, n)
        assert UVARINTS[n] == bytes(out)


def test_truncated_and_too_long() -> None:
    with pytest.raises(VarintError) as info:
        read_uvarint(b"\x80\x80", 0)
    assert info.value.truncated
    with pytest.raises(VarintError) as info:
        read_uvarint(b"", 0)
    assert info.value.truncated
    with pytest.raises(VarintError) as info:
        read_uvarint(b"\x80" * 5 + b"\x01", 0, max_bytes=5)
    assert not info.value.truncated
    assert read_uvarint(b"\x80" * 4 + b"\x01", 0, max_bytes=5) == (1 << 28, 5)
    with pytest.raises(VarintError):
        read_uvarint(b"\xff" * 10 + b"\x01", 0)


def test_the_canonical_reader_takes_one_encoding_per_value() -> None:
    assert read_canonical_uvarint(b"\x00", 0) == (0, 1)
    assert read_canonical_uvarint(b"\xff" * 9 + b"\x01", 0) == (2**64 - 1, 10)
    for data, reason in [
        (b"\x80\x00", "not shortest"),
        (b"\x81\x80\x00", "not shortest"),
        (b"\xff" * 9 + b"\x02", "too long"),
        (b"\x80" * 10 + b"\x01", "too long"),
        (b"\x80", "truncated"),
    ]:
        with pytest.raises(VarintError) as info:
            read_canonical_uvarint(data, 0)
        assert info.value.reason == reason
    assert read_uvarint(b"\x80\x00", 0) == (0, 2)  # the plain reader takes either form
