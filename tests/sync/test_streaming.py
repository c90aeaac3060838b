"""The sending side streams: entries are read and encoded a chunk at a time, in an order
the peer can ingest, SyncDone after the last one; the receiving side starts signature
checks as it decodes."""

from __future__ import annotations

from itertools import pairwise

import pytest

from sdk.documents import PinnedRelationList, Schema
from sdk.documents.bamboo import SignatureChecks, decode_entry
from sdk.documents.operation import decode_operation
from sdk.documents.schema import SYSTEM_SCHEMAS
from sdk.sync.events import SessionAborted, SessionDone
from sdk.sync.messages import EntryMessage, Message, Mode, RoundContext, SyncDone, decode, encode
from sdk.sync.session import SyncConfig
from sdk.sync.store import SyncStore
from tests.documents.helpers import TODO_SCHEMA, todo_fields
from tests.sync.helpers import (
    KEYS,
    TODO,
    Wire,
    dependencies,
    entry_ids,
    history,
    make_store,
    pair,
    views,
)

#: Documents edited by three authors: an entry's ``previous`` names other logs.
HISTORY = history(seed=5, operations=150, authors=3)
NOTE = Schema.application("note", ("0020" + "22" * 32,), "a note", {"text": "str"})


def drive(wire: Wire, sent_by_b: list[list[bytes]]) -> None:
    """Deliver everything both ways, in order; record each of b's ``messages_to_send``."""
    for _ in range(100_000):
        out_a, out_b = wire.a.messages_to_send(), wire.b.messages_to_send()
        if not out_a and not out_b:
            return
        sent_by_b.append(out_b)
        wire.b.receive_many(out_a, 0)
        wire.a.receive_many(out_b, 0)
    raise AssertionError("no quiescence")


def read_calls(calls: list[list[bytes]]) -> list[list[Message]]:
    """The messages of each call, decoded in order (round messages refer back)."""
    context = RoundContext(64)
    return [[decode(f, context) for f in call] for call in calls]


def entries_in(messages: list[Message]) -> list[EntryMessage]:
    return [m for m in messages if isinstance(m, EntryMessage)]


@pytest.mark.parametrize("mode", [Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT])
@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunks_keep_every_entry_after_what_it_depends_on(mode: Mode, chunk: int) -> None:
    """Small chunks split a catch-up many times; every entry still comes after its
    backlink and its ``previous`` (other authors' logs), so nothing waits."""
    full = make_store(HISTORY)
    empty = make_store([])
    wire = pair(empty, full, SyncConfig(mode=mode), SyncConfig(initiator=False, send_chunk=chunk))
    sid = wire.a.request([TODO], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full) and views(empty) == views(full)
    per_call = read_calls(calls)
    messages = [m for call in per_call for m in call]
    seen: set[str] = set()
    for message in entries_in(messages):
        assert dependencies(message.entry, message.operation) <= seen
        seen.add(decode_entry(message.entry).id)
    assert len(seen) == len(HISTORY)
    # Each call hands out about one chunk; a document with several logs stays whole.
    assert len([c for c in per_call if entries_in(c)]) >= len(HISTORY) // max(chunk, 12)
    # SyncDone goes after the session's last entry.
    done = next(n for n, m in enumerate(messages) if isinstance(m, SyncDone))
    assert not any(isinstance(m, EntryMessage) for m in messages[done:])
    assert messages[done].session_id == sid  # type: ignore[union-attr]


def one_log_store(entries: int, documents: int) -> tuple[SyncStore, str]:
    """Single-entry documents, then one document of ``entries`` in one log (its id)."""
    store = make_store([])
    for n in range(documents):
        store.create(KEYS[n % 4], TODO, todo_fields(f"item {n}"))
    published = store.create(KEYS[0], TODO, todo_fields("long"))
    for n in range(entries - 1):
        store.update(KEYS[0], published.document_id, {"title": f"edit {n}"})
    return store, published.document_id


