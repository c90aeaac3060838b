"""Seeded fault injection shared by the simulated network and the memory transport.

Given a sender and a recipient, :meth:`FaultInjector.plan` decides, from a seeded
random generator only, what happens to one broadcast copy: lost, delivered once,
or duplicated, and after what delay. Reordering follows from per-copy jitter.
Partitions split participants into groups that cannot reach each other until
:meth:`FaultInjector.heal`. The same seed and the same sequence of calls give
the same faults, which is what makes simulations reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Probabilities and delays applied to each (message, recipient) copy."""

    #: Probability a copy is dropped.
    loss: float = 0.0
    #: Probability a delivered copy is delivered a second time.
    duplication: float = 0.0
    #: Fixed one-way latency in milliseconds.
    delay_ms: int = 0
    #: Extra uniformly random latency in [0, jitter_ms]; reorders messages.
    jitter_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("loss", "duplication"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError("delay_ms and jitter_ms must be >= 0")


class FaultInjector:
    """Decides the fate of every copy; holds the current partition."""

    def __init__(self, config: FaultConfig | None = None, seed: int = 0) -> None:
        self.config = config or FaultConfig()
        self._rng = random.Random(seed)
        self._group_of: dict[str, int] = {}

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Split the named nodes into groups; nodes not named can reach everyone."""
        self._group_of = {}
        for i, group in enumerate(groups):
            for node in group:
                self._group_of[node] = i

    def heal(self) -> None:
        """End the partition."""
        self._group_of = {}

    def reachable(self, sender: str, recipient: str) -> bool:
        """Whether a copy from ``sender`` can reach ``recipient`` under the current partition."""
        a = self._group_of.get(sender)
        b = self._group_of.get(recipient)
        return a is None or b is None or a == b

    def plan(self, sender: str, recipient: str) -> list[int]:
        """Delays (ms) of the copies to deliver; empty when the copy is lost."""
        if not self.reachable(sender, recipient):
            return []
        cfg = self.config
        rng = self._rng
        if cfg.loss and rng.random() < cfg.loss:
            return []
        copies = 2 if cfg.duplication and rng.random() < cfg.duplication else 1
        return [
            cfg.delay_ms + (rng.randint(0, cfg.jitter_ms) if cfg.jitter_ms else 0)
            for _ in range(copies)
        ]
