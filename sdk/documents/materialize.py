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
listed in id order (ids compare as their lowercase hex strings:
``hash/hash.rs:31-32``, ``operation/operation_id.rs:16-17``); the smallest
is walked to and the others are pushed so that the largest is popped first.
A child with one parent is placed and the walk goes on from it. A child with
several parents (a *merge*) ends this walk: it is pushed if all its parents
are placed, otherwise left to be reached again from its last parent. Two
quirks follow and are reproduced exactly:

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

from bisect import insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from sdk.documents.errors import UsageError
from sdk.documents.operation import Action, FieldValue
from sdk.sds.records import fast_init

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


# Built once per stored entry: the faster constructor (sdk.sds.records).
fast_init(OperationRecord)


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


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """The walk's state right after placement ``k - 1``, before walking on from it.

    Adding an operation changes the walk only from the first placement of one
    of its parents on (only that parent's walk reaches it), so the walk of the
    grown graph resumes at the last checkpoint up to there.
    """

    k: int
    stack: tuple[str, ...]
    fields: dict[str, FieldValue]


class DocumentGraph:
    """A document's operation graph with its materialization, kept current as it grows.

    ``DocumentGraph(operations)`` walks and reduces once (rules 1-4, Ours 1-2);
    :meth:`add` adds one operation whose ``previous`` are all in the graph and
    re-walks only from the last checkpoint before the first placement of one
    of its parents: constant time for an operation built on the tips, one of
    them placed last; the operations walked since that point otherwise.
    """

    CHECKPOINT_EVERY = 8

    __slots__ = (
        "_checkpoints",
        "children",
        "deleted",
        "fields",
        "first",
        "ops",
        "placements",
        "reduced",
        "reference",
        "root",
        "tips",
    )

    def __init__(self, operations: Iterable[OperationRecord] = ()) -> None:
        self._build(operations)

    def _build(self, operations: Iterable[OperationRecord]) -> None:
        self.ops: dict[str, OperationRecord] = {}
        self.children: dict[str, list[str]] = {}
        self.root: str | None = None
        self.tips: set[str] = set()
        self.placements: list[str] = []
        self.first: dict[str, int] = {}
        self.fields: dict[str, FieldValue] = {}
        self.deleted = False
        self.reference = True
        self.reduced = True
        self._checkpoints: list[_Checkpoint] = []
        pending = []
        for op in operations:
            if op.id in self.ops:
                continue
            self.ops[op.id] = op
            if op.previous:
                pending.append(op)
            elif self.root is not None:
                raise UsageError("a document graph has exactly one CREATE")
            else:
                self.root = op.id
        for op in pending:
            self._link(op, sort=False)
        for kids in self.children.values():
            kids.sort()
        if self.ops and self.root is None:
            raise UsageError("a document graph has exactly one CREATE")
        if not pending and self.root is not None:
            # A lone CREATE: the walk places it and ends (what _walk_from(0) does).
            self.tips = {self.root}
            self._place(self.root, [])
            return
        referenced = {p for op in pending for p in op.previous}
        self.tips = set(self.ops) - referenced
        if self.ops:
            self._walk_from(0)

    def _link(self, op: OperationRecord, sort: bool = True) -> None:
        """Rule 1: an edge from each of ``previous`` to ``op``, children kept in id order."""
        previous = op.previous if len(op.previous) == 1 else dict.fromkeys(op.previous)
        for parent in previous:
            if parent not in self.ops or parent == op.id:
                raise UsageError(f"operation {op.id} builds on {parent}, which is not given")
            kids = self.children.get(parent)
            if kids is None:
                self.children[parent] = [op.id]
            elif sort:
                insort(kids, op.id)
            else:
                kids.append(op.id)

    def add(self, op: OperationRecord) -> None:
        """Add ``op`` (its ``previous`` all in the graph) and bring the view up to date."""
        if op.id in self.ops:
            return
        if not op.previous:
            if self.ops:
                raise UsageError("a document graph has exactly one CREATE")
            self._build((op,))
            return
        missing = [p for p in op.previous if p not in self.ops]
        if missing:
            raise UsageError(f"operation {op.id} builds on {missing[0]}, which is not given")
        self.ops[op.id] = op
        self._link(op)
        appended = (
            self.reference
            and not self.deleted
            and len(self.placements) == len(self.ops) - 1
            and self.placements[-1] in op.previous
            and self.tips.issuperset(op.previous)
        )
        self.tips.difference_update(op.previous)
        self.tips.add(op.id)
        if appended:
            # graph.rs:411-449: the last placement's walk reaches op (a merge is
            # stacked and popped at once) and the walk ends: op is placed last.
            self._place(op.id, [])
        elif self.reference and not self.deleted:
            self._walk_from(min(self.first[p] for p in op.previous) + 1)
        else:
            self._walk_from(0)

    def _place(self, op_id: str, stack: list[str]) -> None:
        """Append a placement and apply it (rule 3, Ours 2); checkpoint now and then."""
        k = len(self.placements)
        self.placements.append(op_id)
        first = self.first
        if op_id not in first:
            first[op_id] = k
        op = self.ops[op_id]
        if self.deleted:
            self.reduced = False  # traits.rs:85-87 UpdateOnDeleted
        elif op.action is Action.DELETE:
            self.fields, self.deleted = {}, True
        elif op.fields:
            self.fields.update(op.fields)
        if (k + 1) % self.CHECKPOINT_EVERY == 0 and not self.deleted:
            self._checkpoints.append(_Checkpoint(k + 1, tuple(stack), dict(self.fields)))

    def _walk_from(self, limit: int) -> None:
        """Walk again, resuming at the last checkpoint at or before placement ``limit``."""
        checkpoints = self._checkpoints
        while checkpoints and checkpoints[-1].k > limit:
            checkpoints.pop()
        self.deleted, self.reduced = False, True
        if checkpoints and limit > 0:
            cp = checkpoints[-1]
            # Forget what was placed from the checkpoint on: it is walked again.
            first = self.first
            for op_id in self.placements[cp.k :]:
                if first.get(op_id, -1) >= cp.k:
                    del first[op_id]
            del self.placements[cp.k :]
            self.fields = dict(cp.fields)
            ok = self._reference_walk(list(cp.stack), self.placements[-1])
        else:
            checkpoints.clear()
            self.first.clear()
            self.placements.clear()
            self.fields = {}
            assert self.root is not None
            ok = self._reference_walk([self.root], None)
        self.reference = ok and len(self.first) == len(self.ops)
        if not self.reference:
            self._clean_walk()

    def _reference_walk(self, stack: list[str], current: str | None) -> bool:
        """Rule 2, p2panda-rs ``Graph::walk_from`` (``graph.rs:370-473``); ``False`` where it fails.

        ``current`` is a node placed but not walked on from yet (a resumed walk).
        """
        n = len(self.ops)
        children, ops, placed, place = self.children, self.ops, self.first, self._place
        no_kids: list[str] = []
        while True:
            if current is None:
                if not stack:
                    return True
                current = stack.pop()
                # graph.rs:389-391: more placements than nodes is taken for a cycle.
                if len(self.placements) > n:
                    return False
                place(current, stack)
            while True:
                # graph.rs:243-264: unplaced children, smallest walked, the rest stacked
                # so the largest pops first (graph.rs:416-423).
                kids = [k for k in children.get(current, no_kids) if k not in placed]
                if not kids:
                    break
                walked = kids[0]
                stack.extend(kids[1:])
                parents = ops[walked].previous
                if len(parents) > 1:
                    # graph.rs:426-449: a merge is stacked once its parents are all
                    # placed, else this walk ends; with an empty stack it is an error.
                    if all(p in placed for p in parents):
                        stack.append(walked)
                    elif not stack:
                        return False
                    break
                place(walked, stack)
                current = walked
            current = None

    def _clean_walk(self) -> None:
        """Ours 1: depth-first, smaller id first, each operation once, merges after all parents."""
        waiting = {op_id: len(set(op.previous)) for op_id, op in self.ops.items()}
        self._checkpoints = []
        self.placements = []
        self.first = {}
        self.fields, self.deleted, self.reduced = {}, False, True
        assert self.root is not None
        stack = [self.root]
        while stack:
            current = stack.pop()
            self._place(current, stack)
            ready = []
            for kid in self.children.get(current, ()):
                waiting[kid] -= 1
                if waiting[kid] == 0:
                    ready.append(kid)
            stack.extend(reversed(ready))
        self._checkpoints = []
        if len(self.placements) != len(self.ops):
            raise UsageError("the operation graph has a cycle or an unreachable part")

    @property
    def deviation(self) -> Deviation | None:
        """Which of our rules gave the view where p2panda-rs fails, or ``None``."""
        if not self.reference:
            return "walk"
        return None if self.reduced else "delete"

    def walk(self) -> Walk:
        """The placements, tips and flags of the current walk."""
        return Walk(
            placements=tuple(self.ops[i] for i in self.placements),
            tips=tuple(sorted(self.tips)),
            reference=self.reference,
            appendable=self.reference and len(self.placements) == len(self.ops),
        )

    def view(self) -> DocumentView:
        """The current view (rules 3-4)."""
        if self.root is None:
            raise UsageError("no operations to materialize")
        root = self.ops[self.root]
        return DocumentView(
            document_id=root.id,
            schema_id=root.schema_id,
            view_id=tuple(sorted(self.tips)),
            fields=MappingProxyType(dict(self.fields)),
            deleted=self.deleted,
            operation_count=len(self.ops),
            deviation=self.deviation,
        )


def walk(operations: Iterable[OperationRecord], root_id: str | None = None) -> Walk:
    """Order a document's operations by rule 2 (or Ours 1 where the reference fails).

    ``root_id`` walks only the part of a graph that descends from that
    operation (its own ``previous`` ignored); every operation given must
    descend from it. Operations given twice count once. Raises
    :class:`UsageError` if the graph has no single root or refers to
    operations not given.
    """
    if root_id is not None:
        operations = [replace(op, previous=()) if op.id == root_id else op for op in operations]
    return DocumentGraph(operations).walk()


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
    return DocumentGraph(operations).view()


__all__ = [
    "Deviation",
    "DocumentGraph",
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
