"""The store: publishing, materialized views, and every bad input rejected without a trace."""

from __future__ import annotations

import pytest

from sdk.documents import (
    Action,
    BacklinkMismatch,
    CBORError,
    DocumentCreated,
    DocumentDeleted,
    DocumentDeletedError,
    DocumentStore,
    DocumentUpdated,
    EntryFormatError,
    ForkDetected,
    InvalidInput,
    InvalidSignature,
    KeyPair,
    LipmaaLinkMismatch,
    LogMismatch,
    MissingDependency,
    Operation,
    PayloadMismatch,
    PreviousMismatch,
    SchemaMismatch,
    SizeLimitExceeded,
    UsageError,
    cbor,
    encode_operation,
    lipmaa,
    sign_entry,
)
from sdk.documents.limits import MAX_VALUE_SIZE
from sdk.documents.materialize import materialize

from .helpers import TODO_SCHEMA, snapshot, todo_fields


def links(
    store: DocumentStore, author: str, log_id: int, seq_num: int
) -> tuple[bytes | None, bytes | None]:
    """The correct (backlink, lipmaa link) for a new entry, from what is stored."""
    if seq_num == 1:
        return None, None

    def at(seq: int) -> bytes:
        row = store._db.execute(
            "SELECT hash FROM entries WHERE author=? AND log_id=? AND seq_num=?",
            (author, log_id, seq),
        ).fetchone()
        return bytes.fromhex(row[0])

    target = lipmaa(seq_num)
    return at(seq_num - 1), (at(target) if target != seq_num - 1 else None)


def craft(
    store: DocumentStore,
    key: KeyPair,
    log_id: int,
    seq_num: int,
    operation: Operation | bytes,
    *,
    backlink: bytes | None = None,
    lipmaa_link: bytes | None = None,
    auto_links: bool = True,
) -> tuple[bytes, bytes]:
    """A validly signed entry with arbitrary contents (the test plays a hostile peer)."""
    payload = operation if isinstance(operation, bytes) else encode_operation(operation)
    if auto_links:
        backlink, lipmaa_link = links(store, key.author, log_id, seq_num)
    entry = sign_entry(key, log_id, seq_num, payload, backlink, lipmaa_link)
    return entry.encoded, payload


def assert_rejected(
    store: DocumentStore, entry: bytes, payload: bytes, error: type[InvalidInput]
) -> InvalidInput:
    before = snapshot(store)
    with pytest.raises(error) as info:
        store.ingest(entry, payload)
    assert snapshot(store) == before
    assert isinstance(info.value, error)
    return info.value


def test_create_update_delete_events_and_views(store: DocumentStore, alice: KeyPair) -> None:
    created = store.create(alice, TODO_SCHEMA.id, todo_fields("milk"))
    assert isinstance(created.events[0], DocumentCreated)
    doc = created.document_id
    assert doc == created.operation_id
    updated = store.update(alice, doc, {"done": True, "weight": 2})
    event = updated.events[0]
    assert isinstance(event, DocumentUpdated)
    assert event.view.fields["done"] is True
    assert event.view.fields["weight"] == 2.0 and isinstance(event.view.fields["weight"], float)
    assert event.view.view_id == (updated.operation_id,)
    deleted = store.delete(alice, doc)
    assert isinstance(deleted.events[0], DocumentDeleted)
    view = store.document(doc)
    assert view is not None and view.deleted and not view.fields
    assert store.documents(TODO_SCHEMA.id) == []
    assert len(store.documents(TODO_SCHEMA.id, deleted=True)) == 1
    # Materialize up to an older view.
    old = store.view(doc, (updated.operation_id,))
    assert old.fields["done"] is True and not old.deleted
    first = store.view(doc, (doc,))
    assert first.fields["done"] is False


