"""Two endpoints in memory: replication, sparse sync, live updates, forks, end of log,
overlap resolution, cancellation, and every invariant violation dropping the connection."""

from __future__ import annotations

import json
import math

import pytest

from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    ALL,
    NOTIFY,
    Adjust,
    AdjustmentViolation,
    Apology,
    ApologyViolation,
    Cancel,
    CancelMarker,
    CancelReason,
    Channel,
    CompressedPayload,
    CompressionViolation,
    ConnectionDropped,
    CreditViolation,
    DataOrderViolation,
    EagerMode,
    Eagerness,
    EagernessViolation,
    EndOfLogDetected,
    Endpoint,
    EndpointConfig,
    EntryReceived,
    GrantCredit,
    InvalidData,
    LocalProtocolError,
    LogForkDetected,
    MalformedMessage,
    MemoryLogStore,
    Metadata,
    Notify,
    PayloadChunk,
    PayloadSizeViolation,
    ProposalDropped,
    Propose,
    RangeViolation,
    RemoteProtocolError,
    RequestClosed,
    RequestIdViolation,
    Role,
    SkipBytes,
    SkipTooLarge,
    SkipTooSmall,
    SkipUnavailable,
    SkipViolation,
    StartingHashMismatch,
    SwitchRequest,
    UnknownRequest,
    encode_control,
    encode_data,
    encode_frame,
    lower_pool,
    shortest_path,
    sign_log_entry,
)
from sdk.sync.bamboo_p2p.codec import entry_from_cancel_bytes
from sdk.sync.bamboo_p2p.pair import EndpointPair
from tests.conftest import VECTORS

KEY = KeyPair.from_private_key(bytes(range(32)))
OTHER = KeyPair.from_private_key(bytes(range(1, 33)))
LOG = (KEY.public_key, 0)


def make_log(n: int, key: KeyPair = KEY, log_id: int = 0, size: int = 12) -> MemoryLogStore:
    store = MemoryLogStore()
    for i in range(n):
        store.append(key, log_id, (b"%d:" % i).ljust(size, b"."))
    return store


def connected(a: MemoryLogStore, b: MemoryLogStore, **kw: EndpointConfig) -> EndpointPair:
    pair = EndpointPair.create(a, b, kw.get("config_a"), kw.get("config_b"))
    pair.exchange()
    return pair


def verified_subset(store: MemoryLogStore, source: MemoryLogStore, log: tuple[bytes, int]) -> None:
    for seq in store.sequence_numbers(log):
        entry = store.entry(log, seq)
        assert entry is not None
        entry.verify_signature()
        original = source.entry(log, seq)
        assert original is not None and original.hash == entry.hash
        payload = store.payload(log, seq)
        if payload is not None:
            entry.verify_payload(payload)


# ---------------------------------------------------------------- replication


def test_full_range_sync_both_directions_and_close() -> None:
    a, b = make_log(60), make_log(40, OTHER)
    log_b = (OTHER.public_key, 0)
    source_a, source_b = make_log(60), make_log(40, OTHER)
    pair = connected(a, b)
    rb = pair.b.propose(LOG, 1, end=60)
    ra = pair.a.propose(log_b, 1, end=40)
    pair.run()
    assert pair.error is None
    assert b.sequence_numbers(LOG) == list(range(1, 61))
    assert b.payload_sequence_numbers(LOG) == list(range(1, 61))
    assert a.sequence_numbers(log_b) == list(range(1, 41))
    verified_subset(b, source_a, LOG)
    verified_subset(a, source_b, log_b)
    # Both requests ended with reason 130 and all four messages: ids are free.
    assert pair.a.request_ids() == pair.b.request_ids() == []
    closed_a = {e.request_id for e in pair.a_events if isinstance(e, RequestClosed)}
    assert closed_a == {ra, rb}


