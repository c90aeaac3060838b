"""In-process asyncio pub/sub bus with seeded faults.

A :class:`MemoryNetwork` is one broadcast medium; each participant gets a
:class:`MemoryTransport` from :meth:`MemoryNetwork.transport` under a unique
name, the name the :class:`~transports.faults.FaultInjector` knows it by. For
every publish, each *other* subscribed node's copy is planned by the injector
(lost, delivered, duplicated, after what delay) and scheduled with
``loop.call_later``; jitter therefore reorders. A node's own copy is delivered
at once and never faulted: a node always hears its own broadcast.

Slow subscribers: subscriptions are bounded (:class:`~transports.base.QueueSubscription`),
and what happens when one is full is per subscription, never the whole group's:
by default (``on_full="drop"``) the copy for that subscription is dropped and
counted in :attr:`MemoryNetwork.dropped_full` under its node's name, as a
pub/sub relay drops for a peer that does not read (SDS recovers the loss once
it reads again); every other subscriber still gets it and the sender does not
wait. ``on_full="wait"`` is backpressure instead: ``publish`` waits while any
subscription that would receive the message is full, as a sender waits on a full
TCP window, so one reader that stops stops every sender. Copies already
scheduled still arrive, so a queue overshoots its bound by at most the copies
in flight.

Reproducibility: the injector's random draws happen synchronously inside
``publish``, in subscription order, so the same seed and the same sequence of
publishes give the same losses, duplicates and delays. (Arrival *timing*
still follows the real event loop clock; the lead's manual-clock simulator is
the place for exact-time assertions.)
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import Literal

from transports.base import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    Envelope,
    QueueSubscription,
    Subscription,
    Transport,
    TransportClosed,
    check_topic,
    message_hash,
)
from transports.faults import FaultConfig, FaultInjector

__all__ = ["MemoryNetwork", "MemoryTransport"]


class MemoryNetwork:
    """One shared medium connecting :class:`MemoryTransport` nodes.

    ``faults`` is either a :class:`FaultConfig` (a fresh injector seeded with
    ``seed`` is built) or a ready :class:`FaultInjector` shared with other code
    (``seed`` is then ignored). ``max_payload_size`` mimics a broker limit;
    ``max_pending`` / ``max_pending_bytes`` bound each subscription's queue, and
    ``on_full`` says what a full one does (see the module docstring).
    """

    def __init__(
        self,
        faults: FaultConfig | FaultInjector | None = None,
        seed: int = 0,
        *,
        max_payload_size: int | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        on_full: Literal["drop", "wait"] = "drop",
    ) -> None:
        if on_full not in ("drop", "wait"):
            raise ValueError('on_full must be "drop" or "wait"')
        self.on_full = on_full
        if isinstance(faults, FaultInjector):
            self.faults = faults
        else:
            self.faults = FaultInjector(faults, seed)
        self.max_payload_size = max_payload_size
        #: Bound of every subscription on this network (messages, payload bytes).
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._nodes: dict[str, MemoryTransport] = {}
        #: Copies scheduled but not yet delivered (for tests to await quiescence).
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        #: Copies the injector dropped (loss or partition).
        self.dropped = 0
        #: Copies delivered to a subscription.
        self.delivered = 0
        #: Copies dropped because the receiving subscription was full, by node name.
        self.dropped_full: Counter[str] = Counter()

    def transport(self, name: str) -> MemoryTransport:
        """A new node called ``name`` (the name partitions refer to)."""
        if name in self._nodes:
            raise ValueError(f"a node called {name!r} is already on this network")
        node = MemoryTransport(self, name)
        self._nodes[name] = node
        return node

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Split nodes into groups that cannot reach each other until :meth:`heal`."""
        self.faults.partition(groups)

    def heal(self) -> None:
        """End the partition; copies dropped meanwhile stay lost."""
        self.faults.heal()

    async def quiesce(self) -> None:
        """Wait until every scheduled copy has been delivered (or dropped)."""
        await self._idle.wait()

    async def _wait_for_room(self, topic: str) -> None:
        if self.on_full == "drop":
            return
        while True:
            full = [
                sub
                for node in list(self._nodes.values())
                for sub in node._subscriptions_for(topic)
                if sub.full and not sub.closed
            ]
            if not full:
                return
            await full[0].wait_for_room()

    def _forget(self, name: str) -> None:
        self._nodes.pop(name, None)

    def _broadcast(self, sender: str, topic: str, payload: bytes, hint: bytes) -> None:
        loop = asyncio.get_running_loop()
        envelope = Envelope(topic, payload, hint)
        for name, node in list(self._nodes.items()):
            subs = node._subscriptions_for(topic)
            if not subs:
                continue
            if name == sender:
                for sub in subs:
                    self._deliver(name, sub, envelope)
                continue
            # One plan per node (not per subscription): faults model the link to a node.
            delays = self.faults.plan(sender, name)
            if not delays:
                self.dropped += 1
                continue
            for delay_ms in delays:
                self._in_flight += 1
                self._idle.clear()
                if delay_ms:
                    loop.call_later(delay_ms / 1000, self._arrive, name, subs, envelope)
                else:
                    loop.call_soon(self._arrive, name, subs, envelope)

    def _deliver(self, name: str, sub: QueueSubscription, envelope: Envelope) -> None:
        if self.on_full == "drop" and sub.full:
            self.dropped_full[name] += 1
            return
        sub.deliver(envelope)
        self.delivered += 1

    def _arrive(self, name: str, subs: list[QueueSubscription], envelope: Envelope) -> None:
        for sub in subs:
            if not sub.closed:
                self._deliver(name, sub, envelope)
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()


class MemoryTransport(Transport):
    """One node on a :class:`MemoryNetwork`; create it with :meth:`MemoryNetwork.transport`."""

    def __init__(self, network: MemoryNetwork, name: str) -> None:
        self.network = network
        self.name = name
        self.max_payload_size = network.max_payload_size
        self._subs: list[QueueSubscription] = []
        self._closed = False

    async def publish(self, topic: str, payload: bytes) -> bytes:
        """Broadcast to every node subscribed to ``topic``; returns the retrieval hint.

        With ``on_full="wait"``, waits while a receiving subscription is full. Raises
        :class:`~transports.base.InvalidTopic` (or ``InvalidChannelId``) for a topic
        no transport could carry.
        """
        if self._closed:
            raise TransportClosed(f"memory transport {self.name!r} is closed")
        check_topic(topic, publish=True)
        self._check_size(payload)
        payload = bytes(payload)
        await self.network._wait_for_room(topic)
        if self._closed:
            raise TransportClosed(f"memory transport {self.name!r} is closed")
        hint = message_hash(topic, payload)
        self.network._broadcast(self.name, topic, payload, hint)
        return hint

    async def subscribe(self, topic: str) -> Subscription:
        """Receive ``topic`` (exact match) from now on."""
        if self._closed:
            raise TransportClosed(f"memory transport {self.name!r} is closed")
        check_topic(topic, publish=False)
        sub = QueueSubscription(
            topic,
            self._subs.remove,
            max_pending=self.network.max_pending,
            max_pending_bytes=self.network.max_pending_bytes,
        )
        self._subs.append(sub)
        return sub

    async def close(self) -> None:
        """Leave the network; iteration of open subscriptions ends."""
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            sub.end()
        self._subs.clear()
        self.network._forget(self.name)

    def _subscriptions_for(self, topic: str) -> list[QueueSubscription]:
        return [s for s in self._subs if s.topic == topic]