def test_one_log_per_document_and_lipmaa_links(store: DocumentStore, alice: KeyPair) -> None:
    first = store.create(alice, TODO_SCHEMA.id, todo_fields("a"))
    second = store.create(alice, TODO_SCHEMA.id, todo_fields("b"))
    for i in range(12):
        store.update(alice, first.document_id, {"priority": i})
    rows = store._db.execute("SELECT log_id, document_id FROM logs ORDER BY log_id").fetchall()
    assert rows == [(0, first.document_id), (1, second.document_id)]
    # Replaying everything into a fresh store validates every backlink and lipmaa link.
    fresh = DocumentStore()
    fresh.add_schema(TODO_SCHEMA)
    for entry, payload in store._db.execute(
        "SELECT entry, payload FROM entries ORDER BY log_id, seq_num"
    ).fetchall():
        fresh.ingest(entry, payload)
    assert fresh.document(first.document_id) == store.document(first.document_id)
    assert fresh.document(first.document_id).fields["priority"] == 11  # type: ignore[union-attr]


def test_persists_across_reopen(tmp_path: object, alice: KeyPair) -> None:
    path = str(tmp_path) + "/docs.sqlite"
    s = DocumentStore(path)
    s.add_schema(TODO_SCHEMA)
    created = s.create(alice, TODO_SCHEMA.id, todo_fields())
    s.update(alice, created.document_id, {"title": "eggs"})
    view = s.document(created.document_id)
    s.close()
    again = DocumentStore(path)
    again.add_schema(TODO_SCHEMA)
    assert again.document(created.document_id) == view
    again.update(alice, created.document_id, {"title": "bread"})  # continues the same log
    assert again.document(created.document_id).fields["title"] == "bread"  # type: ignore[union-attr]


def test_duplicate_entry_is_a_no_op(store: DocumentStore, alice: KeyPair) -> None:
    created = store.create(alice, TODO_SCHEMA.id, todo_fields())
    before = snapshot(store)
    assert store.ingest(created.entry, created.operation) == []
    assert snapshot(store) == before


def test_missing_backlink_and_previous_are_dependencies(
    store: DocumentStore, alice: KeyPair
) -> None:
    other = DocumentStore()
    other.add_schema(TODO_SCHEMA)
    created = other.create(alice, TODO_SCHEMA.id, todo_fields())
    updated = other.update(alice, created.document_id, {"done": True})
    with pytest.raises(MissingDependency) as info:
        store.ingest(updated.entry, updated.operation)
    assert info.value.missing == (created.operation_id,)
    assert store.entry_count() == 0


def test_schema_published_as_documents(alice: KeyPair, bob: KeyPair) -> None:
    from sdk.documents import DocumentChannel

    a = DocumentChannel(DocumentStore(), alice)
    payloads, schema = a.define_schema("shopping", "things to buy", {"item": "str", "qty": "int"})
    assert schema.id.startswith("shopping_0020") and schema.fields["qty"].kind == "int"
    payload, _ = a.create(schema.id, {"item": "tea", "qty": 2})
    b = DocumentChannel(DocumentStore(), bob)
    # The item arrives first: held until its schema's definition documents arrive.
    assert b.on_delivered(payload) == []
    events = [e for p in payloads for e in b.on_delivered(p)]
    assert any(isinstance(e, DocumentCreated) and e.view.schema_id == schema.id for e in events)
    assert b.store.documents(schema.id)[0].fields == {"item": "tea", "qty": 2}


# -- bad input: each rejected with the error of its rule, the store unchanged ------------


@pytest.fixture
def doc(store: DocumentStore, alice: KeyPair) -> str:
    """A document of alice with three entries in log 0."""
    created = store.create(alice, TODO_SCHEMA.id, todo_fields())
    store.update(alice, created.document_id, {"priority": 2})
    store.update(alice, created.document_id, {"priority": 3})
    return created.document_id


def _update(store: DocumentStore, doc: str, fields: dict[str, object]) -> Operation:
    view = store.document(doc)
    assert view is not None
    return Operation(Action.UPDATE, TODO_SCHEMA.id, view.view_id, fields)


def test_invalid_signature(store: DocumentStore, alice: KeyPair, doc: str) -> None:
    entry, payload = craft(store, alice, 0, 4, _update(store, doc, {"done": True}))
    forged = entry[:-1] + bytes([entry[-1] ^ 1])
    assert_rejected(store, forged, payload, InvalidSignature)
    # Someone else's key under alice's name: the author bytes swapped in.
    mallory = KeyPair.from_private_key(b"\x07" * 32)
    entry, payload = craft(
        store,
        mallory,
        0,
        1,
        Operation(
            Action.CREATE,
            TODO_SCHEMA.id,
            None,
            TODO_SCHEMA.resolve_fields(todo_fields(), complete=True),
        ),
    )
    impostor = entry[:1] + alice.public_key + entry[33:]
    assert_rejected(store, impostor, payload, InvalidSignature)


