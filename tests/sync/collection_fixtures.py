"""Linked document collections in real document stores, for the collection-sync tests
and ``bench/collection_sync.py``.

A collection is a tree of ``folder`` documents: each has a title and a
``relation_list`` of its children, so everything is reachable from folder 0.
Operations are published in one store and ingested (validated) in the others,
so the stores hold byte-identical logs.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from sdk.documents import DocumentStore, KeyPair, Published, Schema
from sdk.documents.operation import RelationList
from sdk.sync.collection import (
    CollectionServer,
    SnapshotSync,
    decode_message,
    document_key,
    encode_message,
)
from sdk.sync.collection.messages import Request, Response
from sdk.sync.collection.pull import DocumentPull
from sdk.sync.collection.reachability import reachable_documents
from sdk.sync.store import SyncStore

_SCHEMA_VIEW = "0020" + "33" * 32
FOLDER_ID = f"folder_{_SCHEMA_VIEW}"
FOLDER = Schema.application(
    "folder",
    (_SCHEMA_VIEW,),
    "a folder in a linked collection",
    {"title": "str", "children": f"relation_list({FOLDER_ID})"},
)


def new_store() -> DocumentStore:
    """An in-memory store that knows the folder schema."""
    store = DocumentStore()
    store.add_schema(FOLDER)
    return store


def new_sync_store(path: str = ":memory:") -> SyncStore:
    """A store that tells listeners what it stores (what a collection service serves)."""
    store = SyncStore(path)
    store.add_schema(FOLDER)
    return store


def views_of(store: DocumentStore, root: str) -> dict[str, tuple[str, ...]]:
    """Every document reachable from ``root`` and its current view id."""
    return {v.document_id: v.view_id for v in reachable_documents(store, root, 10**6)}


def publish(stores: list[DocumentStore], published: Published) -> Published:
    """Ingest an operation published in ``stores[0]`` into the other stores."""
    for store in stores[1:]:
        store.ingest(published.entry, published.operation)
    return published


@dataclass
class Collection:
    """The ids of a built collection: ``documents[0]`` is the root."""

    documents: list[str]

    @property
    def root(self) -> str:
        """The root document's id."""
        return self.documents[0]


def build_collection(
    stores: list[DocumentStore], key: KeyPair, n: int, fanout: int = 8
) -> Collection:
    """A tree of ``n`` folders (folder ``i``'s children are ``fanout*i+1`` ...), created
    in ``stores[0]`` and ingested into the others. Children are created first."""
    ids: list[str | None] = [None] * n
    for i in reversed(range(n)):
        children = [ids[c] for c in range(fanout * i + 1, min(n, fanout * i + fanout + 1))]
        fields = {"title": f"folder {i}", "children": RelationList(tuple(c for c in children if c))}
        ids[i] = publish(stores, stores[0].create(key, FOLDER_ID, fields)).document_id
    return Collection([i for i in ids if i is not None])


def rename(stores: list[DocumentStore], key: KeyPair, document_id: str, title: str) -> Published:
    """Change one folder's title in ``stores[0]`` (and the others given)."""
    return publish(stores, stores[0].update(key, document_id, {"title": title}))


def add_child(
    stores: list[DocumentStore], key: KeyPair, parent_id: str, title: str
) -> tuple[str, list[Published]]:
    """Create a folder and link it from ``parent_id``: two changed documents."""
    created = publish(stores, stores[0].create(key, FOLDER_ID, {"title": title, "children": []}))
    parent = stores[0].document(parent_id)
    assert parent is not None
    children = parent.fields["children"]
    assert isinstance(children, RelationList)
    linked = publish(
        stores,
        stores[0].update(
            key,
            parent_id,
            {"children": RelationList((*children.document_ids, created.document_id))},
        ),
    )
    return created.document_id, [created, linked]


@dataclass
class CatchUp:
    """What one in-process catch-up did (CPU seconds of both sides)."""

    identify_round_trips: int
    identify_bytes: int
    identify_seconds: float
    pull_round_trips: int
    pull_bytes: int
    pull_seconds: float
    changed: int
    missing: int
    applied: int
    only_local: tuple[str, ...]


def catch_up(server: CollectionServer, store: DocumentStore, root: str, peer: str) -> CatchUp:
    """Snapshot ``root`` at ``server`` and pull every out-of-sync document into ``store``,
    passing every message through its bytes. Pulls are pipelined: one round trip for
    all sedimentrees, one for all missing operations."""
    ids = itertools.count(1)

    def new_id() -> bytes:
        return next(ids).to_bytes(16, "big")

    def ask(request: Request) -> Response:
        nonlocal total
        wire = encode_message(request)
        answer = encode_message(server.handle(peer, request, 0))
        total += len(wire) + len(answer)
        response = decode_message(answer)
        assert isinstance(response, Response)
        return response

    total = 0
    start = time.process_time()
    session = SnapshotSync(store, root, server.config, new_id=new_id)
    request: Request | None = session.start()
    while request is not None:
        request = session.receive(ask(request))
    result = session.result
    assert result is not None
    identify_bytes, identify_seconds = total, time.process_time() - start
    start = time.process_time()
    keys = [document_key(d) for d in result.changed] + list(result.missing)
    pulls = [DocumentPull(store, key, new_id=new_id) for key in keys]
    trips = 0
    wave = [(pull, pull.start()) for pull in pulls]
    while wave:
        trips += 1
        wave = [(pull, nxt) for pull, req in wave for nxt in pull.receive(ask(req))]
    assert all(pull.done for pull in pulls)
    return CatchUp(
        session.round_trips,
        identify_bytes,
        identify_seconds,
        trips,
        total - identify_bytes,
        time.process_time() - start,
        len(result.changed),
        len(result.missing),
        sum(p.applied for p in pulls),
        result.only_local,
    )
