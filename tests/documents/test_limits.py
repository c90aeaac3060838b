"""Limits and validation as p2panda-rs 0.8.1 has them: blob pieces, system schemas, log ids."""

from __future__ import annotations

import pytest

from examples.todo import DocumentGroup
from sdk.documents import (
    Action,
    DocumentStore,
    KeyPair,
    LogMismatch,
    MissingDependency,
    Operation,
    PinnedRelationList,
    SchemaMismatch,
    SizeLimitExceeded,
    cbor,
    decode_payload,
    encode_operation,
    encode_payload,
    sign_entry,
)
from sdk.documents.limits import MAX_BLOB_PIECE_LENGTH, MAX_OPERATION_SIZE

from .helpers import TODO_SCHEMA, todo_fields
from .test_store import assert_rejected, craft


def _piece(size: int) -> bytes:
    """A blob_piece_v1 CREATE with ``size`` bytes of data, encoded as a peer would."""
    return cbor.encode([1, 0, "blob_piece_v1", {"data": bytes(size)}])


def test_blob_piece_of_256_000_bytes_is_accepted_one_more_is_not(
    store: DocumentStore, alice: KeyPair
) -> None:
    # p2panda-rs schema/validate/blob_piece.rs:7-14: len <= 256 * 1000.
    assert MAX_BLOB_PIECE_LENGTH == 256_000
    published = store.create(alice, "blob_piece_v1", {"data": b"\x07" * 256_000})
    view = store.document(published.document_id)
    assert view is not None and view.fields["data"] == b"\x07" * 256_000
    # Locally the reference's schema rule says no; a peer's bytes stop at the decoder's cap.
    with pytest.raises(SchemaMismatch):
        store.create(alice, "blob_piece_v1", {"data": bytes(256_001)})
    bob = KeyPair.from_private_key(b"\x0b" * 32)
    assert store.ingest(*craft(store, bob, 0, 1, _piece(256_000)))
    assert_rejected(store, *craft(store, bob, 1, 1, _piece(256_001)), SizeLimitExceeded)


def test_largest_blob_piece_update_fits_the_operation_cap() -> None:
    # An UPDATE of a full piece naming 1024 previous operations still fits.
    previous = [bytes.fromhex("0020" + f"{i:064x}") for i in range(1024)]
    update = cbor.encode([1, 1, "blob_piece_v1", previous, {"data": bytes(256_000)}])
    assert len(update) <= MAX_OPERATION_SIZE


def test_largest_blob_piece_travels_as_document_content(alice: KeyPair) -> None:
    origin = DocumentStore()
    published = origin.create(alice, "blob_piece_v1", {"data": bytes(range(250)) * 1024})
    content = encode_payload(published.entry, published.operation)
    entry, operation = decode_payload(content)
    receiver = DocumentStore()
    receiver.ingest(entry, operation)
    assert receiver.document(published.document_id) == origin.document(published.document_id)


def test_largest_blob_piece_over_an_sds_channel() -> None:
    group = DocumentGroup(["alice", "bob"], seed=4)
    payload, created = group.docs["alice"].create("blob_piece_v1", {"data": b"\x01" * 256_000})
    group.publish("alice", payload)
    assert group.run_until_converged(60_000)
    view = group.docs["bob"].store.document(created.document_id)
    assert view is not None and view.fields["data"] == b"\x01" * 256_000


@pytest.mark.parametrize(
    ("schema_id", "fields"),
    [
        # blob.rs:13-20, blob.rs:24-27
        ("blob_v1", {"length": 3, "mime_type": "Image/PNG", "pieces": "piece"}),
        ("blob_v1", {"length": 3, "mime_type": "image/png", "pieces": PinnedRelationList(())}),
        # schema_definition.rs:16-22, :29-31
        ("schema_definition_v1", {"name": "_x", "description": "d", "fields": "piece"}),
        ("schema_definition_v1", {"name": "x_", "description": "d", "fields": "piece"}),
        ("schema_definition_v1", {"name": "ok", "description": "d" * 257, "fields": "piece"}),
        # schema_field_definition.rs:17-22, :101-131
        ("schema_field_definition_v1", {"name": "9x", "type": "str"}),
        ("schema_field_definition_v1", {"name": "x", "type": "text"}),
    ],
)
def test_system_schema_rules(
    store: DocumentStore, alice: KeyPair, schema_id: str, fields: dict[str, object]
) -> None:
    piece = store.create(alice, "blob_piece_v1", {"data": b"x"}).operation_id
    fields = {k: PinnedRelationList(((piece,),)) if v == "piece" else v for k, v in fields.items()}
    with pytest.raises(SchemaMismatch):
        store.create(alice, schema_id, fields)