def test_sync_from_the_middle_with_a_lower_certpool_anchor() -> None:
    a = make_log(100)
    b = MemoryLogStore()
    b.copy_entries(a, LOG, list(range(1, 41)))  # b has the first 40 entries
    pair = connected(a, b)
    pair.b.propose(LOG, 50, end=60, lower=40)  # anchored on entry lipmaa(40) = 13
    pair.run()
    assert pair.error is None
    assert set(range(50, 61)) <= set(b.sequence_numbers(LOG))
    # Only the pool entries from 40 on travel before the range, not 41..49.
    assert set(b.sequence_numbers(LOG)) & set(range(41, 50)) == set(lower_pool(50)) & set(
        range(41, 50)
    )
    verified_subset(b, make_log(100), LOG)


def test_sparse_newest_entry_of_the_shared_vector_log() -> None:
    """The certificate pool of entry 100 in the shared vector is what a sparse sync moves."""
    vector = json.loads((VECTORS / "bamboo-ed25519-yasmf.json").read_text())
    data = vector["valid_partial_replicated_seq_100"]
    server = MemoryLogStore()
    for item in data["entries"]:
        server.put_entry(entry_from_cancel_bytes(bytes.fromhex(item["encoded"])))
    log = (bytes.fromhex(data["author"]["public"]), 0)
    phone = MemoryLogStore()
    pair = connected(server, phone)
    pair.b.propose(log, 100, end=100)
    pair.run()
    assert pair.error is None
    assert phone.sequence_numbers(log) == [1, 4, 13, 40, 80, 93, 97, 98, 99, 100]
    assert phone.sequence_numbers(log) == [e["decoded"]["seqNum"] for e in data["entries"]]
    assert pair.a.request_ids() == pair.b.request_ids() == []  # payload 100 skipped: unavailable


def test_sparse_range_moves_only_the_shortest_path() -> None:
    n = 1000
    server, phone = make_log(n), MemoryLogStore()
    pair = connected(server, phone)
    pair.b.propose(LOG, 1, end=n, sparse=True)
    pair.run()
    assert pair.error is None
    assert phone.sequence_numbers(LOG) == shortest_path(n, 1)
    assert len(phone.sequence_numbers(LOG)) <= 2 * math.ceil(math.log2(n))
    verified_subset(phone, server, LOG)


def test_live_updates_on_an_open_range() -> None:
    server, phone = make_log(5), MemoryLogStore()
    pair = connected(server, phone)
    request = pair.b.propose(LOG, 1)
    pair.run()
    assert phone.sequence_numbers(LOG) == [1, 2, 3, 4, 5]
    for i in range(3):
        server.append(KEY, 0, b"live %d" % i)
    pair.run()
    assert phone.sequence_numbers(LOG) == list(range(1, 9))
    assert phone.payload(LOG, 8) == b"live 2"
    assert pair.b.request_ids() == [request]  # still following
    pair.b.adjust(request, end=8)
    pair.run()
    assert pair.a.request_ids() == pair.b.request_ids() == []


def test_notify_eagerness_moves_no_data() -> None:
    server, phone = make_log(20), MemoryLogStore()
    pair = connected(server, phone)
    pair.b.propose(LOG, 1, end=20, eagerness=NOTIFY)
    pair.run()
    assert pair.error is None
    assert phone.sequence_numbers(LOG) == []
    assert pair.a.request_ids() == []


def test_up_to_eagerness_and_payload_size_limits() -> None:
    server = MemoryLogStore()
    sizes = [5, 50, 500, 5, 5000]
    for i, size in enumerate(sizes):
        server.append(KEY, 0, bytes([i]) * size)
    phone = MemoryLogStore()
    pair = connected(server, phone)
    pair.b.propose(LOG, 1, end=5, eagerness=Eagerness(EagerMode.UP_TO, 100), max_payload=1000)
    pair.run()
    assert pair.error is None
    assert phone.sequence_numbers(LOG) == [1, 2, 3, 4, 5]
    assert phone.payload_sequence_numbers(LOG) == [1, 2, 4]
    other = MemoryLogStore()
    pair = connected(server, other)
    pair.b.propose(LOG, 1, end=5, min_payload=10, max_payload=1000)
    pair.run()
    assert other.payload_sequence_numbers(LOG) == [2, 3]


