"""The catch-up a channel owes itself from the store: which windows, and when to retry.

Theory of operation
-------------------
A participant that was away (restarted, disconnected, saw a gap) owes itself
the store's messages of a time window: from when it was last known to have
everything to when it noticed. That window is an *obligation*, not an
attempt (``DESIGN.md``, Runtime): :class:`OwedWindows` keeps the union of
every window owed, the channel persists it with the turn that created it (the
``channel`` row's ``owed`` column, :mod:`sdk.runtime.persistence`), and a
window is settled only once the store answered for all of it, every page. A
failed attempt leaves it owed; :class:`Backoff` says when to try again
(exponential, jittered, bounded), and a transport reconnect, a store query
that succeeds again or a restart try at once.

A crash in the middle of a window resumes the whole window: what was already
delivered is in the persisted local log, so the core drops it as a duplicate.

The runtime owns this state (the core only *asks* for windows, with
:class:`~sdk.sds.RetrieveRange`); :class:`~sdk.runtime.ReliableChannel` is its
one user.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

#: Most disjoint windows kept per channel; beyond it the two closest merge (asking
#: the store for a little more than owed costs only duplicates, which are dropped).
MAX_WINDOWS = 64


class OwedWindows:
    """A union of disjoint half-open windows ``[start, end)`` in epoch ms, oldest first."""

    __slots__ = ("_windows",)

    def __init__(self, windows: Iterable[tuple[int, int]] = ()) -> None:
        self._windows: list[tuple[int, int]] = []
        for start, end in windows:
            self.add(start, end)

    def __bool__(self) -> bool:
        return bool(self._windows)

    def __len__(self) -> int:
        return len(self._windows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwedWindows) and self._windows == other._windows

    def __repr__(self) -> str:
        return f"OwedWindows({self._windows!r})"

    @property
    def windows(self) -> tuple[tuple[int, int], ...]:
        """The owed windows, oldest first."""
        return tuple(self._windows)

    def first(self) -> tuple[int, int] | None:
        """The oldest owed window (fetched first), or ``None``."""
        return self._windows[0] if self._windows else None

    def span(self) -> tuple[int, int] | None:
        """From the start of the oldest owed window to the end of the newest, or ``None``."""
        if not self._windows:
            return None
        return self._windows[0][0], self._windows[-1][1]

    def add(self, start: int, end: int) -> bool:
        """Owe ``[start, end)`` too (merged with what it touches); whether anything changed."""
        if end <= start:
            return False
        merged: list[tuple[int, int]] = []
        placed = False
        for s, e in self._windows:
            if e < start:
                merged.append((s, e))
            elif end < s:
                if not placed:
                    merged.append((start, end))
                    placed = True
                merged.append((s, e))
            else:
                start, end = min(s, start), max(e, end)
        if not placed:
            merged.append((start, end))
            merged.sort()
        while len(merged) > MAX_WINDOWS:
            k = min(range(len(merged) - 1), key=lambda i: merged[i + 1][0] - merged[i][1])
            merged[k : k + 2] = [(merged[k][0], merged[k + 1][1])]
        if merged == self._windows:
            return False
        self._windows = merged
        return True

    def settle(self, start: int, end: int) -> bool:
        """The store answered for ``[start, end)``: owe none of it; whether anything changed."""
        if end <= start:
            return False
        kept: list[tuple[int, int]] = []
        for s, e in self._windows:
            if e <= start or end <= s:
                kept.append((s, e))
                continue
            if s < start:
                kept.append((s, start))
            if end < e:
                kept.append((end, e))
        if kept == self._windows:
            return False
        self._windows = kept
        return True


class Backoff:
    """Delays between attempts: ``minimum`` doubling up to ``maximum`` (seconds), each
    drawn in ``[d/2, d]`` so that participants that failed together do not retry together."""

    __slots__ = ("_rng", "attempts", "maximum", "minimum")

    def __init__(self, minimum: float, maximum: float, rng: random.Random) -> None:
        self.minimum = minimum
        self.maximum = max(minimum, maximum)
        self._rng = rng
        #: Failed attempts since the last success (or reset).
        self.attempts = 0

    def reset(self) -> None:
        """An attempt succeeded (or something says the next one should go out at once)."""
        self.attempts = 0

    def next_delay_ms(self) -> int:
        """Count a failed attempt; how long to wait before the next one (ms)."""
        d = min(self.maximum, self.minimum * (2 ** min(self.attempts, 32)))
        self.attempts += 1
        return int(self._rng.uniform(d / 2, d) * 1000)
