"""Proposals that start inside a payload (an offset) or move payloads only, between two
endpoints in memory: both sides, a large payload cut mid-way and resumed at its offset,
the expected starting hash of an offset proposal, and the violations that drop the
connection (spec, proposal flags 5 and 6; docs/bamboo-p2p.md, decision 15)."""

from __future__ import annotations

import random
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    ALL,
    NOTIFY,
    Adjust,
    Cancel,
    CancelReason,
    Channel,
    DataOrderViolation,
    EagernessViolation,
    EndpointConfig,
    LocalProtocolError,
    MemoryLogStore,
    Metadata,
    Notify,
    PayloadChunk,
    PayloadSizeViolation,
    Propose,
    RangeViolation,
    RequestCancelled,
    StartingHashMismatch,
    SwitchRequest,
    encode_control,
    encode_data,
    encode_frame,
    resume_offset,
    shortest_path,
)
from sdk.sync.bamboo_p2p.codec import decode_control
from sdk.sync.bamboo_p2p.endpoint import Endpoint
from sdk.sync.bamboo_p2p.framing import ChannelFrameDecoder
from sdk.sync.bamboo_p2p.pair import EndpointPair
from sdk.sync.bamboo_p2p.sqlite_store import SqliteLogStore

KEY = KeyPair.from_private_key(bytes(range(32)))
LOG = (KEY.public_key, 0)


def make_log(n: int, size: int = 12, big: dict[int, int] | None = None) -> MemoryLogStore:
    store = MemoryLogStore()
    for i in range(1, n + 1):
        length = (big or {}).get(i, size)
        store.append(KEY, 0, bytes((i * 7 + j) % 251 for j in range(length)))
    return store


def metadata_only(source: MemoryLogStore, seqs: list[int]) -> MemoryLogStore:
    store = MemoryLogStore()
    for seq in seqs:
        entry = source.entry(LOG, seq)
        assert entry is not None
        store.put_entry(entry)
    return store


def connected(a: MemoryLogStore, b: MemoryLogStore, **kw: EndpointConfig) -> EndpointPair:
    pair = EndpointPair.create(a, b, kw.get("config_a"), kw.get("config_b"))
    pair.exchange()
    return pair


def reasons(events: list[object]) -> list[CancelReason]:
    return [e.reason for e in events if isinstance(e, RequestCancelled)]


# ------------------------------------------------------------- payload only


def test_payload_only_moves_the_payloads_of_entries_the_proposer_holds() -> None:
    server = make_log(20)
    phone = metadata_only(server, list(range(1, 21)))  # e.g. after a NOTIFY-payload sync
    pair = connected(server, phone)
    pair.b.propose(LOG, 1, end=20, payload_only=True)
    pair.run()
    assert pair.error is None
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 21))
    for seq in range(1, 21):
        assert phone.payload(LOG, seq) == server.payload(LOG, seq)
    assert pair.a.request_ids() == pair.b.request_ids() == []
    assert reasons(pair.b_events) in ([CancelReason.END_OF_RANGE], [CancelReason.CONFIRM])
    # No metadata travelled: both directions together stay far below one entry each.
    assert pair.a.stats.entries_sent == 0 and pair.b.stats.entries_sent == 0


def test_sparse_payload_only_moves_the_payloads_of_the_link_path() -> None:
    server = make_log(100)
    path = shortest_path(100, 1)
    phone = metadata_only(server, path)
    pair = connected(server, phone)
    pair.b.propose(LOG, 1, end=100, sparse=True, payload_only=True)
    pair.run()
    assert pair.error is None
    assert phone.payload_sequence_numbers(LOG) == path