def test_missing_mandatory_payload_waits_or_cancels_with_132() -> None:
    server = MemoryLogStore()
    server.copy_entries(make_log(3), LOG, [1, 2, 3])
    server._logs[LOG].payloads.pop(2)  # the server lost payload 2
    phone = MemoryLogStore()
    pair = connected(server, phone)
    request = pair.b.propose(LOG, 1, end=3, mandatory=True)
    pair.run()
    assert pair.b.request_ids() == [request]  # waits for payload 2
    assert phone.payload_sequence_numbers(LOG) == [1]
    pair = connected(
        server, MemoryLogStore(), config_a=EndpointConfig(cancel_on_missing_mandatory=True)
    )
    pair.b.propose(LOG, 1, end=3, mandatory=True)
    pair.run()
    reasons = [e.reason for e in pair.b_events if type(e).__name__ == "RequestCancelled"]
    assert reasons == [CancelReason.MANDATORY_PAYLOAD]


def test_both_sides_hold_parts_and_end_with_the_union() -> None:
    full = make_log(30)
    a, b = MemoryLogStore(), MemoryLogStore()
    a.copy_entries(full, LOG, list(range(1, 16)))
    b.copy_entries(full, LOG, list(range(1, 31)))
    a._logs[LOG].payloads.clear()  # a has metadata only
    pair = connected(a, b)
    pair.a.propose(LOG, 1, end=30)
    pair.run()
    assert pair.error is None
    assert a.sequence_numbers(LOG) == list(range(1, 31))
    assert a.payload_sequence_numbers(LOG) == list(range(1, 31))


# ---------------------------------------------------------- fork, end of log


def forked_pair() -> tuple[MemoryLogStore, MemoryLogStore]:
    a, b = MemoryLogStore(), MemoryLogStore()
    for i in range(1, 11):
        a.append(KEY, 0, b"entry %d" % i)
        b.append(KEY, 0, b"entry %d" % i if i < 4 else b"fork %d" % i)
    return a, b


def test_a_fork_is_detected_reported_and_proven() -> None:
    a, b = forked_pair()
    pair = connected(a, b)
    pair.b.propose(LOG, 1, end=10)
    pair.run()
    assert pair.error is None
    forks_b = [e for e in pair.b_events if isinstance(e, LogForkDetected)]
    forks_a = [e for e in pair.a_events if isinstance(e, LogForkDetected)]
    assert forks_b and forks_b[0].verified and forks_b[0].proof[0].seq_num == 4
    assert forks_a and forks_a[0].verified  # a verified b's proof (cancellation 135)
    assert a.fork_proof(LOG) is not None and b.fork_proof(LOG) is not None
    assert pair.a.request_ids() == pair.b.request_ids() == []
    # A known fork below the lower certpool info is answered with 135 straight away.
    c = MemoryLogStore()
    c.copy_entries(a, LOG, [1, 2, 3, 4])
    pair = connected(b, c)
    pair.b.propose(LOG, 6, end=8, lower=5)
    pair.run()
    cancels = [e for e in pair.b_events if type(e).__name__ == "RequestCancelled"]
    assert [e.reason for e in cancels] == [CancelReason.FORKED]


def test_expected_starting_hash_mismatch_is_cancellation_133() -> None:
    a, b = forked_pair()
    pair = connected(a, MemoryLogStore())
    phone = pair.b.store
    assert isinstance(phone, MemoryLogStore)
    phone.copy_entries(b, LOG, [1, 4])  # the fork's entry 4
    pair.b.propose(LOG, 5, end=6, lower=5)  # anchored on entry lipmaa(5) = 4
    pair.run()
    mismatches = [e for e in pair.b_events if isinstance(e, StartingHashMismatch)]
    assert len(mismatches) == 1
    original = a.entry(LOG, 4)
    assert original is not None and mismatches[0].entry.hash == original.hash


