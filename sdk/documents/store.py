"""The document store: authors' logs in SQLite, every entry validated on the way in.

Theory of operation
-------------------
Each author writes one Bamboo log per document (p2panda: "a log holds the
operations of one document by one author"). :meth:`DocumentStore.ingest` takes
an encoded entry and its operation from anywhere (a peer, or this participant's
own :meth:`DocumentStore.create` / ``update`` / ``delete``, which go through
the same path so every rule lives in one place) and checks, in this order:

1. the entry decodes, the payload has the entry's size and hash, the signature
   verifies under the entry's author (Bamboo, "Verification");
2. nothing different is stored at (author, log id, seq num), else a fork;
3. the entry at ``seq_num - 1`` is stored and its hash is the backlink, and the
   lipmaa link is the hash of the entry at ``lipmaa(seq_num)``;
4. the operation decodes and fits its schema (system schemas built in,
   application schemas registered or defined by stored ``schema_definition_v1``
   documents);
5. a CREATE opens a fresh log; an UPDATE or DELETE names stored operations of
   one document of the same schema, none of them a DELETE, and goes in the
   author's log for that document.

If a check needs something not stored yet (the backlink's entry, a previous
operation, a schema definition), :class:`MissingDependency` says what; any
other failure raises the :class:`InvalidInput` subclass of the broken rule.
Either way nothing was written: all checks run before the entry's rows are
written.

:meth:`DocumentStore.ingest_many` takes a batch (what a replication session
receives in one read) and stores it in **one** SQLite transaction: each entry
is checked against the store as it stands with the batch's earlier entries
already in it, so an UPDATE may follow its CREATE in the same batch. The
batch's rows are queued and written with one statement per table before it
commits (or before a query that must see them); the checks' lookups see the
queued rows, and the log positions the batch needs are read in one query when
it starts. An entry whose dependency is missing is set
aside (the caller may retry it); the first invalid entry stops the batch: the
valid entries before it are committed, it and everything after it are not.
The in-memory caches (documents, operation ids, schemas defined by stored
documents) are updated as the batch goes and dropped if the transaction does
not commit, so they never hold what the database does not. :meth:`ingest` is
a batch of one.

Documents are materialized (:mod:`.materialize`, the rules of p2panda-rs) and
cached; a document stored as a lone CREATE is materialized when first read
(its event's view is the CREATE's fields, what materializing it gives). An
operation building on the document's tips, among them the walk's last
placement, is applied in constant time (the walk places it last); any other
resumes the walk at a checkpoint before its parents were placed.

**Threads.** A store may be shared by the event loop's thread and the thread a
sync driver stores and reads on (:attr:`DocumentStore.worker`): every public
method holds the store's :attr:`~DocumentStore.lock` (re-entrant), and the
SQLite connections are opened for use from any thread, only ever under it.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from sdk.documents.bamboo import (
    Entry,
    SignatureChecks,
    decode_entry,
    lipmaa,
    sign_entry,
    start_verifying,
)
from sdk.documents.errors import (
    BacklinkMismatch,
    DocumentDeletedError,
    DocumentError,
    ForkDetected,
    InvalidInput,
    LipmaaLinkMismatch,
    LogMismatch,
    MissingDependency,
    PreviousMismatch,
    SchemaMismatch,
    UsageError,
)
from sdk.documents.events import (
    DocumentCreated,
    DocumentDeleted,
    DocumentEvent,
    DocumentUpdated,
)
from sdk.documents.keys import KeyPair
from sdk.documents.materialize import (
    DocumentGraph,
    DocumentView,
    OperationRecord,
    Walk,
    materialize,
    topological_order,
    view_of,
)
from sdk.documents.operation import (
    Action,
    Operation,
    PinnedRelationList,
    check_view_id,
    decode_operation,
    encode_operation,
)
from sdk.documents.schema import (
    SCHEMA_DEFINITION_V1,
    SCHEMA_FIELD_DEFINITION_V1,
    SYSTEM_SCHEMAS,
    FieldType,
    Schema,
    schema_view_id,
)
from sdk.sds.records import fast_init

_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS entries (
    author   TEXT    NOT NULL,
    log_id   INTEGER NOT NULL,
    seq_num  INTEGER NOT NULL,
    hash     TEXT    NOT NULL UNIQUE,
    entry    BLOB    NOT NULL,
    payload  BLOB    NOT NULL,
    PRIMARY KEY (author, log_id, seq_num)
);
CREATE TABLE IF NOT EXISTS logs (
    author      TEXT    NOT NULL,
    log_id      INTEGER NOT NULL,
    document_id TEXT    NOT NULL,
    PRIMARY KEY (author, log_id),
    UNIQUE (author, document_id)
);
CREATE TABLE IF NOT EXISTS operations (
    id          TEXT    PRIMARY KEY,
    document_id TEXT    NOT NULL,
    action      INTEGER NOT NULL,
    schema_id   TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS operations_by_document ON operations (document_id);
CREATE TABLE IF NOT EXISTS documents (
    id        TEXT    PRIMARY KEY,
    schema_id TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS documents_by_schema ON documents (schema_id);
"""


