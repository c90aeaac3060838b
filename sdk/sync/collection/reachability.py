"""Which documents a collection holds: the root and everything reachable from it.

A collection is the root and every document reachable from it through
``relation`` and ``relation_list`` fields, transitively; pinned relations name a
view, not a document, and documents the store lacks are skipped. A deleted
document belongs to it (its deletion is a state to sync) but has no fields to
follow. The walk is breadth-first in field-name order (deterministic) and stops
with :class:`SnapshotTooLarge` as soon as it would pass the limit.
"""

from __future__ import annotations

from collections.abc import Iterable

from sdk.documents.materialize import DocumentView
from sdk.documents.operation import Relation, RelationList
from sdk.documents.store import DocumentStore
from sdk.sync.collection.errors import SnapshotTooLarge


def related_documents(view: DocumentView) -> Iterable[str]:
    """The document ids ``view`` links to through relation and relation-list fields."""
    for name in sorted(view.fields):
        value = view.fields[name]
        if isinstance(value, Relation):
            yield value.document_id
        elif isinstance(value, RelationList):
            yield from value.document_ids


def reachable_documents(store: DocumentStore, root_id: str, limit: int) -> list[DocumentView]:
    """Current views of the collection of ``root_id``, root first (empty when the store
    lacks the root); see the module docstring."""
    root = store.document(root_id)
    if root is None:
        return []
    views, seen = [root], {root_id}
    for view in views:  # breadth-first: the walk appends what it finds to ``views``
        for document_id in related_documents(view):
            if document_id in seen:
                continue
            seen.add(document_id)
            linked = store.document(document_id)
            if linked is None:
                continue
            if len(views) >= limit:
                raise SnapshotTooLarge(
                    f"the collection of {root_id[:16]}… has more than {limit} documents"
                )
            views.append(linked)
    return views


__all__ = ["reachable_documents", "related_documents"]
