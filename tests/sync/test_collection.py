"""Collection sync state machines over real document stores: snapshots, reachability,
the out-of-sync set, batch sizing, listeners, and every bad input the issue names."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.documents import DocumentStore, KeyPair
from sdk.sync.collection import (
    CollectionConfig,
    CollectionProtocolError,
    CollectionServer,
    LimitExceeded,
    NotInSnapshot,
    OutOfSync,
    SnapshotSync,
    UnknownSnapshot,
    decode_message,
    document_item,
    document_key,
    encode_message,
    first_batch_size,
    reachable_documents,
)
from sdk.sync.collection.errors import BadBlob
from sdk.sync.collection.messages import (
    BlobRef,
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    ErrorResponse,
    FetchBlobPartRequest,
    FetchBlobPartResponse,
    FetchSedimentreeRequest,
    FetchSedimentreeResponse,
    ListenRequest,
    Notification,
    Request,
    Response,
    SnapshotSymbolsRequest,
    SnapshotSymbolsResponse,
    UploadItem,
)
from sdk.sync.collection.pull import DocumentPull
from sdk.sync.collection.sedimentree import (
    operation_blob,
    operation_digest,
    operation_upload_item,
    split_operation_blob,
)
from sdk.sync.errors import RemoteProtocolError
from sdk.sync.riblt import CodedSymbol

from .collection_fixtures import (
    FOLDER_ID,
    Collection,
    add_child,
    build_collection,
    catch_up,
    new_store,
    rename,
)

SERVER = "store-node"
PHONE = "phone"


def counter_ids(prefix: int) -> Callable[[], bytes]:
    """Deterministic 16-byte ids."""
    numbers = itertools.count(1)
    return lambda: bytes([prefix]) + next(numbers).to_bytes(15, "big")


def sync(
    server: CollectionServer,
    client_store: DocumentStore,
    root: str,
    now: int = 0,
    peer: str = PHONE,
    config: CollectionConfig | None = None,
) -> tuple[OutOfSync, SnapshotSync]:
    """Run one client session against the server, through the encoded bytes."""
    session = SnapshotSync(client_store, root, config or server.config, new_id=counter_ids(7))
    request: Request | None = session.start()
    while request is not None:
        wire = encode_message(request)
        decoded = decode_message(wire)
        assert isinstance(decoded, Request)
        response = decode_message(encode_message(server.handle(peer, decoded, now)))
        assert isinstance(response, Response)
        request = session.receive(response)
    assert session.result is not None
    return session.result, session


def truth(server_store: DocumentStore, client_store: DocumentStore, root: str) -> OutOfSync:
    """What a full comparison of both collections finds."""
    limit = 10**6
    theirs = {v.document_id: v for v in reachable_documents(server_store, root, limit)}
    ours = {v.document_id: v for v in reachable_documents(client_store, root, limit)}
    changed = sorted(
        d
        for d in theirs.keys() & ours.keys()
        if document_item(d, theirs[d].view_id) != document_item(d, ours[d].view_id)
    )
    missing = sorted(document_key(d) for d in theirs.keys() - ours.keys())
    only_local = sorted(ours.keys() - theirs.keys())
    keys = frozenset(document_key(d) for d in theirs)
    return OutOfSync(b"", tuple(changed), tuple(missing), tuple(only_local), keys)


def same(found: OutOfSync, expected: OutOfSync) -> None:
    assert found.changed == expected.changed
    assert found.missing == expected.missing
    assert found.only_local == expected.only_local
    assert found.snapshot_keys == expected.snapshot_keys


@pytest.fixture
def key() -> KeyPair:
    return KeyPair.from_private_key(bytes(range(32)))


@pytest.fixture
def pair(key: KeyPair) -> Iterator[tuple[DocumentStore, DocumentStore, Collection]]:
    server_store, phone_store = new_store(), new_store()
    collection = build_collection([server_store, phone_store], key, 120)
    yield server_store, phone_store, collection
    server_store.close()
    phone_store.close()


# -- reachability --------------------------------------------------------------------------


def test_reachability_follows_relation_lists_transitively(key: KeyPair) -> None:
    store = new_store()
    collection = build_collection([store], key, 50, fanout=3)
    unrelated = build_collection([store], key, 5)
    views = reachable_documents(store, collection.root, 100)
    assert {v.document_id for v in views} == set(collection.documents)
    assert views[0].document_id == collection.root
    assert not {v.document_id for v in views} & set(unrelated.documents)
    # a subtree is its own collection
    sub = reachable_documents(store, collection.documents[1], 100)
    assert collection.root not in {v.document_id for v in sub}
    assert reachable_documents(store, "0020" + "ab" * 32, 100) == []


def test_relations_to_unknown_documents_are_skipped(key: KeyPair) -> None:
    store = new_store()
    ghost = "0020" + "cd" * 32
    root = store.create(key, FOLDER_ID, {"title": "r", "children": [ghost]}).document_id
    assert [v.document_id for v in reachable_documents(store, root, 10)] == [root]


def test_a_snapshot_larger_than_the_limit_is_refused(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    server_store, _, collection = pair
    config = CollectionConfig(max_snapshot_documents=50)
    server = CollectionServer(server_store, config, new_id=counter_ids(1))
    session = SnapshotSync(new_store(), collection.root, config, new_id=counter_ids(2))
    response = server.handle(PHONE, session.start(), 0)
    assert isinstance(response.body, ErrorResponse)
    assert response.body.message.startswith("SnapshotTooLarge")
    with pytest.raises(CollectionProtocolError):
        session.receive(response)
    assert server.snapshot_count == 0


# -- the out-of-sync set -------------------------------------------------------------------


def test_in_sync_collections_need_one_round_trip_and_one_batch(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    server_store, phone_store, collection = pair
    server = CollectionServer(server_store, new_id=counter_ids(1))
    result, session = sync(server, phone_store, collection.root)
    assert result.in_sync
    assert session.round_trips == 1
    assert len(result.snapshot_keys) == 120


def test_changes_on_both_sides_are_found_exactly(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    other = KeyPair.from_private_key(bytes(range(1, 33)))
    for i in (3, 17, 64):  # edited by someone else, stored at the store node
        rename([server_store], other, collection.documents[i], f"renamed {i}")
    new_remote, _ = add_child([server_store], other, collection.documents[5], "remote child")
    for i in (17, 90):  # edited offline on the phone (17 on both sides)
        rename([phone_store], key, collection.documents[i], f"offline {i}")
    new_local, _ = add_child([phone_store], key, collection.documents[6], "local child")

    server = CollectionServer(server_store, new_id=counter_ids(1))
    result, _ = sync(server, phone_store, collection.root)
    expected = truth(server_store, phone_store, collection.root)
    same(result, expected)
    assert document_key(new_remote) in result.missing
    assert new_local in result.only_local
    assert collection.documents[17] in result.changed
    assert set(result.changed) == {collection.documents[i] for i in (3, 5, 6, 17, 64, 90)}


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    n=st.integers(1, 60),
    remote_edits=st.integers(0, 25),
    local_edits=st.integers(0, 10),
)
def test_random_collections_and_changes(
    seed: int, n: int, remote_edits: int, local_edits: int
) -> None:
    rng = random.Random(seed)
    key = KeyPair.from_private_key(rng.randbytes(32))
    server_store, phone_store = new_store(), new_store()
    collection = build_collection([server_store, phone_store], key, n, fanout=rng.randint(1, 5))
    for j in range(remote_edits):
        target = rng.choice(collection.documents)
        if rng.random() < 0.3:
            add_child([server_store], key, target, f"r{j}")
        else:
            rename([server_store], key, target, f"r{j}")
    phone_key = KeyPair.from_private_key(rng.randbytes(32))
    for j in range(local_edits):
        target = rng.choice(collection.documents)
        if rng.random() < 0.3:
            add_child([phone_store], phone_key, target, f"l{j}")
        else:
            rename([phone_store], phone_key, target, f"l{j}")
    server = CollectionServer(server_store, new_id=counter_ids(1))
    result, _ = sync(server, phone_store, collection.root)
    same(result, truth(server_store, phone_store, collection.root))


def test_a_missing_root_gives_an_empty_snapshot(key: KeyPair) -> None:
    server_store, phone_store = new_store(), new_store()
    collection = build_collection([phone_store], key, 10)
    server = CollectionServer(server_store, new_id=counter_ids(1))
    result, _ = sync(server, phone_store, collection.root)
    assert result.snapshot_keys == frozenset()
    assert set(result.only_local) == set(collection.documents)


# -- batch sizing ------------------------------------------------------------------------------


def test_the_first_batch_is_sized_from_the_peers_history(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    config = CollectionConfig(
        expected_difference=2, expected_change_fraction=0, expected_local_changes=4
    )
    server = CollectionServer(server_store, config, new_id=counter_ids(1))
    # First contact: no history, the configured expectation.
    first = server.handle(
        PHONE, Request(b"r" * 16, CreateSnapshotRequest(document_key(collection.root))), 0
    )
    assert isinstance(first.body, CreateSnapshotResponse)
    assert len(first.body.symbols) == first_batch_size(2)
    # 40 documents change at the store node: 80 differing items, sent in one batch.
    for i in range(40):
        rename([server_store], key, collection.documents[i], f"new {i}")
    result, session = sync(server, phone_store, collection.root, config=config)
    assert session.round_trips == 1
    assert session.symbols_received == first_batch_size(80 + 4)
    assert len(result.changed) == 40


def test_an_underestimate_quadruples_per_round_trip(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    for i in range(100):
        rename([server_store], key, collection.documents[i], f"new {i}")
    config = CollectionConfig(
        expected_difference=4, expected_change_fraction=0, min_followup_batch=20
    )
    server = CollectionServer(server_store, config, new_id=counter_ids(1))
    result, session = sync(server, phone_store, collection.root, config=config)
    assert len(result.changed) == 100
    # 200 items need about 280 symbols: 8 (4 expected), +24, +96, +384: four trips.
    assert session.symbols_received == first_batch_size(4) * 4**3
    assert session.round_trips == 4


# -- bad input -----------------------------------------------------------------------------------


def test_unknown_and_foreign_snapshot_ids(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    server_store, _, collection = pair
    server = CollectionServer(server_store, new_id=counter_ids(1))
    created = server.handle(
        PHONE, Request(b"a" * 16, CreateSnapshotRequest(document_key(collection.root))), 0
    )
    assert isinstance(created.body, CreateSnapshotResponse)
    snapshot_id = created.body.snapshot_id
    for peer, sid in ((PHONE, b"\x99" * 16), ("someone else", snapshot_id)):
        for body in (SnapshotSymbolsRequest(sid), ListenRequest(sid)):
            response = server.handle(peer, Request(b"b" * 16, body), 0)
            assert isinstance(response.body, ErrorResponse)
            assert response.body.message.startswith("UnknownSnapshot")


def test_the_client_raises_unknown_snapshot(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    for i in range(60):
        rename([server_store], key, collection.documents[i], f"new {i}")
    config = CollectionConfig(expected_difference=1, expected_change_fraction=0)
    server = CollectionServer(server_store, config, new_id=counter_ids(1))
    session = SnapshotSync(phone_store, collection.root, config, new_id=counter_ids(2))
    more = session.receive(server.handle(PHONE, session.start(), 0))
    assert isinstance(more, Request)
    # The snapshot expires before the client asks for more symbols.
    response = server.handle(PHONE, more, config.snapshot_ttl_ms + 1)
    with pytest.raises(UnknownSnapshot):
        session.receive(response)


def test_snapshots_are_bounded_in_number(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    server_store, _, collection = pair
    server = CollectionServer(
        server_store, CollectionConfig(max_snapshots=3), new_id=counter_ids(1)
    )
    ids = []
    for i in range(5):
        r = server.handle(
            PHONE, Request(bytes(16), CreateSnapshotRequest(document_key(collection.root))), i
        )
        assert isinstance(r.body, CreateSnapshotResponse)
        ids.append(r.body.snapshot_id)
    assert server.snapshot_count == 3
    oldest = server.handle(PHONE, Request(bytes(16), SnapshotSymbolsRequest(ids[0])), 5)
    assert isinstance(oldest.body, ErrorResponse)
    newest = server.handle(PHONE, Request(bytes(16), SnapshotSymbolsRequest(ids[-1])), 5)
    assert isinstance(newest.body, SnapshotSymbolsResponse)
    # and in the items they hold together: 120 documents each, at most 250 in all
    server = CollectionServer(
        server_store, CollectionConfig(max_total_items=250), new_id=counter_ids(2)
    )
    for i in range(4):
        server.handle(
            PHONE, Request(bytes(16), CreateSnapshotRequest(document_key(collection.root))), i
        )
        assert server.snapshot_count == min(i + 1, 2)


def test_a_peer_that_never_decodes_is_refused_more_symbols(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    server_store, _, collection = pair
    config = CollectionConfig()
    server = CollectionServer(server_store, config, new_id=counter_ids(1))
    created = server.handle(
        PHONE, Request(bytes(16), CreateSnapshotRequest(document_key(collection.root))), 0
    )
    assert isinstance(created.body, CreateSnapshotResponse)
    sent = len(created.body.symbols)
    for _ in range(100):
        r = server.handle(
            PHONE, Request(bytes(16), SnapshotSymbolsRequest(created.body.snapshot_id)), 0
        )
        if isinstance(r.body, ErrorResponse):
            assert r.body.message.startswith("LimitExceeded")
            break
        assert isinstance(r.body, SnapshotSymbolsResponse)
        sent += len(r.body.symbols)
    else:
        pytest.fail("the server kept sending symbols")
    assert sent == config.max_symbols(120)


def test_symbols_that_never_peel_end_the_session(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    _, phone_store, collection = pair
    config = CollectionConfig(max_snapshot_documents=200)
    session = SnapshotSync(phone_store, collection.root, config, new_id=counter_ids(2))
    request: Request | None = session.start()
    rng = random.Random(5)
    with pytest.raises(LimitExceeded):
        for _ in range(10_000):
            assert request is not None
            garbage = tuple(
                CodedSymbol(rng.randbytes(48), rng.getrandbits(64), 3) for _ in range(50)
            )
            body = (
                CreateSnapshotResponse(b"s" * 16, garbage)
                if isinstance(request.body, CreateSnapshotRequest)
                else SnapshotSymbolsResponse(garbage)
            )
            request = session.receive(Response(request.request_id, body))
    assert session.symbols_received <= config.max_symbols(120 + 200)


def test_responses_to_nothing_and_of_the_wrong_kind(
    pair: tuple[DocumentStore, DocumentStore, Collection],
) -> None:
    _, phone_store, collection = pair
    session = SnapshotSync(phone_store, collection.root, new_id=counter_ids(2))
    request = session.start()
    with pytest.raises(CollectionProtocolError):
        session.receive(Response(b"\x00" * 16, SnapshotSymbolsResponse(())))
    with pytest.raises(CollectionProtocolError):
        session.receive(Response(request.request_id, SnapshotSymbolsResponse(())))


# -- fetch_sedimentree -------------------------------------------------------------------------


def test_fetch_sedimentree_lists_a_documents_operations(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, _, collection = pair
    doc = collection.documents[9]
    rename([server_store], key, doc, "again")
    server = CollectionServer(server_store, new_id=counter_ids(1))
    r = server.handle(PHONE, Request(bytes(16), FetchSedimentreeRequest(document_key(doc))), 0)
    assert isinstance(r.body, FetchSedimentreeResponse) and r.body.content is not None
    commits = r.body.content.commits
    records = server_store.operations(doc)
    assert [c.hash for c in commits] == [operation_digest(o.id) for o in records]
    assert commits[1].parents == (operation_digest(records[0].id),)
    missing = server.handle(PHONE, Request(bytes(16), FetchSedimentreeRequest(b"\x01" * 16)), 0)
    assert missing.body == FetchSedimentreeResponse(None)


# -- listen ------------------------------------------------------------------------------------


def test_listen_delivers_each_change_once_and_the_phone_applies_it(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    server = CollectionServer(server_store, new_id=counter_ids(1))
    _, session = sync(server, phone_store, collection.root)
    request, listener = session.listen()
    listener.receive_response(server.handle(PHONE, request, 1))

    doc = collection.documents[42]
    published = rename([server_store], key, doc, "live edit")
    for _ in range(2):  # the store reports the same operation twice
        server.operation_stored(
            doc, published.operation_id, published.entry, published.operation, "alice"
        )
    outside = build_collection([server_store], key, 1)
    p2 = rename([server_store], key, outside.root, "not in the collection")
    server.operation_stored(outside.root, p2.operation_id, p2.entry, p2.operation, "alice")

    wire = server.notifications(PHONE)
    assert len(wire) == 1
    note = decode_message(wire[0])
    assert isinstance(note, Notification)
    assert note.from_peer == "alice" and note.document == document_key(doc)
    events = listener.apply(note, phone_store)
    assert [e.document_id for e in events] == [doc]
    assert listener.apply(note, phone_store) == []  # a repeat on the wire is passed on once
    assert not listener.is_new(note)
    assert phone_store.document(doc) == server_store.document(doc)
    assert server.notifications(PHONE) == []


def test_notifications_outside_the_snapshot_are_rejected(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    server = CollectionServer(server_store, new_id=counter_ids(1))
    _, session = sync(server, phone_store, collection.root)
    _, listener = session.listen()
    stranger = build_collection([server_store], key, 1)
    published = rename([server_store], key, stranger.root, "x")
    record = server_store.operations(stranger.root)[-1]
    forged = Notification(
        "eve",
        document_key(stranger.root),
        operation_upload_item(record, published.entry, published.operation),
    )
    with pytest.raises(NotInSnapshot):
        listener.is_new(decode_message(encode_message(forged)))  # type: ignore[arg-type]


def test_a_listener_that_falls_behind_is_dropped(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    config = CollectionConfig(max_pending_notifications=5)
    server = CollectionServer(server_store, config, new_id=counter_ids(1))
    _, session = sync(server, phone_store, collection.root, config=config)
    request, _ = session.listen()
    server.handle(PHONE, request, 0)
    for i in range(8):
        doc = collection.documents[i]
        p = rename([server_store], key, doc, f"burst {i}")
        server.operation_stored(doc, p.operation_id, p.entry, p.operation, "alice")
    assert server.notifications(PHONE) == []
    assert server.dropped == {PHONE}


def test_listeners_are_bounded(pair: tuple[DocumentStore, DocumentStore, Collection]) -> None:
    server_store, _, collection = pair
    server = CollectionServer(
        server_store, CollectionConfig(max_listeners=2), new_id=counter_ids(1)
    )
    answers = []
    for i in range(3):
        created = server.handle(
            PHONE, Request(bytes(16), CreateSnapshotRequest(document_key(collection.root))), i
        )
        assert isinstance(created.body, CreateSnapshotResponse)
        answers.append(
            server.handle(
                PHONE, Request(bytes(16), ListenRequest(created.body.snapshot_id)), i
            ).body
        )
    assert isinstance(answers[2], ErrorResponse) and answers[2].message.startswith("LimitExceeded")


# -- per-document pull and convergence -----------------------------------------------------


def views_of(store: DocumentStore, root: str) -> dict[str, object]:
    return {v.document_id: v for v in reachable_documents(store, root, 10**6)}


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    n=st.integers(1, 40),
    edits_a=st.integers(0, 15),
    edits_b=st.integers(0, 15),
)
def test_two_stores_with_random_collections_converge(
    seed: int, n: int, edits_a: int, edits_b: int
) -> None:
    rng = random.Random(seed)
    store_a, store_b = new_store(), new_store()
    base = KeyPair.from_private_key(rng.randbytes(32))
    collection = build_collection([store_a, store_b], base, n, fanout=rng.randint(1, 4))
    for store, edits in ((store_a, edits_a), (store_b, edits_b)):
        key = KeyPair.from_private_key(rng.randbytes(32))
        for j in range(edits):
            target = rng.choice(collection.documents)
            if rng.random() < 0.3:
                add_child([store], key, target, f"c{j}")
            else:
                rename([store], key, target, f"t{j}")
    server_a = CollectionServer(store_a, new_id=counter_ids(1))
    server_b = CollectionServer(store_b, new_id=counter_ids(2))
    catch_up(server_a, store_b, collection.root, "b")  # b pulls what a has
    catch_up(server_b, store_a, collection.root, "a")  # a pulls what b has
    assert views_of(store_a, collection.root) == views_of(store_b, collection.root)
    again = catch_up(server_a, store_b, collection.root, "b")
    assert (again.changed, again.missing, again.only_local) == (0, 0, ())
    assert (again.identify_round_trips, again.pull_round_trips) == (1, 0)


def test_a_pull_fetches_only_missing_operations_in_two_round_trips(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    for i in range(5):
        for j in range(3):
            rename([server_store], key, collection.documents[i], f"v{j}")
    server = CollectionServer(server_store, new_id=counter_ids(1))
    done = catch_up(server, phone_store, collection.root, PHONE)
    assert (done.changed, done.missing, done.applied) == (5, 0, 15)
    assert done.identify_round_trips == 1
    assert done.pull_round_trips == 2  # all sedimentrees, then all missing operations
    for i in range(5):
        assert phone_store.document(collection.documents[i]) == server_store.document(
            collection.documents[i]
        )


def test_fetch_blob_part_serves_parts_and_refuses_unknown_blobs(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, _, collection = pair
    published = rename([server_store], key, collection.root, "x")
    digest = operation_digest(published.operation_id)
    server = CollectionServer(server_store, new_id=counter_ids(1))
    whole = server.handle(PHONE, Request(bytes(16), FetchBlobPartRequest(digest, 0, 10**6)), 0)
    assert isinstance(whole.body, FetchBlobPartResponse)
    assert split_operation_blob(whole.body.data) == (published.entry, published.operation)
    part = server.handle(PHONE, Request(bytes(16), FetchBlobPartRequest(digest, 3, 5)), 0)
    assert part.body == FetchBlobPartResponse(whole.body.data[3:8])
    unknown = server.handle(PHONE, Request(bytes(16), FetchBlobPartRequest(h32(9), 0, 5)), 0)
    assert isinstance(unknown.body, ErrorResponse)
    assert unknown.body.message.startswith("UnknownBlob")


def h32(byte: int) -> bytes:
    return bytes([byte]) * 32


def test_a_blob_that_is_not_the_requested_operation_is_rejected(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    first = rename([server_store], key, collection.documents[1], "one")
    second = rename([server_store], key, collection.documents[2], "two")
    pull = DocumentPull(phone_store, document_key(collection.documents[1]), new_id=counter_ids(4))
    server = CollectionServer(server_store, new_id=counter_ids(1))
    requests = pull.receive(server.handle(PHONE, pull.start(), 0))
    assert len(requests) == 1
    swapped = operation_blob(second.entry, second.operation)
    with pytest.raises(BadBlob):
        pull.receive(Response(requests[0].request_id, FetchBlobPartResponse(swapped)))
    corrupt = bytearray(operation_blob(first.entry, first.operation))
    corrupt[-1] ^= 1
    pull = DocumentPull(phone_store, document_key(collection.documents[1]), new_id=counter_ids(5))
    requests = pull.receive(server.handle(PHONE, pull.start(), 0))
    with pytest.raises(BadBlob):
        pull.receive(Response(requests[0].request_id, FetchBlobPartResponse(bytes(corrupt))))
    assert phone_store.document(collection.documents[1]) != server_store.document(
        collection.documents[1]
    )


def test_a_notification_whose_blob_is_not_its_commit_is_rejected(
    key: KeyPair, pair: tuple[DocumentStore, DocumentStore, Collection]
) -> None:
    server_store, phone_store, collection = pair
    server = CollectionServer(server_store, new_id=counter_ids(1))
    _, session = sync(server, phone_store, collection.root)
    _, listener = session.listen()
    first = rename([server_store], key, collection.documents[3], "a")
    second = rename([server_store], key, collection.documents[4], "b")
    record = server_store.operations(collection.documents[3])[-1]
    good = operation_upload_item(record, first.entry, first.operation)
    swapped = UploadItem(
        BlobRef(data=operation_blob(second.entry, second.operation)), good.tree_part
    )
    with pytest.raises(BadBlob):
        listener.apply(
            Notification("eve", document_key(collection.documents[3]), swapped), phone_store
        )
    truncated = UploadItem(BlobRef(data=b"\x05abc"), good.tree_part)
    with pytest.raises(BadBlob):
        listener.apply(
            Notification("eve", document_key(collection.documents[3]), truncated), phone_store
        )
    by_hash = UploadItem(BlobRef(hash=bytes(32)), good.tree_part)
    with pytest.raises(BadBlob):
        listener.apply(
            Notification("eve", document_key(collection.documents[3]), by_hash), phone_store
        )
    assert phone_store.document(collection.documents[3]) != server_store.document(
        collection.documents[3]
    )
    # the forgeries did not mask the real change
    real = Notification("alice", document_key(collection.documents[3]), good)
    assert listener.apply(real, phone_store)
    assert phone_store.document(collection.documents[3]) == server_store.document(
        collection.documents[3]
    )


# -- fuzzing the state machines' peer input ----------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_pair() -> tuple[DocumentStore, DocumentStore, Collection]:
    server_store, phone_store = new_store(), new_store()
    key = KeyPair.from_private_key(bytes(range(32)))
    collection = build_collection([server_store, phone_store], key, 30)
    for i in range(5):
        rename([server_store], key, collection.documents[i], "fuzz")
    return server_store, phone_store, collection


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_the_server_never_raises_on_bytes(
    fuzz_pair: tuple[DocumentStore, DocumentStore, Collection], data: bytes
) -> None:
    server_store, _, _ = fuzz_pair
    server = CollectionServer(server_store, new_id=counter_ids(1))
    for wire in (data, b"\x00" + bytes(16) + data[:1] + data[1:]):
        try:
            request = decode_message(wire)
        except RemoteProtocolError:
            continue
        if isinstance(request, Request):
            answer = encode_message(server.handle(PHONE, request, 0))
            assert isinstance(decode_message(answer), Response)


response_bodies = st.one_of(
    st.builds(ErrorResponse, st.text(max_size=20)),
    st.builds(
        CreateSnapshotResponse,
        st.binary(min_size=16, max_size=16),
        st.lists(
            st.builds(
                CodedSymbol,
                st.binary(min_size=48, max_size=48),
                st.integers(0, 2**64 - 1),
                st.integers(-3, 3),
            ),
            max_size=5,
        ).map(tuple),
    ),
    st.builds(FetchBlobPartResponse, st.binary(max_size=300)),
    st.builds(FetchSedimentreeResponse, st.none()),
    st.just(SnapshotSymbolsResponse(())),
)


@settings(max_examples=150, deadline=None)
@given(bodies=st.lists(response_bodies, min_size=1, max_size=4), right_id=st.booleans())
def test_clients_raise_only_protocol_errors_on_any_response(
    fuzz_pair: tuple[DocumentStore, DocumentStore, Collection],
    bodies: list[object],
    right_id: bool,
) -> None:
    server_store, phone_store, collection = fuzz_pair
    session = SnapshotSync(phone_store, collection.root, new_id=counter_ids(2))
    request: Request | None = session.start()
    try:
        for body in bodies:
            assert request is not None
            rid = request.request_id if right_id else b"\xee" * 16
            request = session.receive(Response(rid, body))  # type: ignore[arg-type]
            if request is None:
                break
    except RemoteProtocolError:
        pass
    server = CollectionServer(server_store, new_id=counter_ids(1))
    pull = DocumentPull(phone_store, document_key(collection.documents[0]), new_id=counter_ids(3))
    pending = pull.receive(server.handle(PHONE, pull.start(), 0))
    before = phone_store.entry_count()
    try:
        for req, body in zip(pending, bodies, strict=False):
            pull.receive(Response(req.request_id if right_id else b"\xee" * 16, body))  # type: ignore[arg-type]
    except RemoteProtocolError:
        assert phone_store.entry_count() == before
