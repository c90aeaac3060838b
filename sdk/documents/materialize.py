"""Materialization: from a document's operation graph to its view, as p2panda-rs does it.

Theory of operation
-------------------
This module is the one place for the rules that turn a document's operations
into field values and a view id. Peers must agree on them byte for byte, so
they follow the code of the reference, p2panda-rs 0.8.1 (p2panda/p2panda at
commit 7dceb7b36f140ee6a6e7d0266480021a641bf19a, the last that holds
``p2panda-rs/``; paths below are under ``p2panda-rs/src``). Where that code
fails on a graph a peer can build, or where its result depends on the order
operations arrived in, we keep one deterministic rule of our own; each such
rule is marked **Ours** and the reference's behaviour is stated beside it.

Rule 1, the graph (``document/document.rs:255-289``, ``construct_graph``).
    Every operation is a node; each id in its ``previous`` is an edge from
    that operation to it. The CREATE is the only root.

Rule 2, the walk (``graph/graph.rs:243-264`` ``next``, ``:370-473``
``walk_from``). A stack (the reference's ``queue``) starts with the root.
Popping a node *places* it (appends it to the order, even if it was placed
before) and then walks on from it: the node's children not placed yet are
listed in id order; the smallest is walked to and the others are pushed so
that the largest is popped first. A child with one parent is placed and the
walk goes on from it. A child with several parents (a *merge*) ends this walk:
it is pushed if all its parents are placed, otherwise left to be reached again
from its last parent. Two quirks follow and are reproduced exactly:

* siblings pushed at a branch are pushed whatever they are, so a merge pushed
  as a sibling is placed when popped even if one of its parents is not placed
  yet (it can come before that parent);
* a node pushed twice (as a sibling and again through a child edge) is placed
  twice and applied twice (the second time re-applies its fields later).

Rule 3, the reducer (``document/document.rs:135-200`` ``combine``,
``document/traits.rs:68-132`` ``commit`` / ``commit_unchecked``). The first
placed operation (the CREATE) gives every field. Each later placement applies
its operation: an UPDATE overwrites the fields it names, a DELETE removes the
document's fields. ``commit`` falls back to ``commit_unchecked`` when
``previous`` is not the current view id (``document.rs:152-161``), so in a
walk only the order matters, never ``previous``.

Rule 4, the view id (``document/document.rs:303-315``,
``document/document_view_id.rs:50-60``). The sorted, de-duplicated ids of the
graph's tips (operations no other one builds on).

Rule 5, past views (``document/document.rs:244-252`` ``build_to_view_id``,
``graph/graph.rs:272-367`` ``trim``). The document as of a view id is
materialized from that view's operations and everything they transitively
build on (``trim`` keeps exactly those nodes and the edges among them), with
rules 2-4 unchanged.

Deviations (**Ours**), each tested in ``tests/documents/test_reference_order.py``:

* **Ours 1, walk failures.** The reference returns ``CycleDetected`` when a
  pop finds more placements than nodes (``graph.rs:389-391``), which the
  double placements of rule 2 cause in valid graphs (e.g. an operation whose
  ``previous`` names an ancestor of another of its ``previous``), and
  ``BadlyFormedGraph`` when a merge with unplaced parents is reached while the
  stack is empty (``graph.rs:438-442``). Hash-linked graphs have no cycles and
  the store holds every ``previous``, so both are valid graphs the reference
  cannot materialize. We then use the *clean walk*: the same depth-first walk,
  smaller id first, but every operation placed once and a merge only after all
  its parents. :attr:`DocumentView.deviation` says ``"walk"``.
* **Ours 2, DELETE.** The reference fails the whole build with
  ``UpdateOnDeleted`` (``traits.rs:85-87``) when anything is placed after a
  DELETE (a concurrent UPDATE walked later, or the DELETE placed twice); its
  publish check rejects any operation on a document once a DELETE of it is
  stored (``api/validation.rs:129-144``), so whether a concurrent UPDATE is
  kept depends on arrival order. We accept operations concurrent with a DELETE
  and a document with a DELETE anywhere in its (past) graph is deleted. Where
  the reference succeeds the DELETE is the last placement, so both agree.
  :attr:`DocumentView.deviation` says ``"delete"`` when the reference would
  have failed.
* **Ours 3, past views.** ``trim`` returns ``CycleDetected`` when its stack of
  merge parents outgrows the graph (``graph.rs:294-296``); we compute the
  ancestor set directly, so such views materialize too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from sdk.documents.errors import UsageError
from sdk.documents.operation import Action, FieldValue

#: Why a view differs from what p2panda-rs would do (``None``: it does not).
Deviation = Literal["walk", "delete"]


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One validated operation of a document, the unit materialization works on."""

    id: str
    document_id: str
    action: Action
    schema_id: str
    previous: tuple[str, ...] = ()
    fields: Mapping[str, FieldValue] | None = None
    author: str = ""


