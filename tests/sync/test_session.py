"""Replication sessions as a state machine: convergence, sessions, live mode, bad input."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.documents import KeyPair, cbor
from sdk.documents.bamboo import decode_entry, sign_entry
from sdk.documents.errors import InvalidSignature
from sdk.sync import rbsr
from sdk.sync.errors import (
    InvalidEntry,
    LimitExceeded,
    MalformedMessage,
    UnexpectedEntry,
    UnknownSession,
)
from sdk.sync.events import (
    ConnectionClosed,
    PeerMessageRejected,
    Phase,
    Progress,
    RequestIgnored,
    SessionAborted,
    SessionDone,
)
from sdk.sync.messages import (
    Announce,
    EntryMessage,
    Mode,
    RangeSync,
    RoundContext,
    SyncRequest,
    decode,
    encode,
)
from sdk.sync.session import SyncConfig
from tests.documents.helpers import TODO_SCHEMA, todo_fields
from tests.sync.helpers import (
    KEYS,
    TODO,
    closed_subset,
    dependencies,
    entry_ids,
    history,
    make_store,
    pair,
    views,
)

HISTORY = history(seed=1, operations=120)


def split_stores(seed: int, keep_a: float, keep_b: float):
    rng = random.Random(seed)
    a = make_store(closed_subset(HISTORY, rng, keep_a))
    b = make_store(closed_subset(HISTORY, rng, keep_b))
    return a, b


@pytest.mark.parametrize("mode", [Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT])
def test_two_diverged_stores_converge(mode: Mode) -> None:
    a, b = split_stores(2, 0.6, 0.6)
    union = entry_ids(a) | entry_ids(b)
    assert entry_ids(a) != entry_ids(b)
    wire = pair(a, b, SyncConfig(mode=mode))
    sid = wire.a.request([TODO], 0)
    wire.run()
    assert entry_ids(a) == entry_ids(b) == union
    assert views(a) == views(b)
    done_a = [e for e in wire.events_a if isinstance(e, SessionDone)]
    done_b = [e for e in wire.events_b if isinstance(e, SessionDone)]
    assert [d.session_id for d in done_a] == [sid] and len(done_b) == 1
    assert done_a[0].entries_received == done_b[0].entries_sent
    assert done_a[0].entries_sent == done_b[0].entries_received
    assert not wire.a.sessions() and not wire.b.sessions()
    phases = [e.phase for e in wire.events_a if isinstance(e, Progress)]
    assert Phase.RECONCILING in phases and phases[-1] is Phase.DONE


def test_reconciliation_rounds_write_same_author_items_short() -> None:
    a, b = split_stores(2, 0.6, 0.6)
    union = entry_ids(a) | entry_ids(b)
    small = {"branching": 2, "threshold": 2, "part_threshold": 0}  # cuts inside authors
    wire = pair(a, b, SyncConfig(**small), SyncConfig(initiator=False, **small))
    wire.a.request([TODO], 0)
    frames: dict[str, list[bytes]] = {"a": [], "b": []}
    wire.collect()
    while wire.a_to_b or wire.b_to_a:
        to_b, wire.a_to_b = wire.a_to_b, []
        to_a, wire.b_to_a = wire.b_to_a, []
        frames["a"] += to_b
        frames["b"] += to_a
        for data in to_b:
            wire.b.receive(data, 0)
        for data in to_a:
            wire.a.receive(data, 0)
        wire.collect()
    assert entry_ids(a) == entry_ids(b) == union
    short = long = same_author = 0
    for sent in frames.values():
        context = RoundContext()
        for data in sent:
            message = decode(data, context)
            if isinstance(message, RangeSync):
                short += len(data)
                long += len(encode(message))
                fields = cbor.decode(data)[2:]
                same_author += any(isinstance(f, list) and len(f) == 2 for f in fields)
    assert same_author and short < long


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 10_000),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.sampled_from([Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT]),
    st.integers(2, 5),
)
def test_property_random_stores_and_interleavings_converge(seed, keep_a, keep_b, mode, b):
    a, bb = split_stores(seed, keep_a, keep_b)
    union = entry_ids(a) | entry_ids(bb)
    config = SyncConfig(mode=mode, branching=b, threshold=b + 1)
    wire = pair(a, bb, config, SyncConfig(initiator=False, branching=b, threshold=b + 1))
    wire.a.request([TODO], 0)
    wire.run(random.Random(seed))
    assert entry_ids(a) == entry_ids(bb) == union
    assert views(a) == views(bb)
    assert not any(isinstance(e, SessionAborted) for e in wire.events_a + wire.events_b)


def test_equal_stores_finish_in_one_round_trip_with_few_bytes() -> None:
    a = make_store(HISTORY)
    b = make_store(HISTORY)
    wire = pair(a, b)
    wire.a.request([TODO], 0)
    wire.collect()
    first = list(wire.a_to_b)
    wire.a_to_b.clear()
    for data in first:
        wire.b.receive(data, 0)
    wire.collect()
    replies = list(wire.b_to_a)
    wire.b_to_a.clear()
    for data in replies:
        wire.a.receive(data, 0)
    wire.collect()
    # A's SyncDone is the only thing left: one round trip.
    assert len(wire.a_to_b) == 1 and not wire.b_to_a
    wire.run()
    assert sum(len(x) for x in first + replies) + 4 < 200
    assert any(isinstance(e, SessionDone) for e in wire.events_b)


def test_catch_up_from_empty_both_ways() -> None:
    full = make_store(HISTORY)
    for a, b in ((make_store([]), full), (full, make_store([]))):
        wire = pair(a, b)
        wire.a.request([TODO], 0)
        wire.run()
        assert entry_ids(a) == entry_ids(b) == entry_ids(full)


def test_an_empty_peer_gets_entries_at_once_without_a_list_of_logs() -> None:
    full = make_store(HISTORY)
    empty = make_store([])
    wire = pair(empty, full)
    wire.a.request([TODO], 0)
    wire.collect()
    for data in wire.a_to_b:
        wire.b.receive(data, 0)
    wire.a_to_b.clear()
    wire.collect()
    # Spec 2.1: EmptySet asks for all entries directly. The answer is a bare Terminal
    # and the entries (no Payload per log of the full side); the full side's SyncDone
    # waits for the requester's (done means stored, see Replication._local_done).
    context = RoundContext()
    answer = [decode(data, context) for data in wire.b_to_a]
    kinds = [type(m.message if isinstance(m, RangeSync) else m).__name__ for m in answer]
    entries = len(entry_ids(full))
    assert kinds == ["Terminal"] + ["EntryMessage"] * entries
    wire.run()
    assert entry_ids(empty) == entry_ids(full)
    assert views(empty) == views(full)
    done = [e for e in wire.events_a if isinstance(e, SessionDone)]
    assert done[0].entries_received == entries


def test_logs_a_peer_lacks_go_before_reconciliation_ends() -> None:
    full = make_store(HISTORY)
    behind = make_store(closed_subset(HISTORY, random.Random(4), 0.3))
    had = {row[0] for row in behind._db.execute("SELECT DISTINCT author || log_id FROM entries")}
    small = {"branching": 2, "threshold": 2}
    wire = pair(behind, full, SyncConfig(**small), SyncConfig(initiator=False, **small))
    wire.a.request([TODO], 0)
    sent: list[object] = []  # what the full side sent, in order
    wire.collect()
    while wire.a_to_b or wire.b_to_a:
        to_b, wire.a_to_b = wire.a_to_b, []
        to_a, wire.b_to_a = wire.b_to_a, []
        for data in to_b:
            wire.b.receive(data, 0)
        context = RoundContext()
        for data in to_a:
            sent.append(decode(data, context))
            wire.a.receive(data, 0)
        wire.collect()
    assert entry_ids(behind) == entry_ids(full)
    last_round = max(i for i, m in enumerate(sent) if isinstance(m, RangeSync))
    early = [
        m
        for m in sent[:last_round]
        if isinstance(m, EntryMessage)
        and (lambda e: f"{e.author.hex()}{e.log_id}")(decode_entry(m.entry)) not in had
    ]
    # Entries of logs the behind side held nothing of went while ranges were still
    # being reconciled, not all after the last round.
    assert early
    # And their keys were not listed first: the entries say more.
    listed = {
        decode_entry(e.entry).author.hex() + str(decode_entry(e.entry).log_id) for e in early
    } & {
        m.message.key[:32].hex() + str(int.from_bytes(m.message.key[32:40], "big"))
        for m in sent
        if isinstance(m, RangeSync) and isinstance(m.message, rbsr.Payload)
    }
    assert not listed


def test_several_sessions_and_duplicate_requests() -> None:
    a, b = split_stores(3, 0.5, 0.5)
    system = "schema_definition_v1"
    wire = pair(a, b, schemas=(TODO, system))
    first = wire.a.request([TODO], 0)
    second = wire.a.request([system], 0)
    assert (first, second) == (0, 1)
    with pytest.raises(ValueError):
        wire.a.request([TODO], 0)
    # The peer repeats session 0 over the same schemas: ignored.
    wire.collect()
    for data in wire.a_to_b:
        wire.b.receive(data, 0)
    wire.a_to_b.clear()
    wire.b.receive(encode(SyncRequest(0, Mode.SET_RECONCILIATION, (TODO,))), 0)
    wire.b.receive(encode(SyncRequest(7, Mode.SET_RECONCILIATION, (TODO,))), 0)
    wire.collect()
    ignored = [e for e in wire.events_b if isinstance(e, RequestIgnored)]
    assert [e.session_id for e in ignored] == [0, 7]
    wire.run()
    done = {e.session_id for e in wire.events_a if isinstance(e, SessionDone)}
    assert done == {0, 1}
    assert entry_ids(a) == entry_ids(b)


def test_requests_for_schemas_not_announced_are_ignored() -> None:
    a, b = split_stores(4, 0.5, 0.5)
    wire = pair(a, b)
    wire.b.schema_ids = ("schema_definition_v1",)
    before = entry_ids(b)
    wire.a.request([TODO], 0)
    wire.run()
    assert any(
        isinstance(e, RequestIgnored) and e.reason == "schemas not announced" for e in wire.events_b
    )
    assert entry_ids(b) == before


def test_concurrent_requests_for_the_same_id() -> None:
    a, b = split_stores(5, 0.5, 0.5)
    wire = pair(a, b, schemas=(TODO, "schema_definition_v1"))
    wire.a.request([TODO], 0)
    wire.b.request(["schema_definition_v1"], 0)  # also session 0
    wire.run()
    # The dialling side (a) kept its session 0; b asked again under id 1.
    done_a = {e.session_id for e in wire.events_a if isinstance(e, SessionDone)}
    assert done_a == {0, 1}
    assert entry_ids(a) == entry_ids(b)


def test_announce_replaced_only_by_newer_timestamp() -> None:
    a, b = split_stores(6, 0.5, 0.5)
    wire = pair(a, b)
    assert wire.a.receive_announce(Announce(10, (TODO,)))
    assert not wire.a.receive_announce(Announce(10, ()))
    assert not wire.a.receive_announce(Announce(9, ()))
    assert wire.a.remote_announce == Announce(10, (TODO,))
    wire.a.receive(encode(Announce(11, ())), 0)
    assert wire.a.remote_announce == Announce(11, ())
    first = wire.a.announce(5_000)
    assert wire.a.announce(5_000).timestamp > first.timestamp


def test_live_mode_pushes_new_entries_until_ended() -> None:
    a, b = split_stores(7, 0.7, 0.7)
    live = SyncConfig(live_mode=True)
    wire = pair(a, b, live, SyncConfig(initiator=False, live_mode=True))
    sid = wire.a.request([TODO], 0)
    wire.run()
    assert wire.a.sessions()[sid].phase is Phase.LIVE
    published = a.create(KEYS[0], TODO, todo_fields("bread"))
    wire.run()
    assert b.document(published.document_id) is not None
    published_b = b.update(KEYS[1], published.document_id, {"done": True})
    wire.run()
    assert a.has_entry(published_b.operation_id)
    wire.a.end_live(sid, 0)
    wire.run()
    assert sid not in wire.a.sessions() and sid not in wire.b.sessions()
    later = a.create(KEYS[0], TODO, todo_fields("tea"))
    wire.run()
    assert b.document(later.document_id) is None


def test_live_mode_needs_both_sides() -> None:
    a, b = split_stores(8, 0.5, 0.5)
    wire = pair(a, b, SyncConfig(live_mode=True), SyncConfig(initiator=False, live_mode=False))
    sid = wire.a.request([TODO], 0)
    wire.run()
    assert sid not in wire.a.sessions()


# -- bad input ------------------------------------------------------------------------


def open_session(mode: Mode = Mode.SET_RECONCILIATION):
    a, b = split_stores(9, 0.5, 0.3)
    wire = pair(a, b, SyncConfig(mode=mode))
    sid = wire.a.request([TODO], 0)
    wire.collect()
    for data in wire.a_to_b:
        wire.b.receive(data, 0)
    wire.a_to_b.clear()
    wire.collect()
    return wire, sid, b


def snapshot(store):
    return entry_ids(store), views(store)


@pytest.mark.parametrize("data", [b"\xff\x00", encode(Announce(1, ()))[:-1], b"\x82\x18\x63\x00"])
def test_malformed_bytes_close_the_connection_and_change_nothing(data: bytes) -> None:
    wire, sid, b = open_session()
    before = snapshot(b)
    wire.b.receive(data, 0)
    wire.collect()
    closed = [e for e in wire.events_b if isinstance(e, ConnectionClosed)]
    assert len(closed) == 1 and isinstance(closed[0].error, MalformedMessage)
    assert any(isinstance(e, SessionAborted) and e.session_id == sid for e in wire.events_b)
    assert snapshot(b) == before
    assert wire.b.closed


def test_wrong_session_id_is_rejected_and_others_continue() -> None:
    wire, sid, b = open_session()
    entry, operation = HISTORY[0]
    wire.b.receive(encode(EntryMessage(sid + 40, entry, operation)), 0)
    wire.collect()
    rejected = [e for e in wire.events_b if isinstance(e, PeerMessageRejected)]
    assert len(rejected) == 1 and isinstance(rejected[0].error, UnknownSession)
    wire.run()
    assert entry_ids(wire.a.store) == entry_ids(b)


def other_schema_entry() -> tuple[bytes, bytes]:
    from sdk.documents import Schema

    other = Schema.application("note", ("0020" + "22" * 32,), "a note", {"text": "str"})
    store = make_store([])
    store.add_schema(other)
    published = store.create(KEYS[3], other.id, {"text": "hi"})
    return published.entry, published.operation


def test_entry_never_asked_for_aborts_the_session_store_unchanged() -> None:
    wire, sid, b = open_session()
    before = snapshot(b)
    entry, operation = other_schema_entry()
    wire.b.receive(encode(EntryMessage(sid, entry, operation)), 0)
    wire.collect()
    aborted = [e for e in wire.events_b if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, UnexpectedEntry)
    assert snapshot(b) == before
    assert not wire.b.closed


def test_forged_signature_aborts_the_session_store_unchanged() -> None:
    wire, sid, b = open_session(Mode.LOG_HEIGHT)
    before = snapshot(b)
    forger = KeyPair.from_private_key(b"\x09" * 32)
    store = make_store([])
    store.add_schema(TODO_SCHEMA)
    published = store.create(forger, TODO, todo_fields("forged"))
    real = decode_entry(published.entry)
    # Same bytes, someone else's signature.
    other = sign_entry(KEYS[0], real.log_id, real.seq_num, published.operation, None, None)
    forged = published.entry[:-64] + other.signature
    wire.b.receive(encode(EntryMessage(sid, forged, published.operation)), 0)
    wire.collect()
    aborted = [e for e in wire.events_b if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, InvalidEntry)
    assert isinstance(aborted[0].error.cause, InvalidSignature)
    assert snapshot(b) == before


def test_a_stalled_peer_is_cut_off() -> None:
    wire, sid, _ = open_session()
    timer = wire.a.get_timer()
    assert timer is not None
    wire.a.handle_timer(timer - 1)
    assert sid in wire.a.sessions()
    wire.a.handle_timer(timer)
    wire.collect()
    aborted = [e for e in wire.events_a if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, LimitExceeded)


def test_pending_entries_are_bounded() -> None:
    # In order, nothing waits: a whole history syncs under a bound of 3.
    a = make_store(HISTORY)
    b = make_store([])
    wire = pair(
        a, b, SyncConfig(mode=Mode.LOG_HEIGHT), SyncConfig(initiator=False, max_pending_entries=3)
    )
    wire.a.request([TODO], 0)
    wire.run()
    assert entry_ids(b) == entry_ids(a)
    assert not [e for e in wire.events_b if isinstance(e, SessionAborted)]
    # Entries whose backlinks never come: held up to the bound, then the session ends.
    later = [(e, o) for e, o in HISTORY if decode_entry(e).seq_num > 1][:10]
    wire2 = pair(
        make_store([]),
        make_store([]),
        SyncConfig(mode=Mode.LOG_HEIGHT),
        SyncConfig(initiator=False, max_pending_entries=3),
    )
    sid = wire2.a.request([TODO], 0)
    wire2.collect()
    for data in wire2.a_to_b:
        wire2.b.receive(data, 0)
    held: list[int] = []
    for entry, operation in later:
        wire2.b.receive(encode(EntryMessage(sid, entry, operation)), 0)
        wire2.collect()
        if any(isinstance(e, SessionAborted) for e in wire2.events_b):
            break
        held.append(len(wire2.b._sessions[sid].pending))
    assert held == [1, 2, 3]  # the fourth waiting entry ends the session
    aborted = [e for e in wire2.events_b if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, LimitExceeded)
    assert sid not in wire2.b._sessions  # its held entries went with it
    assert entry_ids(wire2.b.store) == set()


def test_flooding_with_rejected_messages_closes_the_connection() -> None:
    wire, _, _ = open_session()
    for n in range(200):
        wire.b.receive(encode(EntryMessage(1000 + n, b"x", b"y")), 0)
    wire.collect()
    assert wire.b.closed
    assert isinstance(
        next(e for e in wire.events_b if isinstance(e, ConnectionClosed)).error, LimitExceeded
    )


def test_entries_stored_between_sync_done_and_live_are_not_lost() -> None:
    a, b = make_store(HISTORY), make_store(HISTORY)
    wire = pair(a, b, SyncConfig(live_mode=True), SyncConfig(initiator=False, live_mode=True))
    sid = wire.a.request([TODO], 0)
    wire.collect()
    for data in wire.a_to_b:
        wire.b.receive(data, 0)
    wire.a_to_b.clear()
    wire.collect()
    # B has sent its SyncDone(live) but has not heard A's yet: not live.
    assert wire.b.sessions()[sid].phase is not Phase.LIVE
    published = b.create(KEYS[2], TODO, todo_fields("between"))
    wire.run()
    assert wire.b.sessions()[sid].phase is Phase.LIVE
    assert a.has_entry(published.operation_id)


def forged_copy(entry: bytes, operation: bytes) -> bytes:
    """``entry`` with a signature by a key that is not its author's."""
    real = decode_entry(entry)
    other = sign_entry(KEYS[0] if real.author != KEYS[0].public_key else KEYS[1],
                       real.log_id, real.seq_num, operation, real.backlink, real.lipmaa_link)  # fmt: skip
    return entry[:-64] + other.signature