def test_end_of_log_entry_is_detected_and_reported() -> None:
    server = make_log(4)
    server.append(KEY, 0, b"the end", end_of_log=True)
    phone = MemoryLogStore()
    pair = connected(server, phone)
    pair.b.propose(LOG, 1, end=5)
    pair.run()
    assert pair.error is None
    ends = [e for e in pair.b_events if isinstance(e, EndOfLogDetected)]
    assert [(e.seq_num, e.reported) for e in ends] == [(5, False)]
    assert phone.end_of_log(LOG) == 5
    # Asking beyond the end: the server answers 134 with the end-of-log sequence number.
    late = MemoryLogStore()
    late.copy_entries(server, LOG, [1, 2, 3, 4])
    pair = connected(server, late)
    pair.b.propose(LOG, 8, end=9, lower=8)
    pair.run()
    ends = [e for e in pair.b_events if isinstance(e, EndOfLogDetected)]
    assert [(e.seq_num, e.reported) for e in ends] == [(5, True)]


def test_an_open_range_over_a_log_that_ends_closes_after_the_end_of_log_entry() -> None:
    server, phone = make_log(3), MemoryLogStore()
    pair = connected(server, phone)
    request = pair.b.propose(LOG, 1)
    pair.run()
    assert pair.b.request_ids() == [request]  # live: following the log
    server.append(KEY, 0, b"last words", end_of_log=True)
    pair.run()
    assert pair.error is None
    assert phone.sequence_numbers(LOG) == phone.payload_sequence_numbers(LOG) == [1, 2, 3, 4]
    assert phone.end_of_log(LOG) == 4
    # Both sides closed it with reason 130: nothing more can follow.
    assert pair.a.request_ids() == pair.b.request_ids() == []
    reasons = [e.reason for e in pair.b_events if type(e).__name__ == "RequestCancelled"]
    assert reasons in ([CancelReason.END_OF_RANGE], [CancelReason.CONFIRM])
    assert RequestClosed(request, True) in pair.b_events


def test_a_range_past_an_end_that_is_already_stored_closes_at_the_end() -> None:
    server = make_log(5)
    server.append(KEY, 0, b"end", end_of_log=True)
    for proposed in ({"end": 50}, {}):
        phone = MemoryLogStore()
        pair = connected(server, phone)
        pair.b.propose(LOG, 1, **proposed)  # type: ignore[arg-type]
        pair.run()
        assert pair.error is None
        assert phone.sequence_numbers(LOG) == list(range(1, 7))
        assert pair.a.request_ids() == pair.b.request_ids() == []


def test_a_request_waiting_for_a_piece_neither_side_has_is_given_up() -> None:
    server, phone = make_log(10), MemoryLogStore()
    pair = connected(server, phone)
    # Upper certificate pool up to 40: entries 11..40 exist nowhere yet.
    request = pair.b.propose(LOG, 1, end=10, upper=40)
    pair.run()
    assert pair.b.request_ids() == [request]  # both wait: the protocol has no timers
    assert pair.b.progress(request) == pair.a.progress(request)
    assert pair.b.request_state(request)["end"] == 10
    stalled = pair.b.give_up(request)
    assert stalled is not None and stalled.request_id == request
    waited = pair.b.progress(request)
    assert waited is not None
    assert (stalled.seq_num, stalled.payload) == (11, False)  # the first upper pool entry
    pair.run()
    assert pair.error is None
    assert pair.a.request_ids() == pair.b.request_ids() == []
    assert stalled in pair.b_events
    reasons = [e.reason for e in pair.a_events if type(e).__name__ == "RequestCancelled"]
    assert reasons == [CancelReason.DO_NOT_RETRY]
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 11))
    # Nothing to give up on once a request is through.
    assert pair.b.progress(request) is None


def test_entries_after_an_end_of_log_are_invalid() -> None:
    honest = make_log(4)
    honest.append(KEY, 0, b"end", end_of_log=True)
    liar = MemoryLogStore()  # holds an entry the author signed after ending the log
    liar.copy_entries(honest, LOG, [1, 2, 3, 4, 5])
    last = honest.entry(LOG, 5)
    assert last is not None
    liar.put_entry(sign_log_entry(KEY, 0, 6, b"more", backlink=last.hash))
    liar.put_payload(LOG, 6, b"more")
    liar._logs[LOG].end = None  # a peer that does not check (ours would answer 134)
    phone = MemoryLogStore()
    phone.copy_entries(honest, LOG, [1, 2, 3, 4, 5])
    pair = connected(liar, phone)
    pair.b.propose(LOG, 6, end=6, lower=6)
    pair.run()
    assert pair.error is not None and isinstance(pair.error[1], InvalidData)