def test_payload_only_both_ways_and_a_non_proposer_lacking_entries_asks_notify() -> None:
    full = make_log(10)
    a = MemoryLogStore()
    a.copy_entries(full, LOG, list(range(1, 11)))
    for seq in range(6, 11):
        a._logs[LOG].payloads.pop(seq)  # a: every entry, payloads of 1..5 only
    b = metadata_only(full, list(range(1, 11)))
    for seq in range(6, 11):
        payload = full.payload(LOG, seq)
        assert payload is not None
        b.put_payload(LOG, seq, payload)  # b: every entry, payloads of 6..10 only
    pair = connected(a, b)
    pair.a.propose(LOG, 1, end=10, payload_only=True)
    pair.run()
    assert pair.error is None
    assert a.payload_sequence_numbers(LOG) == b.payload_sequence_numbers(LOG) == list(range(1, 11))
    # A non-proposer without the entries cannot follow payload bytes: it asks NOTIFY,
    # sends what it has, and receives nothing.
    c = metadata_only(full, [1, 2, 3])
    pair = connected(make_log(10), c)
    source = pair.a
    request = source.propose(LOG, 1, end=10, payload_only=True)
    pair.run()
    assert pair.error is None and source.request_ids() == []
    assert c.payload_sequence_numbers(LOG) == []
    assert request not in pair.b.request_ids()


def test_payload_only_proposal_checks_locally() -> None:
    pair = connected(make_log(5), MemoryLogStore())
    with pytest.raises(LocalProtocolError, match="end"):
        pair.b.propose(LOG, 1, payload_only=True)
    with pytest.raises(LocalProtocolError, match="entries"):
        pair.b.propose(LOG, 1, end=5, payload_only=True)
    request = pair.b.propose(LOG, 1, end=5, payload_only=True, eagerness=NOTIFY)  # needs none
    with pytest.raises(LocalProtocolError, match="entries"):
        pair.b.adjust(request, eagerness=ALL)  # payload bytes it could not frame


# ------------------------------------------------------------------- offset


def test_offset_range_sends_the_rest_of_the_start_payload_then_the_range() -> None:
    server = make_log(6, big={3: 5000})
    phone = MemoryLogStore()
    phone.copy_entries(server, LOG, [1, 2])
    entry3 = server.entry(LOG, 3)
    full3 = server.payload(LOG, 3)
    assert entry3 is not None and full3 is not None
    phone.put_entry(entry3)
    phone.put_partial_payload(LOG, 3, full3[:4000])
    pair = connected(server, phone)
    pair.b.propose(LOG, 3, end=6, offset=4000)
    pair.run()
    assert pair.error is None
    assert phone.payload(LOG, 3) == full3
    assert phone.partial_payload(LOG, 3) is None
    assert phone.sequence_numbers(LOG) == list(range(1, 7))
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 7))
    # Only the last 1000 bytes of payload 3 travelled (plus three small entries).
    assert pair.a.stats.data_bytes_sent < 1000 + 3 * 200


def test_offset_in_a_payload_only_range_and_at_the_payload_end() -> None:
    server = make_log(4, big={2: 300})
    phone = metadata_only(server, [1, 2, 3, 4])
    full2 = server.payload(LOG, 2)
    assert full2 is not None
    phone.put_partial_payload(LOG, 2, full2[:100])
    pair = connected(server, phone)
    pair.b.propose(LOG, 2, end=4, offset=100, payload_only=True)
    pair.run()
    assert pair.error is None
    assert phone.payload_sequence_numbers(LOG) == [2, 3, 4]
    # An offset at the very end moves no bytes of that payload, and nothing is kept.
    server2 = make_log(3)
    phone2 = metadata_only(server2, [1, 2, 3])
    pair = connected(server2, phone2)
    pair.b.propose(LOG, 2, end=3, offset=12)
    pair.run()
    assert pair.error is None and phone2.payload_sequence_numbers(LOG) == [3]


def test_offset_without_a_kept_prefix_is_followed_but_not_kept() -> None:
    server = make_log(3, big={2: 400})
    phone = metadata_only(server, [1, 2])
    pair = connected(server, phone)
    pair.b.propose(LOG, 2, end=3, offset=100)
    pair.run()
    assert pair.error is None
    assert phone.payload_sequence_numbers(LOG) == [3]  # payload 2 could not be checked