def test_a_batch_with_an_invalid_entry_keeps_the_valid_ones_before_it() -> None:
    """One read's entries go to the store together; the first invalid one aborts the session
    after the valid ones before it are committed; nothing after it is stored."""
    a = make_store([])
    b = make_store([])
    wire = pair(a, b, SyncConfig(mode=Mode.LOG_HEIGHT))
    sid = wire.a.request([TODO], 0)
    wire.collect()
    wire.b.receive_many(wire.a_to_b, 0)
    wire.a_to_b.clear()
    frames = [encode(EntryMessage(sid, e, o)) for e, o in HISTORY[:30]]
    bad = 20
    frames[bad] = encode(EntryMessage(sid, forged_copy(*HISTORY[bad]), HISTORY[bad][1]))
    wire.b.receive_many(frames, 0)
    wire.collect()
    aborted = [e for e in wire.events_b if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, InvalidEntry)
    assert isinstance(aborted[0].error.cause, InvalidSignature)
    expected = {decode_entry(e).id for e, _ in HISTORY[:bad]}
    assert entry_ids(b) == expected
    # Stored means indexed too: the range index holds those logs' heights.
    assert len(b.index(TODO)) == len({(decode_entry(e).author, decode_entry(e).log_id)
                                      for e, _ in HISTORY[:bad]})  # fmt: skip
    assert not wire.b.closed