# ------------------------------------------------------- overlap, cancellation


@pytest.mark.parametrize(("start_a", "start_b", "dropped"), [(1, 5, "b"), (5, 1, "a"), (3, 3, "b")])
def test_concurrent_overlapping_proposals(start_a: int, start_b: int, dropped: str) -> None:
    a, b = make_log(20), make_log(20)
    pair = connected(a, b)
    ra = pair.a.propose(LOG, start_a, end=15)
    rb = pair.b.propose(LOG, start_b, end=18)
    pair.run()
    assert pair.error is None
    loser = rb if dropped == "b" else ra
    drops_a = [e for e in pair.a_events if isinstance(e, ProposalDropped)]
    drops_b = [e for e in pair.b_events if isinstance(e, ProposalDropped)]
    assert [e.request_id for e in drops_a] == [e.request_id for e in drops_b] == [loser]
    assert pair.a.request_ids() == pair.b.request_ids() == []
    assert pair.a.credit == pair.b.credit == 16  # the dropped proposal cost nothing


def test_cancellation_takes_four_messages_then_frees_the_id() -> None:
    server = make_log(5)
    pair = connected(server, MemoryLogStore())
    request = pair.b.propose(LOG, 1)
    pair.exchange()
    pair.b.cancel(request, CancelReason.RESOURCE_LIMIT)
    assert pair.b.request_ids() == [request]  # waiting for the peer's two messages
    pair.run()
    assert pair.a.request_ids() == pair.b.request_ids() == []
    assert pair.b.credit == 16  # a replenished the credit of the closed proposal
    with pytest.raises(LocalProtocolError):
        pair.b.cancel(request)


def test_local_misuse_is_a_local_error() -> None:
    pair = connected(MemoryLogStore(), MemoryLogStore(), config_a=EndpointConfig(initial_credit=0))
    with pytest.raises(LocalProtocolError, match="credit"):
        pair.b.propose(LOG, 1)
    with pytest.raises(LocalProtocolError, match="needs entry"):
        pair.a.propose(LOG, 5, lower=5)
    with pytest.raises(LocalProtocolError, match="end"):
        pair.a.propose(LOG, 5, end=4)


# ------------------------------------------------------------ invariants


def frame(channel: Channel, *messages: object, backlink: bool = False) -> bytes:
    if channel is Channel.CONTROL:
        body = b"".join(encode_control(m) for m in messages)  # type: ignore[arg-type]
    else:
        body = b"".join(encode_data(m) for m in messages)  # type: ignore[arg-type]
    return encode_frame(channel, body)


def expect_drop(endpoint: Endpoint, data: bytes, error: type[RemoteProtocolError]) -> None:
    with pytest.raises(error):
        endpoint.receive_data(data)
    assert isinstance(endpoint.error, error)
    events = []
    while (event := endpoint.next_event()) is not None:
        events.append(event)
    assert isinstance(events[-1], ConnectionDropped)
    assert endpoint.data_to_send() == b""
    with pytest.raises(LocalProtocolError):
        endpoint.receive_data(b"\x00")


def proposal(rid: int, **kw: object) -> Propose:
    fields: dict[str, object] = {
        "request_id": rid,
        "author": KEY.public_key,
        "log_id": 0,
        "start": 1,
        "lower_certpool": 1,
        "min_payload": 0,
        "max_payload": 1000,
        "expected_hash": None,
        "eagerness": ALL,
        "end": 5,
        "upper_certpool": 5,
    }
    fields.update(kw)
    return Propose(**fields)  # type: ignore[arg-type]


