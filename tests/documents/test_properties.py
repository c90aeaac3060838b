"""Property tests: delivery order does not matter; decoders only raise their own errors."""

from __future__ import annotations

import contextlib
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.documents import (
    Action,
    DocumentChannel,
    DocumentStore,
    InvalidInput,
    KeyPair,
    MalformedInput,
    MissingDependency,
    OperationRejected,
    cbor,
    decode_entry,
    decode_operation,
    decode_payload,
    decode_varu64,
    encode_payload,
    materialize,
)

from .helpers import TODO_SCHEMA, todo_fields

KEYS = [KeyPair.from_private_key(bytes([i + 1]) * 32) for i in range(3)]


def build_history(
    seed: int, n_ops: int, with_delete: bool
) -> tuple[DocumentStore, str, list[bytes]]:
    """One document edited by three authors with random branches and merges.

    Each UPDATE builds on a random non-empty set of earlier operations, so the
    graph has concurrent branches, merges and concurrent writes to the same
    fields. Returns the origin store, the document id and every payload.
    """
    rng = random.Random(seed)
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    created = store.create(KEYS[0], TODO_SCHEMA.id, todo_fields("start"))
    doc = created.document_id
    payloads = [encode_payload(created.entry, created.operation)]
    known = [doc]
    for i in range(n_ops):
        key = KEYS[rng.randrange(len(KEYS))]
        # Mostly recent operations (live editing), sometimes old ones (an editor
        # coming back online).
        pool = known[-4:] if rng.random() < 0.8 else known
        previous: tuple[str, ...] | None = tuple(
            sorted(set(rng.sample(pool, rng.randint(1, min(3, len(pool))))))
        )
        if rng.random() < 0.5:
            previous = None  # what a local update does: build on every current tip
        fields = rng.choice(
            [{"title": f"t{i}"}, {"priority": i}, {"done": i % 2 == 0, "title": f"u{i}"}]
        )
        published = store.update(key, doc, fields, previous)
        payloads.append(encode_payload(published.entry, published.operation))
        known.append(published.operation_id)
    if with_delete:
        previous = tuple(sorted(set(rng.sample(known, min(2, len(known))))))
        published = store.delete(KEYS[1], doc, previous)
        payloads.append(encode_payload(published.entry, published.operation))
    return store, doc, payloads


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    n_ops=st.integers(0, 14),
    with_delete=st.booleans(),
    order_seed=st.randoms(use_true_random=False),
)
def test_any_delivery_order_materializes_the_same_document(
    seed: int, n_ops: int, with_delete: bool, order_seed: random.Random
) -> None:
    origin, doc, payloads = build_history(seed, n_ops, with_delete)
    shuffled = list(payloads)
    order_seed.shuffle(shuffled)
    # Deliver some twice, as a lossy network with retransmission would.
    shuffled += order_seed.sample(payloads, min(3, len(payloads)))
    receiver = DocumentChannel(DocumentStore(), KeyPair.from_private_key(b"\x09" * 32))
    receiver.store.add_schema(TODO_SCHEMA)
    for payload in shuffled:
        events = receiver.on_delivered(payload)
        assert not any(isinstance(e, OperationRejected) for e in events)
    assert receiver.pending_count == 0
    assert receiver.store.document(doc) == origin.document(doc)
    # The pure materializer agrees with the store's incremental one, in any input order.
    records = origin.operations(doc)
    order_seed.shuffle(records)
    assert materialize(records) == origin.document(doc)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), order_seed=st.randoms(use_true_random=False))
def test_incremental_materialization_agrees_with_full_materialization(
    seed: int, order_seed: random.Random
) -> None:
    # Mostly causal arrival (as SDS delivers) exercises the store's constant-time
    # append; swapped neighbours make it re-walk. Every view must be the full one.
    origin, doc, payloads = build_history(seed, 30, seed % 3 == 0)
    receiver = DocumentChannel(DocumentStore(), KEYS[0])
    receiver.store.add_schema(TODO_SCHEMA)
    arrival = list(payloads)
    for _ in range(len(arrival) // 3):
        i = order_seed.randrange(len(arrival) - 1)
        arrival[i], arrival[i + 1] = arrival[i + 1], arrival[i]
    for payload in arrival:
        receiver.on_delivered(payload)
        view = receiver.store.document(doc)
        if view is not None:
            assert view == materialize(receiver.store.operations(doc))
    assert receiver.store.document(doc) == origin.document(doc)
    assert origin.document(doc) == materialize(origin.operations(doc))


# -- fuzzing: garbage in, only the package's typed errors out ---------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_decoders_raise_only_malformed_input(data: bytes) -> None:
    for decoder in (decode_entry, decode_operation, decode_payload, cbor.decode):
        with contextlib.suppress(MalformedInput):
            decoder(data)
    with contextlib.suppress(MalformedInput):
        decode_varu64(data)


_, _, VALID = build_history(7, 6, True)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid payload with a few bytes flipped, inserted or removed."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data.insert(pos, draw(st.integers(0, 255)))
        elif kind == "delete" and data:
            del data[pos]
        elif kind == "truncate":
            del data[pos:]
    return bytes(data)


@settings(max_examples=200, deadline=None)
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_mutated_payloads_never_escape_as_exceptions(payloads: list[bytes]) -> None:
    channel = DocumentChannel(DocumentStore(), KEYS[2])
    channel.store.add_schema(TODO_SCHEMA)
    for payload in [*payloads, VALID[0]]:
        channel.on_delivered(payload)  # never raises
        try:
            entry, operation = decode_payload(payload)
        except MalformedInput:
            continue
        for decoder, data in ((decode_entry, entry), (decode_operation, operation)):
            with contextlib.suppress(MalformedInput):
                decoder(data)
        with contextlib.suppress(InvalidInput, MissingDependency):
            channel.store.ingest(entry, operation)
    # Whatever came before, the genuine CREATE is accepted.
    assert channel.store.document(decode_entry(decode_payload(VALID[0])[0]).id) is not None


def test_operations_in_history_are_well_formed() -> None:
    store, doc, _ = build_history(3, 10, True)
    actions = [o.action for o in store.operations(doc)]
    assert actions[0] is Action.CREATE and Action.DELETE in actions