def test_the_side_holding_the_payload_sends_from_the_offset_either_way() -> None:
    """The proposer holds the payload, the other side the entry and the prefix."""
    holder = make_log(3, big={3: 900})
    other = MemoryLogStore()
    other.copy_entries(holder, LOG, [1, 2])
    entry3, full3 = holder.entry(LOG, 3), holder.payload(LOG, 3)
    assert entry3 is not None and full3 is not None
    other.put_entry(entry3)
    other.put_partial_payload(LOG, 3, full3[:450])
    pair = connected(other, holder)
    pair.b.propose(LOG, 3, end=3, offset=450)
    pair.run()
    assert pair.error is None
    assert other.payload(LOG, 3) == full3


def test_a_large_payload_cut_mid_way_is_resumed_at_its_offset() -> None:
    size = 2_500_000  # three frames of at most 1 MiB
    server = make_log(3, big={2: size})
    full = server.payload(LOG, 2)
    assert full is not None
    phone = SqliteLogStore()
    config = EndpointConfig(max_payload=4 * 1024 * 1024)
    pair = EndpointPair.create(server, phone, None, config)
    pair.exchange()
    request = pair.b.propose(LOG, 1, end=3)
    pair.exchange()  # the proposal goes out, the server confirms and starts sending
    pair.b_to_a += pair.b.data_to_send()
    pair._deliver(False, None)
    # One write's worth (a payload goes out over several, each up to the limit): the
    # phone is inside payload 2 when the connection is cut.
    pair.a_to_b += pair.a.data_to_send(limit=1 << 20)
    assert pair.a.progress(request) is not None and pair.a.progress(request)[3] > 0
    pair._deliver(True, None)
    progress = pair.b.progress(request)
    assert progress is not None and progress[2] > 0
    received = progress[2]
    pair.b.connection_lost()  # the connection is cut here
    phone.flush()
    kept = phone.partial_payload(LOG, 2)
    assert kept is not None and len(kept) == received and full.startswith(kept)
    assert phone.payload_sequence_numbers(LOG) == [1]
    # A new connection resumes at the offset: only the rest of payload 2 travels.
    pair = EndpointPair.create(server, phone, None, config)
    pair.exchange()
    pair.b.propose(LOG, 2, end=3, offset=len(kept))
    pair.run()
    assert pair.error is None
    assert phone.payload(LOG, 2) == full
    assert phone.partial_payload(LOG, 2) is None
    assert phone.payload_sequence_numbers(LOG) == [1, 2, 3]
    assert pair.a.stats.data_bytes_sent < size - len(kept) + 4096


def test_a_wrong_kept_prefix_is_forgotten_without_blaming_the_peer() -> None:
    server = make_log(2, big={2: 300})
    phone = metadata_only(server, [1, 2])
    phone.put_partial_payload(LOG, 2, b"\xff" * 100)
    pair = connected(server, phone)
    pair.b.propose(LOG, 2, end=2, offset=100)
    pair.run()
    assert pair.error is None
    assert phone.payload(LOG, 2) is None and phone.partial_payload(LOG, 2) is None


def test_offset_expected_starting_hash_mismatch_is_133() -> None:
    # A fork by the one author: two different entries 2.
    a, b = MemoryLogStore(), MemoryLogStore()
    a.append(KEY, 0, b"one")
    b.append(KEY, 0, b"one")
    a.append(KEY, 0, b"two")
    b.append(KEY, 0, b"deux")
    pair = connected(a, b)
    pair.b.propose(LOG, 2, end=2, offset=1)
    pair.run()
    assert pair.error is None
    mismatch = [e for e in pair.b_events if isinstance(e, StartingHashMismatch)]
    assert mismatch and mismatch[0].entry.hash == a.entry(LOG, 2).hash  # type: ignore[union-attr]
    assert reasons(pair.b_events) == [CancelReason.HASH_MISMATCH]