def test_wrong_backlink(store: DocumentStore, alice: KeyPair, doc: str) -> None:
    _, lipmaa_link = links(store, alice.author, 0, 4)
    entry, payload = craft(
        store,
        alice,
        0,
        4,
        _update(store, doc, {"done": True}),
        backlink=bytes.fromhex(doc),
        lipmaa_link=lipmaa_link,
        auto_links=False,
    )
    assert_rejected(store, entry, payload, BacklinkMismatch)


def test_wrong_lipmaa_link(store: DocumentStore, alice: KeyPair, doc: str) -> None:
    backlink, lipmaa_link = links(store, alice.author, 0, 4)
    assert lipmaa_link is not None  # lipmaa(4) == 1
    entry, payload = craft(
        store,
        alice,
        0,
        4,
        _update(store, doc, {"done": True}),
        backlink=backlink,
        lipmaa_link=backlink,
        auto_links=False,
    )
    assert_rejected(store, entry, payload, LipmaaLinkMismatch)


def test_fork(store: DocumentStore, alice: KeyPair, doc: str) -> None:
    # A second, validly signed entry at sequence number 2 with other contents.
    row = store._db.execute("SELECT hash FROM entries WHERE seq_num = 1").fetchone()
    operation = Operation(Action.UPDATE, TODO_SCHEMA.id, (doc,), {"title": "rewritten"})
    entry, payload = craft(
        store, alice, 0, 2, operation, backlink=bytes.fromhex(row[0]), auto_links=False
    )
    assert_rejected(store, entry, payload, ForkDetected)


def test_schema_mismatch(store: DocumentStore, alice: KeyPair, bob: KeyPair, doc: str) -> None:
    bad_type = _update(store, doc, {"done": "yes"})
    assert_rejected(store, *craft(store, bob, 0, 1, bad_type), SchemaMismatch)
    unknown_field = _update(store, doc, {"colour": "red"})
    assert_rejected(store, *craft(store, bob, 0, 1, unknown_field), SchemaMismatch)
    incomplete = Operation(Action.CREATE, TODO_SCHEMA.id, None, {"title": "x"})
    assert_rejected(store, *craft(store, bob, 0, 1, incomplete), SchemaMismatch)
    int_for_float = Operation(Action.UPDATE, TODO_SCHEMA.id, (doc,), {"weight": 1})
    assert_rejected(store, *craft(store, bob, 0, 1, int_for_float), SchemaMismatch)
    other_schema = TODO_SCHEMA.id.replace("todo_", "chore_")
    store.add_schema(type(TODO_SCHEMA)(other_schema, "", dict(TODO_SCHEMA.fields)))
    wrong_schema = Operation(Action.UPDATE, other_schema, (doc,), {"title": "x"})
    assert_rejected(store, *craft(store, bob, 0, 1, wrong_schema), SchemaMismatch)
    with pytest.raises(SchemaMismatch):
        store.update(alice, doc, {"done": 1})


def test_update_to_deleted_document(
    store: DocumentStore, alice: KeyPair, bob: KeyPair, doc: str
) -> None:
    deleted = store.delete(alice, doc)
    update = Operation(Action.UPDATE, TODO_SCHEMA.id, (deleted.operation_id,), {"done": True})
    assert_rejected(store, *craft(store, bob, 0, 1, update), DocumentDeletedError)
    delete_again = Operation(Action.DELETE, TODO_SCHEMA.id, (deleted.operation_id,))
    assert_rejected(store, *craft(store, alice, 0, 5, delete_again), DocumentDeletedError)
    with pytest.raises(DocumentDeletedError):
        store.update(alice, doc, {"done": True})


def test_oversized_fields(store: DocumentStore, bob: KeyPair, doc: str) -> None:
    view = store.document(doc)
    assert view is not None
    huge = cbor.encode(
        [
            1,
            1,
            TODO_SCHEMA.id,
            [bytes.fromhex(i) for i in view.view_id],
            {"title": "x" * (MAX_VALUE_SIZE + 1)},
        ]
    )
    assert_rejected(store, *craft(store, bob, 0, 1, huge), SizeLimitExceeded)
    with pytest.raises(SizeLimitExceeded):
        store.update(bob, doc, {"title": "x" * (MAX_VALUE_SIZE + 1)})


