from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sdk.sds.bloom import (
    COMPACT,
    WAKU,
    BloomFilter,
    BloomProfile,
    RollingBloomFilter,
    _nim_string_hash,
    contains,
    hash_n,
)


def _vectors(vectors_dir: Path) -> list[dict[str, object]]:
    return json.loads((vectors_dir / "sds-bloom-hashn.json").read_text())["vectors"]


def test_every_hash_n_vector(vectors_dir: Path) -> None:
    vectors = _vectors(vectors_dir)
    assert len(vectors) >= 70
    for v in vectors:
        item, n, m = v["input"], v["n"], v["maxValue"]
        expected = v["expected"]
        assert isinstance(item, str) and isinstance(n, int) and isinstance(m, int)
        assert isinstance(expected, dict)
        assert abs(_nim_string_hash(item)) % m == expected["hashA"], v
        assert abs(_nim_string_hash(item + " b")) % m == expected["hashB"], v
        assert hash_n(item, n, m) == expected["hashC"], v


def test_waku_profile_is_the_reference_default() -> None:
    assert (WAKU.capacity, WAKU.error_rate) == (10_000, 0.001)
    assert WAKU.k == 10
    assert WAKU.bits_per_element == 15
    assert WAKU.total_bits == 150_000
    # 1 + floor(150000 / 64) = 2344 words of 8 bytes, as @waku/sds allocates.
    assert WAKU.size_bytes == 2344 * 8 == 18_752


def test_compact_profile_size() -> None:
    assert COMPACT.k == 7
    assert COMPACT.size_bytes == 328
    assert COMPACT.size_bytes < 0.02 * WAKU.size_bytes


def test_acknowledgement_threshold_follows_error_rate() -> None:
    assert WAKU.acknowledgement_threshold() == 2  # 0.001^2 = 1e-6
    assert COMPACT.acknowledgement_threshold() == 3  # 0.01^3 = 1e-6
    assert WAKU.acknowledgement_threshold(1e-9) == 3
    p = BloomProfile("loose", capacity=100, error_rate=0.1)
    assert p.acknowledgement_threshold() == math.ceil(6)


def test_bit_layout_is_big_endian_64_bit_words() -> None:
    # Position p is bit p%64 of word p//64, and words are big-endian: the
    # lowest bit of word 0 is the lowest bit of byte 7.
    profile = BloomProfile("t", capacity=10, error_rate=0.5)
    f = BloomFilter(profile)
    pos = hash_n("x", 0, profile.total_bits)
    f.insert("x")
    word, bit = divmod(pos, 64)
    byte_index = word * 8 + 7 - bit // 8
    assert f.data[byte_index] & (1 << (bit % 8))
    assert "x" in f


def test_filter_roundtrip_and_membership() -> None:
    f = BloomFilter(WAKU)
    ids = [f"{i:064x}" for i in range(500)]
    for mid in ids:
        f.insert(mid)
    g = BloomFilter(WAKU, f.to_bytes())
    assert all(mid in g for mid in ids)
    false_positives = sum(f"{i:064x}" in g for i in range(10_000, 20_000))
    assert false_positives < 10  # 500 of 10,000 capacity: rate far below 0.1 %


def test_wrong_size_bytes_rejected() -> None:
    with pytest.raises(ValueError, match="18752 bytes"):
        BloomFilter(WAKU, b"\x00" * 10)


def test_contains_on_raw_bytes() -> None:
    f = BloomFilter(COMPACT)
    f.insert("abc")
    assert contains(f.to_bytes(), COMPACT.positions("abc"))
    assert not contains(bytes(COMPACT.size_bytes), COMPACT.positions("abc"))


def test_rolling_filter_keeps_recent_half_after_rollover() -> None:
    profile = BloomProfile("small", capacity=8, error_rate=0.01)
    r = RollingBloomFilter(profile)
    ids = [f"id-{i}" for i in range(9)]
    for mid in ids:
        r.insert(mid)
    assert r.rollovers == 1
    # After the rollover the filter holds the 4 most recent of the first 8, plus id-8.
    assert r.count == 5
    assert all(mid in r for mid in ids[4:])
    assert r.recent()[-1] == "id-8"


def test_rolling_filter_never_exceeds_capacity() -> None:
    r = RollingBloomFilter(COMPACT)
    for i in range(2_000):
        r.insert(f"{i}")
        assert r.count <= COMPACT.capacity


@pytest.mark.parametrize("profile", [COMPACT, WAKU, BloomProfile("t", capacity=3, error_rate=0.3)])
def test_positions_are_hash_n_in_the_wire_layout(profile: BloomProfile) -> None:
    # positions() takes small filters' pairs from a table and computes large ones:
    # both must be the documented hash_n positions, ASCII or not.
    m = profile.total_bits
    for item in [f"{i:064x}" for i in range(200)] + ["é", "alicé-1", ""]:
        expected = tuple(
            ((p >> 6) * 8 + 7 - ((p & 63) >> 3), 1 << (p & 7))
            for p in (hash_n(item, n, m) for n in range(profile.k))
        )
        assert profile.positions(item) == expected, item
