"""Bamboo point-to-point over the document store (``DocumentLogStore``): the logs of
p2panda documents are served from it, and what arrives is ingested through its normal
validation (what it does not take waits in the overlay)."""

from __future__ import annotations

from sdk.documents import DocumentStore
from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import MemoryLogStore, SqliteLogStore, shortest_path
from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
from sdk.sync.bamboo_p2p.pair import EndpointPair
from sdk.sync.store import SyncStore
from tests.documents.helpers import TODO_SCHEMA, todo_fields

KEY = KeyPair.from_private_key(bytes(range(32)))


def documents_with_a_log(updates: int) -> tuple[DocumentStore, str, tuple[bytes, int]]:
    docs = DocumentStore()
    docs.add_schema(TODO_SCHEMA)
    created = docs.create(KEY, TODO_SCHEMA.id, todo_fields("milk"))
    for i in range(updates):
        docs.update(KEY, created.document_id, {"title": f"milk {i}", "priority": i})
    [(author, log_id, height)] = docs.log_heights(TODO_SCHEMA.id)
    assert height == updates + 1
    return docs, created.document_id, (author, log_id)


def receiver() -> tuple[DocumentLogStore, DocumentStore]:
    docs = DocumentStore()
    docs.add_schema(TODO_SCHEMA)
    return DocumentLogStore(docs, SqliteLogStore()), docs


def test_the_logs_of_documents_are_served_and_verified() -> None:
    docs, _, log = documents_with_a_log(30)
    server = DocumentLogStore(docs, SqliteLogStore())
    phone = MemoryLogStore()
    pair = EndpointPair.create(server, phone)
    pair.exchange()
    pair.b.propose(log, 1, end=31)
    pair.run()
    assert pair.error is None
    assert phone.payload_sequence_numbers(log) == list(range(1, 32))
    served = docs.log_entries(log[0], log[1])
    for seq, (entry_bytes, operation) in enumerate(served, start=1):
        entry = phone.entry(log, seq)
        assert entry is not None and entry.encoded == entry_bytes
        assert phone.payload(log, seq) == operation
    # The newest entry with its certificate pool, sparse.
    sparse = MemoryLogStore()
    pair = EndpointPair.create(server, sparse)
    pair.exchange()
    pair.b.propose(log, 1, end=31, sparse=True)
    pair.run()
    assert pair.error is None and sparse.sequence_numbers(log) == shortest_path(31, 1)


def test_received_entries_are_ingested_as_documents() -> None:
    docs, document_id, log = documents_with_a_log(20)
    server = DocumentLogStore(docs, SqliteLogStore())
    store, received = receiver()
    pair = EndpointPair.create(server, store)
    pair.exchange()
    pair.b.propose(log, 1, end=21)
    pair.run()
    store.flush()  # what a driver does after each batch of the peer's bytes
    assert pair.error is None
    assert store.ingested == 21 and store.kept_aside == 0
    assert received.log_height(*log) == 21
    view, original = received.document(document_id), docs.document(document_id)
    assert view is not None and original is not None and view.fields == original.fields


def test_a_sparse_log_waits_in_the_overlay_until_its_gaps_are_filled() -> None:
    docs, document_id, log = documents_with_a_log(20)
    server = DocumentLogStore(docs, SqliteLogStore())
    store, received = receiver()
    pair = EndpointPair.create(server, store)
    pair.exchange()
    pair.b.propose(log, 1, end=21, sparse=True)
    pair.run()
    store.flush()
    assert pair.error is None
    path = shortest_path(21, 1)
    # Entry 1 (the CREATE) is a complete log; the others lack their predecessors.
    assert received.log_height(*log) == 1 and store.kept_aside == len(path) - 1
    assert [s for s in range(1, 22) if store.entry(log, s) is not None] == path
    pair = EndpointPair.create(server, store)
    pair.exchange()
    pair.b.propose(log, 1, end=21)
    pair.run()
    store.flush()
    assert pair.error is None
    assert received.log_height(*log) == 21
    view = received.document(document_id)
    assert view is not None and view.fields["title"] == "milk 19"


def test_what_the_document_store_refuses_stays_in_the_overlay() -> None:
    """A Bamboo log whose payloads are not p2panda operations is kept, not ingested."""
    plain = MemoryLogStore()
    for i in range(5):
        plain.append(KEY, 7, b"not an operation %d" % i)
    store, received = receiver()
    pair = EndpointPair.create(plain, store)
    pair.exchange()
    pair.b.propose((KEY.public_key, 7), 1, end=5)
    pair.run()
    store.flush()
    assert pair.error is None
    assert received.entry_count() == 0 and store.kept_aside == 5
    assert store.payload((KEY.public_key, 7), 5) == b"not an operation 4"
    assert store.latest((KEY.public_key, 7)) == 5


def test_an_open_range_serves_what_the_document_store_gets_another_way() -> None:
    docs, document_id, log = documents_with_a_log(3)
    server = DocumentLogStore(docs, SqliteLogStore())
    phone = MemoryLogStore()
    pair = EndpointPair.create(server, phone)
    pair.exchange()
    request = pair.b.propose(log, 1)  # open: follow the log
    pair.run()
    server.flush()
    assert phone.sequence_numbers(log) == [1, 2, 3, 4]
    docs.update(KEY, document_id, {"title": "written elsewhere"})  # not through the adapter
    pair.run()  # the next time the endpoint looks (a driver: its next wake)
    assert phone.sequence_numbers(log) == [1, 2, 3, 4, 5]
    assert pair.b.request_ids() == [request]


def test_a_sync_store_tells_the_driver_of_entries_stored_another_way() -> None:
    docs = SyncStore()
    docs.add_schema(TODO_SCHEMA)
    created = docs.create(KEY, TODO_SCHEMA.id, todo_fields("milk"))
    store = DocumentLogStore(docs, SqliteLogStore())
    heard: list[int] = []
    store.add_listener(lambda: heard.append(1))
    docs.update(KEY, created.document_id, {"title": "from replication"})
    assert heard == [1]
    store.close()
    docs.update(KEY, created.document_id, {"title": "after close"})
    assert heard == [1]