def test_a_peer_spending_credit_it_was_not_given_is_cut_off() -> None:
    pair = connected(MemoryLogStore(), MemoryLogStore(), config_b=EndpointConfig(initial_credit=1))
    pair.b.receive_data(frame(Channel.CONTROL, proposal(0)))
    expect_drop(
        pair.b,
        frame(Channel.CONTROL, proposal(2, start=10, end=11, upper_certpool=11)),
        CreditViolation,
    )


CONTROL_VIOLATIONS: list[tuple[str, list[object], type[RemoteProtocolError]]] = [
    ("credit above 2^64-1", [GrantCredit((1 << 64) - 1)], CreditViolation),
    ("proactive side uses an odd id", [proposal(1)], RequestIdViolation),
    (
        "id still in use",
        [proposal(0), proposal(0, start=9, end=9, upper_certpool=9)],
        RequestIdViolation,
    ),
    ("adjust an inactive request", [Adjust(4, eagerness=ALL)], UnknownRequest),
    ("cancel an inactive request", [Cancel(4, CancelReason.DO_NOT_RETRY)], UnknownRequest),
    (
        "cancel after cancelling",
        [proposal(0), Cancel(0, CancelReason.DO_NOT_RETRY), Cancel(0, CancelReason.DO_NOT_RETRY)],
        AdjustmentViolation,
    ),
    (
        "adjust after cancelling",
        [proposal(0), Cancel(0, CancelReason.DO_NOT_RETRY), Adjust(0, min_payload=3)],
        AdjustmentViolation,
    ),
    ("proposed end below start", [proposal(0, start=5, end=4, upper_certpool=4)], RangeViolation),
    ("proposed upper below end", [proposal(0, upper_certpool=4)], RangeViolation),
    (
        "lower certpool above start",
        [proposal(0, start=3, lower_certpool=4, expected_hash=b"\x00\x20" + bytes(32))],
        RangeViolation,
    ),
    ("start 0", [proposal(0, start=0)], RangeViolation),
    (
        "lower certpool 0",
        [proposal(0, lower_certpool=0, expected_hash=b"\x00\x20" + bytes(32))],
        RangeViolation,
    ),
    ("adjusted end below start", [proposal(0, start=3), Adjust(0, end=2)], RangeViolation),
    (
        "adjusted upper below end",
        [proposal(0, end=None, upper_certpool=None), Adjust(0, end=4, upper_certpool=3)],
        RangeViolation,
    ),
    (
        "adjusted upper certpool 0",
        [proposal(0, end=None, upper_certpool=None), Adjust(0, upper_certpool=0)],
        RangeViolation,
    ),
    (
        "minimum payload size down",
        [proposal(0, min_payload=10), Adjust(0, min_payload=9)],
        AdjustmentViolation,
    ),
    ("maximum payload size up", [proposal(0), Adjust(0, max_payload=1001)], AdjustmentViolation),
]


@pytest.mark.parametrize(("name", "messages", "error"), CONTROL_VIOLATIONS)
def test_control_invariant_violations_drop_the_connection(
    name: str, messages: list[object], error: type[RemoteProtocolError]
) -> None:
    pair = connected(make_log(5), MemoryLogStore())
    *prefix, last = messages
    for message in prefix:
        pair.b.receive_data(frame(Channel.CONTROL, message))
    expect_drop(pair.b, frame(Channel.CONTROL, last), error)


def test_unused_first_bytes_drop_the_connection() -> None:
    pair = connected(MemoryLogStore(), MemoryLogStore())
    expect_drop(pair.b, encode_frame(Channel.CONTROL, b"\x88\x00"), MalformedMessage)
    pair = connected(MemoryLogStore(), MemoryLogStore())
    expect_drop(pair.b, encode_frame(Channel.DATA, b"\x01"), MalformedMessage)


def test_confirmation_without_eagerness_drops_the_connection() -> None:
    pair = connected(MemoryLogStore(), make_log(5))
    request = pair.b.propose(LOG, 1, end=5)
    pair.b.data_to_send()
    expect_drop(pair.b, frame(Channel.CONTROL, Adjust(request, min_payload=1)), AdjustmentViolation)


SOURCE = make_log(5)


