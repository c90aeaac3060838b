"""What one replication session has to send, planned in chunks and read as they go.

Sending entries streams: what a session has to send is queued as logs to send
(:class:`Todo`), cut on the store side into chunks of whole documents (in the order
``SyncStore.entries_for`` keeps across chunks, :func:`chunks`) and read
one chunk per :class:`~sdk.sync.session_state.Read` request
(:func:`sdk.sync.store_work.read_next`), so the peer gets the first entries at once
and the sender holds one chunk at a time. Everything above the peer's heights
(EmptySet, a Have) is not planned up front: a lazy plan (:class:`LazyPlan`) walks the
range indexes as chunks are asked for; a chunk's documents' other logs join it, and
the logs are cut into chunks the same way. Nothing here reads a store.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sdk.documents.schema import SYSTEM_SCHEMAS
from sdk.sync.messages import Message

LogKey = tuple[bytes, int]
#: Entries of a log to send: ``(author, log_id, after_seq, upto_seq)``.
Wanted = tuple[bytes, int, int, int]

#: Logs a lazy plan (:class:`LazyPlan`) takes from the range index at a time.
WALK_PAGE = 256


@dataclass(slots=True)
class LazyPlan:
    """A lazy plan: a session's logs above the peer's heights, planned as chunks are pulled.

    The logs are walked in key order through the session's range indexes, a page
    (:data:`WALK_PAGE` logs) at a time: first the system schemas' logs, then the
    application schemas'. A log counts as sent (``sent_upto``) once it is in a
    chunk, up to its height when its page was walked; a log the walk has not reached
    yet is taken at its height when it is reached, so entries stored meanwhile in
    those logs go with it.
    """

    #: What is left to walk, in order: ``(system schemas, their schema ids)``.
    phases: deque[tuple[bool, tuple[str, ...]]]
    #: The peer's heights (logs above them are sent).
    heights: dict[LogKey, int]
    #: Where the current phase goes on (``None``: its start).
    cursor: bytes | None = None
    #: Logs of the pages walked that are still to go in chunks, in order:
    #: ``(system, author, log_id, height)``.
    pending: deque[tuple[bool, bytes, int, int]] = field(default_factory=deque)

    @property
    def done(self) -> bool:
        """Every log was walked and went into a chunk."""
        return not self.phases and not self.pending


@dataclass(slots=True)
class Todo:
    """Entries ``after < seq_num <= upto`` of logs to send, not cut into chunks yet."""

    logs: dict[LogKey, tuple[int, int]]


class SendQueue:
    """One session's entries and messages to send, in order (see the module docstring)."""

    def __init__(self, chunk: int) -> None:
        #: Entries per chunk (one document's logs stay in one chunk).
        self.limit = max(1, chunk)
        #: Each log's highest entry queued (it counts as sent): a live push or a later
        #: difference does not queue it again.
        self.sent_upto: dict[LogKey, int] = {}
        #: In order: logs to send (cut into chunks when they are first read), chunks of
        #: logs to read and send, lazy plans that make such chunks as they are pulled,
        #: and messages that go after them.
        self.outbox: deque[Todo | list[Wanted] | LazyPlan | Message] = deque()

    def __bool__(self) -> bool:
        return bool(self.outbox)

    def then(self, message: Message) -> None:
        """Queue ``message`` after the entries queued so far."""
        self.outbox.append(message)

    def above(self, schema_ids: Sequence[str], heights: dict[LogKey, int]) -> None:
        """Queue the entries of our logs of ``schema_ids`` above the peer's ``heights``,
        as a :class:`LazyPlan`."""
        system = tuple(s for s in schema_ids if s in SYSTEM_SCHEMAS)
        other = tuple(s for s in schema_ids if s not in SYSTEM_SCHEMAS)
        phases = deque(phase for phase in ((True, system), (False, other)) if phase[1])
        self.outbox.append(LazyPlan(phases, heights))

    def entries(self, wanted: Iterable[Wanted]) -> None:
        """Queue entries ``after < seq_num <= upto`` of logs for the peer, as a :class:`Todo`
        (the store side cuts it into chunks)."""
        todo: dict[LogKey, tuple[int, int]] = {}
        for author, log_id, after, upto in wanted:
            log = (author, log_id)
            after = max(after, self.sent_upto.get(log, 0))
            if upto > after:
                low, high = todo.get(log, (after, upto))
                todo[log] = (min(low, after), max(high, upto))
        if todo:
            self.sent_upto.update((log, upto) for log, (_, upto) in todo.items())
            self.outbox.append(Todo(todo))


def chunks(
    todo: dict[LogKey, tuple[int, int]], documents: dict[LogKey, tuple[bool, str]], limit: int
) -> list[list[Wanted]]:
    """``todo`` in chunks of about ``limit`` entries, of whole documents, given the
    documents of its logs (``SyncStore.log_documents``, ``SyncStore.document_logs``).

    An operation's ``previous`` names operations of its own document, so
    ``SyncStore.entries_for`` orders each chunk as if it read everything at once;
    system-schema documents come first. A document with one log larger than a
    chunk is split along its log (each part after its backlinks); one with several
    logs stays whole.
    """
    # Sorted logs, each document's together where its first log is (dicts keep order).
    groups: dict[object, list[Wanted]] = {}
    for log, (after, upto) in sorted(todo.items()):
        key = documents[log][1] if log in documents else log
        groups.setdefault(key, []).append((*log, after, upto))
    system = {document for is_system, document in documents.values() if is_system}
    out: list[list[Wanted]] = [[]]
    size = 0
    # A stable sort: system documents first, each side in its order.
    for _, group in sorted(groups.items(), key=lambda item: item[0] not in system):
        parts = [group]
        if len(group) == 1 and group[0][3] - group[0][2] > limit:
            author, log_id, after, upto = group[0]
            parts = [
                [(author, log_id, low, min(low + limit, upto))] for low in range(after, upto, limit)
            ]
        for part in parts:
            count = sum([upto - after for _, _, after, upto in part])
            if out[-1] and size + count > limit:
                out.append([])
                size = 0
            out[-1].extend(part)
            size += count
    return out if out[-1] else []


__all__ = ["WALK_PAGE", "LazyPlan", "LogKey", "SendQueue", "Todo", "Wanted", "chunks"]
