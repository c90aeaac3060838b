"""Stateful property test of the SDS core (issue 18): 2-5 participants over a
network the test controls step by step, with loss, duplication, reordering,
partitions and timer calls at arbitrary times.

After every step: nothing raised; no id is both missing and received (held
or delivered); nothing received is lost; every message is delivered at most
once and after its dependencies (or after they were declared lost). At the
end the network heals and every participant's log holds every message, in
the same order.

The example budget is ``CHORUS_SDS_STATEFUL_EXAMPLES`` (default 25, as in CI);
``docs/sds.md`` records a run with a large budget.
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sdk.sds import (
    COMPACT,
    ChannelConfig,
    MessageChannel,
    MessageDelivered,
    MessageLost,
    RepairConfig,
    decode_message,
)
from tests.sds.helpers import T0

EXAMPLES = int(os.environ.get("CHORUS_SDS_STATEFUL_EXAMPLES", "25"))


class GroupMachine(RuleBasedStateMachine):
    """One channel, n participants, every datagram in flight under the test's control."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[MessageChannel] = []
        self.in_flight: list[tuple[int, bytes]] = []
        self.side: list[int] = []
        self.now = T0
        self.deps: dict[str, list[str]] = {}
        self.wire: dict[str, bytes] = {}
        self.sender: dict[str, int] = {}
        self.delivered: list[list[str]] = []
        self.declared_lost: list[set[str]] = []
        self.counter = 0
        self.lost_timeout = 0

    @initialize(
        n=st.integers(min_value=2, max_value=5),
        history=st.integers(min_value=1, max_value=3),
        lost_timeout=st.sampled_from([0, 3_000]),
        seed=st.integers(min_value=0, max_value=2**32),
    )
    def setup(self, n: int, history: int, lost_timeout: int, seed: int) -> None:
        self.lost_timeout = lost_timeout
        config = ChannelConfig(
            causal_history_size=history,
            bloom=COMPACT,
            sync_interval_ms=2_000,
            sweep_interval_ms=100,
            resend_interval_ms=1_000,
            possibly_acked_resend_interval_ms=2_000,
            max_resends=None,
            retrieval_interval_ms=500,
            lost_timeout_ms=lost_timeout,
            repair=RepairConfig(t_min_ms=200, t_max_ms=2_000),
        )
        rng = random.Random(seed)
        self.nodes = [
            MessageChannel("room", f"p{i}", T0, config, rng=random.Random(rng.getrandbits(32)))
            for i in range(n)
        ]
        self.side = [0] * n
        self.delivered = [[] for _ in range(n)]
        self.declared_lost = [set() for _ in range(n)]

    # -- plumbing ----------------------------------------------------------------------
    def _settle(self) -> None:
        """Collect what every participant broadcast and check every event."""
        for i, node in enumerate(self.nodes):
            for dg in node.datagrams_to_send():
                message = decode_message(dg.data)
                if message.content and message.lamport_timestamp is not None:
                    self.deps.setdefault(
                        message.message_id, [e.message_id for e in message.causal_history]
                    )
                    self.wire.setdefault(message.message_id, dg.data)
                    self.sender.setdefault(message.message_id, i)
                for j in range(len(self.nodes)):
                    if j != i and self.side[j] == self.side[i]:
                        self.in_flight.append((j, dg.data))
            self._check_events(i, node)

    def _check_events(self, i: int, node: MessageChannel) -> None:
        delivered = self.delivered[i]
        seen = set(delivered)
        seen.update(mid for mid, who in self.sender.items() if who == i)
        lost = self.declared_lost[i]
        while (event := node.next_event()) is not None:
            if isinstance(event, MessageDelivered):
                mid = event.message_id
                assert mid not in seen, "delivered twice"
                for dep in self.deps[mid]:
                    assert dep in seen or dep in lost, "delivered before a dependency"
                delivered.append(mid)
                seen.add(mid)
            elif isinstance(event, MessageLost):
                assert event.message_id not in seen, "a delivered message declared lost"
                assert event.message_id not in node.incoming, "a held message declared lost"
                lost.add(event.message_id)

    def _timers(self, due_only: bool) -> None:
        for node in self.nodes:
            timer = node.get_timer()
            if not due_only or (timer is not None and timer <= self.now):
                node.handle_timer(self.now)
        self._settle()

    # -- rules -------------------------------------------------------------------------
    @rule(who=st.integers(min_value=0, max_value=4))
    def send(self, who: int) -> None:
        self.counter += 1
        self.nodes[who % len(self.nodes)].send(f"m{self.counter}".encode(), self.now)
        self._settle()

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(min_value=0))
    def deliver(self, pick: int) -> None:
        recipient, data = self.in_flight.pop(pick % len(self.in_flight))
        self.nodes[recipient].receive(data, self.now)
        self._settle()

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(min_value=0))
    def lose(self, pick: int) -> None:
        self.in_flight.pop(pick % len(self.in_flight))

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(min_value=0))
    def duplicate(self, pick: int) -> None:
        self.in_flight.append(self.in_flight[pick % len(self.in_flight)])

    @rule(sides=st.lists(st.integers(min_value=0, max_value=1), min_size=5, max_size=5))
    def partition(self, sides: list[int]) -> None:
        self.side = sides[: len(self.nodes)]

    @rule()
    def heal(self) -> None:
        self.side = [0] * len(self.nodes)

    @rule(ms=st.integers(min_value=0, max_value=5_000), due_only=st.booleans())
    def advance(self, ms: int, due_only: bool) -> None:
        self.now += ms
        self._timers(due_only)

    @rule(who=st.integers(min_value=0, max_value=4), ms=st.integers(min_value=0, max_value=300))
    def timer_on_one(self, who: int, ms: int) -> None:
        self.now += ms
        self.nodes[who % len(self.nodes)].handle_timer(self.now)
        self._settle()

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def received_is_never_missing_or_lost(self) -> None:
        for node in self.nodes:
            received = {p.message.message_id for p in node.incoming.pending()}
            received.update(node.log.ids())
            assert not received.intersection(node.missing())
            assert not received.intersection(node.lost())

    def teardown(self) -> None:
        if not self.nodes:
            return
        self.side = [0] * len(self.nodes)
        if self.lost_timeout:
            # Ids declared lost are no longer asked for: a complete store answers.
            for i, node in enumerate(self.nodes):
                for data in self.wire.values():
                    node.receive(data, self.now)
                self._check_events(i, node)
        sent = set(self.deps)
        deadline = self.now + 30 * 60_000
        while True:
            while self.in_flight:
                recipient, data = self.in_flight.pop(0)
                self.nodes[recipient].receive(data, self.now)
                self._settle()
            logs = [node.log.ids() for node in self.nodes]
            if all(set(log) == sent for log in logs):
                break
            timers = [t for n in self.nodes if (t := n.get_timer()) is not None]
            assert timers and self.now < deadline, "did not converge after healing"
            self.now = max(self.now, min(timers))
            self._timers(due_only=True)
        assert all(log == logs[0] for log in logs)
        for i in range(len(self.nodes)):
            theirs = {mid for mid in sent if self.sender[mid] != i}
            assert sorted(self.delivered[i]) == sorted(theirs)


GroupMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestGroupMachine = GroupMachine.TestCase
