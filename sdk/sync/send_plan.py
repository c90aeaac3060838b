"""What one replication session has to send, planned in chunks and read as they go.

Sending entries streams: what a session has to send is queued as chunks of logs
(whole documents, in the order :meth:`SyncStore.entries_for` keeps across chunks)
and read from the store one chunk per call of :meth:`SendQueue.next`, so the peer
gets the first entries at once and the sender holds one chunk at a time. A log
counts as sent (:attr:`SendQueue.sent_upto`) once queued. Everything above the
peer's heights (EmptySet, a Have) is not planned up front: a lazy plan
(:class:`LazyPlan`) walks the range indexes a page of logs at a time as chunks are
asked for, and a chunk's documents' other logs join it as it is read. Messages
queued with :meth:`SendQueue.then` go after the entries queued before them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice

from sdk.documents.schema import SYSTEM_SCHEMAS
from sdk.sync import rbsr
from sdk.sync.messages import LOG_PREFIX_SIZE, PUBLIC_KEY_SIZE, Message
from sdk.sync.store import EntryToSend, SyncStore

LogKey = tuple[bytes, int]
#: Entries of a log to send: ``(author, log_id, after_seq, upto_seq)``.
Wanted = tuple[bytes, int, int, int]

#: Logs a lazy plan (:class:`LazyPlan`) takes from the range index at a time.
WALK_PAGE = 256
#: After a range index key's log prefix: sorts after every key of that log and before
#: the next log's keys.
_PAST_LOG = b"\xff" * 8 + b"\x00"


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

    #: What is left to walk, in order: ``(system schemas, their logs)``.
    phases: deque[tuple[bool, rbsr.RangeSource]]
    #: The peer's heights (logs above them are sent).
    heights: dict[LogKey, int]
    #: Where the current phase goes on (``None``: its start).
    cursor: bytes | None = None
    #: Logs of the pages walked that are still to go in chunks, in order:
    #: ``(system, author, log_id, height)``.
    pending: deque[tuple[bool, bytes, int, int]] = field(default_factory=deque)
    #: A log longer than a chunk whose document has no other log to send: sent in parts.
    long_log: LogKey | None = None

    @property
    def done(self) -> bool:
        """Every log was walked and went into a chunk."""
        return not self.phases and not self.pending


def logs_of(store: SyncStore, schema_ids: Sequence[str]) -> rbsr.RangeSource:
    """The range index of the schemas' logs (one key per log, in key order)."""
    if len(schema_ids) == 1:
        return store.index(schema_ids[0])
    return store.sync_range(schema_ids)


