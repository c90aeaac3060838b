"""The store side of p2panda replication: the requests of a
:class:`~sdk.sync.session.Replication` (:mod:`sdk.sync.session_state`) carried out on a
:class:`~sdk.sync.store.SyncStore` by :func:`perform` (on the store's worker thread
holding its lock, :mod:`sdk.sync.driver`): entries decoded, checked and stored a batch
per transaction (signature checks running on a verification thread while the batch is
decoded, or, for entries the driver decoded ahead, while the batch before was stored),
a round of set reconciliation answered over the range index, the next chunk of a send
plan read, ordered and encoded.
"""

from __future__ import annotations

from itertools import groupby, islice
from operator import itemgetter
from typing import Any

from sdk.documents.bamboo import Entry, SignatureChecks
from sdk.documents.errors import DocumentError
from sdk.documents.operation import decode_operation
from sdk.documents.store import DocumentStore, Incoming
from sdk.sync import rbsr, send_plan
from sdk.sync.errors import InvalidEntry, LimitExceeded, UnexpectedEntry
from sdk.sync.messages import LOG_PREFIX_SIZE, PUBLIC_KEY_SIZE, encode_entry, key_item
from sdk.sync.send_plan import LazyPlan, LogKey, SendQueue, Todo
from sdk.sync.session_state import (
    BatchStored,
    Flush,
    Read,
    ReadHave,
    Reconcile,
    Reconciled,
    StoreBatch,
)
from sdk.sync.store import SyncStore

#: After a range index key's log prefix: sorts after every key of that log and before
#: the next log's keys.
_PAST_LOG = b"\xff" * 8 + b"\x00"


#: Entries of a batch decoded ahead, in order, and the growing signature checks they
#: were added to (:meth:`sdk.sync.driver.SyncConnection` starts them while the batch
#: before is stored).
Prepared = tuple[list[Entry], SignatureChecks]


def perform(store: SyncStore, request: object, prepared: Prepared | None = None) -> Any:
    """Carry out one of the replication's requests on ``store``; return its answer.
    ``prepared``: the first entries of a :class:`StoreBatch`, decoded, their checks
    running."""
    if isinstance(request, StoreBatch):
        return _ingest(store, request, prepared)
    if isinstance(request, Read):
        return read_next(store, request.session_id, request.queue)
    if isinstance(request, Reconcile):
        return _reconcile(store, request)
    if isinstance(request, ReadHave):
        # The range indexes hold one key per log, in (author, log id) order: the Have's.
        logs = map(key_item, store.sync_range(request.schema_ids).keys_in(None, None))
        return tuple(
            (author, tuple((log_id, seq) for _, log_id, seq in group))
            for author, group in groupby(logs, key=itemgetter(0))
        )
    if isinstance(request, Flush):
        store.flush()
        return None
    raise TypeError(f"not a replication request: {request!r}")


def _ingest(store: SyncStore, request: StoreBatch, prepared: Prepared | None) -> BatchStored:
    """Decode, check and store a batch, then retry the held entries while that stores some."""
    sid, entries = request.session_id, request.entries
    decoded, checks = prepared or ([], None)
    if checks is None and len(entries) > 1:
        checks = SignatureChecks.growing(len(entries))
    batch: list[Incoming] = []
    heights: dict[LogKey, int] = {}
    error: Exception | None = None
    for n, (entry_bytes, operation_bytes) in enumerate(entries):
        try:
            if n < len(decoded):
                incoming = Incoming(decoded[n], decode_operation(operation_bytes), operation_bytes)
            else:
                incoming = DocumentStore.decode(entry_bytes, operation_bytes)
        except DocumentError as exc:
            error = InvalidEntry(f"entry does not decode: {exc}", sid, exc)
            break
        schema_id = incoming.operation.schema_id  # type: ignore[union-attr]  # decoded above
        if schema_id not in request.schema_ids:
            # Spec 2.2: "Is the data related to what was requested". A log of a document
            # outside the requested schemas cannot get in either: the store refuses an
            # UPDATE/DELETE whose schema is not its document's (SchemaMismatch) or that
            # is not in its document's log (LogMismatch).
            error = UnexpectedEntry(f"entry of schema {schema_id}, not requested", sid)
            break
        entry = incoming.entry
        log = (entry.author, entry.log_id)
        heights[log] = max(heights.get(log, 0), entry.seq_num)
        batch.append(incoming)
        if checks is not None and n >= len(decoded):
            checks.add(entry)
    if checks is not None and (not batch or len(batch) < len(decoded)):
        # Nothing to store, or stopped before the entries decoded ahead: they are not
        # the batch's checks.
        checks.cancel()
        checks = None
    if not batch:
        return BatchStored(0, heights, list(request.held), error)
    result = store.ingest_many(batch, checks)
    accepted, held = 0, list(request.held)
    while True:
        accepted += len(result.stored) + result.duplicates
        if result.error is not None:
            bad = result.error[1]
            error = InvalidEntry(f"{type(bad).__name__}: {bad}", sid, bad)
            break
        held += [incoming for incoming, _missing in result.waiting]
        if len(held) > request.max_held:
            error = LimitExceeded(
                f"more than {request.max_held} entries wait for a dependency", sid
            )
            break
        if not held or not result.stored:
            break
        # Something was stored: retry what waited, until a pass stores nothing.
        result, held = store.ingest_many(held), []
    return BatchStored(accepted, heights, held, error)


