"""A group of SDS participants on a simulated lossy network, with a manual clock.

Used by the simulation tests, the benchmarks and the demo; also handy for
trying a :class:`~sdk.sds.ChannelConfig` against a fault profile before
deploying it. Pure: no asyncio, no real time, fully determined by ``seed``.

The stand-in store node archives every message published (a high-availability
cache, specs/sds.md "Design Assumptions"; ``store_loss`` makes it miss a share
of them) and answers each :class:`~sdk.sds.MessageMissing` (by id and hint) and
:class:`~sdk.sds.RetrieveRange` (by arrival time) after ``store_latency_ms``,
as a runtime with a store client does. Each is one store call.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from sdk.sds import (
    ChannelConfig,
    MessageAcknowledged,
    MessageChannel,
    MessageDelivered,
    MessageLost,
    MessageMissing,
    MessageSendExpired,
    RetrieveRange,
)
from sdk.store.client import InMemoryStore
from transports.base import message_hash, topic_for_channel
from transports.faults import FaultConfig, FaultInjector
from transports.simnet import SimulatedNetwork


@dataclass
class NodeRecord:
    """What one participant experienced."""

    delivered: list[MessageDelivered] = field(default_factory=list)
    acknowledged: set[str] = field(default_factory=set)
    sent: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


class GroupSimulation:
    """``n`` participants in one channel over a :class:`SimulatedNetwork`."""

    def __init__(
        self,
        n: int,
        *,
        config: ChannelConfig | None = None,
        faults: FaultConfig | None = None,
        seed: int = 0,
        channel_id: str = "sim",
        start_ms: int = 1_700_000_000_000,
        with_store: bool = True,
        store_latency_ms: int = 50,
        store_loss: float = 0.0,
    ) -> None:
        self.now = start_ms
        self.channel_id = channel_id
        self.topic = topic_for_channel(channel_id)
        self.rng = random.Random(seed)
        self.injector = FaultInjector(faults, seed=self.rng.getrandbits(64))
        self.network = SimulatedNetwork(self.injector)
        self.store = InMemoryStore() if with_store else None
        self.store_latency_ms = store_latency_ms
        self.store_loss = store_loss
        # (arrival time, bytes) of everything archived, for time-range queries.
        self._archived: list[tuple[int, bytes]] = []
        self._store_rng = random.Random(self.rng.getrandbits(64))
        self.node_ids = [f"p{i:02d}" for i in range(n)]
        self.nodes: dict[str, MessageChannel] = {}
        self.records: dict[str, NodeRecord] = {}
        for node in self.node_ids:
            self.nodes[node] = MessageChannel(
                channel_id,
                node,
                self.now,
                config,
                rng=random.Random(self.rng.getrandbits(64)),
            )
            self.records[node] = NodeRecord()
            self.network.subscribe(node, self.topic)
        # (time, seq, node, data) store answers in flight
        self._store_answers: list[tuple[int, int, str, bytes]] = []
        self._seq = 0
        self.store_queries = 0
        self.range_queries = 0
        # Ids the store saw published once (a lossy store misses a copy for good).
        self._seen_by_store: set[str] = set()
        self.bytes_on_wire = 0
        self.content_bytes_on_wire = 0
        self.datagrams = 0

    # -- actions -----------------------------------------------------------------------
    def send(self, node: str, content: bytes) -> str:
        """``node`` sends ``content`` now."""
        mid = self.nodes[node].send(content, self.now)
        self.records[node].sent.append(mid)
        self._flush(node)
        return mid

    def partition(self, *groups: list[str]) -> None:
        """Split the participants; the store stays reachable by everyone."""
        self.injector.partition(groups)

    def heal(self) -> None:
        """End the partition."""
        self.injector.heal()

    def reconnect(self, node: str, away_since: int) -> None:
        """``node`` is back after missing the channel since ``away_since``: what a
        runtime does on reconnect (``MessageChannel.announce``)."""
        self.nodes[node].announce(self.now, away_since=away_since)
        self._drain(node)

    # -- time --------------------------------------------------------------------------
    def run_until(self, t: int) -> None:
        """Advance the clock to ``t``, processing every delivery and timer on the way."""
        while True:
            nxt = self._next_event_time()
            if nxt is None or nxt > t:
                break
            self.now = max(self.now, nxt)
            self._step()
        self.now = max(self.now, t)

    def run_for(self, ms: int) -> None:
        """Advance the clock by ``ms``."""
        self.run_until(self.now + ms)

    def run_until_quiet(
        self, limit_ms: int, check: Callable[[], bool] | None = None, step_ms: int = 500
    ) -> bool:
        """Run until ``check()`` (default: :meth:`converged` and all acknowledged) holds,
        at most ``limit_ms``; return whether it held. ``check`` runs every ``step_ms``
        of simulated time, so the time it first held is known to within ``step_ms``."""
        check = check or (lambda: self.converged() and self.all_acknowledged())
        end = self.now + limit_ms
        while self.now < end:
            if check():
                return True
            self.run_for(min(step_ms, end - self.now))
        return check()

    def _next_event_time(self) -> int | None:
        times = [t for c in self.nodes.values() if (t := c.get_timer()) is not None]
        if (t := self.network.next_delivery_time()) is not None:
            times.append(t)
        if self._store_answers:
            times.append(self._store_answers[0][0])
        return min(times) if times else None

    def _step(self) -> None:
        now = self.now
        for d in self.network.deliveries_due(now):
            self.nodes[d.recipient].receive(d.payload, now, message_hash(d.topic, d.payload))
            self._drain(d.recipient)
        while self._store_answers and self._store_answers[0][0] <= now:
            _, _, node, data = heapq.heappop(self._store_answers)
            self.nodes[node].receive(data, now, message_hash(self.topic, data))
            self._drain(node)
        for node, channel in self.nodes.items():
            t = channel.get_timer()
            if t is not None and t <= now:
                channel.handle_timer(now)
                self._drain(node)

    def _drain(self, node: str) -> None:
        channel = self.nodes[node]
        rec = self.records[node]
        while (event := channel.next_event()) is not None:
            if isinstance(event, MessageDelivered):
                rec.delivered.append(event)
            elif isinstance(event, MessageAcknowledged):
                rec.acknowledged.add(event.message_id)
            elif isinstance(event, MessageMissing) and self.store is not None:
                self.store_queries += 1
                self._answer(
                    node,
                    self.store.lookup(
                        self.channel_id,
                        [event.message_id],
                        [event.retrieval_hint] if event.retrieval_hint else [],
                    ),
                )
            elif isinstance(event, RetrieveRange) and self.store is not None:
                self.store_queries += 1
                self.range_queries += 1
                lo, hi = event.from_ms, event.to_ms
                self._answer(node, [d for t, d in self._archived if lo <= t < hi])
            elif isinstance(event, MessageLost):
                rec.lost.append(event.message_id)
            elif isinstance(event, MessageSendExpired):
                rec.expired.append(event.message_id)
        self._flush(node)

    def _answer(self, node: str, found: list[bytes]) -> None:
        for data in found:
            self._seq += 1
            heapq.heappush(
                self._store_answers, (self.now + self.store_latency_ms, self._seq, node, data)
            )

    def _flush(self, node: str) -> None:
        channel = self.nodes[node]
        for dg in channel.datagrams_to_send():
            self.datagrams += 1
            self.bytes_on_wire += len(dg.data)
            self.network.publish(node, self.topic, dg.data, self.now)
            if dg.message_id and dg.kind.value == "content":
                hint = message_hash(self.topic, dg.data)
                channel.set_retrieval_hint(dg.message_id, hint)
                if self.store is not None and dg.message_id not in self._seen_by_store:
                    self._seen_by_store.add(dg.message_id)
                    if self._store_rng.random() >= self.store_loss:
                        self.store.archive(self.channel_id, dg.message_id, dg.data, hint)
                        self._archived.append((self.now, dg.data))

    # -- checks ------------------------------------------------------------------------
    def all_sent(self) -> set[str]:
        """Every content message id sent by anyone."""
        return {mid for rec in self.records.values() for mid in rec.sent}

    def converged(self) -> bool:
        """Every participant's local log holds every sent message, in the same order."""
        logs = [c.log.ids() for c in self.nodes.values()]
        return len(logs[0]) == len(self.all_sent()) and all(log == logs[0] for log in logs)

    def all_acknowledged(self) -> bool:
        """Every participant's outgoing buffer is empty."""
        return all(len(c.outgoing) == 0 for c in self.nodes.values())


