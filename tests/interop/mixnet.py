"""A channel shared by Chorus and ``@waku/sds`` participants, on one manual clock.

Every datagram a participant emits is broadcast at once to every other
participant, unless a drop rule says it is lost on the way to one of them.
Time moves only in :meth:`MixedNetwork.advance`, which runs each participant's
periodic work the way its application would: Chorus's ``handle_timer``; for the
reference, the incoming, outgoing (resend) and SDS-R sweeps its
``ReliableChannel`` runs on intervals, plus an optional periodic sync. With
``store=True`` the network also archives every content message, and each
application looks up what its participant reports missing there (the spec's
store nodes; the reference's ``ReliableChannel`` queries Waku Store the same way).

Each node records what happened in one vocabulary (:class:`Record`), so tests
compare the two implementations side by side.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sdk.sds import (
    WAKU,
    ChannelConfig,
    EphemeralReceived,
    MessageAcknowledged,
    MessageChannel,
    MessageDelivered,
    MessageKind,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageRejected,
    RepairConfig,
    RetrieveRange,
    decode_message,
)

from .jsharness import JsHarness, JsParticipant, unb64

T0 = 1_700_000_000_000
CHANNEL = "interop-room"

#: ``drop(sender, recipient, data) -> True`` loses that copy of the datagram.
DropRule = Callable[[str, str, bytes], bool]


def chorus_config(**overrides: Any) -> ChannelConfig:
    """A Chorus config that shares a channel with the reference: its filter, no id check,
    manual sync unless asked, and short SDS-R windows matching :func:`js_options`."""
    base: dict[str, Any] = {
        "bloom": WAKU,
        "verify_message_ids": False,
        "sync_interval_ms": 0,
        "repair": RepairConfig(t_min_ms=1_000, t_max_ms=5_000),
    }
    base.update(overrides)
    return ChannelConfig(**base)


def js_options(**overrides: Any) -> dict[str, Any]:
    """Reference options matching :func:`chorus_config`'s SDS-R window."""
    base: dict[str, Any] = {"repair_config": {"tMin": 1_000, "tMax": 5_000}}
    base.update(overrides)
    return base


def message_id_of(data: bytes) -> str:
    """The id of an encoded SDS message."""
    return decode_message(data).message_id