def test_a_bad_message_after_entries_keeps_the_entries_before_it() -> None:
    wire, sid, b = open_session(Mode.LOG_HEIGHT)
    missing = [(e, o) for e, o in HISTORY if decode_entry(e).id not in entry_ids(b)]
    before = entry_ids(b)
    entry, operation = other_schema_entry()
    frames = [encode(EntryMessage(sid, e, o)) for e, o in missing[:5]]
    frames.append(encode(EntryMessage(sid, entry, operation)))
    wire.b.receive_many(frames, 0)
    wire.collect()
    aborted = [e for e in wire.events_b if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, UnexpectedEntry)
    stored = entry_ids(b) - before
    # Those of the five whose dependencies b had are stored; none is lost to the abort.
    assert stored and stored <= {decode_entry(e).id for e, _ in missing[:5]}


def test_one_read_of_entries_is_one_transaction() -> None:
    """Catch-up speed: a read's Entry messages commit once, not once per entry."""
    a = make_store([])
    b = make_store([])
    wire = pair(a, b, SyncConfig(mode=Mode.LOG_HEIGHT))
    sid = wire.a.request([TODO], 0)
    wire.collect()
    wire.b.receive_many(wire.a_to_b, 0)
    statements: list[str] = []
    b._db.set_trace_callback(statements.append)
    wire.b.receive_many([encode(EntryMessage(sid, e, o)) for e, o in HISTORY[:50]], 0)
    b._db.set_trace_callback(None)
    assert len(entry_ids(b)) == 50
    assert statements.count("COMMIT") == 1


