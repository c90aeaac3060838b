"""Materialization: from a document's operation graph to its current view.

Theory of operation (p2panda specification, "Operation Graphs" and "Document
Views"):

* Every operation of a document is a node; its ``previous`` ids are edges to
  the operations it built on. The CREATE is the only root.
* The operations are put in one deterministic topological order: a depth-first
  walk from the CREATE in which, where the graph branches, the branch starting
  with the *smaller* operation id is walked first, and a merge (an operation
  with several previous) is only reached once all its previous are placed.
  The walk keeps a stack of operations whose previous are all placed; each
  time an operation is placed, the children it makes ready are pushed largest
  id first, so the smallest is walked next. It touches every operation and
  edge once (plus sorting siblings at branches): linear, never quadratic.
* Fields are applied in that order, each write replacing the last. So of two
  concurrent branches the one with the higher first operation id is applied
  later and wins writes to the same field, the same on every peer whatever
  order the operations arrived in.
* A DELETE ends the document: the view is ``deleted`` and keeps no fields.
* The view id is the sorted set of graph tips (operations nothing builds on
  yet). Materializing "up to" a view uses only the operations that view's
  operations transitively build on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sdk.documents.errors import UsageError
from sdk.documents.operation import Action, FieldValue


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
    """A document as of one view: its fields, or that it was deleted."""

    document_id: str
    schema_id: str
    view_id: tuple[str, ...]
    fields: Mapping[str, FieldValue] = field(default_factory=dict)
    deleted: bool = False
    operation_count: int = 0

    @property
    def view_id_str(self) -> str:
        """The view id in p2panda's string form: operation ids joined by ``_``."""
        return "_".join(self.view_id)


def topological_order(
    operations: Iterable[OperationRecord], root_id: str | None = None
) -> list[OperationRecord]:
    """Order a document's operations as described in the module docstring.

    ``root_id`` orders only the part of a graph that descends from that
    operation (which is then the root, its own previous ignored): every other
    operation given must descend from it. Raises :class:`UsageError` if the
    graph has no single root, refers to operations not given, or has a cycle
    (the store never builds such graphs; hash links make cycles impossible for
    signed entries).
    """
    return _order_and_tips(operations, root_id)[0]


def _order_and_tips(
    operations: Iterable[OperationRecord], root_id: str | None = None
) -> tuple[list[OperationRecord], tuple[str, ...]]:
    """The topological order and the sorted ids of the graph tips, in one pass."""
    ops = list(operations)
    # Work on list positions, not ids, and resolve each previous id in the same pass
    # that indexes the operations: with the usual causal input order the parent was
    # indexed moments ago and is still in cache (this keeps 100k-operation documents
    # close to linear). Parents not seen yet are resolved after the pass.
    index: dict[str, int] = {}
    # children[i]: None, one child position (the common case: no list allocated,
    # which keeps the garbage collector out of large documents), or a list at branches.
    children: list[int | list[int] | None] = [None] * len(ops)
    waiting = [0] * len(ops)
    later: list[tuple[int, str]] = []
    root = -1
    for i, op in enumerate(ops):
        if index.setdefault(op.id, i) != i:
            # The same operation given twice: drop duplicates and start over.
            return _order_and_tips({o.id: o for o in ops}.values(), root_id)
        previous = op.previous
        if not previous or op.id == root_id:
            if root >= 0:
                raise UsageError("a document graph has exactly one CREATE")
            root = i
            continue
        waiting[i] = len(previous)
        for parent_id in previous:
            parent = index.get(parent_id)
            if parent is None:
                later.append((i, parent_id))
                continue
            kids = children[parent]
            if kids is None:
                children[parent] = i
            elif type(kids) is int:
                children[parent] = [kids, i]
            else:
                kids.append(i)  # type: ignore[union-attr]
    for i, parent_id in later:
        parent = index.get(parent_id)
        if parent is None:
            raise UsageError(f"operation {ops[i].id} builds on {parent_id}, which is not given")
        kids = children[parent]
        if kids is None:
            children[parent] = i
        elif type(kids) is int:
            children[parent] = [kids, i]
        else:
            kids.append(i)  # type: ignore[union-attr]
    if root < 0:
        if not ops:
            return [], ()
        raise UsageError("a document graph has exactly one CREATE")
    order: list[OperationRecord] = []
    stack = [root]
    while stack:
        current = stack.pop()
        order.append(ops[current])
        kids = children[current]
        if kids is None:
            continue
        if type(kids) is int:
            left = waiting[kids] - 1
            waiting[kids] = left
            if left == 0:
                stack.append(kids)
            continue
        ready = []
        for kid in kids:  # type: ignore[union-attr]
            left = waiting[kid] - 1
            waiting[kid] = left
            if left == 0:
                ready.append(kid)
        if len(ready) == 1:
            stack.append(ready[0])
        elif ready:
            # Largest id on the stack first, so the smallest id is walked next.
            ready.sort(key=lambda k: ops[k].id, reverse=True)
            stack.extend(ready)
    if len(order) != len(ops):
        raise UsageError("the operation graph has a cycle or an unreachable part")
    tips = tuple(sorted(ops[i].id for i, kids in enumerate(children) if kids is None))
    return order, tips


def ancestors(
    by_id: Mapping[str, OperationRecord], view_id: Iterable[str]
) -> dict[str, OperationRecord]:
    """The operations ``view_id`` transitively builds on, itself included."""
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


def apply_in_order(order: list[OperationRecord]) -> tuple[dict[str, FieldValue], bool]:
    """Apply ordered operations' fields; return ``(fields, deleted)``."""
    fields: dict[str, FieldValue] = {}
    for op in order:
        if op.action is Action.DELETE:
            return {}, True
        if op.fields:
            fields.update(op.fields)
    return fields, False


def graph_tips(operations: Mapping[str, OperationRecord]) -> tuple[str, ...]:
    """The sorted ids of operations no other given operation builds on."""
    referenced: set[str] = set()
    for op in operations.values():
        referenced.update(op.previous)
    return tuple(sorted(operations.keys() - referenced))


def materialize(
    operations: Iterable[OperationRecord], up_to: Iterable[str] | None = None
) -> DocumentView:
    """Materialize a document from all its operations, or up to the view ``up_to``."""
    if up_to is not None:
        operations = ancestors({op.id: op for op in operations}, up_to).values()
    order, tips = _order_and_tips(operations)
    if not order:
        raise UsageError("no operations to materialize")
    fields, deleted = apply_in_order(order)
    root = order[0]
    return DocumentView(
        document_id=root.id,
        schema_id=root.schema_id,
        view_id=tips,
        fields=MappingProxyType(fields),
        deleted=deleted,
        operation_count=len(order),
    )


__all__ = [
    "DocumentView",
    "OperationRecord",
    "ancestors",
    "apply_in_order",
    "graph_tips",
    "materialize",
    "topological_order",
]