#: Keys per lookup query (_rows_for_keys; at most 3 SQL variables each, well under
#: SQLite's limit of 32,766).
_KEYS_PER_QUERY = 500
_Key = TypeVar("_Key", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True)
class Incoming:
    """An entry and its operation from a peer, decoded once (:meth:`DocumentStore.decode`).

    ``operation`` is ``None`` when the caller did not decode it: the store decodes
    it after the signature check (what :meth:`DocumentStore.ingest` does).
    """

    entry: Entry
    operation: Operation | None
    operation_bytes: bytes


@dataclass(frozen=True, slots=True)
class Ingested:
    """An entry :meth:`DocumentStore.ingest_many` stored: its record and what it changed.

    :attr:`events` of a CREATE are built when first read: a catch-up stores
    thousands of CREATEs and reads none of their events, and a CREATE's event
    depends only on its record (its view is the CREATE's fields).
    """

    incoming: Incoming
    record: OperationRecord
    #: The events; ``None`` for a CREATE until :attr:`events` is read.
    _events: list[DocumentEvent] | None = field(default=None, repr=False, compare=False)

    @property
    def events(self) -> list[DocumentEvent]:
        """What the entry changed: document events, in order (``[]`` for none)."""
        events = self._events
        if events is None:
            events = [_created_event(self.record)]
            object.__setattr__(self, "_events", events)
        return events


# One of each is built per entry a peer sends: their __init__ sets the slots through
# their descriptors instead of the frozen dataclass's object.__setattr__ per field.
fast_init(Incoming, Ingested)


def _created_event(create: OperationRecord) -> DocumentCreated:
    """The event of a stored CREATE: its view is the one-placement walk's."""
    view = view_of(Walk((create,), (create.id,), reference=True, appendable=True))
    return DocumentCreated(create.document_id, create.id, create.author, view)


@dataclass(slots=True)
class BatchResult:
    """What :meth:`DocumentStore.ingest_many` did with a batch, in the batch's order.

    ``stored`` were committed; ``duplicates`` were already stored (no effect);
    ``waiting`` need something not stored yet (nothing written for them);
    ``error`` is the first invalid entry and its error: it and every entry after
    it in the batch were not looked at further (``unprocessed`` counts those
    after it).
    """

    stored: list[Ingested] = field(default_factory=list)
    duplicates: int = 0
    waiting: list[tuple[Incoming, MissingDependency]] = field(default_factory=list)
    error: tuple[Incoming, InvalidInput] | None = None
    unprocessed: int = 0


@dataclass(frozen=True, slots=True)
class Published:
    """A local operation, signed and stored: the bytes to send and what it did."""

    entry: bytes
    operation: bytes
    operation_id: str
    document_id: str
    events: tuple[DocumentEvent, ...]


class _DocumentState:
    """A document's operations and current materialization, kept in memory.

    The walk is kept by :class:`~sdk.documents.materialize.DocumentGraph`: an
    operation building on the tips, one of them placed last, is applied in
    constant time; any other re-walks from the last checkpoint before its
    parents' first placement, not from the CREATE.
    """

    __slots__ = ("graph", "schema_id")

    def __init__(self, create: OperationRecord) -> None:
        self.schema_id = create.schema_id
        self.graph = DocumentGraph((create,))

    @classmethod
    def from_records(cls, records: list[OperationRecord]) -> _DocumentState:
        """The state of a stored document, materialized in one pass."""
        state = cls.__new__(cls)
        state.graph = DocumentGraph(records)
        assert state.graph.root is not None
        state.schema_id = state.graph.ops[state.graph.root].schema_id
        return state

    @property
    def ops(self) -> dict[str, OperationRecord]:
        return self.graph.ops

    @property
    def tips(self) -> set[str]:
        return self.graph.tips

    @property
    def deleted(self) -> bool:
        return self.graph.deleted

    def add(self, op: OperationRecord) -> None:
        self.graph.add(op)

    def view(self, document_id: str) -> DocumentView:
        return self.graph.view()


_P = ParamSpec("_P")
_R = TypeVar("_R")
_Store = TypeVar("_Store", bound="DocumentStore")


