"""SQLite persistence of channel state, so a restart loses and repeats nothing.

One file holds any number of channels of one participant. The runtime
(:mod:`sdk.runtime`) hands it the durable changes each core drained
(:mod:`sdk.sds.journal`) — one transaction per event-loop turn, covering every
channel that turn touched — and it writes exactly those; it reads a
:class:`~sdk.sds.snapshot.ChannelSnapshot` back when a channel is joined again.

Durability. The database runs in WAL mode with ``synchronous=NORMAL``: a
committed transaction survives the process being killed (``SIGKILL``, a
crash) because it is in the operating system's page cache; an operating
system crash or power cut may lose the last transactions (use
``synchronous="FULL"`` to trade throughput for that too).

Ordering guarantees the runtime builds on this (see ``docs/runtime.md``):

* a message we send is committed (local log and outgoing buffer) before its
  first publish, so after a restart it is republished until acknowledged;
* a delivery is committed (local log row with the message's bytes and a
  per-channel delivery sequence number ``seq``) before the application sees
  the event, so a restarted participant treats the message as a duplicate and
  never delivers it again; the application resumes its own processing with
  ``events(after_seq=...)``.

Tables are keyed by channel id; the local log doubles as the channel's message
history (:meth:`Persistence.history`) and as the SDS-R cache after a restart.

Rows per message are kept few, since every row and index entry is paid at wire
speed: our outgoing messages keep their bytes only in the log (the outgoing row's
``data`` is ``NULL`` when it is the logged message's), and the bloom filter's
carry-over window is one ``WITHOUT ROWID`` table numbered by this class. Older
files are migrated when opened (``schema_version`` in ``meta``).

The log is looked up by message id (a dependency or repair older than the core's
window, our own messages' outcomes and hints) through ``log_key``, not an index
of the log: message ids are hashes, so an index keyed by them takes each new row
at a random page, and once it outgrows SQLite's page cache every row dirties a
page of its own (4 KB written to the WAL, then again at the checkpoint, and read
back first): the cost of a row grew with the length of the log (issue 29). Rows
instead enter ``log_key`` in sorted batches of ``_KEY_BATCH`` and each batch
goes into one *epoch* of ``2**_EPOCH_BITS`` delivery sequence numbers, so a
batch shares pages within a bounded subtree and the cost of a row stays flat
however long the log grows. A lookup makes one index seek per epoch (16 for a
million messages); the newest rows, logged but not yet in ``log_key`` (fewer than
a batch), are found in memory (``_pending``); what a session leaves unkeyed is
keyed when the file is opened again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import Any

from sdk.sds.journal import (
    Change,
    ClockAdvanced,
    FilterInserted,
    HeadsChanged,
    HintSet,
    IncomingAdded,
    IncomingRemoved,
    Logged,
    LostAdded,
    LostRemoved,
    MissingRemoved,
    MissingSaved,
    OutgoingRemoved,
    OutgoingSaved,
)
from sdk.sds.message import HistoryEntry
from sdk.sds.outgoing import OutgoingState
from sdk.sds.snapshot import (
    CacheRecord,
    ChannelSnapshot,
    IncomingRecord,
    LogRecord,
    MissingRecord,
    OutgoingRecord,
)

__all__ = ["ChannelBatch", "HistoryRecord", "LogArchiveView", "Persistence", "StoredChannel"]

SCHEMA_VERSION = 7

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS channel (
    channel_id TEXT PRIMARY KEY,
    participant_id TEXT NOT NULL,
    lamport INTEGER NOT NULL,
    heads TEXT NOT NULL DEFAULT '[]',
    referenced TEXT NOT NULL DEFAULT '[]',
    active_at INTEGER,
    owed TEXT,
    received INTEGER NOT NULL DEFAULT 0,
    indexed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS log (
    channel_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    lamport INTEGER NOT NULL,
    sender_id TEXT NOT NULL,
    retrieval_hint BLOB,
    data BLOB,
    outcome TEXT,
    own INTEGER,
    -- What rebuilds the envelope another member's message arrived in on an encrypted
    -- channel (header, signer, signature: ChannelEncryption.seal_record): an SDS-R
    -- repair of it is that envelope, carrying its sender's signature (docs/encryption.md).
    sealed BLOB
);
CREATE TABLE IF NOT EXISTS outgoing (
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    data BLOB,
    next_resend_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    state TEXT NOT NULL,
    filter_hits TEXT NOT NULL,
    PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE IF NOT EXISTS incoming (
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    data BLOB NOT NULL,
    retrieval_hint BLOB,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE IF NOT EXISTS missing (
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    retrieval_hint BLOB,
    sender_id TEXT,
    first_seen INTEGER NOT NULL,
    PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE IF NOT EXISTS lost (
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE IF NOT EXISTS log_key (
    channel_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    key INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (channel_id, epoch, key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bloom_recent (
    channel_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (channel_id, id)
) WITHOUT ROWID;
"""

