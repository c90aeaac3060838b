"""The per-channel Lamport clock (specs/sds.md, "Participant state", "Send Message",
"Deliver Message"): uint64 milliseconds, pegged to wall-clock time."""

from __future__ import annotations

UINT64_MAX = (1 << 64) - 1


class LamportClock:
    """Initialized to ``now``; ticks to ``max(now, value + 1)``; follows delivered timestamps."""

    __slots__ = ("value",)

    def __init__(self, now: int) -> None:
        self.value = now

    def tick(self, now: int) -> int:
        """Advance for a message we send, and return its timestamp."""
        self.value = min(max(now, self.value + 1), UINT64_MAX)
        return self.value

    def observe(self, timestamp: int) -> None:
        """A delivered message's timestamp: the clock never runs behind it."""
        if timestamp > self.value:
            self.value = timestamp