def control_out(endpoint: Endpoint) -> list[object]:
    """The control messages ``endpoint`` sends next (its setup went out already)."""
    messages: list[object] = []
    for channel, body in ChannelFrameDecoder().feed(endpoint.data_to_send()):
        pos = 0
        while channel is Channel.CONTROL and pos < len(body):
            message, pos = decode_control(body, pos)
            messages.append(message)
    return messages


def test_offset_end_of_log_or_fork_prior_to_the_start_is_134_or_135() -> None:
    a = make_log(3)
    a.append(KEY, 0, b"the end", end_of_log=True)
    pair = connected(a, MemoryLogStore())
    pair.a.data_to_send()
    past_the_end = proposal(1, start=6, end=6, upper_certpool=6, lower_certpool=None, offset=0)
    past_the_end = Propose(**{**_fields(past_the_end), "expected_hash": HASH})
    pair.a.receive_data(encode_frame(Channel.CONTROL, encode_control(past_the_end)))
    cancels = [m for m in control_out(pair.a) if isinstance(m, Cancel)]
    assert [(c.reason, c.seq_num) for c in cancels] == [(CancelReason.END_OF_LOG, 4)]
    forked = make_log(5)
    entry2 = forked.entry(LOG, 2)
    assert entry2 is not None
    forked.record_fork(LOG, (entry2, entry2))  # only its place (below 6) matters here
    pair = connected(forked, MemoryLogStore())
    pair.a.data_to_send()
    pair.a.receive_data(encode_frame(Channel.CONTROL, encode_control(past_the_end)))
    cancels = [m for m in control_out(pair.a) if isinstance(m, Cancel)]
    assert [c.reason for c in cancels] == [CancelReason.FORKED]


def test_offset_proposal_checks_locally() -> None:
    pair = connected(make_log(5), make_log(3))
    with pytest.raises(LocalProtocolError, match="needs entry"):
        pair.b.propose(LOG, 4, end=5, offset=2)
    with pytest.raises(LocalProtocolError, match="outside"):
        pair.b.propose(LOG, 3, end=5, offset=13)
    with pytest.raises(LocalProtocolError, match="lower certpool"):
        pair.b.propose(LOG, 3, end=5, offset=2, lower=2)


# --------------------------------------------------------------- violations


def proposal(rid: int, **kw: object) -> Propose:
    fields: dict[str, object] = {
        "request_id": rid,
        "author": KEY.public_key,
        "log_id": 0,
        "start": 2,
        "lower_certpool": 1,
        "min_payload": 0,
        "max_payload": 1000,
        "expected_hash": None,
        "eagerness": ALL,
        "end": 3,
        "upper_certpool": 3,
    }
    fields.update(kw)
    return Propose(**fields)  # type: ignore[arg-type]