def test_log_heights_of_answers_each_log_as_log_height_does() -> None:
    """The heights _apply_differences reads in one query equal the per-log ones."""
    from tests.sync.helpers import history, make_store

    published = history(7, 60)
    store = make_store(published[:40])
    logs = {(e.author, e.log_id) for e in (decode_entry(entry) for entry, _ in published)}
    logs.add((bytes(32), 0))  # a log nobody stored
    heights = store.log_heights_of([*logs, *logs])
    assert heights == {log: store.log_height(*log) for log in logs}
    assert heights[bytes(32), 0] == 0 and any(h > 1 for h in heights.values())


def test_entries_for_reads_many_logs_in_one_query_per_chunk() -> None:
    """Sending: the logs asked for are read in chunks, not one query per log, and
    every entry comes after its backlink and the operations it builds on."""
    store = make_store(history(3, 60))
    key = KeyPair.from_private_key(b"\x09" * 32)
    for n in range(600):
        store.create(key, TODO, todo_fields(f"bulk {n}"))
    logs = {
        (bytes.fromhex(a), log_id)
        for a, log_id in store._db.execute("SELECT author, log_id FROM logs")
    }
    wanted = [(author, log_id, 0) for author, log_id in logs]
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    sent = store.entries_for([*wanted, (bytes(32), 0, 0)])
    store._db.set_trace_callback(None)
    assert sum(s.lstrip().upper().startswith(("SELECT", "WITH")) for s in statements) <= 2
    expected = {e for a, log_id in logs for e in store.log_entries(a, log_id)}
    assert {(out.entry, out.operation) for out in sent} == expected
    assert len(sent) == len(expected)
    seen: set[str] = set()
    for out in sent:
        assert dependencies(out.entry, out.operation) <= seen
        seen.add(decode_entry(out.entry).id)
    partial = store.entries_for([(a, log_id, 1) for a, log_id in logs])
    assert all(out.seq_num > 1 for out in partial)
    assert len(partial) == len(expected) - len(logs)


