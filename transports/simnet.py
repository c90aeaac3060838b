"""A broadcast network driven by a manual clock, for deterministic simulations.

No asyncio and no real time: :meth:`SimulatedNetwork.publish` schedules each
subscriber's copy according to the shared :class:`~transports.faults.FaultInjector`
(loss, duplication, delay, jitter-induced reordering, partitions), and
:meth:`SimulatedNetwork.deliveries_due` hands out what has arrived by ``now``.
Same seed, same calls, same deliveries.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

from transports.faults import FaultInjector


@dataclass(frozen=True, slots=True)
class InFlight:
    """One copy arriving at one node."""

    at: int
    recipient: str
    topic: str
    payload: bytes


class SimulatedNetwork:
    """Pub/sub between named nodes with seeded faults and a manual clock."""

    def __init__(self, faults: FaultInjector | None = None) -> None:
        self.faults = faults or FaultInjector()
        self._subscribers: dict[str, list[str]] = defaultdict(list)
        self._queue: list[tuple[int, int, InFlight]] = []
        self._seq = 0
        #: Copies published, delivered and dropped, for reports.
        self.published = 0
        self.delivered = 0
        self.dropped = 0

    def subscribe(self, node: str, topic: str) -> None:
        """``node`` receives what is published on ``topic`` from now on."""
        if node not in self._subscribers[topic]:
            self._subscribers[topic].append(node)

    def publish(self, sender: str, topic: str, payload: bytes, now: int) -> None:
        """Broadcast to every other subscriber of ``topic``, subject to faults."""
        self.published += 1
        for node in self._subscribers.get(topic, ()):
            if node == sender:
                continue
            delays = self.faults.plan(sender, node)
            if not delays:
                self.dropped += 1
            for delay in delays:
                self._seq += 1
                at = now + delay
                heapq.heappush(self._queue, (at, self._seq, InFlight(at, node, topic, payload)))

    def next_delivery_time(self) -> int | None:
        """When the next copy arrives, or ``None``."""
        return self._queue[0][0] if self._queue else None

    def deliveries_due(self, now: int) -> list[InFlight]:
        """Every copy that has arrived by ``now``, in arrival order."""
        out = []
        queue = self._queue
        while queue and queue[0][0] <= now:
            out.append(heapq.heappop(queue)[2])
        self.delivered += len(out)
        return out
