"""Two endpoints wired together in memory: for tests, benchmarks and trying things out.

Bytes move only when :meth:`EndpointPair.exchange` (or :meth:`run`) is called, and
a seeded chooser may deliver arbitrary prefixes of what each side has produced,
so tests can interleave the two directions any way they like. A connection that
one side dropped stays dropped; :attr:`EndpointPair.error` says who and why.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sdk.sync.bamboo_p2p.endpoint import Endpoint, EndpointConfig
from sdk.sync.bamboo_p2p.errors import RemoteProtocolError
from sdk.sync.bamboo_p2p.events import Event
from sdk.sync.bamboo_p2p.setup import Role
from sdk.sync.bamboo_p2p.store import LogStore


@dataclass
class EndpointPair:
    """A proactive endpoint ``a`` and a reactive endpoint ``b`` over an in-memory pipe."""

    a: Endpoint
    b: Endpoint
    #: Bytes produced by one side and not yet delivered to the other.
    a_to_b: bytearray = field(default_factory=bytearray)
    b_to_a: bytearray = field(default_factory=bytearray)
    error: tuple[str, RemoteProtocolError] | None = None
    a_events: list[Event] = field(default_factory=list)
    b_events: list[Event] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        store_a: LogStore,
        store_b: LogStore,
        config_a: EndpointConfig | None = None,
        config_b: EndpointConfig | None = None,
    ) -> EndpointPair:
        """A fresh connection between two stores."""
        return cls(
            Endpoint(Role.PROACTIVE, store_a, config_a), Endpoint(Role.REACTIVE, store_b, config_b)
        )

    def _deliver(self, to_b: bool, n: int | None) -> int:
        buf = self.a_to_b if to_b else self.b_to_a
        target = self.b if to_b else self.a
        n = len(buf) if n is None else min(n, len(buf))
        if not n or self.error is not None:
            return 0
        chunk = bytes(buf[:n])
        del buf[:n]
        try:
            target.receive_data(chunk)
        except RemoteProtocolError as exc:
            self.error = ("b" if to_b else "a", exc)
        return n

    def _drain_events(self) -> None:
        for endpoint, sink in ((self.a, self.a_events), (self.b, self.b_events)):
            while (event := endpoint.next_event()) is not None:
                sink.append(event)

    def exchange(self, limit: int = 1 << 20) -> int:
        """One round: both produce, both receive everything. Returns bytes moved."""
        out_a = self.a.data_to_send(limit)
        out_b = self.b.data_to_send(limit)
        self.a_to_b += out_a
        self.b_to_a += out_b
        self._drain_events()
        moved = self._deliver(True, None) + self._deliver(False, None)
        self._drain_events()
        return len(out_a) + len(out_b) + moved

    def run(self, max_rounds: int = 100_000, limit: int = 1 << 20) -> int:
        """Exchange until nothing moves (or an error); return the rounds taken."""
        for rounds in range(1, max_rounds + 1):
            if self.exchange(limit) == 0 or self.error is not None:
                return rounds
        return max_rounds

    def step_random(self, rng: random.Random) -> bool:
        """One random step: produce on one side, or deliver a random prefix one way.

        Returns False when nothing was pending anywhere (quiescent after producing).
        """
        choice = rng.randrange(4)
        if choice == 0:
            self.a_to_b += self.a.data_to_send(rng.choice((64, 512, 1 << 20)))
        elif choice == 1:
            self.b_to_a += self.b.data_to_send(rng.choice((64, 512, 1 << 20)))
        else:
            to_b = choice == 2
            buf = self.a_to_b if to_b else self.b_to_a
            if buf:
                self._deliver(to_b, rng.randint(1, len(buf)))
        self._drain_events()
        return bool(self.a_to_b or self.b_to_a)


__all__ = ["EndpointPair"]