# Created after any migration (they may name columns an older file lacks). A join
# loads the newest entries in log order (log_order); rows are read by delivery
# sequence number (log_seq), and found by id through log_key (module docstring).
_INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS log_seq ON log (channel_id, seq);
CREATE INDEX IF NOT EXISTS log_order ON log (channel_id, lamport, message_id);
"""

#: Statements that bring a file of the key's version to the next one.
_MIGRATIONS = {
    # 1 -> 2: when the participant was last active in a channel (catch-up from the
    # store starts there) and how our messages ended without acknowledgement.
    1: (
        "ALTER TABLE channel ADD COLUMN active_at INTEGER",
        "ALTER TABLE log ADD COLUMN outcome TEXT",
    ),
    # 2 -> 3: fewer b-tree writes per message. The log's (channel_id, message_id)
    # key becomes an index of our own messages only (log_own); an outgoing row may
    # leave its bytes to the log row (data NULL); the bloom window loses its
    # AUTOINCREMENT rowid table and second index for one WITHOUT ROWID table (ids
    # and order kept). Tables are rebuilt in rowid order, which keeps every order.
    2: (
        "CREATE TABLE log_v3 (channel_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "message_id TEXT NOT NULL, lamport INTEGER NOT NULL, sender_id TEXT NOT NULL, "
        "retrieval_hint BLOB, data BLOB, outcome TEXT, own INTEGER)",
        "INSERT INTO log_v3 SELECT l.channel_id, l.seq, l.message_id, l.lamport, l.sender_id, "
        "l.retrieval_hint, l.data, l.outcome, CASE WHEN l.sender_id = (SELECT c.participant_id "
        "FROM channel c WHERE c.channel_id = l.channel_id) THEN 1 END FROM log l ORDER BY l.rowid",
        "DROP TABLE log",
        "ALTER TABLE log_v3 RENAME TO log",
        "CREATE TABLE outgoing_v3 (channel_id TEXT NOT NULL, message_id TEXT NOT NULL, "
        "data BLOB, next_resend_at INTEGER NOT NULL, attempts INTEGER NOT NULL, "
        "state TEXT NOT NULL, filter_hits TEXT NOT NULL, PRIMARY KEY (channel_id, message_id))",
        # In rowid order: the rebuilt table keeps the buffer's send order.
        "INSERT INTO outgoing_v3 SELECT channel_id, message_id, data, next_resend_at, "
        "attempts, state, filter_hits FROM outgoing ORDER BY rowid",
        "DROP TABLE outgoing",
        "ALTER TABLE outgoing_v3 RENAME TO outgoing",
        "CREATE TABLE bloom_recent_v3 (channel_id TEXT NOT NULL, id INTEGER NOT NULL, "
        "message_id TEXT NOT NULL, PRIMARY KEY (channel_id, id)) WITHOUT ROWID",
        "INSERT INTO bloom_recent_v3 SELECT channel_id, id, message_id FROM bloom_recent",
        "DROP TABLE bloom_recent",
        "ALTER TABLE bloom_recent_v3 RENAME TO bloom_recent",
    ),
    # 3 -> 4: the catch-up windows the channel still owes itself from the store
    # (sdk/runtime/catch_up.py), JSON [[start, end], ...]; NULL: none.
    3: ("ALTER TABLE channel ADD COLUMN owed TEXT",),
    # 4 -> 5: the count of received messages, kept rather than counted at each join
    # (a join reads a bounded part of the log, whatever its length).
    4: (
        "ALTER TABLE channel ADD COLUMN received INTEGER NOT NULL DEFAULT 0",
        "UPDATE channel SET received = (SELECT COUNT(*) FROM log l WHERE "
        "l.channel_id = channel.channel_id AND l.sender_id != channel.participant_id)",
    ),
    # 5 -> 6: the log's two message-id indexes (every id, and our own) give way to
    # log_key, filled in sorted batches (module docstring). The rows are keyed when
    # the file is opened (Persistence._key_unindexed), as after any session.
    5: (
        "ALTER TABLE channel ADD COLUMN indexed INTEGER NOT NULL DEFAULT 0",
        "DROP INDEX IF EXISTS log_own",
        "DROP INDEX IF EXISTS log_id",
    ),
    # 6 -> 7: the seal record of a received message moves from its own table to its
    # log row (one b-tree insert per message fewer on an encrypted channel). A file
    # made before the table existed gets it empty first, so the copy reads nothing.
    6: (
        "CREATE TABLE IF NOT EXISTS sealed (channel_id TEXT NOT NULL, message_id TEXT "
        "NOT NULL, record BLOB NOT NULL, PRIMARY KEY (channel_id, message_id)) WITHOUT ROWID",
        "ALTER TABLE log ADD COLUMN sealed BLOB",
        "UPDATE log SET sealed = (SELECT s.record FROM sealed s WHERE "
        "s.channel_id = log.channel_id AND s.message_id = log.message_id) WHERE own IS NULL",
        "DROP TABLE sealed",
    ),
}

#: Logged rows keyed into ``log_key`` at once (sorted, in the turn's transaction).
_KEY_BATCH = 4096
#: ``log_key`` epochs span ``2**_EPOCH_BITS`` delivery sequence numbers.
_EPOCH_BITS = 16
#: What :meth:`Persistence._find` reads of a log row, in this order.
_LOG_COLUMNS = (
    "l.seq, l.message_id, l.sender_id, l.lamport, l.retrieval_hint, l.data, l.own, l.outcome, "
    "l.sealed"
)


def _id_key(message_id: str) -> int:
    """A message id's ``log_key`` key: 64 bits of its hash, as SQLite's signed integer."""
    digest = hashlib.blake2b(message_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


#: Ids the window dropped that a lookup still answers from memory: they may not be
#: committed yet (an entry is dropped as it is logged, and written at the flush).
_RECENTLY_EVICTED = 4096


class LogArchiveView:
    """One channel's persisted local log as the core's :class:`~sdk.sds.LogArchive`.

    Looks ids up through ``log_key`` (the module docstring): what the core asks only
    when an id is older than its in-memory window. ``lookups`` counts the lookups made.
    """

    def __init__(self, persistence: Persistence, channel_id: str) -> None:
        self._persistence = persistence
        self.channel_id = channel_id
        self._recent: dict[str, None] = {}
        #: Queries made (for tests and metrics).
        self.lookups = 0

    def delivered(self, message_ids: Set[str]) -> set[str]:
        """Those of ``message_ids`` in the persisted log (or dropped from memory just now)."""
        found = {mid for mid in message_ids if mid in self._recent}
        rest = [mid for mid in message_ids if mid not in found]
        if rest:
            self.lookups += 1
            found.update(self._persistence._find(self.channel_id, rest))
        return found

    def message(self, message_id: str) -> tuple[str, bytes] | None:
        """``(sender_id, encoded message)`` of a persisted log entry, or ``None``."""
        self.lookups += 1
        row = self._persistence._find(self.channel_id, (message_id,)).get(message_id)
        return None if row is None or row[5] is None else (row[2], row[5])

    def evicted(self, message_ids: Iterable[str]) -> None:
        """Remember the latest dropped ids until they are surely committed."""
        recent = self._recent
        for mid in message_ids:
            recent[mid] = None
        while len(recent) > _RECENTLY_EVICTED:
            del recent[next(iter(recent))]


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One message of a channel's persisted local log, in delivery order."""

    seq: int
    message_id: str
    sender_id: str
    lamport_timestamp: int
    #: The encoded SDS message (decode with :func:`sdk.sds.decode_message`).
    data: bytes | None
    retrieval_hint: bytes | None