def meta(seq: int, *, backlink: bool = False, corrupt: bool = False) -> Metadata:
    entry = SOURCE.entry(LOG, seq)
    assert entry is not None
    signature = entry.signature if not corrupt else bytes(64)
    return Metadata(
        0, entry.backlink if backlink else None, entry.payload_size, entry.payload_hash, signature
    )


def payload(seq: int) -> bytes:
    data = SOURCE.payload(LOG, seq)
    assert data is not None
    return data


def data_scenario(greedy: bool = False, **propose: object) -> tuple[Endpoint, int]:
    """b proposes 1..5 of LOG to a, which has nothing and is confirmed; the test plays a."""
    config_a = EndpointConfig(send_greedy=greedy)
    config_b = EndpointConfig(receive_greedy=greedy)
    pair = connected(MemoryLogStore(), MemoryLogStore(), config_a=config_a, config_b=config_b)
    request = pair.b.propose(LOG, 1, end=5, **propose)  # type: ignore[arg-type]
    pair.run()
    assert pair.error is None and pair.b.request_state(request)["confirmed"]
    return pair.b, request


DATA_VIOLATIONS: list[tuple[str, dict[str, object], list[object], type[RemoteProtocolError]]] = [
    ("data before a switch", {}, [Notify(1)], DataOrderViolation),
    ("switch to an inactive request", {}, [SwitchRequest(7)], UnknownRequest),
    ("cancellation marker for an inactive request", {}, [CancelMarker(7)], UnknownRequest),
    ("data after the cancellation marker", {}, ["switch", "marker", Notify(1)], DataOrderViolation),
    ("payload where metadata is due", {}, ["switch", PayloadChunk(b"x")], DataOrderViolation),
    ("metadata where the payload is due", {}, ["switch", meta(1), meta(2)], DataOrderViolation),
    (
        "compressed payload with window 0",
        {},
        ["switch", meta(1), CompressedPayload(3, b"ab")],
        CompressionViolation,
    ),
    ("notify past the end", {"eagerness": NOTIFY}, ["switch", Notify(11)], RangeViolation),
    (
        "payload longer than the metadata says",
        {},
        ["switch", meta(1), PayloadChunk(payload(1) + b"!")],
        PayloadSizeViolation,
    ),
    (
        "payload outside the asked sizes",
        {"max_payload": 5},
        ["switch", meta(1), PayloadChunk(payload(1))],
        PayloadSizeViolation,
    ),
    (
        "data where notifications were asked for",
        {"eagerness": NOTIFY},
        ["switch", meta(1)],
        EagernessViolation,
    ),
    ("notify where data was asked for", {}, ["switch", Notify(1)], EagernessViolation),
    (
        "payload where only its notification was asked for",
        {"eagerness": Eagerness(EagerMode.UP_TO, 4)},
        ["switch", meta(1), PayloadChunk(payload(1))],
        EagernessViolation,
    ),
    ("skip as too small, but it is not", {}, ["switch", meta(1), SkipTooSmall()], SkipViolation),
    ("skip as too large, but it is not", {}, ["switch", meta(1), SkipTooLarge()], SkipViolation),
    (
        "skip a mandatory payload",
        {"mandatory": True},
        ["switch", meta(1), SkipUnavailable()],
        SkipViolation,
    ),
    ("apology for valid metadata", {}, ["switch", meta(1), Apology()], ApologyViolation),
    (
        "skip payload bytes we did not transmit",
        {},
        ["switch", meta(1), SkipBytes(2)],
        SkipViolation,
    ),
    ("apology for nothing", {}, ["switch", Apology()], ApologyViolation),
    ("invalid metadata in safe mode", {}, ["switch", meta(1, corrupt=True)], InvalidData),
    (
        "invalid payload in safe mode",
        {},
        ["switch", meta(1), PayloadChunk(b"x" * len(payload(1)))],
        InvalidData,
    ),
]