@dataclass(frozen=True, slots=True)
class DocumentView:
    """A document as of one view: its fields, or that it was deleted.

    ``deviation`` is ``None`` when p2panda-rs 0.8.1 builds the same view from
    these operations; otherwise it names the rule of ours used where the
    reference fails (``"walk"`` or ``"delete"``, see :mod:`.materialize`).
    """

    document_id: str
    schema_id: str
    view_id: tuple[str, ...]
    fields: Mapping[str, FieldValue] = field(default_factory=dict)
    deleted: bool = False
    operation_count: int = 0
    deviation: Deviation | None = None

    @property
    def view_id_str(self) -> str:
        """The view id in p2panda's string form: operation ids joined by ``_``."""
        return "_".join(self.view_id)


@dataclass(frozen=True, slots=True)
class Walk:
    """The result of ordering a document's operations (rules 2 and 4).

    ``placements`` lists operations in the order they are applied, an
    operation twice where the reference places it twice. ``reference`` is
    ``False`` when the reference's walk fails on this graph and the clean walk
    (Ours 1) gave the order. ``appendable`` is ``True`` when the reference's
    walk placed every operation once: then an operation whose ``previous`` are
    tips, the last placed operation among them, is placed right after it and
    nothing else changes (``graph.rs:411-449``), which lets the store append
    it in constant time.
    """

    placements: tuple[OperationRecord, ...]
    tips: tuple[str, ...]
    reference: bool
    appendable: bool


class _Graph:
    """Rule 1: positions, children in id order, parents, and the root."""

    __slots__ = ("children", "ops", "parents", "root")

    def __init__(self, operations: Iterable[OperationRecord], root_id: str | None) -> None:
        by_id: dict[str, OperationRecord] = {}
        for op in operations:
            by_id.setdefault(op.id, op)
        # Positions in id order: sorting children by position sorts them by id.
        self.ops = [by_id[k] for k in sorted(by_id)]
        index = {op.id: i for i, op in enumerate(self.ops)}
        self.children: list[list[int]] = [[] for _ in self.ops]
        self.parents: list[tuple[int, ...]] = [()] * len(self.ops)
        self.root = -1
        for i, op in enumerate(self.ops):
            if not op.previous or op.id == root_id:
                if self.root >= 0:
                    raise UsageError("a document graph has exactly one CREATE")
                self.root = i
                continue
            parents = []
            for parent_id in dict.fromkeys(op.previous):
                parent = index.get(parent_id)
                if parent is None:
                    raise UsageError(f"operation {op.id} builds on {parent_id}, which is not given")
                self.children[parent].append(i)
                parents.append(parent)
            self.parents[i] = tuple(parents)
        if self.ops and self.root < 0:
            raise UsageError("a document graph has exactly one CREATE")
        for kids in self.children:
            kids.sort()

    def tips(self) -> tuple[str, ...]:
        """Rule 4: the sorted ids of operations nothing builds on."""
        return tuple(op.id for i, op in enumerate(self.ops) if not self.children[i])


def _reference_walk(graph: _Graph) -> list[int] | None:
    """Rule 2, p2panda-rs ``Graph::walk_from`` (``graph.rs:370-473``); ``None`` where it fails."""
    n = len(graph.ops)
    children, parents = graph.children, graph.parents
    placed = [False] * n
    placements: list[int] = []
    stack = [graph.root]
    while stack:
        current = stack.pop()
        # graph.rs:389-391: more placements than nodes is taken for a cycle.
        if len(placements) > n:
            return None
        placed[current] = True
        placements.append(current)
        while True:
            # graph.rs:243-264: unplaced children, smallest walked, the rest stacked
            # so the largest pops first (graph.rs:416-423).
            kids = [k for k in children[current] if not placed[k]]
            if not kids:
                break
            walked = kids[0]
            stack.extend(kids[1:])
            if len(parents[walked]) > 1:
                # graph.rs:426-449: a merge is stacked once its parents are all
                # placed, else this walk ends; with an empty stack it is an error.
                if all(placed[p] for p in parents[walked]):
                    stack.append(walked)
                elif not stack:
                    return None
                break
            placed[walked] = True
            placements.append(walked)
            current = walked
    return placements


def _clean_walk(graph: _Graph) -> list[int]:
    """Ours 1: depth-first, smaller id first, each operation once, merges after all parents."""
    waiting = [len(p) for p in graph.parents]
    placements: list[int] = []
    stack = [graph.root]
    while stack:
        current = stack.pop()
        placements.append(current)
        ready = []
        for kid in graph.children[current]:
            waiting[kid] -= 1
            if waiting[kid] == 0:
                ready.append(kid)
        stack.extend(reversed(ready))
    if len(placements) != len(graph.ops):
        raise UsageError("the operation graph has a cycle or an unreachable part")
    return placements