def expect_drop(endpoint: Endpoint, data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        endpoint.receive_data(data)
    assert isinstance(endpoint.error, error)
    assert endpoint.data_to_send() == b""


SOURCE = make_log(3)
HASH = b"\x00\x20" + bytes(32)


def _fields(p: Propose) -> dict[str, object]:
    return {name: getattr(p, name) for name in Propose.__dataclass_fields__}


def test_an_offset_past_the_payload_drops_the_connection() -> None:
    store = make_log(3)
    entry = store.entry(LOG, 2)
    assert entry is not None
    pair = connected(MemoryLogStore(), store)
    bad = proposal(0, lower_certpool=None, offset=13, expected_hash=entry.hash)
    expect_drop(pair.b, encode_frame(Channel.CONTROL, encode_control(bad)), RangeViolation)


def played(store: MemoryLogStore, **propose: object) -> tuple[Endpoint, int]:
    """b proposes to a (which holds nothing, so it waits for the mandatory payloads);
    the test then plays a with hand-written data."""
    pair = connected(MemoryLogStore(), store)
    request = pair.b.propose(LOG, 2, end=3, mandatory=True, **propose)  # type: ignore[arg-type]
    pair.run()
    assert pair.error is None and pair.b.request_state(request)["confirmed"]
    return pair.b, request


def data(*messages: object) -> bytes:
    return encode_frame(Channel.DATA, b"".join(encode_data(m) for m in messages))  # type: ignore[arg-type]


def entry_meta(seq: int) -> Metadata:
    entry = SOURCE.entry(LOG, seq)
    assert entry is not None
    return Metadata(0, None, entry.payload_size, entry.payload_hash, entry.signature)


def test_metadata_in_a_payload_only_range_drops_the_connection() -> None:
    b, request = played(metadata_only(SOURCE, [1, 2, 3]), payload_only=True)
    expect_drop(b, data(SwitchRequest(request), entry_meta(2)), DataOrderViolation)


def test_bytes_past_the_payload_from_the_offset_drop_the_connection() -> None:
    b, request = played(metadata_only(SOURCE, [1, 2, 3]), offset=5)
    expect_drop(b, data(SwitchRequest(request), PayloadChunk(bytes(8))), PayloadSizeViolation)


def test_notifying_payloads_that_were_asked_for_drops_the_connection() -> None:
    b, request = played(metadata_only(SOURCE, [1, 2, 3]), payload_only=True)
    expect_drop(b, data(SwitchRequest(request), Notify(2)), EagernessViolation)


def test_payload_bytes_to_a_side_that_asked_notify_drop_the_connection() -> None:
    """A non-proposer lacking the entries confirms with NOTIFY; bytes are a violation."""
    pair = connected(metadata_only(SOURCE, [1]), MemoryLogStore())
    pair.b.receive_data(
        encode_frame(Channel.CONTROL, encode_control(proposal(0, payload_only=True)))
    )
    confirmations = [m for m in control_out(pair.b) if isinstance(m, Adjust)]
    assert [c.eagerness for c in confirmations] == [NOTIFY]
    payload = SOURCE.payload(LOG, 2)
    assert payload is not None
    expect_drop(pair.b, data(SwitchRequest(0), PayloadChunk(payload)), EagernessViolation)


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=100, deadline=None)
def test_any_cut_then_resume_delivers_the_payload(seed: int) -> None:
    """A transfer cut after random deliveries is resumed at the kept prefix, with random
    chunk sizes, compression windows and greedy modes; the payload arrives intact.

    Frames are made small (a receiver only reads whole frames, so with 1 MiB frames a
    cut inside these payloads would keep nothing)."""
    with patch("sdk.sync.bamboo_p2p.machine.MAX_FRAME_SIZE", 300):
        cut_and_resume(random.Random(seed))


def cut_and_resume(rng: random.Random) -> None:
    size = rng.randint(1, 6000)
    server = make_log(3, big={2: size})
    full = server.payload(LOG, 2)
    assert full is not None
    phone = MemoryLogStore()

    def configs() -> tuple[EndpointConfig, EndpointConfig]:
        window = rng.choice((0, 64, 4096))
        greedy = rng.random() < 0.5
        return (
            EndpointConfig(chunk_size=rng.choice((7, 100, 1000)), compression_window=window),
            EndpointConfig(compression_window=window, receive_greedy=greedy),
        )

    pair = EndpointPair.create(server, phone, *configs())
    pair.exchange()
    pair.b.propose(LOG, 1, end=3)
    for _ in range(rng.randint(1, 40)):
        pair.step_random(rng)
    assert pair.error is None
    pair.b.connection_lost()
    for _ in range(3):  # resume as often as it takes (each may be cut again)
        if phone.payload(LOG, 2) is not None:
            break
        offset = resume_offset(phone, LOG, 2)
        if phone.entry(LOG, 2) is None:
            break
        pair = EndpointPair.create(server, phone, *configs())
        pair.exchange()
        pair.b.propose(LOG, 2, end=3, offset=offset)
        if rng.random() < 0.5:
            pair.run()
        else:
            for _ in range(rng.randint(1, 40)):
                pair.step_random(rng)
            pair.b.connection_lost()
        assert pair.error is None
    kept = phone.partial_payload(LOG, 2)
    assert kept is None or full.startswith(kept)
    stored = phone.payload(LOG, 2)
    assert stored is None or stored == full
