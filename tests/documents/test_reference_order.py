"""Materialization as p2panda-rs 0.8.1 does it, and our documented rules where it fails.

The expected orders are not produced by our code: the first block is copied
from p2panda-rs's own tests (``p2panda-rs/src/graph/graph.rs`` at commit
7dceb7b36f140ee6a6e7d0266480021a641bf19a: ``basics`` 544-630, ``has_cycle``
632-654, ``can_trim_graph`` 674-707, ``can_trim_more_complex_graph`` 709-782,
``poetic_graph`` 824-871); the others were traced by hand through
``Graph::walk_from`` (``graph.rs:370-473``) and ``next`` (``graph.rs:243-264``),
the trace written beside each.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.documents import (
    Action,
    DocumentStore,
    KeyPair,
    Operation,
    OperationRecord,
    UsageError,
    materialize,
    sign_entry,
)
from sdk.documents.materialize import DocumentGraph, ancestors, walk

from .helpers import TODO_SCHEMA, todo_fields


def graph(spec: dict[str, str], **writes: str) -> list[OperationRecord]:
    """Records from ``{id: previous ids}``; ``writes[id]`` sets field ``x`` (default: id)."""
    ops = []
    for op_id, previous in spec.items():
        action = Action.UPDATE if previous else Action.CREATE
        if writes.get(op_id) == "DELETE":
            ops.append(OperationRecord(op_id, "doc", Action.DELETE, "s", tuple(sorted(previous))))
            continue
        fields = {"x": writes.get(op_id, op_id)}
        ops.append(OperationRecord(op_id, "doc", action, "s", tuple(sorted(previous)), fields))
    return ops


def placements(ops: list[OperationRecord]) -> str:
    return "".join(op.id for op in walk(ops).placements)


# -- p2panda-rs's own graph tests ---------------------------------------------------------

BASICS_1 = {"a": "", "b": "a", "c": "b", "d": "c", "e": "d", "f": "e"}
BASICS_2 = {**BASICS_1, "g": "a", "h": "g", "d": "ch"}
#             /--[I]<--[J]<--[K]<--\
#  /--[B]<--[C]--\                  \
# [A]<--[G]<-----[H]<--[D]<--[E]<---[F]
BASICS_3 = {**BASICS_2, "i": "c", "j": "i", "k": "j", "f": "ek"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(BASICS_1, "abcdef"), (BASICS_2, "abcghdef"), (BASICS_3, "abcijkghdef")],
)
def test_reference_basics_and_poetic_graph(spec: dict[str, str], expected: str) -> None:
    ops = graph(spec)
    assert placements(ops) == expected
    assert placements(list(reversed(ops))) == expected
    assert materialize(ops).deviation is None


def test_reference_has_cycle_is_an_error() -> None:
    # a<-b<-c<-d<-b: signed entries cannot build this (hash links); a caller can.
    with pytest.raises(UsageError):
        walk(graph({"a": "", "b": "ad", "c": "b", "d": "c"}))


@pytest.mark.parametrize(
    ("spec", "tips", "expected"),
    [
        ({"a": "", "b": "a", "c": "b", "d": "c", "e": "c"}, "de", "abcde"),
        ({"a": "", "b": "a", "c": "b", "d": "c", "e": "c"}, "c", "abc"),
        ({"a": "", "b": "a", "c": "b", "d": "c", "e": "c"}, "e", "abce"),
        ({"a": "", "b": "a", "c": "b", "d": "c", "e": "c"}, "d", "abcd"),
        (BASICS_3, "k", "abcijk"),
        (BASICS_3, "ke", "abcijkghde"),
        (BASICS_3, "f", "abcijkghdef"),
        (BASICS_3, "kg", "abcijkg"),
        # "many tips passed, all in the same branch" (graph.rs:773-781)
        (BASICS_3, "abcj", "abcij"),
    ],
)
def test_reference_trim_is_a_past_view(spec: dict[str, str], tips: str, expected: str) -> None:
    ops = graph(spec)
    kept = ancestors({op.id: op for op in ops}, tips).values()
    assert placements(list(kept)) == expected
    view = materialize(ops, up_to=tuple(tips))
    # The view id of a past view is the tips of the trimmed graph (document.rs:303-315).
    assert view.view_id == tuple(sorted(set(expected) - {p for o in kept for p in o.previous}))
    assert view.fields == {"x": expected[-1]}


# -- hand-traced orders -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # 2-way: a's children [b, c]: b walked, c stacked.
        ({"a": "", "b": "a", "c": "a"}, "abc"),
        # 3-way: b walked, c and d stacked so d pops first.
        ({"a": "", "b": "a", "c": "a", "d": "a"}, "abdc"),
        # 4-way: b walked; e, d, c pop in that order.
        ({"a": "", "b": "a", "c": "a", "d": "a", "e": "a"}, "abedc"),
        # Branches with depth: b walked to c; f pops, then d walked to e.
        ({"a": "", "b": "a", "c": "b", "d": "a", "e": "d", "f": "a"}, "abcfde"),
        # Merge beside a sibling: a's children [b, c, m]: b walked, c and m stacked;
        # b's child m has both parents placed, stacked again; m pops twice, then c.
        ({"a": "", "b": "a", "c": "a", "m": "ab"}, "abmmc"),
        # Merge placed before its parent: m (of a and y) stacked as a's child is
        # placed when popped although y is not placed yet (graph.rs:420-423).
        ({"a": "", "b": "a", "c": "a", "y": "c", "m": "ay"}, "abmcy"),
        # Late merge: b walked to d; d's child m waits for e (stack not empty);
        # e pops, m has its parents placed, is stacked and pops.
        ({"a": "", "b": "a", "c": "b", "d": "c", "e": "a", "m": "de"}, "abcdem"),
        # An operation placed twice around another: a's children [b, d, e]: b walked,
        # d, e stacked; b's children [c, d]: c walked, d stacked again; d, e, d pop.
        ({"a": "", "b": "a", "c": "b", "d": "ab", "e": "a"}, "abcded"),
    ],
)
def test_hand_traced_orders(spec: dict[str, str], expected: str) -> None:
    ops = graph(spec)
    assert placements(ops) == expected
    view = materialize(ops)
    assert view.deviation is None
    # Fields: the last placement's write wins.
    assert view.fields == {"x": expected[-1]}


def test_twelve_node_graph() -> None:
    spec = {
        "a": "",
        "b": "a",
        "c": "a",
        "d": "a",
        "e": "b",
        "f": "c",
        "g": "ef",
        "h": "d",
        "i": "gh",
        "j": "c",
        "k": "i",
        "l": "j",
    }
    # a's children [b, c, d]: b walked, c and d stacked (d on top). b walked to e;
    # e's child g waits for f. d pops, walked to h; h's child i waits for g. c pops:
    # children [f, j]: f walked, j stacked; f's child g is ready: stacked, pops;
    # g's child i is ready: stacked, pops, walked to k. j pops, walked to l.
    assert placements(graph(spec)) == "abedhcfgikjl"
    assert materialize(graph(spec)).view_id == ("k", "l")


def test_issue_repro_three_concurrent_updates_end_at_the_middle_one() -> None:
    # CREATE and three concurrent UPDATEs of one field, B1 < B2 < B3 by id.
    ops = graph({"a": "", "b1": "a", "b2": "a", "b3": "a"})
    assert placements(ops) == "ab1b3b2"
    assert materialize(ops).fields == {"x": "b2"}


def test_issue_repro_with_signed_operations(store: DocumentStore) -> None:
    authors = [KeyPair.from_private_key(bytes([i]) * 32) for i in (3, 4, 5)]
    created = store.create(authors[0], TODO_SCHEMA.id, todo_fields("start"))
    doc = created.document_id
    titles = {}
    for i, key in enumerate(authors):
        published = store.update(key, doc, {"title": f"by {i}"}, (created.operation_id,))
        titles[published.operation_id] = f"by {i}"
    b1, b2, b3 = sorted(titles)
    view = store.document(doc)
    assert view is not None
    assert view.fields["title"] == titles[b2]
    assert view.view_id == (b1, b2, b3)
    # Another peer receiving them in any order agrees.
    for seed in range(4):
        other = DocumentStore()
        other.add_schema(TODO_SCHEMA)
        rows = store._db.execute("SELECT entry, payload FROM entries").fetchall()
        rows.sort(key=lambda r: r[0] != created.entry)  # the CREATE first, the rest shuffled
        tail = rows[1:]
        random.Random(seed).shuffle(tail)
        for entry, payload in [rows[0], *tail]:
            other.ingest(entry, payload)
        assert other.document(doc) == view


# -- deviations: where p2panda-rs fails ---------------------------------------------------


def test_ours_1_previous_naming_an_ancestor_of_another_previous() -> None:
    # s and j both build on a and on a's parent c. Reference trace: c's children
    # [a, j, s]: a walked, j and s stacked; a's children [j, s]: j walked, s stacked;
    # j is ready, stacked. Pops: j, s, s, then j with 5 placements > 4 nodes:
    # CycleDetected (graph.rs:389-391). Ours: the clean walk, each once.
    ops = graph({"c": "", "a": "c", "s": "ac", "j": "ac"})
    walked = walk(ops)
    assert not walked.reference
    assert "".join(op.id for op in walked.placements) == "cajs"
    view = materialize(ops)
    assert view.deviation == "walk"
    assert view.fields == {"x": "s"} and view.view_id == ("j", "s")


def test_ours_2_update_walked_after_a_delete() -> None:
    # b (DELETE) is walked before c (UPDATE): the reference fails with
    # UpdateOnDeleted (traits.rs:85-87). Ours: deleted.
    ops = graph({"a": "", "b": "a", "c": "a"}, b="DELETE")
    view = materialize(ops)
    assert view.deleted and view.fields == {} and view.deviation == "delete"
    assert view.view_id == ("b", "c")
    # The DELETE walked last: the reference deletes too, no deviation.
    ops = graph({"a": "", "b": "a", "c": "a"}, c="DELETE")
    view = materialize(ops)
    assert view.deleted and view.deviation is None
    # A past view before the DELETE is not deleted.
    assert materialize(ops, up_to=("b",)).fields == {"x": "b"}


def test_ours_2_update_concurrent_with_delete_in_either_arrival_order(
    alice: KeyPair, bob: KeyPair
) -> None:
    # p2panda-rs rejects bob's UPDATE only when the DELETE arrived first
    # (api/validation.rs:129-144). We accept it in both orders: same operations, same view.
    origin = DocumentStore()
    origin.add_schema(TODO_SCHEMA)
    created = origin.create(alice, TODO_SCHEMA.id, todo_fields())
    update = Operation(
        Action.UPDATE, TODO_SCHEMA.id, (created.operation_id,), {"title": "concurrent"}
    )
    entry = sign_entry(bob, 0, 1, _encode(update))
    deleted = origin.delete(alice, created.document_id)
    stores = []
    for late_update in (False, True):
        store = DocumentStore()
        store.add_schema(TODO_SCHEMA)
        store.ingest(created.entry, created.operation)
        if not late_update:
            store.ingest(entry.encoded, _encode(update))
        store.ingest(deleted.entry, deleted.operation)
        if late_update:
            store.ingest(entry.encoded, _encode(update))
        stores.append(store)
    first, second = (s.document(created.document_id) for s in stores)
    assert first == second
    assert first is not None and first.deleted and first.operation_count == 3


def _encode(operation: Operation) -> bytes:
    from sdk.documents import encode_operation

    return encode_operation(operation)


# -- properties ---------------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn, antichain: bool = False) -> list[OperationRecord]:
    """A random document graph; with ``antichain``, previous never names an ancestor of another."""
    n = draw(st.integers(1, 14))
    names = draw(st.permutations([f"{i:02x}" for i in range(40)]))[:n]
    ops = [OperationRecord(names[0], "doc", Action.CREATE, "s", (), {"x": names[0]})]
    anc: dict[str, set[str]] = {names[0]: {names[0]}}
    for i in range(1, n):
        previous = set(draw(st.lists(st.sampled_from(names[:i]), min_size=1, max_size=3)))
        if antichain:
            previous = {p for p in previous if not any(p in anc[q] - {q} for q in previous)}
        anc[names[i]] = {names[i]}.union(*(anc[p] for p in previous))
        write = draw(st.sampled_from(["x", "y", "DELETE"] if i > 2 else ["x", "y"]))
        if write == "DELETE" and draw(st.integers(0, 4)) == 0:
            ops.append(
                OperationRecord(names[i], "doc", Action.DELETE, "s", tuple(sorted(previous)))
            )
            continue
        fields = {"x" if write == "DELETE" else write: names[i]}
        ops.append(
            OperationRecord(names[i], "doc", Action.UPDATE, "s", tuple(sorted(previous)), fields)
        )
    return ops


@settings(max_examples=300, deadline=None)
@given(dags(), st.randoms(use_true_random=False))
def test_any_arrival_order_gives_the_same_walk_and_view(
    ops: list[OperationRecord], rng: random.Random
) -> None:
    shuffled = list(ops)
    rng.shuffle(shuffled)
    assert walk(shuffled) == walk(ops)
    assert materialize(shuffled) == materialize(ops)
    tip = rng.choice(ops).id
    assert materialize(shuffled, up_to=(tip,)) == materialize(ops, up_to=(tip,))


@settings(max_examples=300, deadline=None)
@given(dags(antichain=True))
def test_graphs_built_on_views_never_need_our_walk(ops: list[OperationRecord]) -> None:
    # Clients build on a view id (the tips), which never names an ancestor of
    # another previous: the reference's walk succeeds on all of these.
    assert walk(ops).reference


@settings(max_examples=300, deadline=None)
@given(dags(), st.integers(1, 4), st.randoms(use_true_random=False))
def test_growing_graph_resumes_to_the_same_walk_as_a_fresh_one(
    ops: list[OperationRecord], every: int, rng: random.Random
) -> None:
    # Operations arrive in a random causal order; after each, the resumed walk
    # (from a checkpoint, or appended) equals a walk of all operations so far.
    class Small(DocumentGraph):
        CHECKPOINT_EVERY = every

    by_id = {op.id: op for op in ops}
    waiting = {op.id: set(op.previous) for op in ops}
    ready = [op.id for op in ops if not op.previous]
    grown = Small()
    arrived: list[OperationRecord] = []
    while ready:
        op = by_id[ready.pop(rng.randrange(len(ready)))]
        arrived.append(op)
        if grown.root is None:
            grown = Small(arrived)
        else:
            grown.add(op)
        fresh = DocumentGraph(arrived)
        assert grown.walk() == fresh.walk()
        assert grown.view() == fresh.view()
        for other in ops:
            if op.id in waiting[other.id]:
                waiting[other.id].discard(op.id)
                if not waiting[other.id]:
                    ready.append(other.id)
    assert len(arrived) == len(ops)


def test_past_views_of_a_stored_document_are_the_references(store: DocumentStore) -> None:
    # build_to_view_id (document.rs:244-252): trim to the view, then walk and reduce.
    authors = [KeyPair.from_private_key(bytes([i]) * 32) for i in (6, 7, 8)]
    created = store.create(authors[0], TODO_SCHEMA.id, todo_fields("start"))
    doc = created.document_id
    titles = {}
    for i, key in enumerate(authors):
        published = store.update(key, doc, {"title": f"by {i}"}, (created.operation_id,))
        titles[published.operation_id] = f"by {i}"
    b1, b2, b3 = sorted(titles)
    # Two of the three branches: the larger is walked last and wins.
    for view_id, winner in (((b1, b2), b2), ((b1, b3), b3), ((b2, b3), b3), ((b1,), b1)):
        view = store.view(doc, view_id)
        assert view.view_id == view_id and view.fields["title"] == titles[winner]
        assert view.deviation is None
    assert store.view(doc, (created.operation_id,)).fields["title"] == "start"
    assert store.view(doc, (b1, b2, b3)) == store.document(doc)


def test_document_graph_add_checks_before_changing_anything() -> None:
    graph_ = DocumentGraph()
    graph_.add(graph({"a": ""})[0])
    before = graph_.view()
    with pytest.raises(UsageError):
        graph_.add(OperationRecord("c", "doc", Action.UPDATE, "s", ("zz",), {"x": "c"}))
    with pytest.raises(UsageError):
        graph_.add(OperationRecord("d", "doc", Action.CREATE, "s", (), {"x": "d"}))
    assert graph_.view() == before and set(graph_.ops) == {"a"}
    graph_.add(OperationRecord("b", "doc", Action.UPDATE, "s", ("a",), {"x": "b"}))
    assert graph_.view().fields == {"x": "b"}


def _reference_trim_fails(ops: list[OperationRecord], tips: tuple[str, ...]) -> bool:
    """The queue of p2panda-rs ``Graph::trim`` (graph.rs:284-341): True if it reports a cycle."""
    by_id = {op.id: op for op in ops}
    queue = list(tips)
    while queue:
        current = by_id[queue.pop()]
        while current.previous:
            if len(queue) > len(by_id):  # graph.rs:294-296
                return True
            if len(current.previous) > 1:
                queue.extend(current.previous)
                break
            current = by_id[current.previous[0]]
    return False


def test_ours_3_past_view_that_trim_cannot_build() -> None:
    # Merges that each name the previous merge and all of b1..b4 (its ancestors).
    # trim pops the largest parent first (the merge), so its queue grows by four
    # per merge and outgrows the 11 nodes: CycleDetected (graph.rs:294-296).
    branches = tuple(f"b{i}" for i in range(1, 5))
    prev_of: dict[str, tuple[str, ...]] = {"a": ()}
    prev_of.update({b: ("a",) for b in branches})
    last: tuple[str, ...] = branches
    for level in range(1, 7):
        prev_of[f"m{level}"] = tuple(sorted(last))
        last = (f"m{level}", *branches)
    ops = [
        OperationRecord(k, "doc", Action.UPDATE if p else Action.CREATE, "s", p, {"x": k})
        for k, p in prev_of.items()
    ]
    assert _reference_trim_fails(ops, ("m6",))
    view = materialize(ops, up_to=("m6",))
    assert view == materialize(ops)  # m6 builds on everything
    assert view.view_id == ("m6",)
    # A smaller past view that trim can build gives the reference's result.
    assert not _reference_trim_fails(ops, ("m1",))
    assert materialize(ops, up_to=("m1",)).fields == {"x": "m1"}


def _literal_walk_from(ops: list[OperationRecord]) -> list[str] | None:
    """graph.rs:243-264 and 370-473 statement by statement (vectors, not sets); None on Err."""
    nodes = {op.id: op for op in ops}
    nexts: dict[str, list[str]] = {op.id: [] for op in ops}
    for op in ops:  # construct_graph: add_link(previous, id), document.rs:277-286
        for previous in op.previous:
            nexts[previous].append(op.id)

    def next_(sorted_nodes: list[str], node: str) -> list[str] | None:
        next_nodes = [k for k in nexts[node] if not any(s == k for s in sorted_nodes)]
        if not next_nodes:
            return None
        next_nodes.sort()
        next_nodes.reverse()
        return next_nodes

    root = next(op.id for op in ops if not op.previous)
    queue = [root]
    sorted_nodes: list[str] = []
    while queue:
        current = queue.pop()
        if len(sorted_nodes) > len(nodes):
            return None  # CycleDetected
        sorted_nodes.append(current)
        while (next_nodes := next_(sorted_nodes, current)) is not None:
            next_node = next_nodes.pop()
            while next_nodes:
                queue.append(next_nodes.pop())
            if len(nodes[next_node].previous) > 1:
                if all(p in sorted_nodes for p in nodes[next_node].previous):
                    queue.append(next_node)
                    break
                if not queue:
                    return None  # BadlyFormedGraph
                break
            sorted_nodes.append(next_node)
            current = next_node
    return sorted_nodes


@settings(max_examples=400, deadline=None)
@given(dags())
def test_walk_equals_a_literal_transliteration_of_walk_from(ops: list[OperationRecord]) -> None:
    literal = _literal_walk_from(ops)
    walked = walk(ops)
    assert walked.reference == (literal is not None)
    if literal is not None:
        assert [op.id for op in walked.placements] == literal
