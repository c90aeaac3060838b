"""Documents over the SDS core's lossy simulated network: concurrent editors converge."""

from __future__ import annotations

import pytest

from examples.todo import DocumentGroup
from sdk.documents import DocumentUpdated, OperationRejected
from transports.faults import FaultConfig

from .helpers import TODO_SCHEMA, todo_fields

LOSSY = FaultConfig(loss=0.3, duplication=0.1, delay_ms=20, jitter_ms=150)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_participants_edit_concurrently_and_converge(seed: int) -> None:
    group = DocumentGroup(["alice", "bob"], faults=LOSSY, seed=seed)
    alice, bob = group.docs["alice"], group.docs["bob"]
    for channel in (alice, bob):
        channel.store.add_schema(TODO_SCHEMA)
    payload, created = alice.create(TODO_SCHEMA.id, todo_fields("milk"))
    group.publish("alice", payload)
    assert group.run_until_converged(120_000)
    doc = created.document_id

    # Offline from each other, both edit the same fields several times.
    group.sim.partition([group.node["alice"]], [group.node["bob"]])
    for i in range(5):
        group.publish("alice", alice.update(doc, {"title": f"alice {i}", "priority": i})[0])
        group.publish("bob", bob.update(doc, {"title": f"bob {i}", "done": True})[0])
        group.run_for(300)
    group.sim.heal()
    assert group.run_until_converged(300_000)

    a_view, b_view = alice.store.document(doc), bob.store.document(doc)
    assert a_view == b_view and a_view is not None
    assert a_view.operation_count == 11
    assert len(a_view.view_id) == 2  # two concurrent branches, not merged yet
    # Of two branches the one whose first operation has the larger id is walked
    # last (p2panda-rs graph.rs:416-423) and wins "title".
    branch_heads = sorted(
        (op.id, op.author) for op in alice.store.operations(doc) if op.previous == (doc,)
    )
    winner = "alice" if branch_heads[-1][1] == alice.key.author else "bob"
    assert a_view.fields["title"] == f"{winner} 4"
    assert a_view.fields["done"] is True and a_view.fields["priority"] == 4

    # A merge by either side is seen by the other.
    group.publish("bob", bob.update(doc, {"title": "merged"})[0])
    assert group.run_until_converged(120_000)
    assert alice.store.document(doc).fields["title"] == "merged"  # type: ignore[union-attr]
    assert len(alice.store.document(doc).view_id) == 1  # type: ignore[union-attr]
    assert any(isinstance(e, DocumentUpdated) for e in group.events["alice"])
    assert group.rejected() == 0


def test_schema_documents_and_late_joiner_hold_nothing_back() -> None:
    group = DocumentGroup(["alice", "bob", "carol"], faults=LOSSY, seed=9)
    payloads, schema = group.docs["alice"].define_schema("note", "a note", {"text": "str"})
    for payload in payloads:
        group.publish("alice", payload)
    payload, note = group.docs["alice"].create(schema.id, {"text": "hello"})
    group.publish("alice", payload)
    assert group.run_until_converged(120_000)
    for name in ("bob", "carol"):
        view = group.docs[name].store.document(note.document_id)
        assert view is not None and view.fields == {"text": "hello"}
        assert group.docs[name].pending_count == 0
    assert not any(isinstance(e, OperationRejected) for ev in group.events.values() for e in ev)
