"""The persistent log store: what an endpoint stores survives closing the file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    MemoryLogStore,
    SqliteLogStore,
    append_entry,
    shortest_path,
    sign_log_entry,
)
from sdk.sync.bamboo_p2p.pair import EndpointPair

KEY = KeyPair.from_private_key(bytes(range(32)))
LOG = (KEY.public_key, 0)


def test_a_full_and_a_sparse_sync_into_sqlite_survive_reopening(tmp_path: Path) -> None:
    server = SqliteLogStore(str(tmp_path / "server.db"))
    for i in range(40):
        append_entry(server, KEY, 0, b"entry %d" % i)
    server.flush()
    path = str(tmp_path / "phone.db")
    phone = SqliteLogStore(path)
    pair = EndpointPair.create(server, phone)
    pair.exchange()
    pair.b.propose(LOG, 1, end=25)
    pair.run()
    assert pair.error is None
    phone.close()
    phone = SqliteLogStore(path)
    assert phone.sequence_numbers(LOG) == phone.payload_sequence_numbers(LOG) == list(range(1, 26))
    assert phone.latest(LOG) == 25
    for seq in range(1, 26):
        stored, original = phone.entry(LOG, seq), server.entry(LOG, seq)
        assert stored is not None and original is not None and stored.hash == original.hash
        assert phone.payload(LOG, seq) == b"entry %d" % (seq - 1)
    # The sparse newest entry lands next to the full range in the same file.
    sparse = SqliteLogStore(str(tmp_path / "sparse.db"))
    pair = EndpointPair.create(server, sparse)
    pair.exchange()
    pair.b.propose(LOG, 1, end=40, sparse=True)
    pair.run()
    assert pair.error is None
    assert sparse.sequence_numbers(LOG) == shortest_path(40, 1)


def test_end_of_log_and_fork_proofs_are_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "log.db")
    store = SqliteLogStore(path, cache_entries=2)
    for i in range(3):
        append_entry(store, KEY, 0, b"%d" % i)
    end = append_entry(store, KEY, 0, b"end", end_of_log=True)
    other = sign_log_entry(KEY, 0, 2, b"another second entry", store.entry(LOG, 1).hash)  # type: ignore[union-attr]
    first = store.entry(LOG, 2)
    assert first is not None
    store.record_fork(LOG, (first, other))
    store.record_fork(LOG, (other, first))  # the first proof is kept
    store.close()
    store = SqliteLogStore(path)
    assert store.end_of_log(LOG) == end.seq_num == 4
    proof = store.fork_proof(LOG)
    assert proof is not None and (proof[0].hash, proof[1].hash) == (first.hash, other.hash)
    assert store.fork_proof((KEY.public_key, 9)) is None
    assert store.end_of_log((KEY.public_key, 9)) is None
    assert store.entry(LOG, 99) is None and store.payload(LOG, 99) is None


def test_memory_and_sqlite_stores_give_the_same_answers(tmp_path: Path) -> None:
    # A tiny cache, payloads too large to read ahead, reads in any order and before
    # and after commits: the caches never answer differently from the table.
    path = str(tmp_path / "same.db")
    memory, sqlite = MemoryLogStore(), SqliteLogStore(path, cache_entries=3)
    sizes = [i if i % 3 else 20_000 + i for i in range(20)]
    for store in (memory, sqlite):
        for size in sizes:
            append_entry(store, KEY, 0, b"x" * size)
    rng = random.Random(7)
    for reopened in (False, True):
        if reopened:
            sqlite.close()
            sqlite = SqliteLogStore(path, cache_entries=3)
        for seq in rng.sample(range(0, 23), 23) * 2:
            assert memory.entry(LOG, seq) == sqlite.entry(LOG, seq)
            assert memory.payload(LOG, seq) == sqlite.payload(LOG, seq)
        assert memory.latest(LOG) == sqlite.latest(LOG) == 20
    # An entry stored without its payload, then the payload.
    entry = sign_log_entry(KEY, 1, 1, b"later")
    sqlite.put_entry(entry)
    with pytest.raises(ValueError):
        sqlite.put_entry(entry)  # its place is taken, written or not
    assert sqlite.payload((KEY.public_key, 1), 1) is None
    sqlite.flush()  # the entry is written without its payload ...
    assert sqlite.payload_sequence_numbers((KEY.public_key, 1)) == []
    sqlite.put_payload((KEY.public_key, 1), 1, b"later")  # ... which follows later
    assert sqlite.payload((KEY.public_key, 1), 1) == b"later"
    assert sqlite.entry((KEY.public_key, 1), 2) is None
    # An entry whose payload never comes survives a restart without it.
    lonely = sign_log_entry(KEY, 2, 1, b"never sent")
    sqlite.put_entry(lonely)
    sqlite.close()
    sqlite = SqliteLogStore(path)
    assert sqlite.entry((KEY.public_key, 2), 1) == lonely
    assert sqlite.payload((KEY.public_key, 2), 1) is None
    assert sqlite.payload((KEY.public_key, 1), 1) == b"later"