@pytest.mark.parametrize(("name", "propose", "messages", "error"), DATA_VIOLATIONS)
def test_data_invariant_violations_drop_the_connection(
    name: str, propose: dict[str, object], messages: list[object], error: type[RemoteProtocolError]
) -> None:
    b, request = data_scenario(**propose)
    resolved = [
        SwitchRequest(request) if m == "switch" else CancelMarker(request) if m == "marker" else m
        for m in messages
    ]
    *prefix, last = resolved
    for message in prefix:
        b.receive_data(frame(Channel.DATA, message))
    expect_drop(b, frame(Channel.DATA, last), error)


def test_greedy_invalid_data_is_apologised_for_then_resent() -> None:
    b, request = data_scenario(greedy=True)
    assert b.params is not None and b.params.receive_greedy
    b.receive_data(frame(Channel.DATA, SwitchRequest(request), meta(1, corrupt=True), Apology()))
    b.receive_data(frame(Channel.DATA, meta(1), PayloadChunk(payload(1)[:3]), Apology()))
    b.receive_data(frame(Channel.DATA, PayloadChunk(payload(1))))
    store = b.store
    assert isinstance(store, MemoryLogStore)
    assert store.sequence_numbers(LOG) == [1] and store.payload_sequence_numbers(LOG) == [1]
    received = [e for e in iter(b.next_event, None) if isinstance(e, EntryReceived)]
    assert len(received) == 1
    # A second apology for the same (now valid) piece, or no apology at all, drops.
    expect_drop(b, frame(Channel.DATA, Apology()), ApologyViolation)
    b, request = data_scenario(greedy=True)
    b.receive_data(frame(Channel.DATA, SwitchRequest(request), meta(1, corrupt=True)))
    expect_drop(b, frame(Channel.DATA, Notify(1)), ApologyViolation)


def test_metadata_backlink_travels_only_when_its_target_is_not_in_the_request() -> None:
    b, request = data_scenario()
    # Piece 0 is entry 1: no links at all; entries 2..5 follow their predecessor.
    b.receive_data(frame(Channel.DATA, SwitchRequest(request), meta(1), PayloadChunk(payload(1))))
    b.receive_data(
        frame(Channel.DATA, meta(2), PayloadChunk(payload(2)), meta(3), PayloadChunk(payload(3)))
    )
    store = b.store
    assert isinstance(store, MemoryLogStore)
    assert store.sequence_numbers(LOG) == [1, 2, 3]


def test_setup_negotiates_modes_and_survives_byte_by_byte_delivery() -> None:
    server, phone = make_log(8), MemoryLogStore()
    a = Endpoint(Role.PROACTIVE, server, EndpointConfig(send_greedy=True))
    b = Endpoint(Role.REACTIVE, phone, EndpointConfig(receive_greedy=True, send_greedy=True))
    for byte in a.data_to_send():
        b.receive_data(bytes((byte,)))
    a.receive_data(b.data_to_send())
    assert a.params is not None and b.params is not None
    assert (a.params.send_greedy, a.params.receive_greedy) == (True, False)
    assert (b.params.send_greedy, b.params.receive_greedy) == (False, True)
    assert a.params.compression_window == b.params.decompression_window == 0
    b.propose(LOG, 1, end=8)
    for _ in range(6):
        for byte in b.data_to_send():
            a.receive_data(bytes((byte,)))
        for byte in a.data_to_send():
            b.receive_data(bytes((byte,)))
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 9))
    assert a.request_ids() == b.request_ids() == []


def test_data_for_a_proposal_that_lost_an_overlap_drops_the_connection() -> None:
    """The peer switches to our unconfirmed proposal, then wins an overlap with it (ours
    counts as never sent): its next data names no request, a protocol violation."""
    pair = connected(make_log(10), MemoryLogStore())
    ours = pair.a.propose(LOG, 5, end=10)  # proactive, unconfirmed
    pair.a.receive_data(frame(Channel.DATA, SwitchRequest(ours)))
    pair.a.receive_data(frame(Channel.CONTROL, proposal(ours + 1, start=1, end=5)))
    assert ours not in pair.a.request_ids()
    expect_drop(pair.a, frame(Channel.DATA, Notify(1)), DataOrderViolation)
