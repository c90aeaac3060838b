"""Document events: what happened to a document, as small frozen dataclasses.

The store returns them from every accepted operation and the
:class:`~sdk.documents.channel.DocumentChannel` hands them to the app. An
operation that arrives for a document already deleted (it was concurrent with
the DELETE) is stored but changes nothing visible, so it yields no event.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdk.documents.errors import InvalidInput
from sdk.documents.materialize import DocumentView


@dataclass(frozen=True, slots=True)
class DocumentCreated:
    """A CREATE was accepted: a new document exists."""

    document_id: str
    operation_id: str
    author: str
    view: DocumentView


@dataclass(frozen=True, slots=True)
class DocumentUpdated:
    """An UPDATE (or a concurrent branch) changed the document's current view."""

    document_id: str
    operation_id: str
    author: str
    view: DocumentView


@dataclass(frozen=True, slots=True)
class DocumentDeleted:
    """A DELETE was accepted: the document has ended."""

    document_id: str
    operation_id: str
    author: str
    view: DocumentView


@dataclass(frozen=True, slots=True)
class OperationRejected:
    """Bytes from a peer broke a rule and were dropped; ``error.rule`` says which."""

    error: InvalidInput

    @property
    def rule(self) -> str:
        """The rule that failed (also the key of the channel's rejection counter)."""
        return self.error.rule


DocumentEvent = DocumentCreated | DocumentUpdated | DocumentDeleted | OperationRejected
"""Every event the document layer emits."""

__all__ = [
    "DocumentCreated",
    "DocumentDeleted",
    "DocumentEvent",
    "DocumentUpdated",
    "OperationRejected",
]
