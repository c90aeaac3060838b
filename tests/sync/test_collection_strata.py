"""Sedimentree strata: a long history summarised by a few hashes, pulled exactly."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.documents import DocumentStore, KeyPair, Published
from sdk.sync.collection import CollectionConfig, CollectionServer, document_key, encode_message
from sdk.sync.collection.errors import BadBlob, MalformedMessage
from sdk.sync.collection.messages import (
    FetchBlobPartRequest,
    FetchBlobPartResponse,
    FetchSedimentreeRequest,
    FetchSedimentreeResponse,
    Request,
    Response,
)
from sdk.sync.collection.pull import DocumentPull
from sdk.sync.collection.sedimentree import (
    is_boundary,
    operation_digest,
    split_stratum_bundle,
    strata_of,
    stratum_bundle,
    stratum_digest,
)
from sdk.sync.errors import RemoteProtocolError

from .collection_fixtures import build_collection, new_store, rename

OPERATIONS = 700


@pytest.fixture(scope="module")
def history() -> tuple[str, list[Published]]:
    """A document with OPERATIONS operations, published in one store (this key makes
    four strata of 225, 64, 157 and 60 operations and 194 loose commits)."""
    key = KeyPair.from_private_key(bytes([5]) * 32)
    store = new_store()
    root = build_collection([store], key, 1).root
    created = store.operations(root)[0]
    entry = store.entry(created.id)
    assert entry is not None
    ops = [Published(entry[0], entry[1], created.id, root, ())]
    ops += [rename([store], key, root, f"title {i}") for i in range(OPERATIONS - 1)]
    store.close()
    return root, ops


def store_with(ops: list[Published]) -> DocumentStore:
    store = new_store()
    for op in ops:
        store.ingest(op.entry, op.operation)
    return store


def ids() -> Callable[[], bytes]:
    numbers = itertools.count(1)
    return lambda: next(numbers).to_bytes(16, "big")


def run_pull(
    server: CollectionServer, store: DocumentStore, key: bytes, **kwargs: int
) -> tuple[DocumentPull, list[Request], int]:
    """The pull, every request it sent, and the bytes both ways."""
    pull = DocumentPull(store, key, new_id=ids(), **kwargs)
    requests = [pull.start()]
    sent: list[Request] = []
    wire = 0
    while requests:
        sent += requests
        answers = [server.handle("phone", r, 0) for r in requests]
        wire += sum(len(encode_message(m)) for m in (*requests, *answers))
        requests = [nxt for a in answers for nxt in pull.receive(a)]
    assert pull.done
    return pull, sent, wire


def test_strata_end_at_boundaries_and_cover_the_history(
    history: tuple[str, list[Published]],
) -> None:
    root, ops = history
    store = store_with(ops)
    records = store.operations(root)
    strata, loose = strata_of(records)
    assert len(strata) >= 2  # this history has boundaries (about one in 256)
    flattened = [o for s in strata for o in s.operations] + [r.id for r in loose]
    assert flattened == [r.id for r in records]
    assert all(is_boundary(s.end) and s.end == operation_digest(s.operations[-1]) for s in strata)
    assert [s.start for s in strata[1:]] == [s.end for s in strata[:-1]] and strata[0].start is None
    assert not any(is_boundary(operation_digest(r.id)) for r in loose)
    server = CollectionServer(store)
    response = server.handle(
        "phone", Request(bytes(16), FetchSedimentreeRequest(document_key(root))), 0
    )
    assert isinstance(response.body, FetchSedimentreeResponse)
    summary = response.body.content
    assert summary is not None
    assert len(summary.strata) == len(strata) and len(summary.commits) == len(loose)
    bundle = stratum_bundle(store, strata[0].operations)
    assert summary.strata[0].blob.size == len(bundle)
    assert [o for o, _ in split_stratum_bundle(bundle, strata[0].digest)] == list(
        strata[0].operations
    )


@pytest.mark.parametrize("have", [0, 1, 250, OPERATIONS - 3, OPERATIONS])
def test_a_pull_with_strata_brings_any_prefix_up_to_date(
    history: tuple[str, list[Published]], have: int
) -> None:
    root, ops = history
    server = CollectionServer(store_with(ops))
    phone = store_with(ops[:have])
    pull, sent, _ = run_pull(server, phone, document_key(root), part_bytes=20_000)
    assert pull.applied == OPERATIONS - have
    assert [r.id for r in phone.operations(root)] == [op.operation_id for op in ops]
    if have == OPERATIONS:
        assert len(sent) == 1  # the summary only


def test_held_strata_are_not_fetched(history: tuple[str, list[Published]]) -> None:
    root, ops = history
    store = store_with(ops)
    strata, loose = strata_of(store.operations(root))
    server = CollectionServer(store)
    have = len(ops) - len(loose) - 1  # all strata but the last operation of the last
    _, sent, wire = run_pull(server, store_with(ops[:have]), document_key(root))
    flat = CollectionServer(store, CollectionConfig(strata=False))
    _, flat_sent, flat_wire = run_pull(flat, store_with(ops[:have]), document_key(root))
    # The summary, the last stratum's bundle and every loose commit; no other stratum.
    bundles = [
        r.body.blob
        for r in sent
        if isinstance(r.body, FetchBlobPartRequest) and r.body.blob in {s.digest for s in strata}
    ]
    assert bundles == [strata[-1].digest]
    assert len(sent) == len(flat_sent) == 1 + 1 + len(loose)
    assert wire < flat_wire  # the summary names 700 operations in 4 strata and 194 commits


def test_a_bundle_that_is_not_its_stratum_is_rejected(
    history: tuple[str, list[Published]],
) -> None:
    root, ops = history
    store = store_with(ops)
    strata, _ = strata_of(store.operations(root))
    bundle = stratum_bundle(store, strata[1].operations)
    with pytest.raises(MalformedMessage):
        split_stratum_bundle(bundle, strata[0].digest)
    for cut in (0, 1, len(bundle) // 2, len(bundle) - 1):
        with pytest.raises(MalformedMessage):
            split_stratum_bundle(bundle[:cut], strata[1].digest)
    server = CollectionServer(store)
    phone = store_with(ops[:1])
    pull = DocumentPull(phone, document_key(root), new_id=ids())
    requests = pull.receive(server.handle("phone", pull.start(), 0))
    first = requests[0]
    forged = Response(first.request_id, FetchBlobPartResponse(bundle))  # stratum 1's bytes
    with pytest.raises(BadBlob):
        pull.receive(forged)
    assert len(phone.operations(root)) == 1  # nothing of it stored


def test_a_stratum_part_of_the_wrong_size_is_rejected(
    history: tuple[str, list[Published]],
) -> None:
    root, ops = history
    server = CollectionServer(store_with(ops))
    phone = store_with(ops[:1])
    pull = DocumentPull(phone, document_key(root), new_id=ids(), part_bytes=1000)
    requests = pull.receive(server.handle("phone", pull.start(), 0))
    with pytest.raises(BadBlob):
        pull.receive(Response(requests[0].request_id, FetchBlobPartResponse(b"short")))


def test_the_server_answers_stratum_bundles_in_parts(
    history: tuple[str, list[Published]],
) -> None:
    root, ops = history
    store = store_with(ops)
    server = CollectionServer(store)
    strata, _ = strata_of(store.operations(root))
    pull, sent, _ = run_pull(server, store_with(ops[:1]), document_key(root), part_bytes=3000)
    parts = [r.body for r in sent if isinstance(r.body, FetchBlobPartRequest)]
    for stratum in strata:
        size = len(stratum_bundle(store, stratum.operations))
        offsets = [p.offset for p in parts if p.blob == stratum.digest]
        assert offsets == list(range(0, size, 3000))
    assert pull.applied == OPERATIONS - 1


@pytest.fixture(scope="module")
def servers(history: tuple[str, list[Published]]) -> list[CollectionServer]:
    """Servers holding the whole history, and its first 300 operations (one stratum)."""
    _, ops = history
    return [CollectionServer(store_with(ops)), CollectionServer(store_with(ops[:300]))]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400), digest=st.binary(min_size=32, max_size=32))
def test_any_bytes_split_or_raise_malformed(data: bytes, digest: bytes) -> None:
    try:
        split_stratum_bundle(data, digest)
    except MalformedMessage:
        return
    assert data == b"\x00" and digest == stratum_digest([])  # only an empty bundle splits


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=st.binary(max_size=2000), cut=st.integers(0, 50))
def test_a_pull_takes_any_bundle_bytes_with_a_typed_error(
    history: tuple[str, list[Published]], servers: list[CollectionServer], answer: bytes, cut: int
) -> None:
    root, _ = history
    server = servers[cut % 2]
    phone = new_store()
    pull = DocumentPull(phone, document_key(root), new_id=ids(), part_bytes=max(len(answer), 512))
    requests = pull.receive(server.handle("phone", pull.start(), 0))
    if not requests:
        return
    before = phone.entry_count()
    try:
        pull.receive(Response(requests[0].request_id, FetchBlobPartResponse(answer)))
    except RemoteProtocolError:
        assert phone.entry_count() == before