class SendQueue:
    """One session's entries and messages to send, in order (see the module docstring)."""

    def __init__(self, store: SyncStore, chunk: int) -> None:
        self.store = store
        #: Entries per chunk (one document's logs stay in one chunk).
        self.limit = max(1, chunk)
        #: Each log's highest entry queued: a live push or a later difference does not
        #: queue it again.
        self.sent_upto: dict[LogKey, int] = {}
        #: In order: chunks of logs to read and send, lazy plans that make such chunks
        #: as they are pulled, and messages that go after them.
        self.outbox: deque[list[Wanted] | LazyPlan | Message] = deque()

    def __bool__(self) -> bool:
        return bool(self.outbox)

    def then(self, message: Message) -> None:
        """Queue ``message`` after the entries queued so far."""
        self.outbox.append(message)

    def above(self, schema_ids: Sequence[str], heights: dict[LogKey, int]) -> None:
        """Queue the entries of our logs of ``schema_ids`` above the peer's ``heights``,
        planned lazily (:class:`LazyPlan`): the first chunk is read at once, the next logs
        only as the chunks before them go."""
        phases: deque[tuple[bool, rbsr.RangeSource]] = deque()
        for is_system in (True, False):
            ids = [s for s in schema_ids if (s in SYSTEM_SCHEMAS) is is_system]
            if ids:
                phases.append((is_system, logs_of(self.store, ids)))
        self.outbox.append(LazyPlan(phases, heights))

    def entries(self, wanted: Iterable[Wanted]) -> None:
        """Queue entries ``after < seq_num <= upto`` of logs for the peer, in chunks.

        Nothing is read yet (:meth:`next` reads a chunk). A chunk holds whole
        documents: an operation's ``previous`` names operations of its own document,
        so :meth:`SyncStore.entries_for` orders each chunk as if it read everything at
        once; system-schema documents come first. A document with one log larger than
        a chunk is split along its log (each part after its backlinks); one with
        several logs stays whole.
        """
        todo: dict[LogKey, tuple[int, int]] = {}
        for author, log_id, after, upto in wanted:
            log = (author, log_id)
            after = max(after, self.sent_upto.get(log, 0))
            if upto > after:
                low, high = todo.get(log, (after, upto))
                todo[log] = (min(low, after), max(high, upto))
        if not todo:
            return
        for log, (_, upto) in todo.items():
            self.sent_upto[log] = upto
        documents = self.store.log_documents(todo) if len(todo) > 1 else {}
        # Sorted logs, each document's together where its first log is (dicts keep order).
        groups: dict[object, list[Wanted]] = {}
        for log in sorted(todo):
            after, upto = todo[log]
            document = documents.get(log)
            key = log if document is None else document[1]
            groups.setdefault(key, []).append((log[0], log[1], after, upto))
        system = {document for is_system, document in documents.values() if is_system}
        ordered = [group for key, group in groups.items() if key in system]
        ordered += [group for key, group in groups.items() if key not in system]
        chunk: list[Wanted] = []
        size = 0
        for group in ordered:
            for count, part in _parts(group, self.limit):
                if chunk and size + count > self.limit:
                    self.outbox.append(chunk)
                    chunk, size = [], 0
                chunk.extend(part)
                size += count
        if chunk:
            self.outbox.append(chunk)

    def next(self) -> tuple[list[EntryToSend] | Message | None, int]:
        """The next item: a chunk's entries read from the store (maybe none) or a message;
        and how many logs a lazy plan walked to make it. ``None``: a lazy plan walked its
        share without making a chunk (it goes on at the next call)."""
        item = self.outbox[0]
        if not isinstance(item, LazyPlan):
            self.outbox.popleft()
            return (self.store.entries_for(item) if isinstance(item, list) else item), 0
        # A walk's chunk is of system schemas or of application ones, not both.
        chunk, walked, grouped = self._walk_chunk(item)
        if item.done:
            self.outbox.popleft()
        if not chunk:
            return (None if not item.done else []), walked
        if not grouped:
            return self.store.entries_for(chunk, same_kind=True), walked
        logs = {(author, log_id) for author, log_id, _, _ in chunk}
        return self.store.entries_for(
            chunk,
            same_kind=True,
            documents=lambda documents: self._document_rest(item, documents, logs),
        ), walked

    def _walk_chunk(self, walk: LazyPlan) -> tuple[list[Wanted], int, bool]:
        """The next chunk of a lazy plan: its logs, how many logs were walked to make it,
        and whether its documents' other logs are still to be looked for.

        Each log goes in whole, a log longer than a chunk alone: in parts along it if its
        document has no other log to send, else whole with the others. The other logs
        of a document join it when the chunk is read. A chunk holds system-schema logs
        or application ones, not both. At most ``16 * limit`` logs are walked per
        call: the chunk may come back empty with the walk not done.
        """
        limit = self.limit
        heights, sent_upto, pending = walk.heights, self.sent_upto, walk.pending
        chunk: list[Wanted] = []
        size = walked = 0
        system = False
        while True:
            if pending:
                log_system, author, log_id, upto = pending[0]
                log = (author, log_id)
                after = max(heights.get(log, 0), sent_upto.get(log, 0))
                count = upto - after
                if count <= 0:
                    pending.popleft()
                    continue
                if chunk and (size + count > limit or log_system is not system):
                    break
                if count > limit:
                    return self._long_chunk(walk, log, after, upto), walked, False
                pending.popleft()
                sent_upto[log] = upto
                chunk.append((author, log_id, after, upto))
                size += count
                system = log_system
                continue
            if size >= limit or not walk.phases or walked >= 16 * limit:
                break
            walked += self._walk_page(walk)
        return chunk, walked, True

    def _long_chunk(self, walk: LazyPlan, log: LogKey, after: int, upto: int) -> list[Wanted]:
        """The chunk of a log longer than a chunk (the head of ``walk.pending``): its next
        part, or the whole document when it has other logs to send."""
        if walk.long_log != log:
            _, others = self.store.document_logs({log: upto})
            chunk = self._document_rest(walk, others, {log})
            if chunk:
                walk.pending.popleft()
                self.sent_upto[log] = upto
                return [(log[0], log[1], after, upto), *chunk]
            walk.long_log = log
        high = min(after + self.limit, upto)
        self.sent_upto[log] = high
        if high == upto:
            walk.pending.popleft()
            walk.long_log = None
        return [(log[0], log[1], after, high)]

    def _document_rest(
        self, walk: LazyPlan, documents: dict[str, dict[LogKey, int]], chunk: set[LogKey]
    ) -> list[Wanted]:
        """Of the logs of ``documents`` (with our heights), those not in ``chunk`` that
        the peer lacks: they go with the chunk (counted as sent)."""
        heights, sent_upto = walk.heights, self.sent_upto
        rest: list[Wanted] = []
        for logs in documents.values():
            for log, height in sorted(logs.items()):
                if log in chunk:
                    continue
                low = max(heights.get(log, 0), sent_upto.get(log, 0))
                if height > low:
                    rest.append((log[0], log[1], low, height))
                    sent_upto[log] = height
        return rest

    def _walk_page(self, walk: LazyPlan) -> int:
        """LazyPlan the next page of logs of a lazy plan into ``walk.pending`` (those with
        entries the peer lacks); return how many logs were walked."""
        system, source = walk.phases[0]
        keys = list(islice(source.keys_in(walk.cursor, None), WALK_PAGE))
        if len(keys) < WALK_PAGE:
            walk.phases.popleft()
            walk.cursor = None
        else:
            walk.cursor = keys[-1][:LOG_PREFIX_SIZE] + _PAST_LOG
        heights, sent_upto, pending = walk.heights, self.sent_upto, walk.pending
        from_bytes = int.from_bytes
        for key in keys:
            # key_item, inlined: a walk reads every log's key.
            author = key[:PUBLIC_KEY_SIZE]
            log_id = from_bytes(key[PUBLIC_KEY_SIZE:LOG_PREFIX_SIZE], "big")
            upto = from_bytes(key[LOG_PREFIX_SIZE:], "big")
            log = (author, log_id)
            if upto > heights.get(log, 0) and upto > sent_upto.get(log, 0):
                pending.append((system, author, log_id, upto))
        return len(keys)


def _parts(group: list[Wanted], limit: int) -> list[tuple[int, list[Wanted]]]:
    """A document's logs to send as parts of a chunk, with their entry counts: the whole
    group, or a single log longer than ``limit`` split along the log."""
    if len(group) == 1 and group[0][3] - group[0][2] > limit:
        author, log_id, after, upto = group[0]
        return [
            (min(low + limit, upto) - low, [(author, log_id, low, min(low + limit, upto))])
            for low in range(after, upto, limit)
        ]
    return [(sum([upto - after for _, _, after, upto in group]), group)]


__all__ = ["WALK_PAGE", "LazyPlan", "LogKey", "SendQueue", "Wanted", "logs_of"]
