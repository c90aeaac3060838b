"""A persistent :class:`~sdk.sync.bamboo_p2p.store.LogStore` in SQLite.

Why a table of its own rather than the document store's ``entries``: the
document store (:mod:`sdk.documents.store`) holds only complete logs of p2panda
operations (every entry's payload decodes as an operation, every backlink's
target is stored), while point-to-point replication stores logs *sparsely*
(certificate pools without what lies between), entries without their payloads,
end-of-log entries (tag 1, which p2panda logs never have) and fork proofs. The
tables can live in the same SQLite file as the document store's; their names
start with ``bamboo_``.

Writes are grouped: :meth:`SqliteLogStore.flush` commits them (see
:meth:`~sdk.sync.bamboo_p2p.store.LogStore.flush`); reads see them before (one connection).

Reads are shaped by how an endpoint reads: a range is sent in order, so a miss
reads the next :data:`PREFETCH` rows of the log in one query (entries and small
payloads); link targets are read again and again (the lipmaa targets near the
root of a log are on every path), so decoded entries stay in a bounded cache.
Each row keeps the entry's hash, so decoding does not hash it again.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, TypeVar

from sdk.documents.bamboo import Entry
from sdk.sync.bamboo_p2p.entries import EntryReader, is_end_of_log
from sdk.sync.bamboo_p2p.store import LogKey, StoreListeners

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bamboo_entries (
    author  BLOB    NOT NULL,
    log_id  INTEGER NOT NULL,
    seq_num INTEGER NOT NULL,
    entry   BLOB    NOT NULL,
    hash    BLOB    NOT NULL,
    payload BLOB,
    PRIMARY KEY (author, log_id, seq_num)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bamboo_logs (
    author  BLOB    NOT NULL,
    log_id  INTEGER NOT NULL,
    end_seq INTEGER,
    fork_a  BLOB,
    fork_b  BLOB,
    PRIMARY KEY (author, log_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bamboo_partial_payloads (
    author  BLOB    NOT NULL,
    log_id  INTEGER NOT NULL,
    seq_num INTEGER NOT NULL,
    prefix  BLOB    NOT NULL,
    PRIMARY KEY (author, log_id, seq_num)
) WITHOUT ROWID;
"""

#: Decoded entries kept in memory.
CACHE_ENTRIES = 4096
#: Rows read ahead on a miss (a range is read in order).
PREFETCH = 256
#: Payloads up to this size are read ahead and cached with their entries.
CACHE_PAYLOAD_BYTES = 16 * 1024