@dataclass(slots=True)
class StoredChannel:
    """What :meth:`Persistence.load_channel` returns."""

    snapshot: ChannelSnapshot
    #: Highest delivery sequence number used so far (0 when none).
    last_seq: int
    #: Messages from other participants in the log.
    received: int
    #: When the participant last changed the channel's state (epoch ms), or ``None``.
    active_at: int | None = None
    #: Catch-up windows ``(start, end)`` (epoch ms) still owed from the store.
    owed: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True)
class ChannelBatch:
    """What one event-loop turn changed in one channel: the core's drained journal.

    Written, with every other channel's batch of the turn, in one transaction.
    """

    channel_id: str
    participant_id: str
    #: The core's durable changes in order (``MessageChannel.drain_changes``).
    changes: list[Change]
    #: The delivery sequence number of each :class:`~sdk.sds.journal.Logged` message.
    seqs: dict[str, int]
    #: The time of the turn (epoch ms); catch-up after a restart starts from it.
    active_at: int | None = None
    #: Ids of the bloom filter's carry-over window to keep (prune beyond it).
    bloom_keep: int = 0
    #: The catch-up windows now owed, when they changed this turn (``None``: unchanged).
    owed: tuple[tuple[int, int], ...] | None = None
    #: ``message_id -> seal record`` of other members' messages logged this turn on an
    #: encrypted channel, written in their log rows (:meth:`Persistence.seal_record`
    #: reads them back).
    sealed: dict[str, bytes] | None = None


