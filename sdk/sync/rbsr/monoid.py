"""The lifting monoid of range fingerprints: a key's lift, a range's :class:`Summary`
(count, sum of lifts) and the :func:`fingerprint` sent for it (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

import xxhash

__all__ = ["FINGERPRINT_SIZE", "MASK", "Summary", "fingerprint", "lift"]

#: Lifts add modulo 2**128.
MASK = (1 << 128) - 1
#: Bytes of a fingerprint on the wire.
FINGERPRINT_SIZE = 16


def lift(key: bytes) -> int:
    """The monoid value of one key: XXH3-128 of its bytes as an integer."""
    return xxhash.xxh3_128_intdigest(key)


@dataclass(frozen=True, slots=True)
class Summary:
    """A range's monoid value: how many keys and the sum of their lifts mod 2**128."""

    count: int = 0
    total: int = 0

    def __add__(self, other: Summary) -> Summary:
        return Summary(self.count + other.count, (self.total + other.total) & MASK)

    def __sub__(self, other: Summary) -> Summary:
        return Summary(self.count - other.count, (self.total - other.total) & MASK)


def fingerprint(summary: Summary) -> bytes:
    """The 16 bytes peers compare: XXH3-128 over the count (8 bytes) and the sum (16)."""
    return xxhash.xxh3_128_digest(
        summary.count.to_bytes(8, "big") + summary.total.to_bytes(16, "big")
    )
