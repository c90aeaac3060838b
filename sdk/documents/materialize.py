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


def topological_order(operations: Iterable[OperationRecord]) -> list[OperationRecord]:
    """Order a document's operations as described in the module docstring.

    Raises :class:`UsageError` if the graph has no single CREATE root, refers
    to operations not given, or has a cycle (the store never builds such graphs;
    hash links make cycles impossible for signed entries).
    """
    by_id: dict[str, OperationRecord] = {}
    for op in operations:
        by_id[op.id] = op
    children: dict[str, list[str]] = {}
    waiting: dict[str, int] = {}
    root: str | None = None
    for op in by_id.values():
        if not op.previous:
            if root is not None:
                raise UsageError("a document graph has exactly one CREATE")
            root = op.id
            continue
        waiting[op.id] = len(op.previous)
        for parent in op.previous:
            if parent not in by_id:
                raise UsageError(f"operation {op.id} builds on {parent}, which is not given")
            kids = children.get(parent)
            if kids is None:
                children[parent] = [op.id]
            else:
                kids.append(op.id)
    if root is None:
        if not by_id:
            return []
        raise UsageError("a document graph has exactly one CREATE")
    order: list[OperationRecord] = []
    stack = [root]
    while stack:
        current = stack.pop()
        order.append(by_id[current])
        kids = children.get(current)
        if not kids:
            continue
        ready = []
        for kid in kids:
            left = waiting[kid] - 1
            waiting[kid] = left
            if left == 0:
                ready.append(kid)
        if len(ready) == 1:
            stack.append(ready[0])
        elif ready:
            # Largest on the stack first, so the smallest id is walked next.
            ready.sort(reverse=True)
            stack.extend(ready)
    if len(order) != len(by_id):
        raise UsageError("the operation graph has a cycle or an unreachable part")
    return order


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
    by_id = {op.id: op for op in operations}
    if up_to is not None:
        by_id = ancestors(by_id, up_to)
    if not by_id:
        raise UsageError("no operations to materialize")
    order = topological_order(by_id.values())
    fields, deleted = apply_in_order(order)
    root = order[0]
    return DocumentView(
        document_id=root.id,
        schema_id=root.schema_id,
        view_id=graph_tips(by_id),
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
