"""A document store that can replicate: the sync range of every schema, indexed.

:class:`SyncStore` is a :class:`~sdk.documents.DocumentStore` (every entry,
local or from a peer, goes through the same validating ``ingest``) that also
keeps, per schema, a :class:`~sdk.sync.rbsr.RangeIndex` of its logs' heights:
one key ``(public_key, log_id, seq_num)`` per log, replaced as the log grows.
Range fingerprints of the sync range are then O(log n), never a scan.

The indexes live in the same SQLite file (tables ``rbsr_nodes``/``rbsr_meta``)
and are flushed with a watermark, the store's entry count; if the process died
between an entry's commit and the next flush, the counts differ on open and the
indexes are rebuilt from the logs (once, on first use of each schema).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sdk.documents.bamboo import MAX_LOG_INTEGER, SignatureChecks
from sdk.documents.operation import decode_operation, is_create
from sdk.documents.schema import SYSTEM_SCHEMAS
from sdk.documents.store import BatchResult, DocumentStore, Incoming, locked
from sdk.sync.messages import item_key, schema_id_set
from sdk.sync.rbsr import MemoryNodeStore, NodeStore, RangeIndex, SqliteNodeStore, UnionIndex
from sdk.sync.rbsr.index import RangeSource
from sdk.sync.rbsr.node_store import sqlite_transaction

LogId = tuple[bytes, int]
#: :meth:`SyncStore.log_documents` reads the store's shared documents in one pass
#: from this many logs on (when they are at least a quarter of the store's logs).
LOG_DOCUMENTS_SCAN_MIN = 1_000
#: Documents with more operations than this are looked up in one pass over the logs
#: rather than operation by operation (:meth:`SyncStore.document_logs`).
SHARED_DOCUMENT_OPERATIONS = 2_000


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """An entry that was just stored (told to :meth:`SyncStore.add_listener` callbacks)."""

    entry: bytes
    operation: bytes
    author: bytes
    log_id: int
    seq_num: int
    schema_id: str


class EntryToSend(NamedTuple):
    """An entry to send (:meth:`SyncStore.entries_for`): its bytes and where it sits."""

    entry: bytes
    operation: bytes
    author: bytes
    log_id: int
    seq_num: int


class SyncStore(DocumentStore):
    """A :class:`DocumentStore` with persisted range indexes of its logs, per schema.

    ``path`` is a SQLite file or ``":memory:"``; the indexes are kept in the
    same file. Call :meth:`flush` after a batch of entries (sessions do it when
    they finish) to persist the index changes; :meth:`close` flushes too.
    """

    def __init__(self, path: str = ":memory:") -> None:
        super().__init__(path)
        self._index_db: sqlite3.Connection | None = None
        if path != ":memory:":
            # Catch-up writes thousands of entries; WAL keeps each commit cheap.
            self._db.execute("PRAGMA journal_mode=WAL")
            # Used from the loop's thread and the worker's, under the store's lock.
            self._index_db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            for db in (self._db, self._index_db):
                db.execute("PRAGMA synchronous=NORMAL")
                # WAL mode syncs the file at checkpoints. At the default (every 1000 pages)
                # a catch-up checkpointed every few batches, a commit costing ~20 ms of wall
                # time, and the index flush ending it checkpointed all its WAL (~0.2 s for
                # 10k entries) before the session could finish; 10000 pages (~40 MB) make
                # a commit a few ms.
                db.execute("PRAGMA wal_autocheckpoint=10000")
            self._index_db.executescript(
                "CREATE TABLE IF NOT EXISTS sync_index_state "
                "(id INTEGER PRIMARY KEY CHECK (id = 0), watermark INTEGER NOT NULL);"
            )
            row = self._index_db.execute(
                "SELECT watermark FROM sync_index_state WHERE id = 0"
            ).fetchone()
            if row is None or int(row[0]) != self.entry_count():
                SqliteNodeStore(self._index_db)  # creates the tables
                self._index_db.execute("DELETE FROM rbsr_nodes")
                self._index_db.execute("DELETE FROM rbsr_meta")
        self._indexes: dict[str, RangeIndex] = {}
        self._listeners: list[Callable[[StoredEntry], None]] = []
        #: The one connection (:class:`~sdk.sync.driver.SyncConnection`, on the event
        #: loop) checking the signatures of its next batch ahead: one at a time, so
        #: that its checks do not keep the verification threads from another
        #: connection's batch the worker is storing.
        self.checking_ahead: object | None = None

    @locked
    def index(self, schema_id: str) -> RangeIndex:
        """The range index of ``schema_id``'s sync range (built from the logs if new)."""
        return self._index(schema_id)[0]

    def _index(self, schema_id: str) -> tuple[RangeIndex, bool]:
        """The range index of ``schema_id`` and whether this call built it from the logs
        (it then holds every committed entry's key)."""
        index = self._indexes.get(schema_id)
        if index is not None:
            return index, False
        db = self._index_db
        node_store: NodeStore = MemoryNodeStore() if db is None else SqliteNodeStore(db, schema_id)
        fresh = node_store.get_meta() is None
        index = RangeIndex(node_store)
        if fresh:
            index.update(inserts=[item_key(*height) for height in self.log_heights(schema_id)])
        self._indexes[schema_id] = index
        return index, fresh

    @locked
    def sync_range(self, schema_ids: Iterable[str]) -> RangeSource:
        """The sync range of several schemas as one set of keys, in key order (one
        schema's: its range index)."""
        ids = schema_id_set(schema_ids)
        if len(ids) == 1:
            return self.index(ids[0])
        return UnionIndex([self.index(s) for s in ids])

    @locked
    def flush(self) -> None:
        """Persist the index changes since the last flush, with the entry count as watermark."""
        if self._index_db is None:
            return
        with sqlite_transaction(self._index_db):
            for index in self._indexes.values():
                index.flush()
            self._index_db.execute(
                "INSERT OR REPLACE INTO sync_index_state (id, watermark) VALUES (0, ?)",
                (self.entry_count(),),
            )

    def close(self) -> None:
        """Flush the indexes and close the database (after the work queued on ``worker``)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        with self.lock:
            self.flush()
            if self._index_db is not None:
                self._index_db.close()
        super().close()

    @locked
    def log_heights_of(self, logs: Iterable[LogId]) -> dict[LogId, int]:
        """The latest sequence number stored of each log (0 if none), one query per chunk."""
        keys = [(author.hex(), log_id) for author, log_id in dict.fromkeys(logs)]
        heights = {(bytes.fromhex(author), log_id): 0 for author, log_id in keys}
        select = (
            "SELECT e.author, e.log_id, max(e.seq_num) FROM wanted w "
            "JOIN entries e ON e.author = w.author AND e.log_id = w.log_id "
            "GROUP BY e.author, e.log_id"
        )
        for _, rows in self._rows_for_keys("author, log_id", keys, select):
            for author, log_id, seq_num in rows:
                heights[bytes.fromhex(author), int(log_id)] = int(seq_num)
        return heights

    @locked
    def log_documents(self, logs: Iterable[LogId]) -> dict[LogId, tuple[bool, str]]:
        """Whether each of ``logs`` is of a system schema, and its document id.

        Only what decides an order is answered: a log is left out when it is not
        stored, or when it is its document's only log and of an application schema.
        For many logs, the store's shared documents and system logs are read in one
        pass (cheaper than one lookup per log once they are a good part of it).
        """
        keys = [(author.hex(), log_id) for author, log_id in dict.fromkeys(logs)]
        if (
            len(keys) >= LOG_DOCUMENTS_SCAN_MIN
            and 4 * len(keys) >= self._db.execute("SELECT count(*) FROM logs").fetchone()[0]
        ):
            wanted, systems = set(keys), tuple(SYSTEM_SCHEMAS)
            rows = self._db.execute(
                "SELECT l.author, l.log_id, l.document_id, d.schema_id FROM logs l "
                "JOIN documents d ON d.id = l.document_id WHERE l.document_id IN "
                "(SELECT document_id FROM logs GROUP BY document_id HAVING count(*) > 1) "
                "UNION SELECT l.author, l.log_id, l.document_id, d.schema_id FROM documents d "
                "JOIN logs l ON l.document_id = d.id "
                f"WHERE d.schema_id IN ({', '.join('?' * len(systems))})",
                systems,
            ).fetchall()
            rows = [r for r in rows if (r[0], r[1]) in wanted]
        else:
            select = (
                "SELECT l.author, l.log_id, l.document_id, d.schema_id FROM wanted w "
                "JOIN logs l ON l.author = w.author AND l.log_id = w.log_id "
                "JOIN documents d ON d.id = l.document_id"
            )
            rows = [
                r for _, chunk in self._rows_for_keys("author, log_id", keys, select) for r in chunk
            ]
        return {
            (bytes.fromhex(author), int(log_id)): (schema_id in SYSTEM_SCHEMAS, str(document_id))
            for author, log_id, document_id, schema_id in rows
        }

    @locked
    def document_logs(
        self, heights: Mapping[LogId, int]
    ) -> tuple[dict[LogId, str], dict[str, dict[LogId, int]]]:
        """Each stored log's document id, and for every document with entries in logs
        not given, all its logs with their heights.

        ``heights`` are the logs' latest sequence numbers (as the range index holds
        them). A document's operations are as many as the entries of its logs, so
        whether it has other logs is known from a count of its operations (an
        index-only read); only the documents that do are read further.
        """
        # Each log by its key in the query (rows give back the keys as they were sent).
        logs_of = {(author.hex(), log_id): (author, log_id) for author, log_id in heights}
        select = (
            "SELECT w.author, w.log_id, l.document_id, "
            "(SELECT count(*) FROM operations o WHERE o.document_id = l.document_id) "
            "FROM wanted w JOIN logs l ON l.author = w.author AND l.log_id = w.log_id"
        )
        document_of: dict[LogId, str] = {}
        counts: dict[str, list[int]] = {}
        for _, rows in self._rows_for_keys("author, log_id", list(logs_of), select):
            for author, log_id, document_id, operations in rows:
                log = logs_of[author, log_id]
                document_of[log] = document_id
                # Per document: its operations, and the entries of its logs seen.
                counts.setdefault(document_id, [operations, 0])[1] += heights[log]
        shared = [d for d, (operations, entries) in counts.items() if operations != entries]
        # A document's logs are found through its operations (each looked up by hash), or
        # for a long history through the logs (which have no index by document).
        small = [(d,) for d in shared if counts[d][0] <= SHARED_DOCUMENT_OPERATIONS]
        large = [(d,) for d in shared if counts[d][0] > SHARED_DOCUMENT_OPERATIONS]
        found: dict[str, dict[LogId, int]] = {}
        through_operations = (
            "SELECT w.document_id, e.author, e.log_id, max(e.seq_num) FROM wanted w "
            "JOIN operations o ON o.document_id = w.document_id "
            "JOIN entries e ON e.hash = o.id GROUP BY w.document_id, e.author, e.log_id"
        )
        through_logs = (
            "SELECT l.document_id, l.author, l.log_id, (SELECT max(e.seq_num) FROM entries e "
            "WHERE e.author = l.author AND e.log_id = l.log_id) FROM logs l "
            "WHERE l.document_id IN (SELECT document_id FROM wanted)"
        )
        for documents, select in ((small, through_operations), (large, through_logs)):
            for _, rows in self._rows_for_keys("document_id", documents, select):
                for document_id, author, log_id, seq_num in rows:
                    found.setdefault(document_id, {})[bytes.fromhex(author), log_id] = seq_num
        return document_of, found

    def add_listener(self, callback: Callable[[StoredEntry], None]) -> Callable[[], None]:
        """Call ``callback`` after every newly stored entry; returns a function removing it.

        The callback runs on the thread that stored the entry (the event loop's, or
        the store's ``worker``), holding the store's lock. Adding and removing need
        not hold it: the list is copied before it is called.
        """
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    @locked
    def ingest_many(
        self, items: Sequence[Incoming], checks: SignatureChecks | None = None
    ) -> BatchResult:
        """Validate and store a batch (as :meth:`DocumentStore.ingest_many`), index its logs.

        The indexes and the listeners see an entry only once its transaction
        has committed.
        """
        result = super().ingest_many(items, checks)
        # Per schema and log, the last sequence number the batch stored and, for a log
        # it did not open, the first: a log's entries are stored in order without
        # gaps, so replacing the height key entry by entry comes down to removing the
        # one before the first and inserting the last, for the whole batch at once.
        grown: dict[str, tuple[dict[LogId, int], dict[LogId, int]]] = {}
        for ingested in result.stored:
            entry = ingested.incoming.entry
            # The store checked that the operation's schema is its document's.
            last, first = grown.setdefault(ingested.record.schema_id, ({}, {}))
            log, seq_num = (entry.author, entry.log_id), entry.seq_num
            if seq_num > 1 and log not in last:
                first[log] = seq_num
            last[log] = seq_num
        for schema_id, (last, first) in grown.items():
            index, built = self._index(schema_id)
            if not built:  # one built from the logs after the batch committed has its keys
                index.update(
                    inserts=[item_key(a, log_id, seq) for (a, log_id), seq in last.items()],
                    removes=[item_key(a, log_id, seq - 1) for (a, log_id), seq in first.items()],
                )
        if not self._listeners:
            return result
        for ingested in result.stored:
            entry = ingested.incoming.entry
            stored = StoredEntry(
                entry=entry.encoded,
                operation=bytes(ingested.incoming.operation_bytes),
                author=entry.author,
                log_id=entry.log_id,
                seq_num=entry.seq_num,
                schema_id=ingested.record.schema_id,
            )
            for listener in list(self._listeners):
                listener(stored)
        return result

    @locked
    def entries_for(
        self,
        wanted: Iterable[tuple[bytes, int, int] | tuple[bytes, int, int, int]],
        *,
        same_kind: bool = False,
    ) -> list[EntryToSend]:
        """Entries of logs after given heights, in an order a peer can ingest.

        ``wanted`` is ``(author, log_id, after_seq)``, or ``(author, log_id, after_seq,
        upto_seq)`` for the entries up to ``upto_seq`` only. Every entry comes after its
        backlink and the operations its ``previous`` names when those are sent too (a
        topological order of both links), system-schema logs first, so a receiver never
        waits for a dependency later in the batch. One query per chunk of logs; stored
        entries are not decoded again (backlinks are the log's order; only a non-CREATE
        operation is decoded, for its ``previous``). ``same_kind``: the caller knows the
        logs are all of system or all of application schemas, so schemas are not read.
        """
        keys = [
            (author.hex(), log_id, after, upto[0] if upto else MAX_LOG_INTEGER)
            for author, log_id, after, *upto in set(wanted)
        ]
        columns = "w.author, w.log_id, w.after, w.upto, e.seq_num, e.hash, e.entry, e.payload"
        joins = ""
        if not same_kind:
            columns += ", d.schema_id"
            joins = (
                " JOIN logs l ON l.author = e.author AND l.log_id = e.log_id"
                " JOIN documents d ON d.id = l.document_id"
            )
        select = (
            f"SELECT {columns} FROM wanted w JOIN entries e ON e.author = w.author "
            "AND e.log_id = w.log_id AND e.seq_num > w.after AND e.seq_num <= w.upto" + joins
        )
        # Per log: whether it is of an application schema, and its rows.
        by_log: dict[tuple[str, int, int, int], tuple[bool, list[Any]]] = {}
        for _, rows in self._rows_for_keys("author, log_id, after, upto", keys, select):
            for row in rows:
                log = by_log.get(row[:4])
                if log is None:
                    log = by_log[row[:4]] = (same_kind or row[8] not in SYSTEM_SCHEMAS, [])
                log[1].append(row[4:8])
        # The logs, and each log's rows, sorted here rather than by an ORDER BY, which
        # sorted every row's bytes in a temporary B-tree.
        logs = sorted(
            (system_last, bytes.fromhex(author_hex), log_id, after, entries)
            for (author_hex, log_id, after, _), (system_last, entries) in by_log.items()
        )
        batch: list[EntryToSend] = []
        ids: list[str] = []
        deps_of: list[tuple[str, ...]] = []
        for _, author, log_id, _, entries in logs:
            entries.sort()
            backlink: tuple[str, ...] = ()
            for seq_num, entry_id, entry_bytes, operation_bytes in entries:
                batch.append(EntryToSend(entry_bytes, operation_bytes, author, log_id, seq_num))
                ids.append(entry_id)
                # A CREATE (most of a catch-up) names no operation, only its backlink.
                if is_create(operation_bytes):
                    deps_of.append(backlink)
                else:
                    deps_of.append((*backlink, *(decode_operation(operation_bytes).previous or ())))
                backlink = (entry_id,)
        if not any(deps_of):
            # Nothing here names anything: the sorted logs are an order already.
            return batch
        in_batch = set(ids)
        waiting: dict[str, list[int]] = {}
        missing = [0] * len(batch)
        for n, deps in enumerate(deps_of):
            present = {d for d in deps if d in in_batch}
            missing[n] = len(present)
            for dep in present:
                waiting.setdefault(dep, []).append(n)
        ready = [n for n in reversed(range(len(batch))) if missing[n] == 0]
        order: list[EntryToSend] = []
        while ready:
            n = ready.pop()
            order.append(batch[n])
            for m in reversed(waiting.get(ids[n], ())):
                missing[m] -= 1
                if missing[m] == 0:
                    ready.append(m)
        return order


__all__ = ["EntryToSend", "StoredEntry", "SyncStore"]
