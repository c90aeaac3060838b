"""The SQLite file's schema: rows per message kept few, and older files migrated in
place without losing state (``sdk/runtime/persistence.py``)."""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path

import pytest

from sdk.runtime.persistence import SCHEMA_VERSION, ChannelBatch, Persistence
from sdk.sds import ChannelConfig, MessageChannel
from sdk.sds.bloom import COMPACT
from sdk.sds.journal import Change, Logged, OutgoingSaved
from sdk.sds.snapshot import export_snapshot, restore_snapshot

CONFIG = ChannelConfig(bloom=COMPACT, causal_history_size=2)

# The schema as version 2 wrote it (before outgoing rows could leave their bytes to
# the log and before the bloom window lost its AUTOINCREMENT table).
_V2_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE channel (
    channel_id TEXT PRIMARY KEY, participant_id TEXT NOT NULL, lamport INTEGER NOT NULL,
    heads TEXT NOT NULL DEFAULT '[]', referenced TEXT NOT NULL DEFAULT '[]',
    active_at INTEGER
);
CREATE TABLE log (
    channel_id TEXT NOT NULL, seq INTEGER NOT NULL, message_id TEXT NOT NULL,
    lamport INTEGER NOT NULL, sender_id TEXT NOT NULL, retrieval_hint BLOB, data BLOB,
    outcome TEXT, PRIMARY KEY (channel_id, message_id)
);
CREATE UNIQUE INDEX log_seq ON log (channel_id, seq);
CREATE TABLE outgoing (
    channel_id TEXT NOT NULL, message_id TEXT NOT NULL, data BLOB NOT NULL,
    next_resend_at INTEGER NOT NULL, attempts INTEGER NOT NULL, state TEXT NOT NULL,
    filter_hits TEXT NOT NULL, PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE incoming (
    channel_id TEXT NOT NULL, message_id TEXT NOT NULL, data BLOB NOT NULL,
    retrieval_hint BLOB, received_at INTEGER NOT NULL, PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE missing (
    channel_id TEXT NOT NULL, message_id TEXT NOT NULL, retrieval_hint BLOB,
    sender_id TEXT, first_seen INTEGER NOT NULL, PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE lost (
    channel_id TEXT NOT NULL, message_id TEXT NOT NULL, PRIMARY KEY (channel_id, message_id)
);
CREATE TABLE bloom_recent (
    id INTEGER PRIMARY KEY AUTOINCREMENT, channel_id TEXT NOT NULL, message_id TEXT NOT NULL
);
CREATE INDEX bloom_recent_channel ON bloom_recent (channel_id, id);
INSERT INTO meta VALUES ('schema_version', '2'), ('participant_id', 'alice');
"""


def _pair() -> tuple[MessageChannel, MessageChannel]:
    return (
        MessageChannel("room", "alice", 1_000, CONFIG, rng=random.Random(1), journal=True),
        MessageChannel("room", "bob", 1_000, CONFIG, rng=random.Random(2), journal=True),
    )


def _batch(channel: MessageChannel, first_seq: int) -> ChannelBatch:
    changes = channel.drain_changes()
    logged = [c.message_id for c in changes if isinstance(c, Logged)]
    seqs = {mid: first_seq + k for k, mid in enumerate(logged)}
    return ChannelBatch(
        "room", channel.participant_id, changes, seqs, 2_000, channel.bloom.carry_over
    )


def _write_v2(path: Path, alice: MessageChannel) -> None:
    """What version 2 stored for ``alice``: her log, outgoing buffer and bloom window."""
    snap = export_snapshot(alice)
    db = sqlite3.connect(path)
    db.executescript(_V2_SCHEMA)
    db.execute(
        "INSERT INTO channel VALUES ('room', 'alice', ?, '[]', '[]', 2000)",
        (snap.lamport_timestamp,),
    )
    # The first of alice's messages ended unacknowledged in an earlier session.
    outcome = {snap.outgoing[0].message_id: "expired:3"}
    for seq, record in enumerate(snap.log, start=1):
        db.execute(
            "INSERT INTO log VALUES ('room', ?, ?, ?, ?, ?, NULL, ?)",
            (
                seq,
                record.message_id,
                record.lamport_timestamp,
                record.sender_id,
                record.retrieval_hint,
                outcome.get(record.message_id),
            ),
        )
    for o in snap.outgoing:
        db.execute(
            "INSERT INTO outgoing VALUES ('room', ?, ?, ?, ?, ?, ?)",
            (
                o.message_id,
                o.data,
                o.next_resend_at,
                o.attempts,
                o.state.value,
                json.dumps(list(o.filter_hits)),
            ),
        )
    # AUTOINCREMENT ids with a pruned prefix, as a long-running file has them.
    db.execute("INSERT INTO bloom_recent (id, channel_id, message_id) VALUES (40, 'room', 'old')")
    for mid in snap.bloom_recent:
        db.execute("INSERT INTO bloom_recent (channel_id, message_id) VALUES ('room', ?)", (mid,))
    db.execute("DELETE FROM bloom_recent WHERE id = 40")
    db.commit()
    db.close()


def test_a_version_2_file_opens_migrated_and_keeps_its_state(tmp_path: Path) -> None:
    alice, bob = _pair()
    for k in range(3):
        alice.send(f"to bob {k}".encode(), 1_100 + k)
        bob.send(f"to alice {k}".encode(), 1_100 + k)
    for d in bob.datagrams_to_send():
        alice.receive(d.data, 1_200)
    assert len(alice.outgoing) == 3 and len(alice.bloom.recent()) == 3
    path = tmp_path / "v2.db"
    _write_v2(path, alice)
    before = export_snapshot(alice)

    p = Persistence(path)
    assert p._meta("schema_version") == str(SCHEMA_VERSION) == "7"
    stored = p.load_channel("room", bloom_keep=alice.bloom.carry_over, cache_size=0)
    assert stored is not None
    assert stored.owed == ()  # no catch-up window owed in a file from before they were kept
    snap = stored.snapshot
    assert snap.outgoing == before.outgoing  # bytes, schedule and send order
    assert snap.bloom_recent == before.bloom_recent
    assert [r.message_id for r in snap.log] == [r.message_id for r in before.log]
    assert stored.last_seq == len(before.log)
    # Counted once by the migration, kept since (not counted at each join).
    assert stored.received == sum(1 for r in before.log if r.sender_id != "alice")
    first, second = (o.message_id for o in before.outgoing[:2])
    assert p.send_outcome("room", first) == "expired:3"
    assert p.send_outcome("room", second) is None
    # Every logged row is keyed by id, and only alice's own are marked hers.
    keyed = p._db.execute("SELECT COUNT(*) FROM log_key WHERE channel_id = 'room'").fetchone()
    assert keyed[0] == len(before.log)
    own = {r.message_id for r in before.log if r.sender_id == "alice"}
    marked = {r[0] for r in p._db.execute("SELECT message_id FROM log WHERE own = 1")}
    assert marked == own and len(own) == 3

    # The migrated file takes new writes: new bloom ids come after the old ones.
    restored = MessageChannel("room", "alice", 3_000, CONFIG, rng=random.Random(3), journal=True)
    restore_snapshot(restored, snap, 3_000)
    restored.drain_changes()
    bob.send(b"after the upgrade", 3_100)
    for d in bob.datagrams_to_send():
        restored.receive(d.data, 3_200)
    p.write([_batch(restored, stored.last_seq + 1)])
    again = p.load_channel("room", bloom_keep=alice.bloom.carry_over, cache_size=0)
    assert again is not None
    assert again.snapshot.bloom_recent == [*before.bloom_recent, restored.bloom.recent()[-1]]
    p.close()


def test_an_outgoing_row_leaves_its_bytes_to_the_log(tmp_path: Path) -> None:
    alice, _ = _pair()
    p = Persistence(tmp_path / "a.db")
    alice.send(b"hello", 1_100)
    p.write([_batch(alice, 1)])
    data = p._db.execute("SELECT data FROM outgoing").fetchall()
    assert data == [(None,)], "the outgoing row keeps no second copy of the message"
    stored = p.load_channel("room", bloom_keep=alice.bloom.carry_over, cache_size=0)
    assert stored is not None
    assert stored.snapshot.outgoing == export_snapshot(alice).outgoing
    p.close()


def test_the_bloom_window_is_one_table_without_a_second_index(tmp_path: Path) -> None:
    p = Persistence(tmp_path / "a.db")
    sql = p._db.execute("SELECT sql FROM sqlite_master WHERE name = 'bloom_recent'").fetchone()
    assert "WITHOUT ROWID" in sql[0]
    assert not p._db.execute("PRAGMA index_list(bloom_recent)").fetchall()[1:]
    p.close()


def test_the_log_has_no_index_keyed_by_message_id(tmp_path: Path) -> None:
    alice, bob = _pair()
    bob.send(b"hi alice", 1_100)
    for d in bob.datagrams_to_send():
        alice.receive(d.data, 1_200)
    alice.send(b"hi bob", 1_300)
    p = Persistence(tmp_path / "a.db")
    p.write([_batch(alice, 1)])
    # (name, partial): the seq index and log order (a join's window). Ids are found
    # through log_key, filled in sorted batches: an index keyed by id took every row
    # at a random page (test_a_row_costs_the_same_however_long_the_log).
    indexes = {r[1]: r[4] for r in p._db.execute("PRAGMA index_list(log)")}
    assert indexes == {"log_seq": 0, "log_order": 0}
    rows = p._db.execute("SELECT sender_id, own FROM log ORDER BY seq").fetchall()
    assert rows == [("bob", None), ("alice", 1)]
    p.close()


def _rows(first_seq: int, count: int, *, own_every: int = 2) -> ChannelBatch:
    """``count`` logged messages (every ``own_every``-th ours), as a turn writes them."""
    changes: list[Change] = []
    seqs = {}
    for seq in range(first_seq, first_seq + count):
        mid = hashlib.sha256(seq.to_bytes(8, "big")).hexdigest()
        own = seq % own_every == 0
        seqs[mid] = seq
        changes.append(Logged(mid, seq, "alice" if own else "bob", None, b"m" * 150, (), own, None))
    return ChannelBatch("room", "alice", changes, seqs, 2_000)


def _wal_bytes(p: Persistence) -> int:
    return Path(p.path + "-wal").stat().st_size


def test_a_row_costs_the_same_however_long_the_log(tmp_path: Path) -> None:
    """What a turn writes does not grow with the log: an index keyed by message id
    (random keys) dirtied a page of its own per row once it held some thousands of
    ids, and the bench's throughput fell with history (issue 29)."""
    p = Persistence(tmp_path / "a.db")
    p._db.execute("PRAGMA wal_autocheckpoint=0")  # the WAL only grows: its size is the cost
    turn = 64

    def cost(first_seq: int) -> float:
        """WAL bytes per row of 16 turns of ``turn`` rows from ``first_seq``."""
        p._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for k in range(16):
            p.write([_rows(first_seq + k * turn, turn)])
        return _wal_bytes(p) / (16 * turn)

    early = cost(1)
    seq = 1 + 16 * turn
    while seq < 60_000:  # history, written in big turns (fast)
        p.write([_rows(seq, 4_000)])
        seq += 4_000
    late = cost(seq)
    # With the id indexes (schema 5): early ~2.2 KB, late ~10 KB per row.
    assert late <= 1.5 * early, (early, late)
    p.close()


def test_ids_are_found_before_and_after_they_are_keyed_and_after_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.db"
    p = Persistence(path)
    batch = _persistence_batch_size()
    first = _rows(1, batch - 1)
    p.write([first])
    ids = list(first.seqs)
    assert p._db.execute("SELECT COUNT(*) FROM log_key").fetchone()[0] == 0  # not yet keyed
    archive = p.archive("room")
    assert archive.delivered({ids[0], ids[-1], "f" * 64}) == {ids[0], ids[-1]}
    assert p.send_outcome("room", ids[1]) is None  # ours, acknowledged
    p.write([_rows(batch, 2)])  # the batch is full: keyed, in the same transaction
    assert p._db.execute("SELECT COUNT(*) FROM log_key").fetchone()[0] == batch + 1
    assert archive.delivered({ids[0], ids[-1], "f" * 64}) == {ids[0], ids[-1]}
    found = archive.message(ids[6])  # seq 7: bob's
    assert found is not None and found[0] == "bob"
    p.write([_rows(batch + 2, 5)])  # logged, not keyed, when the process ends
    last = list(_rows(batch + 2, 5).seqs)[-1]
    p.close()

    again = Persistence(path)  # keyed at open: nothing is looked up by a scan
    assert again._db.execute("SELECT COUNT(*) FROM log_key").fetchone()[0] == batch + 6
    assert again.archive("room").delivered({ids[3], last}) == {ids[3], last}
    again.close()


def _persistence_batch_size() -> int:
    from sdk.runtime import persistence

    return persistence._KEY_BATCH


# The schema as version 5 wrote it: the log indexed by every id and by our own.
_V5_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE channel (
    channel_id TEXT PRIMARY KEY, participant_id TEXT NOT NULL, lamport INTEGER NOT NULL,
    heads TEXT NOT NULL DEFAULT '[]', referenced TEXT NOT NULL DEFAULT '[]',
    active_at INTEGER, owed TEXT, received INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE log (
    channel_id TEXT NOT NULL, seq INTEGER NOT NULL, message_id TEXT NOT NULL,
    lamport INTEGER NOT NULL, sender_id TEXT NOT NULL, retrieval_hint BLOB, data BLOB,
    outcome TEXT, own INTEGER
);
CREATE UNIQUE INDEX log_seq ON log (channel_id, seq);
CREATE UNIQUE INDEX log_own ON log (channel_id, message_id) WHERE own = 1;
CREATE INDEX log_id ON log (channel_id, message_id);
CREATE INDEX log_order ON log (channel_id, lamport, message_id);
INSERT INTO meta VALUES ('schema_version', '5'), ('participant_id', 'alice');
INSERT INTO channel (channel_id, participant_id, lamport, received) VALUES ('room', 'alice', 9, 1);
"""


def test_a_version_5_file_opens_with_its_log_keyed_by_id(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    db = sqlite3.connect(path)
    db.executescript(_V5_SCHEMA)
    # Three epochs' worth of sequence numbers: each row keyed in its own.
    seqs = [1, 2, 70_000, 140_000]
    for seq in seqs:
        own = 1 if seq == 2 else None
        db.execute(
            "INSERT INTO log VALUES ('room', ?, ?, ?, ?, NULL, ?, ?, ?)",
            (seq, f"id-{seq}", seq, "alice" if own else "bob", b"m", "expired:2", own),
        )
    db.commit()
    db.close()

    p = Persistence(path)
    assert p._meta("schema_version") == str(SCHEMA_VERSION) == "7"
    indexes = {r[1] for r in p._db.execute("PRAGMA index_list(log)")}
    assert indexes == {"log_seq", "log_order"}
    epochs = [r[0] for r in p._db.execute("SELECT epoch FROM log_key ORDER BY seq")]
    assert epochs == [0, 0, 1, 2]
    archive = p.archive("room")
    assert archive.delivered({f"id-{s}" for s in seqs} | {"id-3"}) == {f"id-{s}" for s in seqs}
    assert archive.message("id-140000") == ("bob", b"m")
    assert p.send_outcome("room", "id-2") == "expired:2"
    assert p.send_outcome("room", "id-1") is None  # not ours
    stored = p.load_channel("room", bloom_keep=0, cache_size=0)
    assert stored is not None and stored.last_seq == 140_000 and stored.received == 1
    p.close()


def test_ids_of_a_rolled_back_write_are_not_found(tmp_path: Path) -> None:
    p = Persistence(tmp_path / "a.db")
    kept = _rows(1, 10)
    p.write([kept])
    failing = _rows(11, 10)
    # Fails after its log rows are inserted (an outgoing entry without a valid state).
    failing.changes.append(OutgoingSaved("x", b"", 0, 0, None, ()))  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        p.write([failing])
    archive = p.archive("room")
    assert archive.delivered(set(failing.seqs) | set(kept.seqs)) == set(kept.seqs)
    again = _rows(11, 3)
    # The same sequence numbers, other messages (other bytes, so other ids).
    again = ChannelBatch(
        "room",
        "alice",
        [
            Logged(f"other-{c.message_id}", c.lamport_timestamp, "bob", None, b"o", (), False)
            for c in again.changes
            if isinstance(c, Logged)
        ],
        {f"other-{mid}": seq for mid, seq in again.seqs.items()},
        2_000,
    )
    p.write([again])
    assert archive.delivered(set(again.seqs)) == set(again.seqs)
    assert not archive.delivered(set(failing.seqs))  # their seqs hold other messages now
    p.close()


# The schema as version 6 wrote it: seal records in a table of their own.
_V6_SCHEMA = (
    _V5_SCHEMA.replace("'5'", "'6'")
    .replace("CREATE UNIQUE INDEX log_own ON log (channel_id, message_id) WHERE own = 1;\n", "")
    .replace("CREATE INDEX log_id ON log (channel_id, message_id);\n", "")
    .replace(
        "received INTEGER NOT NULL DEFAULT 0",
        "received INTEGER NOT NULL DEFAULT 0, indexed INTEGER NOT NULL DEFAULT 0",
    )
    + """
CREATE TABLE sealed (
    channel_id TEXT NOT NULL, message_id TEXT NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (channel_id, message_id)
) WITHOUT ROWID;
"""
)


def test_a_version_6_file_keeps_its_seal_records_in_the_log_rows(tmp_path: Path) -> None:
    path = tmp_path / "v6.db"
    db = sqlite3.connect(path)
    db.executescript(_V6_SCHEMA)
    for seq, sender in ((1, "bob"), (2, "alice"), (3, "carol")):
        own = 1 if sender == "alice" else None
        db.execute(
            "INSERT INTO log VALUES ('room', ?, ?, ?, ?, NULL, ?, NULL, ?)",
            (seq, f"id-{seq}", seq, sender, b"m", own),
        )
    db.execute("INSERT INTO sealed VALUES ('room', 'id-1', ?)", (b"r" * 103,))
    db.commit()
    db.close()

    p = Persistence(path)
    assert p._meta("schema_version") == str(SCHEMA_VERSION) == "7"
    tables = {r[0] for r in p._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "sealed" not in tables
    assert p.seal_record("room", "id-1") == b"r" * 103
    assert p.seal_record("room", "id-3") is None  # received, no record kept
    assert p.seal_record("room", "id-2") is None  # ours
    # New records go to the rows written after the migration.
    batch = _rows(5, 1)  # a received message
    (mid,) = batch.seqs
    batch.sealed = {mid: b"s" * 103}
    p.write([batch])
    assert p.seal_record("room", mid) == b"s" * 103
    p.close()