def test_system_schema_rules_accept_valid_values(store: DocumentStore, alice: KeyPair) -> None:
    piece = store.create(alice, "blob_piece_v1", {"data": b"x"}).operation_id
    pieces = PinnedRelationList(((piece,),))
    for mime in ("image/png", "application/vnd.oasis.opendocument.text", "text/plain"):
        store.create(alice, "blob_v1", {"length": 1, "mime_type": mime, "pieces": pieces})
    field = store.create(alice, "schema_field_definition_v1", {"name": "x_1", "type": "int"})
    definition = {
        "name": "a_b9",
        "description": "d" * 256,
        "fields": PinnedRelationList(((field.operation_id,),)),
    }
    store.create(alice, "schema_definition_v1", definition)


def _create(log_id: int, seq_num: int, key: KeyPair, title: str = "x") -> tuple[bytes, bytes]:
    operation = Operation(
        Action.CREATE,
        TODO_SCHEMA.id,
        None,
        TODO_SCHEMA.resolve_fields(todo_fields(title), complete=True),
    )
    payload = encode_operation(operation)
    return sign_entry(key, log_id, seq_num, payload).encoded, payload


def test_any_free_log_opens_a_new_document(
    store: DocumentStore, alice: KeyPair, bob: KeyPair
) -> None:
    # p2panda-rs >= 0.7.1 api/validation.rs:52-90: at seq 1 with no log of the author for
    # the document, any log id without an entry at seq 1 is accepted.
    store.ingest(*_create(5, 1, alice, "five"))
    store.ingest(*_create(2, 1, alice, "two"))
    assert_rejected(store, *_create(5, 1, alice, "five again"), Exception)  # log 5 is taken
    doc = next(v.document_id for v in store.documents() if v.fields["title"] == "two")
    # Bob's first operation on alice's document opens any free log of his.
    update = Operation(Action.UPDATE, TODO_SCHEMA.id, (doc,), {"done": True})
    payload = encode_operation(update)
    store.ingest(sign_entry(bob, 9, 1, payload).encoded, payload)
    assert store.document(doc).fields["done"] is True  # type: ignore[union-attr]
    # A second log of bob for the same document is not (LogIdDoesNotMatchExisting).
    again = encode_operation(Operation(Action.UPDATE, TODO_SCHEMA.id, (doc,), {"done": False}))
    assert_rejected(store, sign_entry(bob, 3, 1, again).encoded, again, LogMismatch)
    # A local create picks the next log after the author's highest, as next_log_id does.
    assert (
        store.create(alice, TODO_SCHEMA.id, todo_fields()).entry
        == store._db.execute(
            "SELECT entry FROM entries WHERE author = ? AND log_id = 6", (alice.author,)
        ).fetchone()[0]
    )


def test_a_create_must_open_its_log(store: DocumentStore, alice: KeyPair) -> None:
    store.ingest(*_create(0, 1, alice))
    # A CREATE at seq 2: the reference has no log for the new document
    # (ExpectedDocumentLogNotFound, api/validation.rs:71-77).
    backlink = bytes.fromhex(store.documents()[0].document_id)
    operation = Operation(
        Action.CREATE,
        TODO_SCHEMA.id,
        None,
        TODO_SCHEMA.resolve_fields(todo_fields("y"), complete=True),
    )
    payload = encode_operation(operation)
    entry = sign_entry(alice, 0, 2, payload, backlink, None).encoded
    assert_rejected(store, entry, payload, LogMismatch)


def test_sequence_gaps_are_held_not_rejected(store: DocumentStore, alice: KeyPair) -> None:
    # The reference rejects an entry whose seq is not the next one; we report what is
    # missing so a DocumentChannel holds it until the gap is filled.
    created = store.create(alice, TODO_SCHEMA.id, todo_fields())
    other = DocumentStore()
    other.add_schema(TODO_SCHEMA)
    second = store.update(alice, created.document_id, {"done": True})
    with pytest.raises(MissingDependency):
        other.ingest(second.entry, second.operation)
    other.ingest(created.entry, created.operation)
    other.ingest(second.entry, second.operation)
    assert other.document(created.document_id) == store.document(created.document_id)