def test_malformed_cbor_and_entries(store: DocumentStore, bob: KeyPair, doc: str) -> None:
    assert_rejected(store, *craft(store, bob, 0, 1, b"\x85\x01\x00"), CBORError)
    entry, payload = craft(store, bob, 0, 1, _update(store, doc, {"done": True}))
    assert_rejected(store, entry + b"\x00", payload, EntryFormatError)
    assert_rejected(store, b"\x01" + entry[1:], payload, EntryFormatError)
    assert_rejected(store, entry[:50], payload, InvalidInput)


def test_payload_mismatch(store: DocumentStore, bob: KeyPair, doc: str) -> None:
    entry, payload = craft(store, bob, 0, 1, _update(store, doc, {"done": True}))
    other = encode_operation(_update(store, doc, {"done": False}))
    assert_rejected(store, entry, other, PayloadMismatch)
    assert_rejected(store, entry, payload + b"\x00", PayloadMismatch)


def test_log_rules(store: DocumentStore, alice: KeyPair, doc: str) -> None:
    other = store.create(alice, TODO_SCHEMA.id, todo_fields("b"))  # log 1
    # An UPDATE of `doc` appended to the log of the other document.
    update = _update(store, doc, {"done": True})
    assert_rejected(store, *craft(store, alice, 1, 2, update), LogMismatch)
    # An UPDATE of `doc` opening a second log of alice for the same document.
    assert_rejected(store, *craft(store, alice, 7, 1, update), LogMismatch)
    # A CREATE inside an existing log.
    create = Operation(
        Action.CREATE,
        TODO_SCHEMA.id,
        None,
        TODO_SCHEMA.resolve_fields(todo_fields(), complete=True),
    )
    assert_rejected(store, *craft(store, alice, 0, 4, create), LogMismatch)
    assert other.document_id != doc


def test_previous_spanning_documents(
    store: DocumentStore, alice: KeyPair, bob: KeyPair, doc: str
) -> None:
    other = store.create(alice, TODO_SCHEMA.id, todo_fields("b"))
    previous = tuple(sorted((doc, other.document_id)))
    update = Operation(Action.UPDATE, TODO_SCHEMA.id, previous, {"done": True})
    assert_rejected(store, *craft(store, bob, 0, 1, update), PreviousMismatch)


def test_usage_errors(store: DocumentStore, alice: KeyPair) -> None:
    with pytest.raises(UsageError):
        store.update(alice, "0020" + "00" * 32, {"done": True})
    with pytest.raises(UsageError):
        store.create(alice, "nothing_0020" + "00" * 32, {"a": 1})
    with pytest.raises(SchemaMismatch):
        store.create(alice, "nothing_v1", {"a": 1})


def test_schema_ids_must_name_a_schema_definition(
    store: DocumentStore, alice: KeyPair, doc: str
) -> None:
    # A schema id whose view is a todo document, not a schema_definition_v1 one.
    bogus = f"fake_{doc}"
    operation = Operation(Action.CREATE, bogus, None, {"title": "x"})
    assert_rejected(store, *craft(store, alice, 5, 1, operation), SchemaMismatch)
    # A schema id naming a definition under another name.
    fields = store.create(alice, "schema_field_definition_v1", {"name": "title", "type": "str"})
    definition = store.create(
        alice,
        "schema_definition_v1",
        {"name": "real", "description": "", "fields": [(fields.document_id,)]},
    )
    assert store.schema(f"real_{definition.document_id}").fields["title"].kind == "str"
    wrong_name = Operation(Action.CREATE, f"other_{definition.document_id}", None, {"title": "x"})
    assert_rejected(store, *craft(store, alice, 6, 1, wrong_name), SchemaMismatch)