@pytest.mark.parametrize("mode", [Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT])
def test_what_is_read_and_encoded_at_once_is_bounded(mode: Mode) -> None:
    """Single-log documents and one long log: no call hands out more than a chunk."""
    full, _ = one_log_store(entries=40, documents=30)
    empty = make_store([])
    wire = pair(empty, full, SyncConfig(mode=mode), SyncConfig(initiator=False, send_chunk=8))
    wire.a.request([TODO], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    sizes = [len(entries_in(c)) for c in read_calls(calls)]
    assert max(sizes) <= 8 and sum(sizes) == 70


def test_sessions_on_one_connection_are_served_in_turn() -> None:
    full = make_store([])
    full.add_schema(NOTE)
    for n in range(40):
        full.create(KEYS[n % 4], TODO, todo_fields(f"item {n}"))
        full.create(KEYS[n % 4], NOTE.id, {"text": f"note {n}"})
    empty = make_store([])
    empty.add_schema(NOTE)
    schemas = (TODO, NOTE.id)
    wire = pair(
        empty,
        full,
        SyncConfig(mode=Mode.LOG_HEIGHT),
        SyncConfig(initiator=False, send_chunk=5),
        schemas=schemas,
    )
    first = wire.a.request([TODO], 0)
    second = wire.a.request([NOTE.id], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    order = [m.session_id for c in read_calls(calls) for m in entries_in(c)]
    # Both catch-ups make progress together, not one after the other.
    assert set(order[:20]) == {first, second}
    assert sum(1 for x, y in pairwise(order) if x != y) >= 8


def test_live_mode_sends_what_was_stored_mid_stream_once() -> None:
    """An entry published while the catch-up streams is sent once, after the catch-up."""
    full, long_log = one_log_store(entries=20, documents=20)
    empty = make_store([])
    wire = pair(
        empty,
        full,
        SyncConfig(mode=Mode.LOG_HEIGHT, live_mode=True),
        SyncConfig(initiator=False, live_mode=True, send_chunk=4),
    )
    sid = wire.a.request([TODO], 0)
    wire.b.receive_many(wire.a.messages_to_send(), 0)
    wire.a.receive_many(wire.b.messages_to_send(), 0)  # b's Have
    wire.b.receive_many(wire.a.messages_to_send(), 0)  # a's Have: b queues 40 entries
    head = wire.b.messages_to_send()
    assert 0 < len(entries_in([decode(f) for f in head])) <= 4
    wire.a.receive_many(head, 0)
    extra = [full.update(KEYS[0], long_log, {"done": True}) for _ in range(2)]
    extra.append(full.create(KEYS[1], TODO, todo_fields("new")))
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    assert all(empty.has_entry(p.operation_id) for p in extra)
    assert wire.b.sessions()[sid].entries_sent == len(entry_ids(full)) == 43  # none twice
    # In live mode, what is published goes out as it is stored.
    later = full.create(KEYS[2], TODO, todo_fields("later"))
    drive(wire, calls)
    assert empty.has_entry(later.operation_id)
    wire.a.end_live(sid, 0)
    drive(wire, calls)
    assert sid not in wire.a.sessions() and sid not in wire.b.sessions()


def test_an_aborted_session_sends_nothing_more() -> None:
    full = make_store(HISTORY)
    wire = pair(
        make_store([]),
        full,
        SyncConfig(mode=Mode.LOG_HEIGHT),
        SyncConfig(initiator=False, send_chunk=4),
    )
    sid = wire.a.request([TODO], 0)
    wire.b.receive_many(wire.a.messages_to_send(), 0)
    wire.a.receive_many(wire.b.messages_to_send(), 0)
    wire.b.receive_many(wire.a.messages_to_send(), 0)
    assert entries_in([decode(f) for f in wire.b.messages_to_send()])
    # The peer breaks the session (an entry b never asked for): b stops streaming.
    entry, operation = HISTORY[0]
    wire.b.receive(encode(SyncDone(sid, False)), 0)
    wire.b.receive(encode(EntryMessage(sid, entry, operation)), 0)
    assert any(isinstance(e, SessionAborted) for e in iter(wire.b.next_event, None))
    assert not entries_in([decode(f) for f in wire.b.messages_to_send()])


def test_a_cut_mid_stream_is_resumed_by_a_new_session() -> None:
    full = make_store(HISTORY)
    empty = make_store([])
    for _ in range(2):
        wire = pair(empty, full, SyncConfig(), SyncConfig(initiator=False, send_chunk=6))
        wire.a.request([TODO], 0)
        for _ in range(8):  # a few rounds, then the stream is cut
            wire.b.receive_many(wire.a.messages_to_send(), 0)
            wire.a.receive_many(wire.b.messages_to_send(), 0)
        wire.a.close()
        wire.b.close()
        assert 0 < len(entry_ids(empty)) < len(HISTORY) or len(entry_ids(empty)) == len(HISTORY)
    wire = pair(empty, full, SyncConfig(), SyncConfig(initiator=False, send_chunk=6))
    wire.a.request([TODO], 0)
    drive(wire, [])
    assert entry_ids(empty) == entry_ids(full) and views(empty) == views(full)


def test_signature_checks_start_as_a_read_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """receive_many feeds a growing batch of checks to ingest_many, same entries in order."""
    full = make_store(HISTORY)
    empty = make_store([])
    # Batches of 32: the 150 entries take several calls.
    wire = pair(
        empty, full, SyncConfig(mode=Mode.LOG_HEIGHT, max_batch=32), SyncConfig(initiator=False)
    )
    given: list[tuple[list[bytes], SignatureChecks | None, bool]] = []
    ingest_many = empty.ingest_many

    def spy(items, checks=None):  # type: ignore[no-untyped-def]
        entries = [item.entry for item in items]
        covered = checks is not None and checks.covers(entries)
        given.append(([e.hash for e in entries], checks, covered))
        return ingest_many(items, checks)

    monkeypatch.setattr(empty, "ingest_many", spy)
    wire.a.request([TODO], 0)
    sent_by_b: list[list[bytes]] = []
    drive(wire, sent_by_b)
    assert entry_ids(empty) == entry_ids(full)
    # Every call came with its checks, begun on exactly its entries in order ...
    assert len(given) > 1
    assert all(isinstance(checks, SignatureChecks) and covered for _, checks, covered in given)
    # ... and the calls between them got every entry b sent, once, in the order sent.
    sent = [decode_entry(m.entry).hash for call in read_calls(sent_by_b) for m in entries_in(call)]
    assert [h for hashes, _, _ in given for h in hashes] == sent
    assert len(sent) == len(HISTORY)


def test_ingest_many_refuses_checks_of_other_entries() -> None:
    from sdk.documents import UsageError
    from sdk.documents.store import DocumentStore

    store = make_store([])
    items = [DocumentStore.decode(e, o) for e, o in HISTORY[:3]]
    checks = SignatureChecks.growing(3)
    for item in reversed(items):
        checks.add(item.entry)
    with pytest.raises(UsageError):
        store.ingest_many(items, checks)
    assert not entry_ids(store)
    assert TODO_SCHEMA.id == TODO


@pytest.mark.parametrize("scan_from", [1, 10**9])
def test_log_documents_answers_what_decides_the_order(
    monkeypatch: pytest.MonkeyPatch, scan_from: int
) -> None:
    """Both ways of reading it (a pass over the store, a lookup per log) give every log
    of a document with several logs, and system logs, with the right document."""
    import sdk.sync.store as sync_store

    monkeypatch.setattr(sync_store, "LOG_DOCUMENTS_SCAN_MIN", scan_from)
    store = make_store(HISTORY)
    rows = store._db.execute("SELECT author, log_id, document_id FROM logs").fetchall()
    logs = {(bytes.fromhex(a), int(n)): str(d) for a, n, d in rows}
    per_document: dict[str, int] = {}
    for document in logs.values():
        per_document[document] = per_document.get(document, 0) + 1
    found = store.log_documents(logs)
    shared = {log for log, document in logs.items() if per_document[document] > 1}
    assert shared and shared <= set(found) <= set(logs)
    assert all(found[log] == (False, logs[log]) for log in found)


def test_system_schema_documents_go_first_across_chunks() -> None:
    systems = ("schema_field_definition_v1", "schema_definition_v1")
    full = make_store([])
    for n in range(6):
        full.create(KEYS[n % 4], TODO, todo_fields(f"item {n}"))
    # Authors whose keys sort after the todo authors' still go first.
    field = full.create(KEYS[3], systems[0], {"name": "x_1", "type": "int"})
    full.create(
        KEYS[2],
        systems[1],
        {
            "name": "a_b9",
            "description": "d",
            "fields": PinnedRelationList(((field.operation_id,),)),
        },
    )
    empty = make_store([])
    wire = pair(
        empty,
        full,
        SyncConfig(mode=Mode.LOG_HEIGHT),
        SyncConfig(initiator=False, send_chunk=2),
        schemas=(TODO, *systems),
    )
    wire.a.request([TODO, *systems], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    sent = [m for c in read_calls(calls) for m in entries_in(c)]
    kinds = [decode_operation(m.operation).schema_id in SYSTEM_SCHEMAS for m in sent]
    assert kinds == [True, True] + [False] * 6


# -- lazy plans: a peer holding nothing (EmptySet) or asking with a Have -------------------


def start_catchup(wire: Wire, mode: Mode) -> int:
    """Run the exchange up to the message that makes b plan everything it sends; return
    the session id. b has not been asked for data after it."""
    sid = wire.a.request([TODO], 0)
    if mode is Mode.LOG_HEIGHT:
        wire.b.receive_many(wire.a.messages_to_send(), 0)  # the request: b sends its Have
        wire.a.receive_many(wire.b.messages_to_send(), 0)  # a answers with its Have
    return sid


def entries_sent(wire: Wire, sid: int) -> int:
    """What b counted as sent in session ``sid``, open or done."""
    if sid in wire.b.sessions():
        return wire.b.sessions()[sid].entries_sent
    done = [e for e in iter(wire.b.next_event, None) if isinstance(e, SessionDone)]
    return next(e.entries_sent for e in done if e.session_id == sid)


def documents_of(store: SyncStore) -> tuple[dict[str, str], dict[str, int]]:
    """Each entry's document, and how many logs each document has."""
    document_of = dict(store._db.execute("SELECT id, document_id FROM operations").fetchall())
    logs = dict(
        store._db.execute("SELECT document_id, count(*) FROM logs GROUP BY document_id").fetchall()
    )
    return document_of, logs


@pytest.mark.parametrize("mode", [Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT])
def test_the_first_chunk_goes_before_the_rest_is_planned(
    monkeypatch: pytest.MonkeyPatch, mode: Mode
) -> None:
    """The first chunk is read after one page of the range index is walked: the store is
    not asked for every log's height or document first, and only the chunk's logs count
    as sent; the rest is planned as later chunks are asked for."""
    import sdk.sync.rbsr as rbsr
    import sdk.sync.send_plan as send_plan

    monkeypatch.setattr(send_plan, "WALK_PAGE", 8)
    full = make_store([])
    for n in range(60):
        full.create(KEYS[n % 4], TODO, todo_fields(f"item {n}"))
    empty = make_store([])
    wire = pair(empty, full, SyncConfig(mode=mode), SyncConfig(initiator=False, send_chunk=4))
    sid = start_catchup(wire, mode)

    def refuse(*_: object) -> None:
        raise AssertionError("the whole plan was asked for")

    monkeypatch.setattr(full, "log_heights", refuse)
    monkeypatch.setattr(full, "log_documents", refuse)
    walked: list[bytes] = []
    keys_in = rbsr.RangeIndex.keys_in

    def counting(self: rbsr.RangeIndex, lo: bytes | None, hi: bytes | None):  # type: ignore[no-untyped-def]
        for key in keys_in(self, lo, hi):
            walked.append(key)
            yield key

    monkeypatch.setattr(rbsr.RangeIndex, "keys_in", counting)
    wire.b.receive_many(wire.a.messages_to_send(), 0)
    first = entries_in([decode(f) for f in wire.b.messages_to_send()])
    assert len(first) == 4
    assert len(walked) <= 8 + 1  # one page (and the next key, read ahead)
    assert len(wire.b._sessions[sid].queue.sent_upto) == 4
    wire.a.receive_many([encode(m) for m in first], 0)
    drive(wire, [])
    assert entry_ids(empty) == entry_ids(full)
    assert entries_sent(wire, sid) == 60  # none twice


@pytest.mark.parametrize("mode", [Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT])
@pytest.mark.parametrize(("page", "chunk"), [(1, 1), (2, 4), (5, 3), (256, 7)])
def test_a_lazy_plan_keeps_documents_whole_and_in_order(
    monkeypatch: pytest.MonkeyPatch, mode: Mode, page: int, chunk: int
) -> None:
    """Pages of a few logs split documents with several authors' logs across pages: the
    logs of such a document still go in one chunk, in an order the peer can ingest."""
    import sdk.sync.send_plan as send_plan

    monkeypatch.setattr(send_plan, "WALK_PAGE", page)
    full = make_store(HISTORY)
    empty = make_store([])
    wire = pair(empty, full, SyncConfig(mode=mode), SyncConfig(initiator=False, send_chunk=chunk))
    sid = wire.a.request([TODO], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full) and views(empty) == views(full)
    assert entries_sent(wire, sid) == len(HISTORY)
    document_of, logs_of = documents_of(full)
    shared = {d for d, logs in logs_of.items() if logs > 1}
    assert shared
    seen: set[str] = set()
    call_of: dict[str, int] = {}
    for n, call in enumerate(read_calls(calls)):
        for message in entries_in(call):
            assert dependencies(message.entry, message.operation) <= seen
            entry_id = decode_entry(message.entry).id
            seen.add(entry_id)
            document = document_of[entry_id]
            if document in shared:
                assert call_of.setdefault(document, n) == n, "a document split across chunks"


def test_a_long_log_of_a_document_with_other_logs_stays_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log longer than a chunk is sent in parts only when its document has no other
    log to send."""
    import sdk.sync.send_plan as send_plan

    monkeypatch.setattr(send_plan, "WALK_PAGE", 2)
    full, long_document = one_log_store(entries=30, documents=6)
    full.update(KEYS[3], long_document, {"done": True})  # a second log of that document
    empty = make_store([])
    wire = pair(empty, full, SyncConfig(), SyncConfig(initiator=False, send_chunk=4))
    wire.a.request([TODO], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    document_of, _ = documents_of(full)
    sizes = [
        sum(document_of[decode_entry(m.entry).id] == long_document for m in entries_in(call))
        for call in read_calls(calls)
    ]
    assert max(sizes) == 31 and sum(sizes) == 31


@pytest.mark.parametrize("live", [False, True])
def test_entries_stored_while_a_plan_is_walked_go_once(
    monkeypatch: pytest.MonkeyPatch, live: bool
) -> None:
    """Entries stored mid-walk: in a log the walk has not reached they go with the
    catch-up; in one it passed, with live mode after it; none twice."""
    import sdk.sync.send_plan as send_plan

    monkeypatch.setattr(send_plan, "WALK_PAGE", 3)
    full = make_store(HISTORY)
    empty = make_store([])
    wire = pair(
        empty,
        full,
        SyncConfig(live_mode=live),
        SyncConfig(initiator=False, live_mode=live, send_chunk=3),
    )
    sid = wire.a.request([TODO], 0)
    wire.b.receive_many(wire.a.messages_to_send(), 0)
    head = wire.b.messages_to_send()
    assert entries_in([decode(f) for f in head])
    wire.a.receive_many(head, 0)
    session = wire.b._sessions[sid]
    rows = full._db.execute("SELECT author, log_id, document_id FROM logs").fetchall()
    logs = {(bytes.fromhex(a), int(n)): str(d) for a, n, d in rows}
    key_of = {key.public_key: key for key in KEYS}
    passed = next(log for log in sorted(logs) if log in session.queue.sent_upto)
    ahead = next(log for log in sorted(logs, reverse=True) if log not in session.queue.sent_upto)
    grown_passed = full.update(key_of[passed[0]], logs[passed], {"done": True})
    grown_ahead = full.update(key_of[ahead[0]], logs[ahead], {"done": True})
    created = full.create(KEYS[3], TODO, todo_fields("new"))
    calls: list[list[bytes]] = []
    drive(wire, calls)
    messages = [m for call in read_calls(calls) for m in call]
    done = next(n for n, m in enumerate(messages) if isinstance(m, SyncDone))
    in_catchup = {decode_entry(m.entry).id for m in entries_in(messages[:done])}
    assert grown_ahead.operation_id in in_catchup
    assert entries_sent(wire, sid) == len(entry_ids(empty))  # none twice
    if live:
        assert entry_ids(empty) == entry_ids(full)
        assert empty.has_entry(grown_passed.operation_id) and empty.has_entry(created.operation_id)


def test_a_walk_with_little_to_send_does_not_stop_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Log-Height against a peer holding nearly everything: the walk passes many logs with
    nothing to send between chunks, and ``messages_to_send`` does not return ``[]`` before
    the last entry and SyncDone."""
    import sdk.sync.send_plan as send_plan

    monkeypatch.setattr(send_plan, "WALK_PAGE", 2)
    full = make_store([])
    for n in range(80):
        full.create(KEYS[n % 4], TODO, todo_fields(f"item {n}"))
    empty = make_store([])
    rows = full._db.execute("SELECT entry, payload FROM entries").fetchall()
    for entry, payload in rows[:-2]:
        empty.ingest(bytes(entry), bytes(payload))
    wire = pair(
        empty,
        full,
        SyncConfig(mode=Mode.LOG_HEIGHT),
        SyncConfig(initiator=False, send_chunk=1),
    )
    sid = wire.a.request([TODO], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    assert wire.b.sessions().get(sid) is None and wire.a.sessions().get(sid) is None


def test_system_documents_go_first_in_a_lazy_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    import sdk.sync.send_plan as send_plan

    monkeypatch.setattr(send_plan, "WALK_PAGE", 1)
    systems = ("schema_field_definition_v1", "schema_definition_v1")
    full = make_store([])
    for n in range(6):
        full.create(KEYS[n % 4], TODO, todo_fields(f"item {n}"))
    field = full.create(KEYS[3], systems[0], {"name": "x_1", "type": "int"})
    full.create(
        KEYS[2],
        systems[1],
        {
            "name": "a_b9",
            "description": "d",
            "fields": PinnedRelationList(((field.operation_id,),)),
        },
    )
    empty = make_store([])
    wire = pair(
        empty,
        full,
        SyncConfig(),
        SyncConfig(initiator=False, send_chunk=3),
        schemas=(TODO, *systems),
    )
    wire.a.request([TODO, *systems], 0)
    calls: list[list[bytes]] = []
    drive(wire, calls)
    assert entry_ids(empty) == entry_ids(full)
    sent = [m for c in read_calls(calls) for m in entries_in(c)]
    kinds = [decode_operation(m.operation).schema_id in SYSTEM_SCHEMAS for m in sent]
    assert kinds == [True, True] + [False] * 6


@pytest.mark.parametrize("through_logs_from", [0, 10**9])
def test_document_logs_finds_the_other_logs_of_shared_documents(
    monkeypatch: pytest.MonkeyPatch, through_logs_from: int
) -> None:
    """Both ways of finding a document's other logs (through its operations, through the
    logs) give every log of each document that has logs beyond those asked about, with
    its height, and nothing for documents whose logs were all asked about."""
    import sdk.sync.store as sync_store

    monkeypatch.setattr(sync_store, "SHARED_DOCUMENT_OPERATIONS", through_logs_from)
    store = make_store(HISTORY)
    rows = store._db.execute("SELECT author, log_id, document_id FROM logs").fetchall()
    logs = {(bytes.fromhex(a), int(n)): str(d) for a, n, d in rows}
    heights = store.log_heights_of(logs)
    asked = dict(sorted(heights.items())[::2])
    document_of, others = store.document_logs(asked)
    assert document_of == {log: logs[log] for log in asked}
    beyond = {logs[log] for log in logs if log not in asked and logs[log] in document_of.values()}
    assert beyond and set(others) == beyond
    for document, found in others.items():
        assert found == {log: heights[log] for log, d in logs.items() if d == document}


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16_383, 16_384, 70_000, 2_097_152])
def test_the_writer_prefixes_frames_as_the_framing_does(size: int) -> None:
    from sdk.sds.varint import encode_uvarint as length_prefix
    from sdk.sync.framing import encode_frame

    data = b"x" * size
    assert length_prefix(size) + data == encode_frame(data)