def chat_through_outage(
    sim: GroupSimulation,
    cut: str,
    outage_ms: int,
    *,
    before_ms: int = 5_000,
    after_ms: int = 2_000,
    step_ms: int = 100,
) -> int:
    """Everyone takes turns sending (one message per ``step_ms`` in all); ``cut`` is
    cut off from the others for ``outage_ms`` after ``before_ms``, then reconnects
    (:meth:`GroupSimulation.reconnect`: after a broker is down everyone, after the
    partition ``cut``); traffic stops ``after_ms`` later.

    Returns when ``cut`` reconnected (what convergence is measured from).
    """
    ids = sim.node_ids
    outage_at = sim.now + before_ms
    back_at = outage_at + outage_ms
    stop_at = back_at + after_ms
    i = 0
    isolated = False
    while sim.now < stop_at:
        if not isolated and outage_at <= sim.now < back_at:
            sim.partition([cut], [p for p in ids if p != cut])
            isolated = True
        if isolated and sim.now >= back_at:
            sim.heal()
            sim.reconnect(cut, away_since=outage_at)
            isolated = False
        sender = ids[i % len(ids)]
        if not (isolated and sender == cut):
            sim.send(sender, f"m{i}".encode())
        i += 1
        sim.run_for(step_ms)
    if isolated:
        sim.heal()
        sim.reconnect(cut, away_since=outage_at)
    return back_at