@dataclass
class Record:
    """What one participant experienced, in one vocabulary for both implementations."""

    delivered: list[tuple[str, bytes]] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    #: Highest count (reference) or distinct-peer hits (Chorus) seen per id.
    possibly_acknowledged: dict[str, int] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    #: Retrieval hint reported with each missing id (last one seen).
    missing_hints: dict[str, bytes | None] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    ephemeral: list[tuple[str, str, bytes]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    repairs_sent: int = 0
    sync_received: int = 0

    def delivered_ids(self) -> list[str]:
        """Ids delivered, in delivery order."""
        return [mid for mid, _ in self.delivered]


class Node:
    """A participant of the mixed network."""

    name: str
    kind: str
    record: Record
    net: MixedNetwork

    def send(self, content: bytes) -> str:
        raise NotImplementedError

    def send_ephemeral(self, content: bytes) -> None:
        raise NotImplementedError

    def send_sync(self) -> None:
        raise NotImplementedError

    def receive(self, data: bytes) -> None:
        raise NotImplementedError

    def tick(self, now: int) -> None:
        raise NotImplementedError

    def log(self) -> list[str]:
        raise NotImplementedError


class ChorusNode(Node):
    """A Chorus :class:`MessageChannel`."""

    kind = "chorus"

    def __init__(self, net: MixedNetwork, name: str, config: ChannelConfig) -> None:
        self.net = net
        self.name = name
        self.record = Record()
        self.channel = MessageChannel(
            net.channel_id, name, net.now, config, rng=random.Random(name)
        )
        self._to_fetch: set[str] = set()
        self._ranges: list[tuple[int, int]] = []

    def send(self, content: bytes) -> str:
        mid = self.channel.send(content, self.net.now)
        self._flush()
        return mid

    def send_ephemeral(self, content: bytes) -> None:
        self.channel.send_ephemeral(content, self.net.now)
        self._flush()

    def send_sync(self) -> None:
        self.channel.send_sync(self.net.now)
        self._flush()

    def receive(self, data: bytes) -> None:
        self.channel.receive(data, self.net.now)
        self._drain()

    def tick(self, now: int) -> None:
        # The application answers MessageMissing from the store (when there is one).
        fetch, self._to_fetch = self._to_fetch, set()
        for mid in sorted(fetch):
            data = self.net.fetch(mid)
            if data is not None:
                self.receive(data)
        ranges, self._ranges = self._ranges, []
        for lo, hi in ranges:  # as the runtime serves RetrieveRange
            for data in self.net.fetch_range(lo, hi):
                self.receive(data)
        timer = self.channel.get_timer()
        if timer is not None and timer <= now:
            repairs_before = self.channel.stats["repairs_sent"]
            self.channel.handle_timer(now)
            self.record.repairs_sent += self.channel.stats["repairs_sent"] - repairs_before
            self._drain()
            self._flush()

    def log(self) -> list[str]:
        return self.channel.log.ids()

    def _flush(self) -> None:
        for dg in self.channel.datagrams_to_send():
            self.net.broadcast(self, dg.data)
        self._drain()

    def _drain(self) -> None:
        rec = self.record
        while (event := self.channel.next_event()) is not None:
            if isinstance(event, MessageDelivered):
                rec.delivered.append((event.message_id, event.content))
            elif isinstance(event, MessageAcknowledged):
                rec.acknowledged.append(event.message_id)
            elif isinstance(event, MessagePossiblyAcknowledged):
                prev = rec.possibly_acknowledged.get(event.message_id, 0)
                rec.possibly_acknowledged[event.message_id] = max(prev, event.hits)
            elif isinstance(event, MessageMissing):
                rec.missing.add(event.message_id)
                rec.missing_hints[event.message_id] = event.retrieval_hint
                self._to_fetch.add(event.message_id)
            elif isinstance(event, MessageLost):
                rec.lost.add(event.message_id)
            elif isinstance(event, EphemeralReceived):
                rec.ephemeral.append((event.message_id, event.sender_id, event.content))
            elif isinstance(event, MessageRejected):
                rec.rejected.append(f"{event.reason.value}: {event.detail}")
            elif isinstance(event, RetrieveRange):
                self._ranges.append((event.from_ms, event.to_ms))
        rec.sync_received = self.channel.stats["sync_received"]


class JsNode(Node):
    """A reference ``@waku/sds`` participant, driven the way its ``ReliableChannel`` drives it."""

    kind = "js"

    def __init__(
        self,
        net: MixedNetwork,
        harness: JsHarness,
        name: str,
        options: dict[str, Any],
        *,
        resend_ms: int | None = 30_000,
        sync_ms: int | None = None,
        offset: int = 0,
    ) -> None:
        self.net = net
        self.name = name
        self.record = Record()
        #: Every event the harness reported, as it reported it.
        self.raw_events: list[dict[str, Any]] = []
        self.js: JsParticipant = harness.participant(name, net.channel_id, net.now, **options)
        self.resend_ms = resend_ms
        self.sync_ms = sync_ms
        self.offset = offset
        self._fetched: dict[str, int] = {}
        self._next_resend = net.now + resend_ms if resend_ms else None
        self._next_sync = net.now + sync_ms if sync_ms else None

    def send(self, content: bytes) -> str:
        mid, out = self.js.send(content, self.net.now)
        self._broadcast(out)
        return mid

    def send_ephemeral(self, content: bytes) -> None:
        self._broadcast(self.js.send_ephemeral(content, self.net.now))

    def send_sync(self) -> None:
        self._broadcast(self.js.send_sync(self.net.now))

    def receive(self, data: bytes) -> None:
        self.js.receive(data, self.net.now, offset=self.offset)
        self._drain()

    def tick(self, now: int) -> None:
        # As the reference's ReliableChannel does: what the incoming sweep reports
        # missing is looked up in the store (when there is one).
        for mid in self.js.sweep_incoming(now):
            if now >= self._fetched.get(mid, 0) + self.net.store_retry_ms:
                self._fetched[mid] = now
                data = self.net.fetch(mid)
                if data is not None:
                    self.receive(data)
        self._broadcast(self.js.sweep_repair(now))
        if self._next_resend is not None and self.resend_ms and now >= self._next_resend:
            self._next_resend = now + self.resend_ms
            unacknowledged, _ = self.js.sweep_outgoing(now)
            self._broadcast([data for _, data in unacknowledged])
        if self._next_sync is not None and self.sync_ms and now >= self._next_sync:
            self._next_sync = now + self.sync_ms
            self._broadcast(self.js.send_sync(now))
        self._drain()

    def log(self) -> list[str]:
        return self.js.log()

    def _broadcast(self, datagrams: list[bytes]) -> None:
        for data in datagrams:
            self.net.broadcast(self, data)
        self._drain()

    def _drain(self) -> None:
        rec = self.record
        for ev in self.js.events():
            self.raw_events.append(ev)
            t = ev["type"]
            if t == "delivered":
                content = ev["content_b64"]
                rec.delivered.append((ev["message_id"], unb64(content) if content else b""))
            elif t == "acknowledged":
                rec.acknowledged.append(ev["message_id"])
            elif t == "possibly_acknowledged":
                prev = rec.possibly_acknowledged.get(ev["message_id"], 0)
                rec.possibly_acknowledged[ev["message_id"]] = max(prev, ev["count"])
            elif t == "missing":
                rec.missing.update(ev["message_ids"])
                for entry in ev["entries"]:
                    hint = entry["hint_b64"]
                    rec.missing_hints[entry["message_id"]] = unb64(hint) if hint else None
            elif t == "lost":
                rec.lost.update(ev["message_ids"])
            elif t == "ephemeral":
                rec.ephemeral.append((ev["message_id"], ev["sender_id"], unb64(ev["content_b64"])))
            elif t == "sync_received":
                rec.sync_received += 1
            elif t == "error":
                rec.rejected.append(ev["error"])
            elif t == "repair:response-sent":
                rec.repairs_sent += 1


class MixedNetwork:
    """One channel, a manual clock, and broadcast with optional loss."""

    def __init__(
        self,
        harness: JsHarness,
        *,
        channel_id: str = CHANNEL,
        start_ms: int = T0,
        loss: float = 0.0,
        seed: int = 0,
        store: bool = False,
        store_loss: float = 0.0,
    ) -> None:
        self.harness = harness
        self.channel_id = channel_id
        self.now = start_ms
        self.nodes: dict[str, Node] = {}
        self.loss = loss
        self.rng = random.Random(seed)
        self.drop_rules: list[DropRule] = []
        self.dropped = 0
        self.datagrams = 0
        self.held: list[tuple[Node, bytes]] | None = None
        #: The spec's high-availability cache: every content message broadcast, by id.
        self.store: dict[str, bytes] | None = {} if store else None
        #: The same messages by arrival time, for time-range queries.
        self.store_times: list[tuple[int, bytes]] = []
        #: Share of content messages the store never archives (decided per id).
        self.store_loss = store_loss
        self._store_seen: set[str] = set()
        self.store_retry_ms = 2_000
        self.store_hits = 0

    def chorus(self, name: str, config: ChannelConfig | None = None) -> ChorusNode:
        """Add a Chorus participant."""
        node = ChorusNode(self, name, config or chorus_config())
        self.nodes[name] = node
        return node

    def js(self, name: str, options: dict[str, Any] | None = None, **kwargs: Any) -> JsNode:
        """Add a reference participant (``kwargs``: ``resend_ms``, ``sync_ms``, ``offset``)."""
        node = JsNode(self, self.harness, name, options or js_options(), **kwargs)
        self.nodes[name] = node
        return node

    def drop(self, rule: DropRule) -> DropRule:
        """Lose datagrams matching ``rule`` until :meth:`undrop`."""
        self.drop_rules.append(rule)
        return rule

    def drop_message(self, message_id: str, to: str | None = None) -> DropRule:
        """Lose every copy of one message (to one recipient, or to everyone)."""

        def rule(sender: str, recipient: str, data: bytes) -> bool:
            return (to is None or recipient == to) and message_id_of(data) == message_id

        return self.drop(rule)

    def undrop(self, rule: DropRule | None = None) -> None:
        """Remove one drop rule, or all of them."""
        if rule is None:
            self.drop_rules.clear()
        else:
            self.drop_rules.remove(rule)

    def hold(self) -> None:
        """Queue broadcasts instead of delivering them (to make sends concurrent)."""
        self.held = []

    def release(self) -> None:
        """Deliver what :meth:`hold` queued, in a different random order to each participant."""
        held, self.held = self.held or [], None
        for node in list(self.nodes.values()):
            items = [(s, d) for s, d in held if s is not node]
            self.rng.shuffle(items)
            for sender, data in items:
                self._deliver(sender, node, data)

    def fetch(self, message_id: str) -> bytes | None:
        """A message from the store, if there is a store and it has the message."""
        data = self.store.get(message_id) if self.store is not None else None
        self.store_hits += data is not None
        return data

    def fetch_range(self, from_ms: int, to_ms: int) -> list[bytes]:
        """Every archived message that arrived in ``[from_ms, to_ms)``."""
        return [d for t, d in self.store_times if from_ms <= t < to_ms]

    def broadcast(self, sender: Node, data: bytes) -> None:
        """Deliver ``data`` to every other participant, minus what is lost."""
        self.datagrams += 1
        if self.store is not None:
            message = decode_message(data)
            mid = message.message_id
            if message.kind is MessageKind.CONTENT and mid not in self._store_seen:
                self._store_seen.add(mid)
                if not self.store_loss or self.rng.random() >= self.store_loss:
                    self.store[mid] = data
                    self.store_times.append((self.now, data))
        if self.held is not None:
            self.held.append((sender, data))
            return
        for node in list(self.nodes.values()):
            if node is not sender:
                self._deliver(sender, node, data)

    def _deliver(self, sender: Node, node: Node, data: bytes) -> None:
        if any(rule(sender.name, node.name, data) for rule in self.drop_rules) or (
            self.loss and self.rng.random() < self.loss
        ):
            self.dropped += 1
            return
        node.receive(data)

    def advance(self, ms: int, step_ms: int = 250) -> None:
        """Move the clock forward by ``ms``, running every participant's periodic work each step."""
        end = self.now + ms
        while self.now < end:
            self.now = min(end, self.now + step_ms)
            for node in list(self.nodes.values()):
                node.tick(self.now)

    def logs(self) -> dict[str, list[str]]:
        """Every participant's local log."""
        return {name: node.log() for name, node in self.nodes.items()}