class Persistence:
    """A SQLite file holding one participant's channels."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL") -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError("synchronous must be OFF, NORMAL, FULL or EXTRA")
        self.path = os.fspath(path)
        # isolation_level=None: transactions are explicit (BEGIN ... COMMIT) so one
        # batch is exactly one transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        # Checkpoints are where WAL mode syncs to disk; with one small transaction per
        # event-loop turn the default (every 1000 pages) would sync every few hundred
        # messages. 10000 pages (~40 MB of WAL) halves the cost of a commit.
        self._db.execute("PRAGMA wal_autocheckpoint=10000")
        self._db.execute("PRAGMA foreign_keys=OFF")
        self._db.executescript(_SCHEMA)
        version = self._meta("schema_version")
        if version is None:
            self._set_meta("schema_version", str(SCHEMA_VERSION))
        elif int(version) > SCHEMA_VERSION:
            raise ValueError(
                f"{self.path} has schema version {version}; this SDK reads {SCHEMA_VERSION}"
            )
        else:
            self._migrate(int(version))
        self._db.executescript(_INDEXES)
        #: Per channel, the ids (-> seq) logged but not yet in ``log_key``.
        self._pending: dict[str, dict[str, int]] = {}
        #: Per channel, the highest delivery sequence number keyed in ``log_key``.
        self._indexed: dict[str, int] = {}
        #: ``_pending`` must be read again (a write rolled back).
        self._pending_stale = False
        self._key_unindexed()
        self._bloom_added_since_prune: dict[str, int] = {}
        #: Per channel, the id of the last ``bloom_recent`` row (read once, then counted).
        self._bloom_last_id: dict[str, int] = {}
        #: Transactions committed (for tests and metrics).
        self.commits = 0

    def _migrate(self, version: int) -> None:
        db = self._db
        if version == SCHEMA_VERSION:
            return
        db.execute("BEGIN")
        try:
            while version < SCHEMA_VERSION:
                for statement in _MIGRATIONS[version]:
                    db.execute(statement)
                version += 1
            self._set_meta("schema_version", str(version))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- the message-id key ------------------------------------------------------------
    def _key_unindexed(self) -> None:
        """Key every logged row not yet in ``log_key`` (at open: at most a batch per
        channel that a session left, or all of a migrated or directly written log)."""
        db = self._db
        db.execute("BEGIN")
        try:
            for channel_id, indexed in db.execute(
                "SELECT channel_id, indexed FROM channel"
            ).fetchall():
                top = db.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM log WHERE channel_id = ?", (channel_id,)
                ).fetchone()[0]
                # One epoch at a time: memory stays bounded whatever the log's length.
                start = indexed
                while start < top:
                    end = min(top, ((start >> _EPOCH_BITS) + 1) << _EPOCH_BITS)
                    rows = db.execute(
                        "SELECT message_id, seq FROM log WHERE channel_id = ? AND seq > ? "
                        "AND seq <= ?",
                        (channel_id, start, end),
                    ).fetchall()
                    self._insert_keys(channel_id, dict(rows), end)
                    start = end
                self._indexed[channel_id] = max(indexed, top)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _insert_keys(self, channel_id: str, seqs: dict[str, int], through: int) -> None:
        """Put ``seqs`` (id -> seq) into ``log_key``, sorted, and record that every row
        up to ``through`` is keyed (in the caller's transaction)."""
        rows = sorted((seq >> _EPOCH_BITS, _id_key(mid), seq) for mid, seq in seqs.items())
        self._db.executemany(
            "INSERT OR IGNORE INTO log_key (channel_id, epoch, key, seq) VALUES (?, ?, ?, ?)",
            [(channel_id, *row) for row in rows],
        )
        self._db.execute(
            "UPDATE channel SET indexed = MAX(indexed, ?) WHERE channel_id = ?",
            (through, channel_id),
        )

    def _load_pending(self) -> None:
        """Read what is logged but not keyed again (after a rolled-back write)."""
        self._pending.clear()
        self._indexed.clear()
        for channel_id, indexed in self._db.execute(
            "SELECT channel_id, indexed FROM channel"
        ).fetchall():
            self._indexed[channel_id] = indexed
            self._pending[channel_id] = dict(
                self._db.execute(
                    "SELECT message_id, seq FROM log WHERE channel_id = ? AND seq > ?",
                    (channel_id, indexed),
                ).fetchall()
            )
        self._pending_stale = False

    def _find(self, channel_id: str, message_ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
        """The log rows (``_LOG_COLUMNS``) of those of ``message_ids`` in the log."""
        if self._pending_stale:
            self._load_pending()
        db = self._db
        pending = self._pending.get(channel_id, {})
        top = self._indexed.get(channel_id, 0) >> _EPOCH_BITS
        # One seek per epoch (literal integers, not parameters).
        epochs = ",".join(map(str, range(top + 1)))
        found: dict[str, tuple[Any, ...]] = {}
        for mid in message_ids:
            seq = pending.get(mid)
            if seq is not None:
                row = db.execute(
                    f"SELECT {_LOG_COLUMNS} FROM log l "
                    "WHERE l.channel_id = ? AND l.seq = ? AND l.message_id = ?",
                    (channel_id, seq, mid),
                ).fetchone()
            else:
                row = db.execute(
                    f"SELECT {_LOG_COLUMNS} FROM log_key k JOIN log l "
                    "ON l.channel_id = k.channel_id AND l.seq = k.seq "
                    f"WHERE k.channel_id = ? AND k.epoch IN ({epochs}) AND k.key = ? "
                    "AND l.message_id = ? LIMIT 1",
                    (channel_id, _id_key(mid), mid),
                ).fetchone()
            if row is not None:
                found[mid] = row
        return found

    # -- identity ----------------------------------------------------------------------
    def participant_id(self) -> str | None:
        """The participant id this file belongs to, if one was recorded."""
        return self._meta("participant_id")

    def set_participant_id(self, participant_id: str) -> None:
        """Record the participant id; refuses to change an existing one."""
        current = self.participant_id()
        if current is not None and current != participant_id:
            raise ValueError(
                f"{self.path} holds the state of participant {current!r}, not "
                f"{participant_id!r}; use another file or the same participant id"
            )
        if current is None:
            self._set_meta("participant_id", participant_id)

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # -- reading -----------------------------------------------------------------------
    def channels(self) -> list[str]:
        """Ids of the channels with saved state."""
        return [r[0] for r in self._db.execute("SELECT channel_id FROM channel ORDER BY 1")]

    def archive(self, channel_id: str) -> LogArchiveView:
        """``channel_id``'s persisted log as the core's :class:`~sdk.sds.LogArchive`."""
        return LogArchiveView(self, channel_id)

    def load_channel(
        self,
        channel_id: str,
        *,
        bloom_keep: int,
        cache_size: int,
        log_window: int | None = None,
    ) -> StoredChannel | None:
        """The saved state of ``channel_id``, or ``None`` if it was never saved.

        ``bloom_keep`` is how many recent filter ids to restore (the profile's
        carry-over window), ``cache_size`` how many logged messages refill the
        SDS-R cache, ``log_window`` how many of the newest log entries (in log
        order) to load, with the heads among older ones (``None``: all). What is
        read is bounded by these, not by the length of the log.
        """
        db = self._db
        row = db.execute(
            "SELECT participant_id, lamport, heads, referenced, active_at, owed, received "
            "FROM channel WHERE channel_id = ?",
            (channel_id,),
        ).fetchone()
        if row is None:
            return None
        participant_id, lamport, heads, referenced, active_at, owed, received = row
        snap = ChannelSnapshot(
            channel_id=channel_id,
            participant_id=participant_id,
            lamport_timestamp=lamport,
            heads=json.loads(heads),
            referenced=json.loads(referenced),
        )
        newest = [
            LogRecord(mid, lam, sender, hint)
            for mid, lam, sender, hint in db.execute(
                "SELECT message_id, lamport, sender_id, retrieval_hint FROM log "
                "WHERE channel_id = ? ORDER BY lamport DESC, message_id DESC LIMIT ?",
                (channel_id, -1 if log_window is None else log_window + 1),
            )
        ]
        if log_window is not None and len(newest) > log_window:
            # More than the window: what is older is the archive's, from the floor down.
            below = newest.pop()
            snap.log_floor = (below.lamport_timestamp, below.message_id)
            loaded = {r.message_id for r in newest}
            older_heads = [h for h in snap.heads if h not in loaded]
            newest.extend(self._log_rows(channel_id, older_heads))
            newest.sort(key=lambda r: (r.lamport_timestamp, r.message_id), reverse=True)
        snap.log = newest[::-1]
        outgoing = db.execute(
            "SELECT message_id, data, next_resend_at, attempts, state, filter_hits "
            "FROM outgoing WHERE channel_id = ? ORDER BY rowid",
            (channel_id,),
        ).fetchall()
        # An outgoing row without bytes left them to its log row.
        logged = self._find(channel_id, [r[0] for r in outgoing if r[1] is None])
        snap.outgoing = [
            OutgoingRecord(
                mid,
                data if data is not None else logged[mid][5],
                nra,
                att,
                OutgoingState(state),
                tuple(json.loads(hits)),
            )
            for mid, data, nra, att, state, hits in outgoing
        ]
        snap.incoming = [
            IncomingRecord(mid, data, hint, at)
            for mid, data, hint, at in db.execute(
                "SELECT message_id, data, retrieval_hint, received_at FROM incoming "
                "WHERE channel_id = ? ORDER BY rowid",
                (channel_id,),
            )
        ]
        snap.missing = [
            MissingRecord(HistoryEntry(mid, hint, sender), first_seen)
            for mid, hint, sender, first_seen in db.execute(
                "SELECT message_id, retrieval_hint, sender_id, first_seen FROM missing "
                "WHERE channel_id = ? ORDER BY rowid",
                (channel_id,),
            )
        ]
        snap.lost = [
            r[0]
            for r in db.execute(
                "SELECT message_id FROM lost WHERE channel_id = ? ORDER BY 1", (channel_id,)
            )
        ]
        snap.bloom_recent = [
            r[0]
            for r in db.execute(
                "SELECT message_id FROM (SELECT id, message_id FROM bloom_recent "
                "WHERE channel_id = ? ORDER BY id DESC LIMIT ?) ORDER BY id",
                (channel_id, bloom_keep),
            )
        ]
        snap.repair_cache = [
            CacheRecord(mid, sender, data)
            for mid, sender, data in db.execute(
                "SELECT message_id, sender_id, data FROM (SELECT seq, message_id, sender_id, "
                "data FROM log WHERE channel_id = ? AND data IS NOT NULL ORDER BY seq DESC "
                "LIMIT ?) ORDER BY seq",
                (channel_id, cache_size),
            )
        ]
        last_seq = db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM log WHERE channel_id = ?", (channel_id,)
        ).fetchone()[0]
        owed_windows = tuple((int(a), int(b)) for a, b in json.loads(owed)) if owed else ()
        return StoredChannel(snap, int(last_seq), int(received), active_at, owed_windows)

    def _log_rows(self, channel_id: str, message_ids: list[str]) -> list[LogRecord]:
        """The log entries of ``message_ids`` (by id, through log_key)."""
        return [
            LogRecord(mid, row[3], row[2], row[4])
            for mid, row in self._find(channel_id, message_ids).items()
        ]

    def seal_record(self, channel_id: str, message_id: str) -> bytes | None:
        """What rebuilds the envelope another member's message ``message_id`` arrived in on
        encrypted channel ``channel_id`` (:attr:`ChannelBatch.sealed`), or ``None``."""
        row = self._find(channel_id, (message_id,)).get(message_id)
        return None if row is None or row[8] is None else bytes(row[8])

    def send_outcome(self, channel_id: str, message_id: str) -> str | None:
        """How one of our messages ended without acknowledgement (``"expired:<attempts>"``,
        ``"failed:<error>"``), or ``None``."""
        row = self._find(channel_id, (message_id,)).get(message_id)
        return None if row is None or row[6] != 1 else row[7]

    def history(
        self, channel_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[HistoryRecord]:
        """Logged messages of ``channel_id`` with ``seq > after_seq``, in delivery order."""
        rows = self._db.execute(
            "SELECT seq, message_id, sender_id, lamport, data, retrieval_hint FROM log "
            "WHERE channel_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (channel_id, after_seq, -1 if limit is None else limit),
        )
        return [HistoryRecord(*r) for r in rows]

    # -- writing -----------------------------------------------------------------------
    def write(self, batches: Iterable[ChannelBatch]) -> None:
        """Apply every channel's batch in one transaction."""
        db = self._db
        if self._pending_stale:
            self._load_pending()
        db.execute("BEGIN")
        try:
            for batch in batches:
                self._write_channel(batch)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            # Both were counted ahead of rows that were rolled back.
            self._bloom_last_id.clear()
            self._pending_stale = True
            raise
        self.commits += 1

    def _write_channel(self, b: ChannelBatch) -> None:
        db = self._db
        ch = b.channel_id
        sealed = b.sealed or {}
        logged: list[tuple[object, ...]] = []
        logged_at: dict[str, int] = {}
        hints: list[tuple[bytes, str, str]] = []
        outcomes: list[tuple[str, str, str]] = []
        lamport: int | None = None
        heads: HeadsChanged | None = None
        bloom: list[str] = []
        # Keyed state: only the last change of an id in the batch matters (a message
        # can be buffered and delivered, or sent and acknowledged, in one turn).
        outgoing: dict[str, OutgoingSaved | None] = {}
        incoming: dict[str, IncomingAdded | None] = {}
        missing: dict[str, MissingSaved | None] = {}
        lost: dict[str, bool] = {}
        for c in b.changes:
            kind = type(c)
            if kind is Logged:
                assert isinstance(c, Logged)
                logged_at[c.message_id] = len(logged)
                logged.append(
                    (
                        ch,
                        b.seqs[c.message_id],
                        c.message_id,
                        c.lamport_timestamp,
                        c.sender_id,
                        c.retrieval_hint,
                        c.data,
                        1 if c.own else None,
                        sealed.get(c.message_id) if sealed else None,
                    )
                )
            elif kind is FilterInserted:
                assert isinstance(c, FilterInserted)
                bloom.append(c.message_id)
            elif kind is OutgoingSaved:
                assert isinstance(c, OutgoingSaved)
                outgoing[c.message_id] = c
            elif kind is OutgoingRemoved:
                assert isinstance(c, OutgoingRemoved)
                outgoing[c.message_id] = None
                if c.outcome != "acknowledged":
                    outcomes.append((c.outcome, ch, c.message_id))
            elif kind is HintSet:
                assert isinstance(c, HintSet)
                at = logged_at.get(c.message_id)
                if at is not None:
                    # Logged in this batch (our send, its hint set right after): one
                    # insert with the hint instead of an insert and an update.
                    row = logged[at]
                    logged[at] = (*row[:5], c.retrieval_hint, *row[6:])
                else:
                    hints.append((c.retrieval_hint, ch, c.message_id))
            elif kind is ClockAdvanced:
                assert isinstance(c, ClockAdvanced)
                lamport = c.lamport_timestamp
            elif kind is HeadsChanged:
                assert isinstance(c, HeadsChanged)
                heads = c
            elif kind is IncomingAdded:
                assert isinstance(c, IncomingAdded)
                incoming[c.message_id] = c
            elif kind is IncomingRemoved:
                assert isinstance(c, IncomingRemoved)
                incoming[c.message_id] = None
            elif kind is MissingSaved:
                assert isinstance(c, MissingSaved)
                missing[c.entry.message_id] = c
            elif kind is MissingRemoved:
                assert isinstance(c, MissingRemoved)
                missing[c.message_id] = None
            elif kind is LostAdded:
                assert isinstance(c, LostAdded)
                lost[c.message_id] = True
            elif kind is LostRemoved:
                assert isinstance(c, LostRemoved)
                lost[c.message_id] = False
        # One statement for the channel row (statements are most of a commit's CPU).
        db.execute(
            "INSERT INTO channel (channel_id, participant_id, lamport, heads, referenced, "
            "active_at, owed, received) VALUES (:ch, :pid, COALESCE(:lamport, 0), "
            "COALESCE(:heads, '[]'), COALESCE(:ref, '[]'), :active, :owed, :received) "
            "ON CONFLICT (channel_id) DO UPDATE SET lamport = COALESCE(:lamport, lamport), "
            "received = received + :received, "
            "heads = COALESCE(:heads, heads), referenced = COALESCE(:ref, referenced), "
            "active_at = COALESCE(:active, active_at), "
            "owed = CASE WHEN :owed_set THEN :owed ELSE owed END",
            {
                "ch": ch,
                "pid": b.participant_id,
                "lamport": lamport,
                "heads": None if heads is None else json.dumps(heads.heads),
                "ref": None if heads is None else json.dumps(heads.referenced),
                "active": b.active_at,
                "owed_set": b.owed is not None,
                "owed": json.dumps(b.owed) if b.owed else None,
                "received": sum(1 for row in logged if row[7] is None),
            },
        )
        pending = self._pending.setdefault(ch, {})
        if logged:
            db.executemany(
                "INSERT OR IGNORE INTO log (channel_id, seq, message_id, lamport, sender_id, "
                "retrieval_hint, data, own, sealed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                logged,
            )
            pending.update((mid, b.seqs[mid]) for mid in logged_at)
        if hints or outcomes:
            # Ours (the transport returned another hint than the one saved with the
            # send, or the send ended unacknowledged); rarely a peer's message we
            # republished for SDS-R. Found by id, written by seq.
            rows = self._find(ch, [h[2] for h in hints] + [o[2] for o in outcomes])
            db.executemany(
                "UPDATE log SET retrieval_hint = ? WHERE channel_id = ? AND seq = ?",
                [(hint, ch, rows[mid][0]) for hint, _, mid in hints if mid in rows],
            )
            db.executemany(
                "UPDATE log SET outcome = ? WHERE channel_id = ? AND seq = ?",
                [
                    (outcome, ch, rows[mid][0])
                    for outcome, _, mid in outcomes
                    if mid in rows and rows[mid][6] == 1
                ],
            )
        if outgoing:
            removed = [(ch, mid) for mid, o in outgoing.items() if o is None]
            if removed:
                db.executemany(
                    "DELETE FROM outgoing WHERE channel_id = ? AND message_id = ?", removed
                )
            saved = [
                (
                    ch,
                    o.message_id,
                    # Our send, logged in this batch with these bytes: the log row
                    # keeps them (load_channel reads them from there).
                    None
                    if (at := logged_at.get(o.message_id)) is not None and logged[at][6] == o.data
                    else o.data,
                    o.next_resend_at,
                    o.attempts,
                    o.state.value,
                    json.dumps(list(o.filter_hits)) if o.filter_hits else "[]",
                )
                for o in outgoing.values()
                if o is not None
            ]
            if saved:
                # An upsert, not INSERT OR REPLACE: an updated entry keeps its rowid,
                # so a restore rebuilds the buffer in send order.
                db.executemany(
                    "INSERT INTO outgoing (channel_id, message_id, data, next_resend_at, "
                    "attempts, state, filter_hits) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (channel_id, message_id) DO UPDATE SET "
                    "next_resend_at = excluded.next_resend_at, attempts = excluded.attempts, "
                    "state = excluded.state, filter_hits = excluded.filter_hits",
                    saved,
                )
        if incoming:
            db.executemany(
                "DELETE FROM incoming WHERE channel_id = ? AND message_id = ?",
                [(ch, mid) for mid, i in incoming.items() if i is None],
            )
            db.executemany(
                "INSERT OR REPLACE INTO incoming (channel_id, message_id, data, retrieval_hint, "
                "received_at) VALUES (?, ?, ?, ?, ?)",
                [
                    (ch, i.message_id, i.data, i.retrieval_hint, i.received_at)
                    for i in incoming.values()
                    if i is not None
                ],
            )
        if missing:
            db.executemany(
                "DELETE FROM missing WHERE channel_id = ? AND message_id = ?",
                [(ch, mid) for mid, m in missing.items() if m is None],
            )
            db.executemany(
                "INSERT OR REPLACE INTO missing (channel_id, message_id, retrieval_hint, "
                "sender_id, first_seen) VALUES (?, ?, ?, ?, ?)",
                [
                    (
                        ch,
                        m.entry.message_id,
                        m.entry.retrieval_hint,
                        m.entry.sender_id,
                        m.first_seen,
                    )
                    for m in missing.values()
                    if m is not None
                ],
            )
        if lost:
            db.executemany(
                "DELETE FROM lost WHERE channel_id = ? AND message_id = ?",
                [(ch, mid) for mid, is_lost in lost.items() if not is_lost],
            )
            db.executemany(
                "INSERT OR IGNORE INTO lost (channel_id, message_id) VALUES (?, ?)",
                [(ch, mid) for mid, is_lost in lost.items() if is_lost],
            )
        if bloom:
            last = self._bloom_last_id.get(ch)
            if last is None:
                last = db.execute(
                    "SELECT COALESCE(MAX(id), 0) FROM bloom_recent WHERE channel_id = ?", (ch,)
                ).fetchone()[0]
            first = last + 1
            last += len(bloom)
            db.executemany(
                "INSERT INTO bloom_recent (channel_id, id, message_id) VALUES (?, ?, ?)",
                [(ch, first + k, mid) for k, mid in enumerate(bloom)],
            )
            self._bloom_last_id[ch] = last
            added = self._bloom_added_since_prune.get(ch, 0) + len(bloom)
            # Prune now and then, not every turn: the window only has to be kept, not exact.
            if b.bloom_keep and added >= max(64, b.bloom_keep // 4):
                db.execute(
                    "DELETE FROM bloom_recent WHERE channel_id = ? AND id <= ?",
                    (ch, last - b.bloom_keep),
                )
                added = 0
            self._bloom_added_since_prune[ch] = added
        if len(pending) >= _KEY_BATCH:
            through = max(pending.values())
            self._insert_keys(ch, pending, through)
            self._indexed[ch] = max(self._indexed.get(ch, 0), through)
            self._pending[ch] = {}

    def close(self) -> None:
        """Checkpoint the WAL and close the file."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()
