"""DocumentChannel: payload framing, held entries, rejections as events."""

from __future__ import annotations

import pytest

from sdk.documents import (
    CBORError,
    DocumentChannel,
    DocumentCreated,
    DocumentDeleted,
    DocumentStore,
    DocumentUpdated,
    KeyPair,
    OperationRejected,
    decode_payload,
    encode_payload,
)

from .helpers import TODO_SCHEMA, snapshot, todo_fields


def channel(key: KeyPair, **kwargs: int) -> DocumentChannel:
    c = DocumentChannel(DocumentStore(), key, **kwargs)
    c.store.add_schema(TODO_SCHEMA)
    return c


def test_payload_framing_is_a_two_item_cbor_array() -> None:
    payload = encode_payload(b"\x00entry", b"\x84op")
    assert payload == b"\x82\x46\x00entry\x43\x84op"
    assert decode_payload(payload) == (b"\x00entry", b"\x84op")
    for bad in (b"", b"\x81\x40", b"\x83\x40\x40\x40", b"\x82\x40\x01", b"\x82\x40\x40\x00"):
        with pytest.raises(CBORError):
            decode_payload(bad)


def test_local_operations_return_payload_and_event(alice: KeyPair, bob: KeyPair) -> None:
    a, b = channel(alice), channel(bob)
    payload, created = a.create(TODO_SCHEMA.id, todo_fields("milk"))
    assert isinstance(created, DocumentCreated)
    events = b.on_delivered(payload)
    assert [type(e) for e in events] == [DocumentCreated]
    assert events[0].view == created.view
    payload, updated = b.update(created.document_id, {"done": True})
    assert isinstance(updated, DocumentUpdated)
    assert [type(e) for e in a.on_delivered(payload)] == [DocumentUpdated]
    payload, deleted = a.delete(created.document_id)
    assert isinstance(deleted, DocumentDeleted)
    assert [type(e) for e in b.on_delivered(payload)] == [DocumentDeleted]
    assert b.on_delivered(payload) == []  # a duplicate delivery changes nothing
    assert b.stats["duplicate"] == 1


def test_entries_wait_for_dependencies_then_apply(alice: KeyPair, bob: KeyPair) -> None:
    a, b = channel(alice), channel(bob)
    p1, created = a.create(TODO_SCHEMA.id, todo_fields())
    p2, _ = a.update(created.document_id, {"priority": 2})
    p3, _ = a.update(created.document_id, {"priority": 3})
    assert b.on_delivered(p3) == [] and b.on_delivered(p2) == []
    assert b.pending_count == 2 and b.store.entry_count() == 0
    events = b.on_delivered(p1)
    assert [type(e) for e in events] == [DocumentCreated, DocumentUpdated, DocumentUpdated]
    assert b.pending_count == 0
    assert b.store.document(created.document_id) == a.store.document(created.document_id)


def test_pending_is_bounded_oldest_dropped(alice: KeyPair, bob: KeyPair) -> None:
    a, b = channel(alice), channel(bob, max_pending=2)
    p1, created = a.create(TODO_SCHEMA.id, todo_fields())
    later = [a.update(created.document_id, {"priority": i})[0] for i in range(3)]
    for payload in later:
        b.on_delivered(payload)
    assert b.pending_count == 2 and b.stats["evicted"] == 1
    b.on_delivered(p1)
    # The evicted entry (seq 2) is gone, so seq 3 and 4 still wait for it.
    assert b.pending_count == 2
    b.on_delivered(later[0])
    assert b.pending_count == 0
    assert b.store.document(created.document_id) == a.store.document(created.document_id)


def test_bad_input_becomes_an_event_and_a_counter(alice: KeyPair, bob: KeyPair) -> None:
    a, b = channel(alice), channel(bob)
    payload, _ = a.create(TODO_SCHEMA.id, todo_fields())
    entry, operation = decode_payload(payload)
    forged = encode_payload(entry[:-1] + bytes([entry[-1] ^ 0x80]), operation)
    before = snapshot(b.store)
    for bad, rule in ((b"\xff", "cbor"), (forged, "signature")):
        events = b.on_delivered(bad)
        assert len(events) == 1 and isinstance(events[0], OperationRejected)
        assert events[0].rule == rule and b.stats[rule] == 1
    assert snapshot(b.store) == before
    assert b.stats["rejected"] == 2


def test_pending_is_bounded_in_bytes(alice: KeyPair, bob: KeyPair) -> None:
    a = channel(alice)
    _, created = a.create(TODO_SCHEMA.id, todo_fields())
    later = [a.update(created.document_id, {"title": "x" * 1000})[0] for _ in range(3)]
    b = channel(bob, max_pending_bytes=3000)
    for payload in later:
        b.on_delivered(payload)
    assert b.pending_count == 2 and b.stats["evicted"] == 1