def _reconcile(store: SyncStore, request: Reconcile) -> Reconciled:
    """Run the reconciler over the sync range, then look up our heights of the logs it
    learned the peer holds keys of."""
    reconciler = request.reconciler
    reconciler.source = store.sync_range(request.schema_ids)
    try:
        round_ = request.round
        reply = reconciler.initiate() if round_ is None else reconciler.receive_round(round_)
    except rbsr.ReconcileError as exc:
        return Reconciled([], [], [], [], {}, exc)
    finally:
        reconciler.source = None
    local, remote = reconciler.take_differences()
    lacks = reconciler.take_peer_lacks()
    heights = store.log_heights_of(key_item(key)[:2] for key in remote) if remote else {}
    return Reconciled(reply, local, remote, lacks, heights)


def read_next(store: SyncStore, session_id: int, queue: SendQueue) -> tuple[list[bytes], int]:
    """Read the head of ``queue``'s outbox (a chunk, logs to cut into chunks, or a lazy
    plan's next chunk), take it off as it is used up; return the Entry messages of
    ``session_id``, encoded, and their entry and operation bytes. ``[]`` with the plan
    still there: a lazy plan walked its share without making a chunk."""
    outbox = queue.outbox
    item = outbox.popleft()
    if isinstance(item, Todo):
        documents = store.log_documents(item.logs) if len(item.logs) > 1 else {}
        chunks = send_plan.chunks(item.logs, documents, queue.limit)
    elif isinstance(item, LazyPlan):
        chunks = send_plan.chunks(*_walk_chunk(store, queue, item), queue.limit)
        if not item.done:
            outbox.appendleft(item)
    else:
        assert isinstance(item, list), "messages are sent by the machine"
        chunks = [item]
    # The first chunk is read now; the others go first in the outbox. A walk's chunk is
    # of system schemas or of application ones, not both.
    outbox.extendleft(reversed(chunks[1:]))
    entries = store.entries_for(chunks[0], same_kind=isinstance(item, LazyPlan)) if chunks else []
    messages = [encode_entry(session_id, e.entry, e.operation) for e in entries]
    return messages, sum(len(e.entry) + len(e.operation) for e in entries)


def _walk_chunk(
    store: SyncStore, queue: SendQueue, walk: LazyPlan
) -> tuple[dict[LogKey, tuple[int, int]], dict[LogKey, tuple[bool, str]]]:
    """The logs of a lazy plan's next chunk (as :class:`Todo` logs) and their
    documents, for :func:`~sdk.sync.send_plan.chunks`.

    Whole logs are taken up to a chunk's size (a log longer than a chunk alone),
    of system schemas or of application ones, not both; then the other logs of
    their documents that the peer lacks join them (counted as sent). At most
    ``16 * limit`` logs are walked per call: the chunk may come back empty with
    the walk not done.
    """
    limit = queue.limit
    heights, sent_upto, pending = walk.heights, queue.sent_upto, walk.pending
    todo: dict[LogKey, tuple[int, int]] = {}
    size = walked = 0
    system = False
    while True:
        if pending:
            log_system, author, log_id, upto = pending[0]
            log = (author, log_id)
            after = max(heights.get(log, 0), sent_upto.get(log, 0))
            if upto <= after:
                pending.popleft()
                continue
            if todo and (size + upto - after > limit or log_system is not system):
                break
            pending.popleft()
            sent_upto[log] = upto
            todo[log] = (after, upto)
            size += upto - after
            system = log_system
            continue
        if size >= limit or not walk.phases or walked >= 16 * limit:
            break
        walked += _walk_page(store, walk, sent_upto)
    if not todo:
        return todo, {}
    document_of, others = store.document_logs({log: t[1] for log, t in todo.items()})
    for document, logs in others.items():
        for log, height in logs.items():
            low = max(heights.get(log, 0), sent_upto.get(log, 0))
            if log not in todo and height > low:
                todo[log] = (low, height)
                sent_upto[log] = height
                document_of[log] = document
    return todo, {log: (system, document) for log, document in document_of.items()}


def _walk_page(store: SyncStore, walk: LazyPlan, sent_upto: dict[LogKey, int]) -> int:
    """Walk the next page of logs of a lazy plan into ``walk.pending`` (those with
    entries the peer lacks); return how many logs were walked."""
    system, schema_ids = walk.phases[0]
    source = store.sync_range(schema_ids)
    page = send_plan.WALK_PAGE  # looked up here: a test may change it
    keys = list(islice(source.keys_in(walk.cursor, None), page))
    if len(keys) < page:
        walk.phases.popleft()
        walk.cursor = None
    else:
        walk.cursor = keys[-1][:LOG_PREFIX_SIZE] + _PAST_LOG
    heights, pending = walk.heights, walk.pending
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


__all__ = ["Prepared", "perform", "read_next"]
