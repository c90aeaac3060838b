"""Random proposal/adjust/cancel interleavings from both sides end consistent.

Both endpoints act concurrently (proposals, adjustments, cancellations, credit), and
bytes are delivered in random prefixes in both directions. Whatever happens, no
honest endpoint drops the connection, both end with no active request once
everything is cancelled, every stored entry is the author's own entry, verified,
and a request that was left to finish delivers its whole range.
"""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sdk.documents.bamboo import lipmaa
from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    ALL,
    NOTIFY,
    CancelReason,
    EagerMode,
    Eagerness,
    Endpoint,
    EndpointConfig,
    LocalProtocolError,
    MemoryLogStore,
    RemoteProtocolError,
    RequestCancelled,
    Role,
    lower_pool,
)
from sdk.sync.bamboo_p2p.pair import EndpointPair

KEYS = [KeyPair.from_private_key(bytes([i]) * 32) for i in range(1, 4)]
N = 40


def source() -> MemoryLogStore:
    store = MemoryLogStore()
    for k, key in enumerate(KEYS):
        for i in range(N):
            store.append(key, 0, bytes([k, i]) * (1 + (i * 7) % 13))
    return store


SOURCE = source()
LOGS = [(key.public_key, 0) for key in KEYS]


def partial(rng: random.Random) -> MemoryLogStore:
    store = MemoryLogStore()
    for log in LOGS:
        upto = rng.choice((0, 0, 5, 13, 20, N))
        store.copy_entries(SOURCE, log, list(range(1, upto + 1)))
        for seq in range(1, upto + 1):
            if rng.random() < 0.2:  # metadata only, maybe with a cut payload's prefix
                store._logs[log].payloads.pop(seq)
                full = SOURCE.payload(log, seq)
                if full is not None and rng.random() < 0.5:
                    store.put_partial_payload(log, seq, full[: rng.randint(0, len(full))])
    return store


def random_action(endpoint: Endpoint, rng: random.Random) -> None:
    store = endpoint.store
    assert isinstance(store, MemoryLogStore)
    kind = rng.randrange(10)
    try:
        if kind < 4:
            log = rng.choice(LOGS)
            start = rng.randint(1, N)
            end = rng.choice((None, rng.randint(start, N)))
            candidates = [*lower_pool(start), start]
            lower = rng.choice([p for p in candidates if p == 1 or store.entry(log, lipmaa(p))])
            eager = rng.choice((ALL, NOTIFY, Eagerness(EagerMode.UP_TO, rng.randint(0, 20))))
            # Now and then a range that starts inside a payload, or moves payloads only.
            shape = rng.randrange(6)
            start_entry = store.entry(log, start)
            offset = None
            if shape == 0 and start_entry is not None:
                offset, lower = rng.randint(0, start_entry.payload_size), 1
            endpoint.propose(
                log,
                start,
                end=end,
                lower=lower,
                offset=offset,
                payload_only=shape == 1,
                sparse=end is not None and rng.random() < 0.3,
                eagerness=eager,
                min_payload=rng.choice((0, 0, 5)),
                max_payload=rng.choice((1000, 15)),
                mandatory=rng.random() < 0.2,
            )
        elif kind < 7 and endpoint.request_ids():
            rid = rng.choice(endpoint.request_ids())
            state = endpoint.request_state(rid)
            if state["i_cancelled"]:
                return
            end = state["end"]
            new_end = None
            if rng.random() < 0.4:
                top = end if isinstance(end, int) else N
                new_end = rng.randint(1, top)
            endpoint.adjust(
                rid,
                eagerness=rng.choice((None, ALL, NOTIFY)),
                allow_skip=rng.random() < 0.3,
                end=new_end,
                min_payload=rng.choice((None, 20)),
                max_payload=rng.choice((None, 10)),
            )
        elif kind < 9 and endpoint.request_ids():
            rid = rng.choice(endpoint.request_ids())
            endpoint.cancel(
                rid, rng.choice((CancelReason.DO_NOT_RETRY, CancelReason.RESOURCE_LIMIT))
            )
        else:
            endpoint.grant_credit(rng.randint(1, 3))
    except LocalProtocolError:
        pass