def locked(
    method: Callable[Concatenate[_Store, _P], _R],
) -> Callable[Concatenate[_Store, _P], _R]:
    """Run a store method holding the store's lock (see "Threads" in the module docstring)."""

    @functools.wraps(method)
    def call(self: _Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.lock:
            return method(self, *args, **kwargs)

    return call


class DocumentStore:
    """Authors' logs and the documents their operations make, in one SQLite file.

    ``path`` is a file name or ``":memory:"``. Safe to share between threads:
    each public method holds :attr:`lock`; a sync driver runs its session's
    storage work on :attr:`worker`, off the event loop.
    """

    def __init__(self, path: str = ":memory:") -> None:
        # Used from the loop's thread and the worker's, never at once (``lock``).
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        #: Held by every public method, and by a sync driver around each step of a
        #: session that reads or writes the store: one user at a time.
        self.lock = threading.RLock()
        self._worker: ThreadPoolExecutor | None = None
        self._db.executescript(_SCHEMA_SQL)
        self._schemas: dict[str, Schema] = dict(SYSTEM_SCHEMAS)
        self._documents: dict[str, _DocumentState] = {}
        # Documents stored as a lone CREATE whose state nobody asked for yet: built
        # by _state on first use (a catch-up stores thousands and reads few).
        self._created: dict[str, OperationRecord] = {}
        self._document_of: dict[str, str] = {}
        # Entries of the open batch not written yet (their rows go in one executemany
        # per table when the batch commits, or before any query that reads them);
        # and, for the whole batch, the lookups the checks make on what the batch
        # wrote. _hash_at also holds the log positions a batch reads, fetched in one
        # query when it starts, and _absent those not stored; _new_authors the batch's
        # authors with nothing stored (no position to read).
        self._queued: list[tuple[Entry, bytes, OperationRecord]] = []
        self._hash_at: dict[tuple[str, int, int], str] = {}
        self._absent: set[tuple[str, int, int]] = set()
        self._new_authors: set[str] = set()
        self._log_doc: dict[tuple[str, int], str] = {}
        self._doc_log: dict[tuple[str, str], int] = {}

    @property
    def worker(self) -> ThreadPoolExecutor:
        """The store's one thread for storage work off the event loop (made on first use).

        Sync drivers run their sessions' reads, checks and commits here, each step
        under :attr:`lock`; one thread keeps the steps of every session in the
        order they were asked for.
        """
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        return self._worker

    def close(self) -> None:
        """Close the database (after the work queued on :attr:`worker`)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        with self.lock:
            self._db.close()

    # -- schemas ---------------------------------------------------------------------

    @locked
    def add_schema(self, schema: Schema) -> None:
        """Make ``schema`` known, e.g. one the app ships with its code."""
        self._schemas[schema.id] = schema

    @locked
    def schema(self, schema_id: str) -> Schema:
        """The schema with this id: system, registered, or defined by stored documents.

        Raises :class:`MissingDependency` when the defining operations are not
        stored yet and :class:`SchemaMismatch` when they do not define a schema.
        """
        known = self._schemas.get(schema_id)
        if known is not None:
            return known
        view_id = schema_view_id(schema_id)
        if view_id is None:
            raise SchemaMismatch(f"unknown system schema {schema_id}")
        definition = self._view_of(view_id, SCHEMA_DEFINITION_V1.id)
        name = definition.fields["name"]
        field_views = definition.fields["fields"]
        description = definition.fields["description"]
        assert isinstance(field_views, PinnedRelationList)
        assert isinstance(name, str) and isinstance(description, str)
        if f"{name}_{'_'.join(view_id)}" != schema_id:
            raise SchemaMismatch(f"schema definition {view_id} is named {name!r}")
        fields: dict[str, FieldType] = {}
        for field_view in field_views.view_ids:
            spec = self._view_of(field_view, SCHEMA_FIELD_DEFINITION_V1.id)
            field_name, field_type = spec.fields["name"], spec.fields["type"]
            assert isinstance(field_name, str) and isinstance(field_type, str)
            fields[field_name] = FieldType.parse(field_type)
        try:
            schema = Schema(schema_id, description, fields)
        except DocumentError as exc:
            raise SchemaMismatch(f"schema definition {schema_id} is invalid: {exc}") from exc
        self._schemas[schema_id] = schema
        return schema

    def _view_of(self, view_id: tuple[str, ...], schema_id: str) -> DocumentView:
        """The view ``view_id`` of a stored document of ``schema_id`` (for definitions)."""
        missing = tuple(i for i in view_id if self._document_id_of(i) is None)
        if missing:
            raise MissingDependency(f"schema definition needs {len(missing)} operations", missing)
        documents = {self._document_id_of(i) for i in view_id}
        if len(documents) != 1:
            raise SchemaMismatch("a schema view id spans several documents")
        state = self._state(documents.pop() or "")
        if state.schema_id != schema_id:
            raise SchemaMismatch(f"{view_id[0]} is not a {schema_id} operation")
        view = materialize(state.ops.values(), up_to=view_id)
        if view.deleted:
            raise SchemaMismatch(f"the {schema_id} document at {view_id[0]} is deleted")
        return view

    # -- reading ---------------------------------------------------------------------

    @locked
    def document(self, document_id: str) -> DocumentView | None:
        """The current view of a document, or ``None`` if it is not stored."""
        if self._document_id_of(document_id) != document_id:
            return None
        return self._state(document_id).view(document_id)

    @locked
    def documents(
        self, schema_id: str | None = None, *, deleted: bool = False
    ) -> list[DocumentView]:
        """Current views of all documents (of one schema), deleted ones only if asked."""
        if schema_id is None:
            rows = self._db.execute("SELECT id FROM documents ORDER BY id").fetchall()
        else:
            rows = self._db.execute(
                "SELECT id FROM documents WHERE schema_id = ? ORDER BY id", (schema_id,)
            ).fetchall()
        views = [self._state(row[0]).view(row[0]) for row in rows]
        return [v for v in views if deleted or not v.deleted]

    @locked
    def view(self, document_id: str, view_id: tuple[str, ...]) -> DocumentView:
        """The document as it was at ``view_id`` (only operations that view builds on)."""
        if self._document_id_of(document_id) != document_id:
            raise UsageError(f"document {document_id} is not stored")
        return materialize(self._state(document_id).ops.values(), up_to=view_id)

    @locked
    def operations(self, document_id: str) -> list[OperationRecord]:
        """A document's operations in materialization order."""
        if self._document_id_of(document_id) != document_id:
            raise UsageError(f"document {document_id} is not stored")
        return topological_order(self._state(document_id).ops.values())

    @locked
    def has_entry(self, entry_hash: str) -> bool:
        """True if an entry with this hash (= operation id) is stored."""
        row = self._db.execute("SELECT 1 FROM entries WHERE hash = ?", (entry_hash,)).fetchone()
        return row is not None

    @locked
    def entry(self, entry_hash: str) -> tuple[bytes, bytes] | None:
        """``(entry, operation)`` bytes of the entry with this hash, or ``None``."""
        row = self._db.execute(
            "SELECT entry, payload FROM entries WHERE hash = ?", (entry_hash,)
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    @locked
    def entry_count(self) -> int:
        """How many entries are stored (all authors and logs)."""
        return int(self._db.execute("SELECT count(*) FROM entries").fetchone()[0])

    @locked
    def document_of(self, operation_id: str) -> str | None:
        """The id of the document a stored operation belongs to, or ``None``."""
        return self._document_id_of(operation_id)

    def _document_id_of(self, operation_id: str) -> str | None:
        cached = self._document_of.get(operation_id)
        if cached is not None:
            return cached
        row = self._db.execute(
            "SELECT document_id FROM operations WHERE id = ?", (operation_id,)
        ).fetchone()
        if row is None:
            return None
        self._document_of[operation_id] = row[0]
        return str(row[0])

    def _state(self, document_id: str) -> _DocumentState:
        state = self._documents.get(document_id)
        if state is not None:
            return state
        create = self._created.pop(document_id, None)
        if create is not None:
            state = self._documents[document_id] = _DocumentState(create)
            return state
        self._write_rows()
        # The entries were checked when they were stored: their ids and authors are
        # read, not decoded and hashed again; only the operations are decoded.
        rows = self._db.execute(
            "SELECT o.id, e.author, e.payload FROM operations o JOIN entries e ON e.hash = o.id "
            "WHERE o.document_id = ?",
            (document_id,),
        ).fetchall()
        records = []
        for operation_id, author, payload in rows:
            operation = self.schema_for(decode_operation(payload))
            records.append(
                OperationRecord(
                    id=operation_id,
                    document_id=document_id,
                    action=operation.action,
                    schema_id=operation.schema_id,
                    previous=operation.previous or (),
                    fields=operation.fields,
                    author=author,
                )
            )
        state = _DocumentState.from_records(records)
        self._documents[document_id] = state
        return state

    @locked
    def schema_for(self, operation: Operation) -> Operation:
        """``operation`` checked against its schema, with typed field values."""
        return self.schema(operation.schema_id).resolve(operation)

    # -- log lookups -----------------------------------------------------------------

    def _entry_hash(self, author: str, log_id: int, seq_num: int) -> str | None:
        known = self._hash_at.get((author, log_id, seq_num))
        if known is not None:
            return known
        if author in self._new_authors or (author, log_id, seq_num) in self._absent:
            return None
        row = self._db.execute(
            "SELECT hash FROM entries WHERE author = ? AND log_id = ? AND seq_num = ?",
            (author, log_id, seq_num),
        ).fetchone()
        return None if row is None else str(row[0])

    def _log_document(self, author: str, log_id: int) -> str | None:
        pending = self._log_doc.get((author, log_id))
        if pending is not None:
            return pending
        row = self._db.execute(
            "SELECT document_id FROM logs WHERE author = ? AND log_id = ?", (author, log_id)
        ).fetchone()
        return None if row is None else str(row[0])

    def _log_of_document(self, author: str, document_id: str) -> int | None:
        pending = self._doc_log.get((author, document_id))
        if pending is not None:
            return pending
        row = self._db.execute(
            "SELECT log_id FROM logs WHERE author = ? AND document_id = ?", (author, document_id)
        ).fetchone()
        return None if row is None else int(row[0])

    def _latest(self, author: str, log_id: int) -> tuple[int, str] | None:
        row = self._db.execute(
            "SELECT seq_num, hash FROM entries WHERE author = ? AND log_id = ? "
            "ORDER BY seq_num DESC LIMIT 1",
            (author, log_id),
        ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    # -- ingest ----------------------------------------------------------------------

    @locked
    def ingest(self, entry_bytes: bytes, operation_bytes: bytes) -> list[DocumentEvent]:
        """Validate and store one entry with its operation; return what it changed.

        An entry already stored is accepted again without effect (``[]``).
        Raises :class:`InvalidInput` subclasses naming the broken rule, or
        :class:`MissingDependency`; in both cases the store is unchanged.
        """
        result = self.ingest_many([Incoming(decode_entry(entry_bytes), None, operation_bytes)])
        if result.error is not None:
            raise result.error[1]
        if result.waiting:
            raise result.waiting[0][1]
        return result.stored[0].events if result.stored else []

    @staticmethod
    def decode(entry_bytes: bytes, operation_bytes: bytes) -> Incoming:
        """Decode an entry and its operation (no other check); raises :class:`InvalidInput`."""
        return Incoming(
            decode_entry(entry_bytes), decode_operation(operation_bytes), operation_bytes
        )

    @locked
    def ingest_many(
        self, items: Sequence[Incoming], checks: SignatureChecks | None = None
    ) -> BatchResult:
        """Validate and store a batch in one transaction (see the module docstring).

        Never raises for a peer's bad input: the result says what was stored,
        what waits for a dependency and which entry was invalid. A database
        error rolls the whole batch back and is raised. ``checks``: the batch's
        signature checks if the caller started them (``SignatureChecks.growing``,
        fed the same entries in order, as it decoded them); it is sealed here.
        """
        if checks is not None:
            checks.seal()
            if not checks.covers([item.entry for item in items]):
                checks.cancel()
                raise UsageError("checks must be of the batch's entries, in order")
        result = BatchResult()
        if not items:
            return result
        schemas_before = set(self._schemas)
        # Signatures depend on nothing stored: the whole batch is checked on worker
        # threads while this thread validates and writes entry after entry.
        if checks is None:
            checks = start_verifying([item.entry for item in items])
        # The author's hex is each log lookup's key: computed once per entry.
        authors = [item.entry.author.hex() for item in items]
        self._db.execute("BEGIN")
        try:
            self._fetch_positions(items, authors)
            for n, item in enumerate(items):
                try:
                    ingested = self._ingest_one(item, authors[n], checks, n)
                except MissingDependency as exc:
                    result.waiting.append((item, exc))
                    continue
                except InvalidInput as exc:
                    result.error = (item, exc)
                    result.unprocessed = len(items) - n - 1
                    checks.cancel()
                    break
                if ingested is None:
                    result.duplicates += 1
                else:
                    result.stored.append(ingested)
            self._forget_lookups()
            self._write_rows()
            self._db.execute("COMMIT")
        except BaseException:
            checks.cancel()
            self._queued.clear()
            self._forget_lookups()
            self._db.execute("ROLLBACK")
            # The caches followed the batch; the database did not keep it.
            self._documents.clear()
            self._created.clear()
            self._document_of.clear()
            for schema_id in set(self._schemas) - schemas_before:
                del self._schemas[schema_id]
            raise
        return result

    def _ingest_one(
        self, item: Incoming, author: str, checks: SignatureChecks, n: int
    ) -> Ingested | None:
        """Check and write one entry inside the open transaction; None if already stored.

        ``author`` is the entry's author as hex. ``checks.valid(n)`` is whether its
        signature verified (consulted in this order, as :meth:`Entry.verify_signature`
        would be).
        """
        entry = item.entry
        entry_id = entry.hash.hex()
        log_id, seq_num = entry.log_id, entry.seq_num
        # The hash covers author, log id and seq num: an entry is stored iff its own
        # position holds its hash, so one lookup answers "duplicate?" and "fork?".
        at_position = self._entry_hash(author, log_id, seq_num)
        if at_position == entry_id:
            return None
        entry.verify_payload(item.operation_bytes)
        if not checks.valid(n):
            entry.verify_signature()  # raises InvalidSignature with the entry's details
            raise AssertionError("a signature verified on a second look")
        if at_position is not None or seq_num != 1:
            # A first entry at an empty position has no link to check.
            self._check_log_links(entry, author, at_position)
        operation = item.operation
        if operation is None:
            operation = decode_operation(item.operation_bytes)
        schema_id = operation.schema_id
        schema = self._schemas.get(schema_id)
        operation = (self.schema(schema_id) if schema is None else schema).resolve(operation)
        action = operation.action
        if action is Action.CREATE and seq_num == 1:
            # A CREATE opening its log (most entries of a catch-up): the log is unused,
            # its first position being empty, so _check_document has nothing to check.
            document_id = entry_id
        else:
            document_id = self._check_document(entry, author, entry_id, operation)
        record = OperationRecord(
            id=entry_id,
            document_id=document_id,
            action=action,
            schema_id=schema_id,
            previous=operation.previous or (),
            fields=operation.fields,
            author=author,
        )
        self._write(entry, item.operation_bytes, record)
        return Ingested(item, record, self._apply(record))

    def _check_log_links(self, entry: Entry, author: str, at_position: str | None) -> None:
        """Fork, backlink and lipmaa link checks against the stored log (Bamboo).

        ``author`` is the entry's author as hex; ``at_position`` the hash stored at
        the entry's (author, log id, seq num).
        """
        if at_position is not None:
            raise ForkDetected(
                f"author {author[:16]}… log {entry.log_id} already has a different "
                f"entry {entry.seq_num}"
            )
        if entry.seq_num == 1:
            return
        assert entry.backlink is not None
        previous = self._entry_hash(author, entry.log_id, entry.seq_num - 1)
        if previous is None:
            raise MissingDependency(
                f"entry {entry.seq_num - 1} of the log is not stored", (entry.backlink.hex(),)
            )
        if previous != entry.backlink.hex():
            raise BacklinkMismatch(
                f"entry {entry.seq_num}'s backlink is not entry {entry.seq_num - 1}"
            )
        if entry.lipmaa_link is not None:
            target = lipmaa(entry.seq_num)
            # The log is stored without gaps up to seq_num - 1, so the target is stored.
            if self._entry_hash(author, entry.log_id, target) != entry.lipmaa_link.hex():
                raise LipmaaLinkMismatch(
                    f"entry {entry.seq_num}'s lipmaa link is not entry {target}"
                )

    def _check_document(
        self, entry: Entry, author: str, entry_id: str, operation: Operation
    ) -> str:
        """Document, previous and log id rules; return the operation's document id.

        ``author`` and ``entry_id`` are the entry's author and hash as hex.
        """
        # A log's row is written with its first entry, which _check_log_links found
        # not stored: a first entry's log is unused.
        log_document = None if entry.seq_num == 1 else self._log_document(author, entry.log_id)
        if operation.action is Action.CREATE:
            if entry.seq_num != 1 or log_document is not None:
                raise LogMismatch("a CREATE opens a new log: sequence number 1 of an unused log id")
            return entry_id
        previous = operation.previous or ()
        documents = {op_id: self._document_id_of(op_id) for op_id in previous}
        missing = tuple(op_id for op_id, doc in documents.items() if doc is None)
        if missing:
            raise MissingDependency(f"{len(missing)} previous operations are not stored", missing)
        document_ids = set(documents.values())
        if len(document_ids) != 1:
            raise PreviousMismatch("previous names operations of several documents")
        document_id = document_ids.pop() or ""
        state = self._state(document_id)
        if state.schema_id != operation.schema_id:
            raise SchemaMismatch(
                f"document {document_id[:16]}… has schema {state.schema_id}, "
                f"not {operation.schema_id}"
            )
        for op_id in previous:
            if state.ops[op_id].action is Action.DELETE:
                raise DocumentDeletedError(
                    f"document {document_id[:16]}… was deleted by {op_id[:16]}…"
                )
        if entry.seq_num == 1:
            if log_document is not None or self._log_of_document(author, document_id) is not None:
                raise LogMismatch("the author already has a log for this document")
        elif log_document != document_id:
            raise LogMismatch(f"log {entry.log_id} belongs to another document")
        return document_id

    def _write(self, entry: Entry, payload: bytes, record: OperationRecord) -> None:
        """Queue one entry (written by :meth:`_write_rows` inside the transaction) and
        note its position and, for a first entry, its log for the batch's lookups."""
        self._queued.append((entry, payload, record))
        author, log_id, document_id = record.author, entry.log_id, record.document_id
        self._hash_at[author, log_id, entry.seq_num] = record.id
        if entry.seq_num == 1:
            self._log_doc[author, log_id] = document_id
            self._doc_log[author, document_id] = log_id

    def _write_rows(self) -> None:
        """Write the queued entries' rows: one statement per table for the whole batch."""
        queued = self._queued
        if not queued:
            return
        db = self._db
        db.executemany(
            "INSERT INTO entries (author, log_id, seq_num, hash, entry, payload) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(r.author, e.log_id, e.seq_num, r.id, e.encoded, p) for e, p, r in queued],
        )
        # A log's row goes with its first entry.
        logs = [(r.author, e.log_id, r.document_id) for e, _, r in queued if e.seq_num == 1]
        if logs:
            db.executemany("INSERT INTO logs (author, log_id, document_id) VALUES (?, ?, ?)", logs)
        db.executemany(
            "INSERT INTO operations (id, document_id, action, schema_id) VALUES (?, ?, ?, ?)",
            [(r.id, r.document_id, int(r.action), r.schema_id) for _, _, r in queued],
        )
        # A document's row goes with its CREATE (looked up once, not once per entry).
        create = Action.CREATE
        documents = [(r.document_id, r.schema_id) for _, _, r in queued if r.action is create]
        if documents:
            db.executemany("INSERT INTO documents (id, schema_id) VALUES (?, ?)", documents)
        queued.clear()

    def _forget_lookups(self) -> None:
        """End of a batch: what the lookups know may change outside it."""
        self._hash_at.clear()
        self._absent.clear()
        self._new_authors.clear()
        self._log_doc.clear()
        self._doc_log.clear()

    def _rows_for_keys(
        self, columns: str, keys: Sequence[_Key], select: str
    ) -> Iterator[tuple[Sequence[_Key], list[Any]]]:
        """``(chunk, rows)`` of ``select`` run against each chunk of ``keys`` (at most
        ``_KEYS_PER_QUERY``) given as the table ``wanted (columns)``: one query per
        chunk instead of one per key."""
        placeholder = "(" + ", ".join(["?"] * (columns.count(",") + 1)) + ")"
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            chunk = keys[start : start + _KEYS_PER_QUERY]
            rows = self._db.execute(
                f"WITH wanted ({columns}) AS (VALUES "
                + ", ".join([placeholder] * len(chunk))
                + ") "
                + select,
                [value for key in chunk for value in key],
            ).fetchall()
            yield chunk, rows

    def _fetch_positions(self, items: Sequence[Incoming], authors: Sequence[str]) -> None:
        """Read the log positions the batch's checks look at, in one query per chunk.

        Each entry's own position (duplicate or fork), its backlink's and its
        lipmaa link's: found ones go to ``_hash_at``, the others to ``_absent``
        (entries are never deleted, and what the batch writes goes to ``_hash_at``).
        Authors with no entry stored (most of a catch-up's) are asked about first,
        one key each, and go to ``_new_authors``: none of their positions is read.
        """
        distinct = list(dict.fromkeys(authors))
        stored: set[str] = set()
        select = (
            "SELECT w.author FROM wanted w "
            "WHERE EXISTS (SELECT 1 FROM entries e WHERE e.author = w.author)"
        )
        for _, rows in self._rows_for_keys("author", [(a,) for a in distinct], select):
            stored.update(row[0] for row in rows)
        self._new_authors.update(a for a in distinct if a not in stored)
        if not stored:
            return
        wanted: dict[tuple[str, int, int], None] = {}
        for item, author in zip(items, authors, strict=True):
            if author not in stored:
                continue
            entry = item.entry
            log_id, seq_num = entry.log_id, entry.seq_num
            wanted[author, log_id, seq_num] = None
            if seq_num > 1:
                wanted[author, log_id, seq_num - 1] = None
                if entry.lipmaa_link is not None:
                    wanted[author, log_id, lipmaa(seq_num)] = None
        select = (
            "SELECT e.author, e.log_id, e.seq_num, e.hash FROM wanted w "
            "JOIN entries e ON e.author = w.author AND e.log_id = w.log_id "
            "AND e.seq_num = w.seq_num"
        )
        for chunk, rows in self._rows_for_keys("author, log_id, seq_num", list(wanted), select):
            for author, log_id, seq_num, entry_hash in rows:
                self._hash_at[author, log_id, seq_num] = entry_hash
            self._absent.update(chunk)
        self._absent.difference_update(self._hash_at)

    def _apply(self, record: OperationRecord) -> list[DocumentEvent] | None:
        """Apply a stored operation to its document; its events (``None`` for a
        CREATE: :attr:`Ingested.events` builds them when read)."""
        self._document_of[record.id] = record.document_id
        if record.action is Action.CREATE:
            # A lone CREATE's view comes from its one-placement walk; the
            # document's state is built when something needs it (_state).
            self._created[record.document_id] = record
            return None
        state = self._state(record.document_id)
        was_deleted = state.deleted
        state.add(record)
        if was_deleted:
            return []
        view = state.view(record.document_id)
        if state.deleted:
            return [DocumentDeleted(record.document_id, record.id, record.author, view)]
        return [DocumentUpdated(record.document_id, record.id, record.author, view)]

    # -- publishing ------------------------------------------------------------------

    @locked
    def create(self, key: KeyPair, schema_id: str, fields: Mapping[str, object]) -> Published:
        """Create a document: sign a CREATE in a new log of ``key`` and store it."""
        try:
            schema = self.schema(schema_id)
        except MissingDependency as exc:
            raise UsageError(
                f"schema {schema_id} is not known: add_schema() it or wait for its definition"
            ) from exc
        typed = schema.resolve_fields(fields, complete=True)
        return self._publish(key, Operation(Action.CREATE, schema_id, None, typed), None)

    @locked
    def update(
        self,
        key: KeyPair,
        document_id: str,
        fields: Mapping[str, object],
        previous: tuple[str, ...] | None = None,
    ) -> Published:
        """Update some fields of a document, building on ``previous`` (default: current view)."""
        state, previous = self._local_target(document_id, previous)
        typed = self.schema(state.schema_id).resolve_fields(fields, complete=False)
        operation = Operation(Action.UPDATE, state.schema_id, previous, typed)
        return self._publish(key, operation, document_id)

    @locked
    def delete(
        self, key: KeyPair, document_id: str, previous: tuple[str, ...] | None = None
    ) -> Published:
        """Delete a document, building on ``previous`` (default: current view)."""
        state, previous = self._local_target(document_id, previous)
        operation = Operation(Action.DELETE, state.schema_id, previous, None)
        return self._publish(key, operation, document_id)

    def _local_target(
        self, document_id: str, previous: tuple[str, ...] | None
    ) -> tuple[_DocumentState, tuple[str, ...]]:
        if self._document_id_of(document_id) != document_id:
            raise UsageError(f"document {document_id} is not stored; create it or wait for it")
        state = self._state(document_id)
        if state.deleted:
            raise DocumentDeletedError(f"document {document_id[:16]}… is deleted")
        if previous is None:
            previous = tuple(sorted(state.tips))
        return state, check_view_id(tuple(previous))

    def _publish(self, key: KeyPair, operation: Operation, document_id: str | None) -> Published:
        author = key.author
        log_id = None if document_id is None else self._log_of_document(author, document_id)
        if log_id is None:
            row = self._db.execute(
                "SELECT max(log_id) FROM logs WHERE author = ?", (author,)
            ).fetchone()
            log_id = 0 if row[0] is None else int(row[0]) + 1
        latest = self._latest(author, log_id)
        seq_num = 1 if latest is None else latest[0] + 1
        backlink = lipmaa_link = None
        if latest is not None:
            backlink = bytes.fromhex(latest[1])
            target = lipmaa(seq_num)
            if target != seq_num - 1:
                target_hash = self._entry_hash(author, log_id, target)
                assert target_hash is not None
                lipmaa_link = bytes.fromhex(target_hash)
        payload = encode_operation(operation)
        entry = sign_entry(key, log_id, seq_num, payload, backlink, lipmaa_link)
        # The same checks as a peer's entry: one place for every rule.
        events = self.ingest(entry.encoded, payload)
        return Published(
            entry=entry.encoded,
            operation=payload,
            operation_id=entry.id,
            document_id=entry.id if document_id is None else document_id,
            events=tuple(events),
        )

    # -- replication reads (sdk.sync) ------------------------------------------------

    @locked
    def log_heights(self, schema_id: str) -> list[tuple[bytes, int, int]]:
        """``(author public key, log id, latest seq num)`` of each log of ``schema_id``'s documents.

        The sync range of p2panda replication (``sdk.sync``), in ``(author, log id)``
        order. Each log's height is one index seek (not a pass over its entries).
        """
        rows = self._db.execute(
            "SELECT l.author, l.log_id, (SELECT max(e.seq_num) FROM entries e "
            "WHERE e.author = l.author AND e.log_id = l.log_id) FROM logs l "
            "JOIN documents d ON d.id = l.document_id "
            "WHERE d.schema_id = ? ORDER BY l.author, l.log_id",
            (schema_id,),
        ).fetchall()
        return [(bytes.fromhex(a), int(log_id), int(seq)) for a, log_id, seq in rows]

    @locked
    def log_entries(
        self, author: bytes, log_id: int, after_seq: int = 0, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """``(entry, operation)`` bytes of a log's entries after ``after_seq``, in order
        (at most ``limit`` of them)."""
        rows = self._db.execute(
            "SELECT entry, payload FROM entries WHERE author = ? AND log_id = ? AND seq_num > ? "
            "ORDER BY seq_num LIMIT ?",
            (author.hex(), log_id, after_seq, -1 if limit is None else limit),
        ).fetchall()
        return [(bytes(e), bytes(p)) for e, p in rows]

    @locked
    def log_height(self, author: bytes, log_id: int) -> int:
        """The latest sequence number of a log (0 if it is not stored)."""
        latest = self._latest(author.hex(), log_id)
        return 0 if latest is None else latest[0]


__all__ = ["BatchResult", "DocumentStore", "Incoming", "Ingested", "Published", "locked"]