def test_the_range_index_follows_batches_that_grow_logs() -> None:
    """ingest_many updates the index once per batch: it holds each log's height key."""
    from sdk.documents.store import DocumentStore
    from sdk.sync.messages import item_key

    store = make_store([])
    index = store.index(TODO)
    rng = random.Random(5)
    published = history(11, 150)
    start = 0
    while start < len(published):
        size = rng.randrange(1, 30)
        chunk = published[start : start + size]
        result = store.ingest_many([DocumentStore.decode(e, o) for e, o in chunk])
        assert result.error is None and not result.waiting
        start += size
        heights = store.log_heights(TODO)
        assert list(index.iter_from(None)) == sorted(item_key(*h) for h in heights)
    assert any(seq > 1 for _, _, seq in store.log_heights(TODO))


@pytest.mark.parametrize("reopen", [False, True])
def test_an_index_first_built_by_a_batch_holds_its_keys_once(tmp_path, reopen: bool) -> None:
    """A batch whose schema has no index yet builds it from the committed logs (that batch's
    keys in it, not applied again); later batches, and a reopened file store's persisted
    index, follow each log's height."""
    from sdk.documents.store import DocumentStore
    from sdk.sync.messages import item_key

    path = str(tmp_path / "s.db")
    store = make_store([], path)
    published = history(13, 120)
    for start in range(0, len(published), 40):
        if reopen and start:
            store.close()
            store = make_store([], path)
        chunk = published[start : start + 40]
        result = store.ingest_many([DocumentStore.decode(e, o) for e, o in chunk])
        assert result.error is None and not result.waiting
        heights = store.log_heights(TODO)
        assert list(store.index(TODO).iter_from(None)) == sorted(item_key(*h) for h in heights)
        assert len(store.index(TODO)) == len(heights)
    assert any(seq > 1 for _, _, seq in store.log_heights(TODO))
    store.close()


def test_both_connections_of_a_file_store_checkpoint_alike(tmp_path) -> None:
    """The index connection's flush must not checkpoint a catch-up's WAL early."""
    from sdk.sync.store import SyncStore

    store = SyncStore(str(tmp_path / "s.db"))
    assert store._index_db is not None
    threshold = store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    assert store._index_db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == threshold > 1000
    store.close()