def check_consistent(pair: EndpointPair) -> None:
    assert pair.error is None, pair.error
    for endpoint in (pair.a, pair.b):
        store = endpoint.store
        assert isinstance(store, MemoryLogStore)
        for log in LOGS:
            for seq in store.sequence_numbers(log):
                entry = store.entry(log, seq)
                original = SOURCE.entry(log, seq)
                assert entry is not None and original is not None
                assert entry.hash == original.hash
                payload = store.payload(log, seq)
                if payload is not None:
                    assert payload == SOURCE.payload(log, seq)


@given(st.integers(0, 2**32 - 1), st.integers(20, 200))
# 1078: a payload-only proposer that asked NOTIFY (lacking the entries) adjusted its
# eagerness to ALL, then got payload bytes it could not frame; adjust now refuses that.
@example(1078, 198)
@settings(max_examples=150, deadline=None)
def test_random_interleavings_end_consistent(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    configs = [
        EndpointConfig(
            initial_credit=rng.choice((1, 3, 16)),
            chunk_size=rng.choice((3, 7, 1000)),
            send_greedy=rng.random() < 0.5,
            receive_greedy=rng.random() < 0.5,
            compression_window=rng.choice((0, 0, 16, 4096)),
        )
        for _ in range(2)
    ]
    pair = EndpointPair.create(partial(rng), partial(rng), *configs)
    for _ in range(steps):
        if rng.random() < 0.25:
            random_action(rng.choice((pair.a, pair.b)), rng)
        pair.step_random(rng)
        assert pair.error is None, pair.error
    pair.run()
    check_consistent(pair)
    # Cancel whatever is left (live ranges, waits on data nobody has): all ids free up.
    for endpoint in (pair.a, pair.b):
        for rid in endpoint.request_ids():
            if not endpoint.request_state(rid)["i_cancelled"]:
                endpoint.cancel(rid)
    pair.run()
    check_consistent(pair)
    assert pair.a.request_ids() == [] and pair.b.request_ids() == []


@given(st.integers(0, 2**32 - 1))
# 2866: a cancellation (130) produced after a payload overtook it when control frames
# went out before data frames; the peer confirmed and dropped the payload as stale.
@example(2866)
@settings(max_examples=25, deadline=None)
def test_finished_ranges_deliver_everything(seed: int) -> None:
    """Requests nobody adjusts or cancels, over random delivery, deliver their range."""
    rng = random.Random(seed)
    server = MemoryLogStore()
    for log in LOGS:
        server.copy_entries(SOURCE, log, list(range(1, N + 1)))
    phone = partial(rng)
    pair = EndpointPair.create(server, phone, EndpointConfig(chunk_size=5), EndpointConfig())
    wanted: dict[tuple[bytes, int], set[int]] = {}
    for _ in range(300):
        if rng.random() < 0.1:
            log = rng.choice(LOGS)
            start = rng.randint(1, N)
            end = rng.randint(start, N)
            try:
                if pair.b.credit:
                    pair.b.propose(log, start, end=end)
                    wanted.setdefault(log, set()).update(range(start, end + 1))
            except LocalProtocolError:
                pass  # overlaps an unconfirmed proposal of the peer (none here) or no credit
        pair.step_random(rng)
    pair.run()
    assert pair.error is None
    for log, seqs in wanted.items():
        assert seqs <= set(phone.sequence_numbers(log))
        assert seqs <= set(phone.payload_sequence_numbers(log))
    assert pair.b.request_ids() == []
    cancelled = [e for e in pair.b_events if isinstance(e, RequestCancelled)]
    assert {e.reason for e in cancelled} <= {CancelReason.END_OF_RANGE, CancelReason.CONFIRM}


ENDER = KeyPair.from_private_key(bytes([9]) * 32)
ENDED = (ENDER.public_key, 0)


def ended_source() -> MemoryLogStore:
    store = MemoryLogStore()
    for i in range(N):
        store.append(ENDER, 0, bytes([i]) * (1 + i % 5))
    store.append(ENDER, 0, b"the end", end_of_log=True)
    return store


ENDED_SOURCE = ended_source()


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_open_ranges_over_an_ended_log_close_themselves(seed: int) -> None:
    """Open ranges (and ranges past the end) over a log that has ended, proposed at random
    times over random delivery, close once the end-of-log entry is through."""
    rng = random.Random(seed)
    server = MemoryLogStore()
    held = rng.choice((N - 10, N, N + 1))  # the server may learn the end while serving
    server.copy_entries(ENDED_SOURCE, ENDED, list(range(1, held + 1)))
    phone = MemoryLogStore()
    phone.copy_entries(ENDED_SOURCE, ENDED, list(range(1, rng.choice((0, 3, 12)) + 1)))
    pair = EndpointPair.create(server, phone, EndpointConfig(chunk_size=3), EndpointConfig())
    starts: list[int] = []
    for step in range(300):
        if step == 150 and held < N + 1:
            server.copy_entries(ENDED_SOURCE, ENDED, list(range(held + 1, N + 2)))
        if rng.random() < 0.08 and pair.b.credit:
            start = rng.randint(1, N + 1)
            candidates = [p for p in (*lower_pool(start), start) if p >= 1]
            lower = rng.choice([p for p in candidates if p == 1 or phone.entry(ENDED, lipmaa(p))])
            end = rng.choice((None, None, N + 5))
            try:
                pair.b.propose(ENDED, start, end=end, lower=lower)
                starts.append(start)
            except LocalProtocolError:
                pass  # the previous proposal on this log is not confirmed yet
        pair.step_random(rng)
        assert pair.error is None, pair.error
    if len(server.sequence_numbers(ENDED)) < N + 1:
        server.copy_entries(ENDED_SOURCE, ENDED, list(range(1, N + 2)))
    pair.run()
    assert pair.error is None, pair.error
    assert pair.a.request_ids() == pair.b.request_ids() == []
    if starts:
        assert set(range(min(starts), N + 2)) <= set(phone.payload_sequence_numbers(ENDED))
        assert phone.end_of_log(ENDED) == N + 1


# ------------------------------------------------------------- endpoint fuzzing


def _transcript() -> tuple[bytes, bytes]:
    """What a server sends to a phone syncing 1..12 of a log, and what the phone sends."""
    server = MemoryLogStore()
    server.copy_entries(SOURCE, LOGS[0], list(range(1, 13)))
    phone = Endpoint(Role.REACTIVE, MemoryLogStore())
    a = Endpoint(Role.PROACTIVE, server)
    to_phone, to_server = bytearray(a.data_to_send()), bytearray(phone.data_to_send())
    phone.receive_data(bytes(to_phone))
    a.receive_data(bytes(to_server))
    phone.propose(LOGS[0], 1, end=12)
    for _ in range(10):
        out = phone.data_to_send()
        to_server += out
        a.receive_data(out)
        out = a.data_to_send()
        to_phone += out
        phone.receive_data(out)
    return bytes(to_phone), bytes(to_server)


TO_PHONE, TO_SERVER = _transcript()


def _feed_phone(data: bytes) -> MemoryLogStore:
    """Replay server bytes to a fresh phone that proposes as soon as it has credit."""
    store = MemoryLogStore()
    phone = Endpoint(Role.REACTIVE, store)
    phone.data_to_send()
    try:
        phone.receive_data(data[:7])  # setup (3 bytes) and the credit frame (4 bytes)
        if phone.credit:
            phone.propose(LOGS[0], 1, end=12)
        phone.data_to_send()
        phone.receive_data(data[7:])
        phone.data_to_send()
    except RemoteProtocolError:
        assert phone.error is not None
    return store


def test_the_unmutated_transcript_syncs() -> None:
    assert _feed_phone(TO_PHONE).payload_sequence_numbers(LOGS[0]) == list(range(1, 13))


@given(st.binary(max_size=400))
@settings(max_examples=500, deadline=None)
def test_fuzz_endpoint_with_garbage_raises_only_protocol_errors(data: bytes) -> None:
    _feed_phone(b"\x00\x00\x00" + data)


@given(st.lists(st.tuples(st.integers(0, len(TO_PHONE) - 1), st.integers(0, 255)), max_size=4))
@settings(max_examples=500, deadline=None)
def test_fuzz_endpoint_with_a_mutated_transcript(flips: list[tuple[int, int]]) -> None:
    data = bytearray(TO_PHONE)
    for index, value in flips:
        data[index] = value
    _feed_phone(bytes(data))