def walk(operations: Iterable[OperationRecord], root_id: str | None = None) -> Walk:
    """Order a document's operations by rule 2 (or Ours 1 where the reference fails).

    ``root_id`` walks only the part of a graph that descends from that
    operation (its own ``previous`` ignored); every operation given must
    descend from it. Operations given twice count once. Raises
    :class:`UsageError` if the graph has no single root or refers to
    operations not given.
    """
    graph = _Graph(operations, root_id)
    if not graph.ops:
        return Walk((), (), True, False)
    positions = _reference_walk(graph)
    reference = positions is not None and len(set(positions)) == len(graph.ops)
    if not reference or positions is None:
        positions = _clean_walk(graph)
    return Walk(
        placements=tuple(graph.ops[i] for i in positions),
        tips=graph.tips(),
        reference=reference,
        appendable=reference and len(positions) == len(graph.ops),
    )


def topological_order(
    operations: Iterable[OperationRecord], root_id: str | None = None
) -> list[OperationRecord]:
    """Each operation once, in the order it is first applied (see :func:`walk`)."""
    seen: set[str] = set()
    order = []
    for op in walk(operations, root_id).placements:
        if op.id not in seen:
            seen.add(op.id)
            order.append(op)
    return order


def reduce(placements: Iterable[OperationRecord]) -> tuple[dict[str, FieldValue], bool, bool]:
    """Rule 3 and Ours 2: ``(fields, deleted, reference)`` after applying ``placements``.

    ``reference`` is ``False`` when p2panda-rs would fail with
    ``UpdateOnDeleted``: something is placed after a DELETE.
    """
    fields: dict[str, FieldValue] = {}
    deleted = False
    reference = True
    for op in placements:
        if deleted:
            # traits.rs:85-87: UpdateOnDeleted; Ours 2: stays deleted.
            reference = False
            continue
        if op.action is Action.DELETE:
            fields, deleted = {}, True
        elif op.fields:
            fields.update(op.fields)
    return fields, deleted, reference


def apply_in_order(order: list[OperationRecord]) -> tuple[dict[str, FieldValue], bool]:
    """Apply placed operations' fields by rule 3 / Ours 2; return ``(fields, deleted)``."""
    fields, deleted, _ = reduce(order)
    return fields, deleted


def ancestors(
    by_id: Mapping[str, OperationRecord], view_id: Iterable[str]
) -> dict[str, OperationRecord]:
    """Rule 5: the operations ``view_id`` transitively builds on, itself included."""
    found: dict[str, OperationRecord] = {}
    stack = list(view_id)
    while stack:
        op_id = stack.pop()
        if op_id in found:
            continue
        op = by_id.get(op_id)
        if op is None:
            raise UsageError(f"operation {op_id} is not part of this document")
        found[op_id] = op
        stack.extend(op.previous)
    return found


def graph_tips(operations: Mapping[str, OperationRecord]) -> tuple[str, ...]:
    """Rule 4: the sorted ids of operations no other given operation builds on."""
    referenced: set[str] = set()
    for op in operations.values():
        referenced.update(op.previous)
    return tuple(sorted(operations.keys() - referenced))


def view_of(walked: Walk) -> DocumentView:
    """The view rules 3 and 4 (and Ours 1-2 where the reference fails) give a walk."""
    if not walked.placements:
        raise UsageError("no operations to materialize")
    fields, deleted, reduced = reduce(walked.placements)
    deviation: Deviation | None = None
    if not walked.reference:
        deviation = "walk"
    elif not reduced:
        deviation = "delete"
    root = walked.placements[0]
    return DocumentView(
        document_id=root.id,
        schema_id=root.schema_id,
        view_id=walked.tips,
        fields=MappingProxyType(fields),
        deleted=deleted,
        operation_count=len({op.id for op in walked.placements}),
        deviation=deviation,
    )


def materialize(
    operations: Iterable[OperationRecord], up_to: Iterable[str] | None = None
) -> DocumentView:
    """Materialize a document from all its operations, or up to the view ``up_to``."""
    if up_to is not None:
        operations = ancestors({op.id: op for op in operations}, up_to).values()
    return view_of(walk(operations))


__all__ = [
    "Deviation",
    "DocumentView",
    "OperationRecord",
    "Walk",
    "ancestors",
    "apply_in_order",
    "graph_tips",
    "materialize",
    "reduce",
    "topological_order",
    "view_of",
    "walk",
]