def test_ingest_many_stores_a_batch_in_order_and_stops_at_the_first_invalid(
    alice: KeyPair,
) -> None:
    """A CREATE and its UPDATEs in one batch; a forged entry stops it after the valid prefix."""
    source = DocumentStore()
    source.add_schema(TODO_SCHEMA)
    created = source.create(alice, TODO_SCHEMA.id, todo_fields("a"))
    updates = [source.update(alice, created.document_id, {"title": f"t{i}"}) for i in range(3)]
    other = source.create(alice, TODO_SCHEMA.id, todo_fields("b"))
    forged = bytearray(updates[2].entry)
    forged[-1] ^= 1
    items = [DocumentStore.decode(p.entry, p.operation) for p in (created, updates[0], updates[1])]
    items.append(DocumentStore.decode(bytes(forged), updates[2].operation))
    items.append(DocumentStore.decode(other.entry, other.operation))
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    result = store.ingest_many(items)
    assert [i.record.id for i in result.stored] == [
        created.operation_id,
        updates[0].operation_id,
        updates[1].operation_id,
    ]
    assert result.error is not None and isinstance(result.error[1], InvalidSignature)
    assert result.unprocessed == 1
    assert store.entry_count() == 3 and not store.has_entry(other.operation_id)
    view = store.document(created.document_id)
    assert view is not None and view.fields["title"] == "t1"
    # The entry after the invalid one can come again; a repeat is a no-op.
    again = store.ingest_many(
        [
            DocumentStore.decode(other.entry, other.operation),
            DocumentStore.decode(updates[1].entry, updates[1].operation),
        ]
    )
    assert len(again.stored) == 1 and again.duplicates == 1 and again.error is None


def test_ingest_many_rolls_back_and_forgets_its_caches_on_a_database_error(
    alice: KeyPair,
) -> None:
    source = DocumentStore()
    source.add_schema(TODO_SCHEMA)
    created = source.create(alice, TODO_SCHEMA.id, todo_fields("a"))
    updated = source.update(alice, created.document_id, {"title": "b"})
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    store.ingest(created.entry, created.operation)
    before = snapshot(store)
    # The database refuses the batch's second write: the whole batch is rolled back.
    store._db.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON operations WHEN NEW.action = 1 "
        "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
    )
    other = source.create(alice, TODO_SCHEMA.id, todo_fields("c"))
    with pytest.raises(Exception, match="disk says no"):
        store.ingest_many(
            [
                DocumentStore.decode(other.entry, other.operation),
                DocumentStore.decode(updated.entry, updated.operation),
            ]
        )
    assert snapshot(store) == before
    view = store.document(created.document_id)
    assert view is not None and view.fields["title"] == "a"
    assert store.document(other.document_id) is None


def _log_of_five(alice: KeyPair) -> tuple[DocumentStore, list[tuple[bytes, bytes]]]:
    """A source store with one document: a CREATE and four UPDATEs (seq 4 has a lipmaa link)."""
    source = DocumentStore()
    source.add_schema(TODO_SCHEMA)
    created = source.create(alice, TODO_SCHEMA.id, todo_fields("a"))
    published = [created] + [
        source.update(alice, created.document_id, {"title": f"t{i}"}) for i in range(4)
    ]
    return source, [(p.entry, p.operation) for p in published]


