"""A shared todo list that several participants edit concurrently over a lossy network.

Each participant has its own key, its own document store and a
:class:`~sdk.documents.DocumentChannel`; the operations travel as the content
of SDS messages over a simulated network that drops 30% of copies, duplicates
and reorders them, and partitions the group for a while. Alice publishes the
``todo`` schema as p2panda schema documents, everybody adds and edits items,
and during the partition both sides edit the same items: at the end every
participant prints the same list. Run with ``python examples/todo.py``.

:class:`DocumentGroup` is the reusable part: it wires documents to the SDS
simulation exactly as an app wires them to a real channel (send the payload,
feed each delivered message's content back).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

if not __package__:
    # Run as a file (`python examples/todo.py`, from any folder): this
    # checkout's packages come first. (`python -m examples.todo` works only in the
    # checkout's root: elsewhere `examples` is py-libp2p's package of that name.)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blake3 import blake3

from sdk.documents import (
    DocumentChannel,
    DocumentEvent,
    DocumentStore,
    FieldValue,
    KeyPair,
    OperationRejected,
)
from sdk.sds import COMPACT, ChannelConfig, RepairConfig
from sdk.testing.simulation import GroupSimulation
from transports.faults import FaultConfig

#: Timers short enough that a lossy simulation converges in simulated seconds.
FAST_CONFIG = ChannelConfig(
    bloom=COMPACT,
    resend_interval_ms=2_000,
    possibly_acked_resend_interval_ms=4_000,
    sweep_interval_ms=200,
    sync_interval_ms=2_000,
    retrieval_interval_ms=1_000,
    repair=RepairConfig(t_min_ms=3_000, t_max_ms=10_000),
)


class DocumentGroup:
    """Participants sharing documents over one simulated SDS channel."""

    def __init__(
        self,
        names: list[str],
        *,
        faults: FaultConfig | None = None,
        seed: int = 0,
        config: ChannelConfig = FAST_CONFIG,
    ) -> None:
        self.names = names
        self.sim = GroupSimulation(
            len(names), config=config, faults=faults, seed=seed, channel_id="todo"
        )
        self.node = dict(zip(names, self.sim.node_ids, strict=True))
        self.docs: dict[str, DocumentChannel] = {}
        self.events: dict[str, list[DocumentEvent]] = {}
        self._fed: dict[str, int] = {}
        for name in names:
            # Deterministic keys so a seed reproduces the whole run.
            key = KeyPair.from_private_key(blake3(f"{seed}/{name}".encode()).digest())
            self.docs[name] = DocumentChannel(DocumentStore(), key)
            self.events[name] = []
            self._fed[name] = 0

    def publish(self, name: str, payload: bytes) -> None:
        """``name`` sends a payload from its DocumentChannel over SDS."""
        self.sim.send(self.node[name], payload)

    def pump(self) -> None:
        """Feed every newly delivered SDS message to its participant's DocumentChannel."""
        for name in self.names:
            delivered = self.sim.records[self.node[name]].delivered
            for message in delivered[self._fed[name] :]:
                self.events[name].extend(self.docs[name].on_delivered(message.content))
            self._fed[name] = len(delivered)

    def run_for(self, ms: int, step_ms: int = 100) -> None:
        """Advance simulated time, delivering document payloads as SDS delivers them."""
        end = self.sim.now + ms
        while self.sim.now < end:
            self.sim.run_for(min(step_ms, end - self.sim.now))
            self.pump()

    def state(self, name: str) -> dict[str, Mapping[str, FieldValue] | None]:
        """Every document ``name`` knows: its fields, or ``None`` once deleted."""
        return {
            view.document_id: None if view.deleted else dict(view.fields)
            for view in self.docs[name].store.documents(deleted=True)
        }

    def converged(self) -> bool:
        """SDS logs agree and every participant materializes the same documents."""
        states = [self.state(name) for name in self.names]
        return self.sim.converged() and all(s == states[0] for s in states)

    def run_until_converged(self, limit_ms: int = 600_000) -> bool:
        """Run until :meth:`converged` (and SDS is quiet), at most ``limit_ms``."""
        end = self.sim.now + limit_ms
        while self.sim.now < end:
            if self.converged() and self.sim.all_acknowledged():
                return True
            self.run_for(500)
        return self.converged()

    def rejected(self) -> int:
        """Operations any participant rejected (none in an honest group)."""
        return sum(isinstance(e, OperationRejected) for ev in self.events.values() for e in ev)


def main(argv: list[str] | None = None) -> int:
    """Run the shared todo list; exit status 0 when every participant converged."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--loss", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=5)
    ns = parser.parse_args(argv)

    group = DocumentGroup(
        ["alice", "bob", "carol"],
        faults=FaultConfig(loss=ns.loss, duplication=0.05, delay_ms=30, jitter_ms=120),
        seed=ns.seed,
    )
    alice, bob, carol = (group.docs[n] for n in group.names)
    print(f"3 participants, {ns.loss:.0%} loss, 5% duplication, reordering")

    # Alice publishes the schema as p2panda schema documents; peers learn it from them.
    payloads, schema = alice.define_schema(
        "todo", "A shared todo item", {"title": "str", "done": "bool", "priority": "int"}
    )
    for payload in payloads:
        group.publish("alice", payload)
    print(f"schema {schema.id[:24]}… published as {len(payloads)} documents")

    payload, milk = alice.create(schema.id, {"title": "buy milk", "done": False, "priority": 2})
    group.publish("alice", payload)
    payload, report = alice.create(schema.id, {"title": "report", "done": False, "priority": 1})
    group.publish("alice", payload)
    group.run_until_converged()  # bob can only write items once he knows the schema
    payload, bike = bob.create(schema.id, {"title": "fix bike", "done": False, "priority": 3})
    group.publish("bob", payload)
    group.run_until_converged()

    print("-- partition: alice | bob, carol; both sides edit the same items")
    group.sim.partition([group.node["alice"]], [group.node["bob"], group.node["carol"]])
    group.publish("alice", alice.update(milk.document_id, {"done": True})[0])
    group.publish("alice", alice.update(milk.document_id, {"title": "buy oat milk"})[0])
    group.publish("bob", bob.update(milk.document_id, {"title": "buy milk and bread"})[0])
    group.publish("alice", alice.update(report.document_id, {"priority": 5})[0])
    group.publish("carol", carol.delete(report.document_id)[0])
    group.publish("carol", carol.update(bike.document_id, {"done": True})[0])
    group.run_for(5_000)
    print("-- partition healed")
    group.sim.heal()
    done = group.run_until_converged()

    names = {milk.document_id: "milk", report.document_id: "report", bike.document_id: "bike"}
    for name in group.names:
        items = []
        for doc_id, fields in sorted(group.state(name).items()):
            if doc_id not in names:
                continue  # the schema's own documents
            items.append(
                f"{names[doc_id]}: deleted"
                if fields is None
                else f"{names[doc_id]}: {fields['title']!r} done={fields['done']!r} "
                f"priority={fields['priority']!r}"
            )
        print(f"{name:5s} | " + " | ".join(items))
    # Materialization follows p2panda-rs 0.8.1: a view with no deviation is the
    # one a p2panda node (aquadoggo) builds from the same operations.
    views = [group.docs[group.names[0]].store.document(doc_id) for doc_id in names]
    same_as_p2panda = all(v is not None and v.deviation is None for v in views)
    print(f"p2panda-rs 0.8.1 builds the same views: {'yes' if same_as_p2panda else 'no'}")
    if done and group.rejected() == 0:
        print("CONVERGED: every participant materializes the same todo list")
        return 0
    print("NOT CONVERGED", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
