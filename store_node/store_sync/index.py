"""The archive's sync keys and their range index, persisted in the archive's database.

**Sync key** (:func:`sync_key`): ``timestamp (8 bytes, big-endian) || message
hash (32 bytes)``, compared as bytes, so keys sort by time, then hash. This is
Waku Store Sync's item, ``SyncID(time, hash)`` ordered by time then hash
(waku-org/nwaku ``waku/waku_store_sync/common.nim`` lines 16-18 and ``cmp``, at
commit 02b21678; ``reconciliation.nim`` ``messageIngress``, at 000672d7, builds
it from the message's own timestamp and ``computeMessageHash(pubsubTopic, msg)``).
Here both halves come
from what every node archives identically for the same message:

* the time is the SDS ``lamport_timestamp`` (milliseconds, set by the sender;
  0 for ephemeral messages, which have none). ``first_arrival`` is *not* usable:
  it is each node's own clock, so one message would have a different key on
  every node. A sealed envelope (``docs/encryption.md``) shows no Lamport time:
  its row holds the envelope's sender-set timestamp in that column, bounded at
  ingest like the Lamport time, and is synced under it;
* the hash is the archived ``transport_hash``, the retrieval hint
  :func:`transports.base.message_hash` (SHA-256 over topic and payload) that
  every party derives from the same bytes, and which the archive already
  indexes (``messages_hash``), so a peer's missing key is fetched by an index
  lookup. Rows without a hash are not synced (every transport sets one).

**Index**: an :class:`sdk.sync.rbsr.RangeIndex` (the sync layer's augmented
B+-tree) whose nodes live in the archive's own database (``rbsr_nodes`` /
``rbsr_meta``, tree :data:`TREE`; one :class:`~sdk.sync.rbsr.SqlNodeStore`, in SQLite or,
with the :data:`POSTGRES` dialect, in PostgreSQL), so a fingerprint reads a
handful of rows whatever the archive's size. It follows the archive
incrementally: its watermark is the archive ``seq`` it reflects, and
:meth:`ArchiveIndex.catch_up` indexes the rows after it (a primary-key range
scan), flushing nodes and watermark in one transaction; after a crash between
a commit and a flush the same rows are indexed again (inserts are idempotent).
A watermark on ``seq`` is sound because ``seq`` grows in commit order: one node
writes an archive (:mod:`store_node.lock`) through one writer connection, and
messages fetched from peers go through that same ingest writer.
Deleted rows (retention) are noticed by :meth:`ArchiveIndex.verify`, which
compares the index's size with the archive's count, and the index is rebuilt.

One thread owns the index (:meth:`ArchiveIndex.call`): the indexer, and every
session's reconciler, run there in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sdk.sync.rbsr import SQLITE, RangeIndex, RankedSet, SqlDialect, SqlNodeStore, Summary
from sdk.sync.rbsr.node_store import sqlite_transaction
from store_node.archive.base import Archive, Criteria
from store_node.errors import ArchiveUnavailable
from store_node.store_sync.wire import KEY_SIZE

T = TypeVar("T")

#: The index's tree name in ``rbsr_nodes`` / ``rbsr_meta``.
TREE = "store_sync"
#: Archive rows read per catch-up batch (one flush each).
CATCH_UP_BATCH = 20_000
#: Hashes per archive lookup when loading messages for a peer.
LOAD_BATCH = 200


def sync_key(lamport_timestamp: int | None, message_hash: bytes) -> bytes:
    """The sync key of an archived message (see the module docstring)."""
    if len(message_hash) != KEY_SIZE - 8:
        raise ValueError(f"a message hash is {KEY_SIZE - 8} bytes, got {len(message_hash)}")
    return (lamport_timestamp or 0).to_bytes(8, "big") + message_hash


def key_hash(key: bytes) -> bytes:
    """The message-hash half of a sync key."""
    return key[8:]


class FloorView(RankedSet):
    """The keys of a range index at or above ``floor`` (the later of both peers' floors,
    see :mod:`store_node.store_sync.machine`), seen as a whole set.

    Keys below the floor do not exist for the reconciler: ranks count from the floor,
    and a circular range wraps from the largest key to the floor. Store-sync cuts are
    whole keys (its reconciler is built without ``shorten``; see docs/store-node.md on
    shortening).
    """

    def __init__(self, index: RangeIndex, floor: bytes) -> None:
        self._index = index
        self._floor = floor

    def __len__(self) -> int:
        return len(self._index) - self._index.prefix(self._floor).count

    def prefix(self, bound: bytes | None) -> Summary:
        """The value of the keys at or above the floor and below ``bound``."""
        if bound is not None and bound <= self._floor:
            return Summary()
        return self._index.prefix(bound) - self._index.prefix(self._floor)

    def key_at(self, rank: int) -> bytes:
        """The key with ``rank`` smaller keys at or above the floor."""
        return self._index.key_at(self._index.prefix(self._floor).count + rank)

    def iter_from(self, lo: bytes | None) -> Iterator[bytes]:
        """Keys ``>= lo`` and at or above the floor, in order."""
        return self._index.iter_from(self._floor if lo is None or lo < self._floor else lo)


#: :class:`~sdk.sync.rbsr.SqlNodeStore`'s dialect for PostgreSQL (psycopg 3).
POSTGRES = SqlDialect("%s", "BIGINT", "BYTEA", lambda conn: conn.transaction())
#: SQLite's, flushing in ``BEGIN IMMEDIATE``: it takes the write lock up front (waiting
#: behind ingest's batch under busy_timeout) rather than failing on a lock upgrade half-way.
_SQLITE_IMMEDIATE = dataclasses.replace(
    SQLITE, transaction=lambda db: sqlite_transaction(db, "BEGIN IMMEDIATE")
)


class ArchiveIndex:
    """The sync keys of one archive in a persisted range index; see the module docstring."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sync-index")
        self._conn: Any = None
        self._dialect = _SQLITE_IMMEDIATE if archive.backend == "sqlite" else POSTGRES
        self.index: RangeIndex | None = None

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the index's thread: every use of :attr:`index` (the methods
        after :meth:`close`) goes through here."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        """Release the thread and the index's connection (blocking; idempotent)."""
        self._executor.shutdown(wait=True)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def open(self) -> RangeIndex:
        """Open (or create) the persisted index, check it, and bring it up to date."""
        self.index = self._open_tree()
        self.verify()
        return self.index

    def _open_tree(self) -> RangeIndex:
        if self._conn is None:
            try:
                self._conn = self.archive.connect("sync")
            except ArchiveUnavailable as exc:
                # Like its other failures, the index raises the driver's own error.
                raise (exc.__cause__ or exc) from None
        return RangeIndex(SqlNodeStore(self._conn, TREE, self._dialect))

    def _flush(self) -> None:
        assert self.index is not None
        # The archive's writer may hold SQLite's lock past busy_timeout: try a few times.
        for attempt in range(1, 5):
            try:
                self.index.flush()
                return
            except sqlite3.OperationalError:
                time.sleep(0.1 * attempt)
        self.index.flush()

    def catch_up(self) -> int:
        """Index the archive rows committed since the watermark; return how many keys."""
        assert self.index is not None
        added = 0
        while True:
            rows = self.archive.sync_keys_after(self.index.watermark, CATCH_UP_BATCH)
            if not rows:
                return added
            before = len(self.index)
            self.index.update(inserts=[sync_key(lamport, digest) for _, lamport, digest in rows])
            added += len(self.index) - before
            self.index.watermark = rows[-1][0]
            self._flush()

    def verify(self) -> bool:
        """Catch up, then rebuild if rows were deleted under the index; True if it was sound."""
        assert self.index is not None
        self.catch_up()
        if self.archive.count_sync_keys(self.index.watermark) == len(self.index):
            return True
        self.rebuild()
        return False

    def rebuild(self) -> None:
        """Drop the persisted index and index the whole archive again."""
        for table in ("rbsr_nodes", "rbsr_meta"):
            self._conn.execute(f"DELETE FROM {table} WHERE tree = {self._dialect.param}", (TREE,))
        self.index = self._open_tree()
        self.catch_up()

    def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        """``(channel_id, raw bytes)`` of the archived messages with these keys.

        Keys no longer archived (deleted by retention since) are skipped.
        """
        out: list[tuple[str, bytes]] = []
        hashes = sorted({key_hash(k) for k in keys})
        for start in range(0, len(hashes), LOAD_BATCH):
            chunk = tuple(hashes[start : start + LOAD_BATCH])
            after = None
            while True:
                page = self.archive.find(
                    Criteria(message_hashes=chunk),
                    after=after,
                    forward=True,
                    limit=len(chunk),
                    max_bytes=64 * 1024 * 1024,
                    include_data=True,
                )
                # Rows of these hashes only (a lookup), each with its data (include_data).
                out += [(m.channel_id, m.data) for m in page.messages if m.data is not None]
                if (after := page.next_key) is None:
                    break
        return out


__all__ = ["POSTGRES", "TREE", "ArchiveIndex", "FloorView", "key_hash", "sync_key"]