def chat_through_partition(
    sim: GroupSimulation,
    cut: list[str],
    partition_ms: int,
    *,
    rate_per_participant: int = 10,
    kills: int = 0,
    kill_ms: int = 3_000,
    up_ms: int = 3_000,
    after_ms: int = 2_000,
) -> int:
    """Everyone sends ``rate_per_participant`` messages/s throughout; first ``kills``
    times every participant is cut off from every other for ``kill_ms`` (a broker
    down), ``up_ms`` apart; then ``cut`` is split from the rest for
    ``partition_ms`` (both sides keep talking among themselves). At the end of
    each fault the participants cut off reconnect (:meth:`GroupSimulation.reconnect`:
    everyone after a broker is down, ``cut`` after the partition); traffic stops
    ``after_ms`` later (issue 27: without a store the peers must fill the gaps).

    Returns when the partition healed (what convergence is measured from).
    """
    ids = sim.node_ids
    rest = [p for p in ids if p not in cut]
    step = max(1, 1_000 // (rate_per_participant * len(ids)))
    t0 = sim.now
    # (start, end, groups, who reconnects) of each fault, relative to t0.
    faults: list[tuple[int, int, list[list[str]], list[str]]] = []
    at = up_ms
    for _ in range(kills):
        faults.append((at, at + kill_ms, [[p] for p in ids], ids))
        at += kill_ms + up_ms
    faults.append((at, at + partition_ms, [list(cut), rest], list(cut)))
    healed_at = t0 + at + partition_ms
    stop_at = healed_at + after_ms
    current: tuple[int, int, list[list[str]], list[str]] | None = None
    i = 0
    while sim.now < stop_at:
        rel = sim.now - t0
        fault = next((f for f in faults if f[0] <= rel < f[1]), None)
        if fault is not current:
            if current is not None:
                sim.heal()
                for p in current[3]:
                    sim.reconnect(p, away_since=t0 + current[0])
            if fault is not None:
                sim.partition(*fault[2])
            current = fault
        sim.send(ids[i % len(ids)], f"m{i}".encode())
        i += 1
        sim.run_for(step)
    if current is not None:
        sim.heal()
        for p in current[3]:
            sim.reconnect(p, away_since=t0 + current[0])
    return healed_at