def _fork_of_third(alice: KeyPair, log: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """Another entry 3 of the same log (same author, different operation)."""
    other = DocumentStore()
    other.add_schema(TODO_SCHEMA)
    for entry, payload in log[:2]:
        other.ingest(entry, payload)
    fork = other.update(alice, other.documents()[0].document_id, {"title": "x"})
    return fork.entry, fork.operation


def test_ingest_many_checks_entries_against_the_batch_and_the_store(alice: KeyPair) -> None:
    """Duplicates, forks and links are found whether the other entry is stored or in the batch."""
    source, log = _log_of_five(alice)
    fork = _fork_of_third(alice, log)
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    # In the batch: entry 1 twice, links (backlinks, entry 4's lipmaa link) to batch entries.
    batch = [log[0], log[1], log[2], log[0], log[3], log[4]]
    result = store.ingest_many([DocumentStore.decode(e, p) for e, p in batch])
    assert len(result.stored) == 5 and result.duplicates == 1 and result.error is None
    assert snapshot(store) == snapshot(source)
    # Against the store: duplicates are no-ops, a different entry 3 is a fork.
    again = store.ingest_many([DocumentStore.decode(e, p) for e, p in (log[1], fork)])
    assert again.duplicates == 1
    assert again.error is not None and isinstance(again.error[1], ForkDetected)
    # Within one batch: the fork comes after its own position's entry.
    fresh = DocumentStore()
    fresh.add_schema(TODO_SCHEMA)
    result = fresh.ingest_many([DocumentStore.decode(e, p) for e, p in (*log[:3], fork)])
    assert len(result.stored) == 3
    assert result.error is not None and isinstance(result.error[1], ForkDetected)
    assert fresh.entry_count() == 3


def test_ingest_many_reads_log_positions_only_of_authors_it_holds(
    alice: KeyPair, bob: KeyPair
) -> None:
    """Authors with nothing stored are asked about once each, none of their positions read;
    a stored author's positions are read, its duplicates and forks found as before."""
    source, log = _log_of_five(alice)
    fork = _fork_of_third(alice, log)
    other = source.create(bob, TODO_SCHEMA.id, todo_fields("b"))
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)

    def position_reads() -> list[str]:
        return [s for s in statements if "e.seq_num = w.seq_num" in s]

    result = store.ingest_many([DocumentStore.decode(e, p) for e, p in log[:3]])
    assert len(result.stored) == 3 and result.error is None
    assert position_reads() == []
    statements.clear()
    batch = [(other.entry, other.operation), log[1], log[3], fork]
    again = store.ingest_many([DocumentStore.decode(e, p) for e, p in batch])
    assert again.duplicates == 1 and len(again.stored) == 2
    assert again.error is not None and isinstance(again.error[1], ForkDetected)
    (read,) = position_reads()
    assert alice.author in read and bob.author not in read
    store._db.set_trace_callback(None)
    assert store.document(other.document_id) is not None
    assert store.entry_count() == 5


def test_ingest_many_reads_a_stored_document_after_writing_part_of_the_batch(
    tmp_path: object, alice: KeyPair, bob: KeyPair
) -> None:
    """A document not in memory is read from the database with the batch's rows in it."""
    source, log = _log_of_five(alice)
    other = source.create(bob, TODO_SCHEMA.id, todo_fields("b"))
    path = str(tmp_path) + "/store.db"  # type: ignore[operator]
    store = DocumentStore(path)
    store.add_schema(TODO_SCHEMA)
    store.ingest(*log[0])
    store.close()
    store = DocumentStore(path)
    store.add_schema(TODO_SCHEMA)
    batch = [(other.entry, other.operation), log[1], log[2], log[3], log[4]]
    result = store.ingest_many([DocumentStore.decode(e, p) for e, p in batch])
    assert len(result.stored) == 5 and result.error is None
    assert snapshot(store) == snapshot(source)
    store.close()


def test_a_created_documents_event_view_is_its_materialized_view(
    store: DocumentStore, alice: KeyPair
) -> None:
    created = store.create(alice, TODO_SCHEMA.id, todo_fields("milk"))
    event = created.events[0]
    assert isinstance(event, DocumentCreated)
    view = store.document(created.document_id)
    assert view is not None and event.view == view
    assert view == materialize(store.operations(created.document_id))
    assert store.documents(TODO_SCHEMA.id) == [view]
    assert view.operation_count == 1 and view.view_id == (created.operation_id,)


def test_a_create_event_is_built_when_read_and_is_the_same(
    alice: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ingest_many does not build a CREATE's view until its events are read (a catch-up
    reads none); read, they are what ingest returns: the CREATE's materialized view."""
    import sdk.documents.store as store_module

    source = DocumentStore()
    source.add_schema(TODO_SCHEMA)
    created = source.create(alice, TODO_SCHEMA.id, todo_fields("milk"))
    entry, payload = source.entry(created.operation_id) or (b"", b"")
    calls: list[object] = []
    real_view_of = store_module.view_of

    def counting_view_of(walk: object) -> object:
        calls.append(walk)
        return real_view_of(walk)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "view_of", counting_view_of)
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    result = store.ingest_many([DocumentStore.decode(entry, payload)])
    assert len(result.stored) == 1 and calls == []
    events = result.stored[0].events
    assert len(calls) == 1 and result.stored[0].events is events
    assert events == list(created.events)
    assert isinstance(events[0], DocumentCreated)
    assert events[0].view == store.document(created.document_id)
