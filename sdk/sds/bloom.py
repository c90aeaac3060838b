"""Bloom filters of received message ids, bit-compatible with ``@waku/sds``.

Layout and hashing follow the reference JavaScript implementation exactly, so a
filter serialized here is byte-for-byte what ``@waku/sds`` sends and vice versa:

* sizing: ``bits_per_element = ceil(-ln(error_rate) / ln(2)^2)``,
  ``k = round(ln(2) * bits_per_element)``, ``m = capacity * bits_per_element``
  bits stored in ``1 + m // 64`` 64-bit words (one spare word, as the reference);
* hashing: Kirsch-Mitzenmacher double hashing over Nim's string hash, which is
  MurmurHash3-x86-32 (seed 0) of the UTF-8 bytes read as a signed 32-bit integer:
  ``a = |h(id)| % m``, ``b = |h(id + " b")| % m``, ``pos_i = |a + i*b| % m``
  (checked against ``shared/vectors/sds-bloom-hashn.json``);
* bit ``p`` is bit ``p % 64`` of word ``p // 64``; words are big-endian on the wire.

Both ends of a channel must use the same :class:`BloomProfile`: a filter of the
wrong size is ignored (and counted) by the receiver.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import mmh3

#: (byte index, bit mask) pairs locating an id's k bits in the serialized filter.
Positions = tuple[tuple[int, int], ...]


def _nim_string_hash(item: str) -> int:
    """Nim's ``hash(string)``: MurmurHash3-x86-32, seed 0, over the UTF-8 bytes, signed.

    This is what the shared vectors (and the Nim implementation) compute. The
    reference's JavaScript build feeds UTF-16 code units instead, which agrees
    for every ASCII id (hex digests, UUIDs) and differs only for non-ASCII ids.
    """
    return int(mmh3.hash(item.encode(), 0, signed=True))


def hash_n(item: str, n: int, max_value: int) -> int:
    """The ``n``-th bit position of ``item`` in a filter of ``max_value`` bits."""
    a = abs(_nim_string_hash(item)) % max_value
    b = abs(_nim_string_hash(item + " b")) % max_value
    return abs(a + n * b) % max_value


@dataclass(frozen=True, slots=True)
class BloomProfile:
    """Filter parameters shared by every participant of a channel."""

    name: str
    #: Ids the filter holds before it rolls over.
    capacity: int
    #: Target false-positive rate at capacity.
    error_rate: float
    bits_per_element: int = field(init=False)
    k: int = field(init=False)
    total_bits: int = field(init=False)
    size_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        if self.capacity < 1 or not 0.0 < self.error_rate < 1.0:
            raise ValueError("capacity must be >= 1 and error_rate in (0, 1)")
        bpe = math.ceil(-math.log(self.error_rate) / math.log(2) ** 2)
        k = round(math.log(2) * bpe)
        bits = self.capacity * bpe
        object.__setattr__(self, "bits_per_element", bpe)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "total_bits", bits)
        object.__setattr__(self, "size_bytes", (1 + bits // 64) * 8)

    def acknowledgement_threshold(self, target_false_ack: float = 1e-6) -> int:
        """Distinct peers whose *full* filters must contain an id for it to count as acknowledged.

        A hit in a filter at capacity is false with probability ``error_rate``;
        ``t`` hits from distinct peers with ``error_rate ** t``. This is the
        worst case of the rule the outgoing buffer applies (which uses each
        filter's actual fill, see ``sdk/sds/outgoing.py``): 2 for ``waku`` (the
        reference's default threshold), 3 for ``compact``.
        """
        return max(1, math.ceil(math.log(target_false_ack) / math.log(self.error_rate)))

    def false_positive_rate(self, data: bytes | bytearray) -> float:
        """Probability that an id never inserted hits in this serialized filter: ``fill ** k``."""
        fill = int.from_bytes(data, "big").bit_count() / self.total_bits
        return float(min(1.0, fill) ** self.k)

    def is_saturated(self, data: bytes | bytearray) -> bool:
        """Whether a peer's serialized filter holds so many ids that its hits mean little.

        A filter that is never rolled over (``@waku/sds`` keeps one for the life
        of a channel) keeps filling past ``capacity``, and its false-positive
        rate ``fill ** k`` climbs towards 1: counted as acknowledgements, its
        hits would stop resends of messages nobody has. A filter is saturated
        when that rate, estimated from the fill of its first 256 bytes, exceeds
        twice ``error_rate``. Bit positions are uniform, so the prefix is a fair
        sample, and it costs about a microsecond per received message. A filter
        at capacity sits at or below ``error_rate``; the factor 2 puts it more
        than four standard deviations of sampling noise below the cut (for
        ``waku``: fill 0.487 at capacity against 0.537).
        """
        sample = data[:256]
        bits = min(8 * len(sample), self.total_bits)  # a small filter's spare word is no sample
        if not bits:
            return False
        fill = int.from_bytes(sample, "big").bit_count() / bits
        return bool(fill**self.k > 2 * self.error_rate)

    def positions(self, item: str) -> Positions:
        """Where ``item``'s bits live in the serialized filter."""
        m = self.total_bits
        data = item.encode()
        # abs(a + i*b) % m with a, b >= 0 is (a + i*b) % m.
        a = abs(mmh3.hash(data, 0, signed=True)) % m
        b = abs(mmh3.hash(data + b" b", 0, signed=True)) % m
        table = _bit_table(self)
        if table is not None:
            return tuple([table[(a + i * b) % m] for i in range(self.k)])
        out = []
        p = a
        for _ in range(self.k):
            out.append(((p >> 6) * 8 + 7 - ((p & 63) >> 3), 1 << (p & 7)))
            p = (p + b) % m
        return tuple(out)


#: Filters of at most this many bits have every bit's (byte index, mask) pair in a table
#: (hashing an id is then two lookups per bit); larger ones compute them per id.
_TABLE_BITS = 1 << 15
_bit_tables: dict[int, list[tuple[int, int]] | None] = {}


def _bit_table(profile: BloomProfile) -> list[tuple[int, int]] | None:
    m = profile.total_bits
    table = _bit_tables.get(m, False)
    if table is False:
        table = _bit_tables[m] = (
            [((p >> 6) * 8 + 7 - ((p & 63) >> 3), 1 << (p & 7)) for p in range(m)]
            if m <= _TABLE_BITS
            else None
        )
    return table  # type: ignore[return-value]  # False was replaced


#: Bit-for-bit the ``@waku/sds`` default filter: 10,000 ids at 0.1 %, k=10, 18,752 bytes.
WAKU = BloomProfile("waku", capacity=10_000, error_rate=0.001)
#: A low-bandwidth filter (328 bytes): the 256 most recent ids at 1 %, k=7.
#: Recent ids are what acknowledgement needs; older messages are acknowledged
#: by causal history or resent.
COMPACT = BloomProfile("compact", capacity=256, error_rate=0.01)

PROFILES: dict[str, BloomProfile] = {p.name: p for p in (WAKU, COMPACT)}


def contains(data: bytes | bytearray, positions: Positions) -> bool:
    """Whether a serialized filter has every bit of ``positions`` set."""
    for index, mask in positions:
        if not data[index] & mask:
            return False
    return True


class BloomFilter:
    """One filter of a :class:`BloomProfile`, kept in its wire layout."""

    __slots__ = ("count", "data", "profile")

    def __init__(self, profile: BloomProfile, data: bytes | None = None) -> None:
        self.profile = profile
        if data is not None and len(data) != profile.size_bytes:
            raise ValueError(
                f"{profile.name} filter must be {profile.size_bytes} bytes, got {len(data)}"
            )
        self.data = bytearray(data) if data is not None else bytearray(profile.size_bytes)
        self.count = 0

    def insert(self, item: str, positions: Positions | None = None) -> None:
        """Add ``item`` (pass its precomputed ``positions`` to skip hashing)."""
        data = self.data
        for index, mask in positions or self.profile.positions(item):
            data[index] |= mask
        self.count += 1

    def __contains__(self, item: str) -> bool:
        return contains(self.data, self.profile.positions(item))

    def to_bytes(self) -> bytes:
        """The wire form."""
        return bytes(self.data)


class RollingBloomFilter:
    """The per-channel filter of received ids, rolled over at capacity (specs/sds.md,
    "Participant state": the filter SHOULD be rolled over once it reaches capacity).

    A plain reset would forget every id at once, and messages received just
    before it could no longer be acknowledged by filter. Instead the new filter
    is seeded with the most recent ``capacity // 2`` ids, so the wire filter
    always covers at least the last ``capacity // 2`` received ids and never
    exceeds its designed false-positive rate. Re-seeding costs ``capacity // 2``
    inserts every ``capacity // 2`` inserts: constant amortized time.
    """

    __slots__ = ("_filter", "_recent", "profile", "rollovers")

    def __init__(self, profile: BloomProfile, recent: Iterable[str] = ()) -> None:
        self.profile = profile
        self._filter = BloomFilter(profile)
        # With each id its bit positions, so a rollover re-inserts without hashing.
        self._recent: deque[tuple[str, Positions]] = deque(maxlen=max(1, profile.capacity // 2))
        self.rollovers = 0
        for item in recent:
            self.insert(item)

    def insert(self, item: str, positions: Positions | None = None) -> None:
        """Add a received id."""
        if self._filter.count >= self.profile.capacity:
            self._roll_over()
        if positions is None:
            positions = self.profile.positions(item)
        self._filter.insert(item, positions)
        self._recent.append((item, positions))

    def _roll_over(self) -> None:
        self.rollovers += 1
        fresh = BloomFilter(self.profile)
        for item, positions in self._recent:
            fresh.insert(item, positions)
        self._filter = fresh

    def __contains__(self, item: str) -> bool:
        return item in self._filter

    def has_positions(self, positions: Positions) -> bool:
        """``item in self`` for the item whose :meth:`BloomProfile.positions` these are."""
        return contains(self._filter.data, positions)

    @property
    def count(self) -> int:
        """Ids in the current generation."""
        return self._filter.count

    @property
    def carry_over(self) -> int:
        """How many recent ids a rollover carries over (what persistence must keep)."""
        return self._recent.maxlen or 1

    def recent(self) -> Sequence[str]:
        """The ids a rollover would carry over (for persistence)."""
        return tuple([item for item, _ in self._recent])

    def to_bytes(self) -> bytes:
        """The wire form of the current generation."""
        return self._filter.to_bytes()
