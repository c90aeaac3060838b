"""A :class:`~sdk.sync.bamboo_p2p.store.LogStore` over the document store.

Bamboo point-to-point serves and receives logs; the p2panda documents a node
holds are Bamboo logs in the document store (:mod:`sdk.documents.store`, table
``entries``). :class:`DocumentLogStore` lets an endpoint read them there, so a
store node serves its documents over Bamboo p2p without copying them.

Reads look in the document store first (read ahead and cached as
:mod:`.sqlite_store` reads its table, with its bounds), then in an *overlay*
:class:`~sdk.sync.bamboo_p2p.store.LogStore` (a :class:`SqliteLogStore`, its
``bamboo_*`` tables may share the file). The overlay holds what the document
store cannot (:mod:`.sqlite_store` lists it and says why), entries whose payload
is not a valid operation, and prefixes of cut payloads.

Writes are grouped until :meth:`DocumentLogStore.flush`: every received entry with
its payload is offered to the document store's normal ingest
(:meth:`DocumentStore.ingest_many <sdk.documents.store.DocumentStore.ingest_many>`:
signature, links, operation, schema, document rules), in log order and one
transaction per flush; what it does not take (a missing dependency, an invalid
operation, metadata without a payload) goes to the overlay. Then entries of the
touched logs that wait in the overlay right above the document store's latest are
offered again, so a log whose gap was filled moves into the document store. Both
stores have committed when ``flush`` returns.

Entries that reach the document store by another path (p2panda replication,
local writes) are served too: a :class:`~sdk.sync.store.SyncStore` (the store
node's) tells its listeners of each, and this store passes that on to its own
(:meth:`add_listener`), so open ranges send them at once; over a plain
:class:`DocumentStore` an open range sees them at its next wake.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sdk.documents.bamboo import Entry, decode_entry
from sdk.documents.store import DocumentStore, Incoming
from sdk.sync.bamboo_p2p.entries import is_end_of_log
from sdk.sync.bamboo_p2p.sqlite_store import (
    CACHE_ENTRIES,
    CACHE_PAYLOAD_BYTES,
    PREFETCH,
    cache_put,
)
from sdk.sync.bamboo_p2p.store import LogKey, LogStore, StoreListeners
from sdk.sync.store import SyncStore

#: Entries offered again from the overlay per log and flush.
PROMOTE_BATCH = 1024


class DocumentLogStore(StoreListeners):
    """The logs of a :class:`DocumentStore`, plus an ``overlay`` for everything else."""

    def __init__(self, documents: DocumentStore, overlay: LogStore) -> None:
        super().__init__()
        self.documents = documents
        #: The document store's lock: the Bamboo driver holds it around each step.
        self.lock = documents.lock
        self.overlay = overlay
        self._cache: OrderedDict[tuple[bytes, int, int], tuple[Entry, bytes | None]] = OrderedDict()
        #: Entries and payloads put since the last flush (a payload's entry was put with
        #: it, or before: then it is in the overlay).
        self._pending: dict[tuple[bytes, int, int], Entry] = {}
        self._pending_payloads: dict[tuple[bytes, int, int], bytes] = {}
        #: Highest pending sequence number and pending end-of-log entry, per log.
        self._pending_latest: dict[LogKey, int] = {}
        self._pending_ends: dict[LogKey, int] = {}
        #: The document store's latest per log being received into, read once per flush:
        #: nothing above it is asked of SQLite (a receiver looks up every new entry's
        #: place). Logs only served are asked each time: other services add to them.
        self._heights: dict[LogKey, int] = {}
        self._unlisten_documents: Callable[[], None] | None = None
        if isinstance(documents, SyncStore):
            self._unlisten_documents = documents.add_listener(lambda _stored: self._stored())
        #: How many entries went into the document store through this adapter.
        self.ingested = 0
        #: How many went to the overlay because the document store did not take them.
        self.kept_aside = 0

    @property
    def worker(self) -> ThreadPoolExecutor:
        """The document store's worker thread: the Bamboo driver's steps run there, in
        turn with replication's on the same store (``sdk.sync.bamboo_p2p.driver``)."""
        return self.documents.worker

    def close(self) -> None:
        """Flush, and stop listening to the document store (neither store is closed)."""
        self.flush()
        if self._unlisten_documents is not None:
            self._unlisten_documents()
            self._unlisten_documents = None

    # ------------------------------------------------------------------ reads

    def _from_documents(self, log: LogKey, seq_num: int) -> tuple[Entry, bytes | None] | None:
        found = self._cache.get((*log, seq_num))
        if found is not None:
            return found
        if log in self._pending_latest and seq_num > self._height(log):
            return None  # receiving into this log: its new entries are not stored yet
        wanted = None
        for entry_bytes, payload in self.documents.log_entries(*log, seq_num - 1, PREFETCH):
            entry = decode_entry(entry_bytes)
            item = (entry, payload if len(payload) <= CACHE_PAYLOAD_BYTES else None)
            cache_put(self._cache, (*log, entry.seq_num), item, CACHE_ENTRIES)
            if entry.seq_num == seq_num:
                wanted = (entry, payload)
        return wanted

    def _height(self, log: LogKey) -> int:
        height = self._heights.get(log)
        if height is None:
            height = self._heights[log] = self.documents.log_height(log[0], log[1])
        return height

    def entry(self, log: LogKey, seq_num: int) -> Entry | None:
        """The entry, from what was put, the document store or the overlay."""
        if (pending := self._pending.get((*log, seq_num))) is not None:
            return pending
        if (found := self._from_documents(log, seq_num)) is not None:
            return found[0]
        return self.overlay.entry(log, seq_num)

    def payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The payload (operation bytes), if held anywhere."""
        if (pending := self._pending_payloads.get((*log, seq_num))) is not None:
            return pending
        if (found := self._from_documents(log, seq_num)) is None:
            return self.overlay.payload(log, seq_num)
        if found[1] is not None:
            return found[1]
        rows = self.documents.log_entries(log[0], log[1], seq_num - 1, 1)  # too large to cache
        return rows[0][1] if rows else None

    def latest(self, log: LogKey) -> int:
        """The highest sequence number held anywhere."""
        height = self.documents.log_height(log[0], log[1])
        return max(height, self.overlay.latest(log), self._pending_latest.get(log, 0))

    def end_of_log(self, log: LogKey) -> int | None:
        """End-of-log entries are never p2panda operations: the overlay's."""
        pending = self._pending_ends.get(log)
        return pending if pending is not None else self.overlay.end_of_log(log)

    def fork_proof(self, log: LogKey) -> tuple[Entry, Entry] | None:
        """The overlay's fork proof of ``log``."""
        return self.overlay.fork_proof(log)

    def partial_payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The overlay's prefix of a cut payload."""
        return self.overlay.partial_payload(log, seq_num)

    # ----------------------------------------------------------------- writes

    def put_entry(self, entry: Entry) -> None:
        """Hold a verified entry until :meth:`flush` offers it to the document store."""
        self._pending[(entry.author, entry.log_id, entry.seq_num)] = entry
        log = (entry.author, entry.log_id)
        self._pending_latest[log] = max(self._pending_latest.get(log, 0), entry.seq_num)
        if is_end_of_log(entry):
            self._pending_ends[log] = entry.seq_num
        self._stored()

    def put_payload(self, log: LogKey, seq_num: int, payload: bytes) -> None:
        """Hold a verified payload with its entry until :meth:`flush`."""
        self._pending_payloads[(*log, seq_num)] = payload
        self._stored()

    def put_partial_payload(self, log: LogKey, seq_num: int, prefix: bytes | None) -> None:
        """Kept in the overlay."""
        self.overlay.put_partial_payload(log, seq_num, prefix)

    def record_fork(self, log: LogKey, proof: tuple[Entry, Entry]) -> None:
        """Kept in the overlay."""
        self.overlay.record_fork(log, proof)

    def flush(self) -> None:
        """Ingest what was put into the document store, keep the rest in the overlay,
        commit both."""
        overlay = self.overlay
        overlay.flush()  # one writer at a time when both share a file
        pending, self._pending = self._pending, {}
        payloads, self._pending_payloads = self._pending_payloads, {}
        self._pending_latest.clear()
        self._pending_ends.clear()
        self._heights.clear()  # this flush moves them: read again after it
        offered: list[Incoming] = []
        for key in sorted(pending.keys() | payloads.keys()):
            entry = pending.get(key) or overlay.entry(key[:2], key[2])
            payload = payloads.get(key)
            if entry is not None and payload is not None and not is_end_of_log(entry):
                offered.append(Incoming(entry, None, payload))
        taken = self._ingest(offered)
        for key, entry in sorted(pending.items()):
            if key not in taken:
                self.kept_aside += 1
                overlay.put_entry(entry)
        for key, payload in payloads.items():
            if key not in taken:
                overlay.put_payload(key[:2], key[2], payload)
        overlay.flush()
        for log in sorted({key[:2] for key in (*pending, *payloads)}):
            self._promote(log)

    def _ingest(self, offered: list[Incoming]) -> set[tuple[bytes, int, int]]:
        """Offer entries to the document store; return the positions it took."""
        taken: set[tuple[bytes, int, int]] = set()
        while offered:
            result = self.documents.ingest_many(offered)
            for ingested in result.stored:
                e = ingested.incoming.entry
                taken.add((e.author, e.log_id, e.seq_num))
            self.ingested += len(result.stored)
            if result.error is None:
                break
            # The invalid one stays aside; the ones after it were not looked at.
            offered = offered[len(offered) - result.unprocessed :]
        return taken

    def _promote(self, log: LogKey) -> None:
        """Offer the overlay's entries right above the document store's latest again."""
        height = self.documents.log_height(log[0], log[1])
        offered: list[Incoming] = []
        while len(offered) < PROMOTE_BATCH:
            seq_num = height + 1 + len(offered)
            entry = self.overlay.entry(log, seq_num)
            payload = self.overlay.payload(log, seq_num) if entry is not None else None
            if entry is None or payload is None or is_end_of_log(entry):
                break
            offered.append(Incoming(entry, None, payload))
        if offered:
            self._ingest(offered)


__all__ = ["DocumentLogStore"]