#: The rows of one log, and of one entry, in every table.
_LOG = "author = ? AND log_id = ?"
_AT = "author = ? AND log_id = ? AND seq_num = ?"
_INSERT_ENTRY = (
    "INSERT INTO bamboo_entries (author, log_id, seq_num, entry, hash, payload) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)

_K = TypeVar("_K")
_V = TypeVar("_V")


def cache_put(cache: OrderedDict[_K, _V], key: _K, value: _V, size: int) -> None:
    """Put ``key`` in a cache of at most ``size`` items, forgetting the oldest."""
    cache[key] = value
    if len(cache) > size:
        cache.popitem(last=False)


class SqliteLogStore(StoreListeners):
    """A :class:`~sdk.sync.bamboo_p2p.store.LogStore` in one SQLite file (``:memory:`` too)."""

    def __init__(self, path: str = ":memory:", *, cache_entries: int = CACHE_ENTRIES) -> None:
        super().__init__()
        # One connection, used from one thread at a time (the asyncio driver's loop).
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._cache: OrderedDict[tuple[bytes, int, int], Entry] = OrderedDict()
        self._cache_size = cache_entries
        #: Small payloads read ahead with their entries (``None``: stored without one).
        self._payloads: OrderedDict[tuple[bytes, int, int], bytes | None] = OrderedDict()
        #: Highest stored sequence number per log read so far: nothing above is asked of
        #: SQLite (a receiver looks up every new entry's place before storing it).
        self._latest: dict[LogKey, int] = {}
        #: End-of-log positions read so far (asked for every entry that arrives).
        self._ends: dict[LogKey, int | None] = {}
        #: Entries put whose row is not written yet: a payload usually follows its
        #: entry at once, and one INSERT with both costs half of INSERT then UPDATE.
        self._unwritten: dict[tuple[bytes, int, int], Entry] = {}
        #: Whether any cut payload's prefix is kept (put_payload then forgets it).
        self._has_partials = self._row("SELECT 1 FROM bamboo_partial_payloads LIMIT 1") is not None

    def close(self) -> None:
        """Commit and close the file."""
        self.flush()
        self._db.close()

    def _row(self, sql: str, args: tuple[object, ...] = ()) -> Any:
        return self._db.execute(sql, args).fetchone()

    def _write(self, sql: str, args: Sequence[tuple[object, ...]]) -> None:
        """Run ``sql`` once per row of ``args`` in the open write transaction."""
        if not self._db.in_transaction:
            self._db.execute("BEGIN")
        self._db.executemany(sql, args)

    def flush(self) -> None:
        """Commit what was put since the last flush."""
        if self._unwritten:
            rows = [(*k, e.encoded, e.hash, None) for k, e in self._unwritten.items()]
            self._unwritten.clear()
            self._write(_INSERT_ENTRY, rows)
        if self._db.in_transaction:
            self._db.execute("COMMIT")

    def _remember_payload(self, key: tuple[bytes, int, int], payload: bytes | None) -> None:
        if payload is not None and len(payload) > CACHE_PAYLOAD_BYTES:
            self._payloads.pop(key, None)
        else:
            cache_put(self._payloads, key, payload, self._cache_size)

    def _read_ahead(self, log: LogKey, seq_num: int) -> Entry | None:
        """Read entry ``seq_num`` and the rows after it into the caches; return it."""
        rows = self._db.execute(
            "SELECT seq_num, entry, hash, length(payload), "
            f"CASE WHEN length(payload) <= {CACHE_PAYLOAD_BYTES} THEN payload END "
            f"FROM bamboo_entries WHERE {_LOG} AND seq_num >= ? ORDER BY seq_num LIMIT ?",
            (*log, seq_num, PREFETCH),
        )
        wanted: Entry | None = None
        for seq, encoded, entry_hash, size, payload in rows:
            key = (*log, seq)
            # Only verified entries are ever put: decoding needs no checks beyond layout.
            entry = EntryReader(encoded).entry(entry_hash)
            if seq == seq_num:
                wanted = entry
            cache_put(self._cache, key, entry, self._cache_size)
            if size is None or payload is not None:
                self._remember_payload(key, payload)
        return wanted

    # ------------------------------------------------------------------ LogStore

    def entry(self, log: LogKey, seq_num: int) -> Entry | None:
        """The stored entry, if any."""
        key = (*log, seq_num)
        found = self._cache.get(key) or self._unwritten.get(key)
        if found is None and seq_num <= self.latest(log):
            found = self._read_ahead(log, seq_num)
        return found

    def payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The stored payload, if any."""
        key = (*log, seq_num)
        if key in self._payloads:
            return self._payloads[key]
        if seq_num > self.latest(log) or key in self._unwritten:
            return None
        row = self._row(f"SELECT payload FROM bamboo_entries WHERE {_AT}", key)
        return None if row is None else row[0]

    def put_entry(self, entry: Entry) -> None:
        """Store a verified entry (its place must be free); written with its payload if
        that follows before the next :meth:`flush`."""
        log = (entry.author, entry.log_id)
        key = (*log, entry.seq_num)
        if self.entry(log, entry.seq_num):  # the cache, the unwritten ones, or the file
            raise ValueError(f"entry {entry.seq_num} of this log is already stored")
        self._unwritten[key] = entry
        if is_end_of_log(entry):
            self._write(
                "INSERT INTO bamboo_logs (author, log_id, end_seq) VALUES (?, ?, ?) "
                "ON CONFLICT (author, log_id) DO UPDATE SET end_seq = excluded.end_seq",
                [key],
            )
            self._ends[log] = entry.seq_num
        self._latest[log] = max(self.latest(log), entry.seq_num)
        cache_put(self._cache, key, entry, self._cache_size)
        self._remember_payload(key, None)
        self._stored()

    def put_payload(self, log: LogKey, seq_num: int, payload: bytes) -> None:
        """Store the verified payload of a stored entry."""
        key = (*log, seq_num)
        entry = self._unwritten.pop(key, None)
        if entry is not None:
            self._write(_INSERT_ENTRY, [(*key, entry.encoded, entry.hash, payload)])
        else:
            self._write(f"UPDATE bamboo_entries SET payload = ? WHERE {_AT}", [(payload, *key)])
        self._remember_payload(key, payload)
        if self._has_partials:
            self.put_partial_payload(log, seq_num, None)
        self._stored()

    def partial_payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The kept prefix of a cut payload, if any."""
        if not self._has_partials:
            return None
        row = self._row(f"SELECT prefix FROM bamboo_partial_payloads WHERE {_AT}", (*log, seq_num))
        return None if row is None else bytes(row[0])

    def put_partial_payload(self, log: LogKey, seq_num: int, prefix: bytes | None) -> None:
        """Keep (or with ``None`` forget) the prefix of a cut payload."""
        if prefix is None:
            self._write(f"DELETE FROM bamboo_partial_payloads WHERE {_AT}", [(*log, seq_num)])
            return
        self._has_partials = True
        self._write(
            "INSERT INTO bamboo_partial_payloads (author, log_id, seq_num, prefix) "
            "VALUES (?, ?, ?, ?) "
            "ON CONFLICT (author, log_id, seq_num) DO UPDATE SET prefix = excluded.prefix",
            [(*log, seq_num, prefix)],
        )

    def end_of_log(self, log: LogKey) -> int | None:
        """The end-of-log sequence number, if known."""
        if log not in self._ends:
            row = self._row(f"SELECT end_seq FROM bamboo_logs WHERE {_LOG}", log)
            self._ends[log] = None if row is None else row[0]
        return self._ends[log]

    def fork_proof(self, log: LogKey) -> tuple[Entry, Entry] | None:
        """The fork proof of ``log``, if known."""
        row = self._row(f"SELECT fork_a, fork_b FROM bamboo_logs WHERE {_LOG}", log)
        if row is None or row[0] is None:
            return None
        return EntryReader(row[0]).entry(), EntryReader(row[1]).entry()

    def record_fork(self, log: LogKey, proof: tuple[Entry, Entry]) -> None:
        """Remember a fork proof (the first one is kept)."""
        self._write(
            "INSERT INTO bamboo_logs (author, log_id, fork_a, fork_b) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (author, log_id) DO UPDATE SET fork_a = excluded.fork_a, "
            "fork_b = excluded.fork_b WHERE fork_a IS NULL",
            [(*log, proof[0].encoded, proof[1].encoded)],
        )

    def latest(self, log: LogKey) -> int:
        """The highest stored sequence number of ``log`` (0 if none)."""
        found = self._latest.get(log)
        if found is None:
            row = self._row(f"SELECT MAX(seq_num) FROM bamboo_entries WHERE {_LOG}", log)
            found = self._latest[log] = int(row[0] or 0)
        return found

    # ------------------------------------------------------------- inspection

    def _sequence_numbers(self, log: LogKey, condition: str) -> list[int]:
        self.flush()
        rows = self._db.execute(
            f"SELECT seq_num FROM bamboo_entries WHERE {_LOG}{condition} ORDER BY seq_num", log
        )
        return [r[0] for r in rows]

    def sequence_numbers(self, log: LogKey) -> list[int]:
        """The stored sequence numbers of ``log``, ascending."""
        return self._sequence_numbers(log, "")

    def payload_sequence_numbers(self, log: LogKey) -> list[int]:
        """The sequence numbers whose payload is stored, ascending."""
        return self._sequence_numbers(log, " AND payload IS NOT NULL")


__all__ = ["CACHE_ENTRIES", "CACHE_PAYLOAD_BYTES", "PREFETCH", "SqliteLogStore", "cache_put"]
