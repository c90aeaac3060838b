"""Unit tests of the core's small modules: Lamport clock, local log, buffers, SDS-R."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from sdk.sds import (
    COMPACT,
    WAKU,
    ChannelConfig,
    Message,
    MessageChannel,
    Participant,
    RepairConfig,
)
from sdk.sds.bloom import BloomFilter, RollingBloomFilter
from sdk.sds.incoming import IncomingBuffer, PendingMessage
from sdk.sds.lamport import UINT64_MAX, LamportClock
from sdk.sds.local_log import LocalLog
from sdk.sds.message import decode_message
from sdk.sds.message_id import compute_message_id
from sdk.sds.outgoing import OutgoingBuffer, OutgoingEntry, OutgoingState
from sdk.sds.repair import RepairState, in_response_group, repair_hash, request_time, response_time
from tests.conftest import REPO


def test_lamport_clock() -> None:
    c = LamportClock(1_000)
    assert c.tick(500) == 1_001  # clock ahead of wall time: +1
    assert c.tick(5_000) == 5_000  # wall time ahead: jump to now
    c.observe(4_000)
    assert c.value == 5_000
    c.observe(9_000)
    assert c.value == 9_000
    c.value = UINT64_MAX
    assert c.tick(0) == UINT64_MAX  # saturates at uint64 rather than overflow


def test_local_log_orders_by_lamport_then_id() -> None:
    log = LocalLog(with_sender=False)
    log.add("b", 2, "x")
    log.add("c", 1, "x")
    log.add("a", 2, "x")
    log.add("a", 2, "x")  # idempotent
    assert log.ids() == ["c", "a", "b"]
    assert "a" in log and "z" not in log and len(log) == 3


def test_local_log_causal_history_prefers_unreferenced_heads() -> None:
    log = LocalLog(with_sender=True)
    rng = random.Random(0)
    for i in range(10):
        log.add(f"m{i}", i, "s")
    log.mark_referenced(f"m{i}" for i in range(1, 10))
    history = log.causal_history(2, rng)
    # m0 was never referenced: it goes first, then the most recent.
    assert [e.message_id for e in history] == ["m0", "m9"]
    assert history[0].sender_id == "s"
    assert log.heads() == ["m0"]


def test_local_log_reference_before_logging() -> None:
    log = LocalLog(with_sender=False)
    log.mark_referenced(["late"])
    log.add("late", 1, "s")
    assert log.heads() == []


def test_local_log_all_logged_references_clear_heads_only() -> None:
    log = LocalLog(with_sender=False)
    for i in (3, 1, 2):  # inserted out of order: the id list follows the log order
        log.add(f"m{i}", i, "s")
    log.mark_referenced(["m1", "m2"], all_logged=True)
    assert log.heads() == ["m3"] and log.referenced_unlogged() == []
    log.mark_referenced(["m3"], all_logged=True)
    log.mark_referenced(["m1"], all_logged=True)  # no heads left: nothing happens
    assert log.heads() == [] and log.referenced_unlogged() == []
    entries, ids, _ = log.causal_history_encoded(3, random.Random(0))
    assert ids == [e.message_id for e in entries] == ["m1", "m2", "m3"]


def test_send_references_the_heads_it_names() -> None:
    # send() marks its causal history referenced as known-logged ids: the heads it
    # names stop being heads, and nothing is remembered as referenced-before-logged.
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, causal_history_size=2)
    a = MessageChannel("c", "alice", 0, cfg, rng=random.Random(1))
    b = MessageChannel("c", "bob", 0, cfg, rng=random.Random(2))
    for i in range(3):
        b.send(b"from bob %d" % i, 1 + i)
    for dg in b.datagrams_to_send():
        a.receive(dg.data, 10)
    assert len(a.log.heads()) == 1  # bob's messages reference each other but the last
    a.send(b"from alice", 11)
    assert a.log.heads() == [a.log.ids()[-1]]  # only alice's own message
    assert a.log.referenced_unlogged() == []


def test_local_log_retrieval_hint() -> None:
    log = LocalLog(with_sender=False)
    log.add("m", 1, "s")
    assert log.set_retrieval_hint("m", b"h")
    assert not log.set_retrieval_hint("unknown", b"h")
    assert log.causal_history(1, random.Random(0))[0].retrieval_hint == b"h"


def _pending(mid: str, *deps: str) -> PendingMessage:
    return PendingMessage(Message("s", mid, "c", 1, content=b"x"), b"", None, 0, set(deps))


def test_incoming_buffer_resolves_by_dependency_index() -> None:
    buf = IncomingBuffer()
    buf.add(_pending("x", "a", "b"))
    buf.add(_pending("y", "a"))
    assert buf.is_awaited("a") and len(buf) == 2
    ready = buf.resolve("a")
    assert [p.message.message_id for p in ready] == ["y"]
    assert buf.resolve("unrelated") == []
    assert [p.message.message_id for p in buf.resolve("b")] == ["x"]
    assert len(buf) == 0


def test_outgoing_buffer_states() -> None:
    buf = OutgoingBuffer(target=1e-4, profile=COMPACT)
    positions = COMPACT.positions("m")
    buf.add(OutgoingEntry("m", b"", positions, next_resend_at=10))
    buf.add(OutgoingEntry("n", b"", COMPACT.positions("n"), next_resend_at=20))
    assert [e.message_id for e in buf.due(15)] == ["m"]
    filt = bytearray(b"\x55" * COMPACT.size_bytes)  # half full: a hit is false ~1 % of the time
    for index, mask in COMPACT.positions("n"):
        filt[index] &= ~mask  # "n" is not in it
    for index, mask in positions:
        filt[index] |= mask
    acked, possibly = buf.review_filter(bytes(filt), "peer1")
    assert acked == [] and possibly == [("m", 1)]
    assert buf.get("m") is not None and buf.get("m").state is OutgoingState.POSSIBLY_ACKNOWLEDGED  # type: ignore[union-attr]
    assert buf.review_filter(bytes(filt), "peer1") == ([], [])  # same peer: no new evidence
    acked, _ = buf.review_filter(bytes(filt), "peer2")
    assert acked == ["m"] and "m" not in buf
    assert buf.acknowledge_history(["n", "zzz"]) == ["n"]
    assert len(buf) == 0


def test_repair_hash_and_times() -> None:
    cfg = RepairConfig(t_min_ms=30_000, t_max_ms=120_000)
    # hash(a, b) is the hash of the concatenation, as @waku/sds computes it.
    assert repair_hash("ab", "c") == repair_hash("a", "bc") == repair_hash("abc")
    t = request_time(cfg, "me", "m1", 1_000)
    assert 1_000 + 30_000 <= t < 1_000 + 120_000
    assert response_time(cfg, "orig", "orig", "m1", 5) == 5  # the original sender answers first
    assert 5 <= response_time(cfg, "other", "orig", "m1", 5) < 5 + 120_000
    one = RepairConfig(num_response_groups=1)
    assert in_response_group(one, "x", "y", "m")
    many = RepairConfig(num_response_groups=4)
    assert in_response_group(many, "y", "y", "m")  # always in one's own group
    members = sum(in_response_group(many, f"p{i}", "y", "m") for i in range(400))
    assert 50 < members < 150  # about a quarter


def test_repair_state_requests_and_cancellation() -> None:
    cfg = RepairConfig(t_min_ms=10, t_max_ms=20, max_requests_per_message=1)
    st = RepairState(cfg, "me")
    from sdk.sds.message import HistoryEntry

    st.on_missing(HistoryEntry("a", None, "s"), 0)
    st.on_missing(HistoryEntry("b", None, "s"), 0)
    assert not st.has_eligible_requests(9)
    assert st.has_eligible_requests(20)
    taken = st.take_requests(20)
    assert len(taken) == 1  # capped per message
    st.on_message_seen("a")
    st.on_message_seen("b")
    assert not st.pending
    st.cache("m", "s", b"data")
    st.on_repair_request(HistoryEntry("m", None, "s"), 100)
    assert st.due_responses(100 + 20) == [b"data"]
    assert st.due_responses(1_000) == []


def _filter_of(*ids: str) -> bytes:
    f = BloomFilter(WAKU)
    for mid in ids:
        f.insert(mid)
    return f.to_bytes()


def test_repair_cache_keeps_what_a_peer_has_not_delivered_beyond_its_size() -> None:
    # Issue 20 item 3: a peer cut off while more than cache_size messages pass
    # must still find them here, however young or old, until the age cap.
    cfg = RepairConfig(cache_size=2, cache_retention_ms=10_000, cache_max_bytes=1_000)
    st = RepairState(cfg, "me", WAKU)
    st.on_peer_filter("a", _filter_of(), 0)  # peers known before the burst
    st.on_peer_filter("b", _filter_of(), 0)
    ids = [f"m{i}" for i in range(5)]
    for i, mid in enumerate(ids):
        st.cache(mid, "s", b"x" * 10, i)
    assert [mid for mid, _, _ in st.cached_items()] == ids  # nobody showed them yet
    st.on_peer_filter("b", _filter_of(*ids), 10)
    st.on_peer_filter("a", _filter_of("m0", "m1", "m3"), 10)  # a lacks m2
    assert st.delivery_marks() == {"a": 0, "b": 0}  # read at the sweep
    st.sweep(10)
    # m0 and m1 went everywhere and are dropped; from m2 on "a" may still ask.
    assert [mid for mid, _, _ in st.cached_items()] == ["m2", "m3", "m4"]
    assert st.delivery_marks() == {"a": 0, "b": 3}
    st.cache("m5", "s", b"x" * 10, 11)
    assert [mid for mid, _, _ in st.cached_items()] == ["m2", "m3", "m4", "m5"]
    st.on_peer_filter("a", _filter_of(*ids), 20)
    st.sweep(20)
    assert [mid for mid, _, _ in st.cached_items()] == ["m4", "m5"]


def test_repair_cache_age_and_byte_caps_hold_whoever_lacks_a_message() -> None:
    cfg = RepairConfig(cache_size=2, cache_retention_ms=1_000, cache_max_bytes=100)
    st = RepairState(cfg, "me", WAKU)
    st.on_peer_filter("a", _filter_of(), 0)  # "a" never shows anything again
    for i in range(5):
        st.cache(f"m{i}", "s", b"x" * 10, i)
    assert len(st.cached_items()) == 5
    st.cache("late", "s", b"x" * 10, 2_000)  # the burst is past the age cap
    assert [mid for mid, _, _ in st.cached_items()] == ["m4", "late"]
    st.cache("huge", "s", b"x" * 95, 2_001)  # the byte bound holds regardless
    assert [mid for mid, _, _ in st.cached_items()] == ["huge"]


def test_repair_cache_peers_that_came_later_or_went_silent_hold_nothing_back() -> None:
    cfg = RepairConfig(cache_size=2, cache_retention_ms=10_000)
    st = RepairState(cfg, "me", WAKU)
    st.on_peer_filter("a", _filter_of(), 0)
    for i in range(4):
        st.cache(f"m{i}", "s", b"x", i)
    assert len(st.cached_items()) == 4  # "a" has shown none of them
    st.on_peer_filter("newcomer", _filter_of(), 5)  # first heard after m0-m3
    assert st.delivery_marks()["newcomer"] == 4
    st.sweep(5_000)
    assert len(st.cached_items()) == 4
    st.on_peer_filter("newcomer", _filter_of(), 9_000)
    st.sweep(10_001)  # "a" silent for the whole retention
    assert "a" not in st.delivery_marks()
    assert [mid for mid, _, _ in st.cached_items()] == ["m2", "m3"]


def test_repair_cache_with_no_peer_known_keeps_cache_size() -> None:
    # A restore or a journal replay: no delivery marks, the count rule alone.
    st = RepairState(RepairConfig(cache_size=2), "me", WAKU)
    for i in range(5):
        st.cache(f"m{i}", "s", b"x", i)
    assert [mid for mid, _, _ in st.cached_items()] == ["m3", "m4"]


def test_repair_cache_a_peer_own_messages_and_saturated_filters() -> None:
    st = RepairState(RepairConfig(cache_size=0), "me", WAKU)
    st.on_peer_filter("a", _filter_of(), 0)
    st.cache("from-a", "a", b"x", 1)
    st.cache("from-s", "s", b"x", 2)
    assert len(st.cached_items()) == 2
    st.on_peer_filter("a", _filter_of(), 3)
    st.sweep(3)  # "a" has its own message, whatever its filter says
    assert [mid for mid, _, _ in st.cached_items()] == ["from-s"]
    full = bytes([0xFF]) * WAKU.size_bytes  # hits everything: proves nothing
    st.on_peer_filter("a", full, 4)
    st.sweep(4)
    assert [mid for mid, _, _ in st.cached_items()] == ["from-s"]
    st.on_peer_filter("a", _filter_of("from-s"), 5)
    st.sweep(5)
    assert st.cached_items() == []


def test_message_id_rule() -> None:
    a = compute_message_id("c", "alice", 1, b"x")
    assert len(a) == 64 and int(a, 16) >= 0
    assert a != compute_message_id("c", "bob", 1, b"x")
    assert a != compute_message_id("c", "alice", 2, b"x")
    assert a != compute_message_id("d", "alice", 1, b"x")
    # Length prefixes keep field boundaries: ("ab","c") differs from ("a","bc").
    assert compute_message_id("ab", "c", 1, b"") != compute_message_id("a", "bc", 1, b"")


def test_participant_routes_many_channels() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None)
    a = Participant("alice", config=cfg, rng=random.Random(1))
    b = Participant("bob", config=cfg, rng=random.Random(2))
    for p in (a, b):
        p.join("one", 0)
        p.join("two", 0)
    a.send("one", b"in one", 1)
    a.send("two", b"in two", 2)
    for dg in a.datagrams_to_send():
        b.receive(dg.data, 3)
    got = []
    while (e := b.next_event()) is not None:
        got.append((e.channel_id, getattr(e, "content", None)))
    assert got == [("one", b"in one"), ("two", b"in two")]
    b.receive(b"garbage", 4)
    assert b.rejected == 1
    assert a.get_timer() is not None  # outgoing buffers pending
    with pytest.raises(ValueError, match="join"):
        a.send("three", b"x", 5)


def test_importing_the_core_does_not_import_asyncio() -> None:
    code = "import sys, sdk.sds; sys.exit(1 if 'asyncio' in sys.modules else 0)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False)
    assert result.returncode == 0, "sdk.sds must stay free of asyncio"


def test_message_id_rule_is_pinned() -> None:
    # A receiver verifying ids depends on this exact layout (sdk/sds/message_id.py).
    assert (
        compute_message_id("room", "alice", 1_700_000_000_001, b"hello", ["m0", "m1"])
        == "6675e74cc0ef1c347fc38b0869305567ac085039ce99afcba38ff90892731d0f"
    )


def _message_id_by_the_rule(
    channel: str, sender: str, lamport: int, content: bytes, history: list[str]
) -> str:
    """The layout in sdk/sds/message_id.py's docstring, written out plainly."""
    import hashlib
    import struct

    def u32(n: int) -> bytes:
        return struct.pack(">I", n)

    data = b"chorus-sds-id/1\x00"
    data += u32(len(channel.encode())) + channel.encode()
    data += u32(len(sender.encode())) + sender.encode()
    data += struct.pack(">Q", lamport) + u32(len(history))
    data += b"".join(u32(len(mid.encode())) for mid in history)
    data += b"".join(mid.encode() for mid in history) + content
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "history",
    [
        [],
        ["a" * 64] * 200,  # the usual: ids all as long (hex digests)
        ["a" * 64, "b" * 63, "c" * 65],  # lengths differ, same total as three 64s
        ["x", "yy", "zzz"],
        ["é" * 32, "a" * 64],  # not ASCII: UTF-8 lengths, not character counts
        ["é" * 32] * 3,  # equal in characters and in bytes
        ["", "m"],
    ],
)
def test_message_id_matches_the_documented_layout(history: list[str]) -> None:
    for lamport in (0, 1_700_000_000_001, 2**64 - 1):
        assert compute_message_id(
            "room", "alicé", lamport, b"hello", history
        ) == _message_id_by_the_rule("room", "alicé", lamport, b"hello", history)


def test_local_log_encoded_history_is_the_encoding_of_the_history() -> None:
    # The log keeps each entry encoded; whichever way a history is chosen (the
    # newest entries, or heads), its bytes must be exactly its entries' encoding.
    from sdk.sds.message import history_field

    log = LocalLog(with_sender=True)
    for i in (5, 1, 9, 3, 7):  # out of order: entries are inserted, not appended
        log.add(f"m{i}", i, f"s{i}")
    log.set_retrieval_hint("m3", b"hint")
    log.mark_referenced(["m1", "m3", "m5", "m7", "m9"])
    log.add("m0", 0, "s0")  # an unreferenced head older than the newest entries
    for n, heads in ((3, None), (2, 1), (6, None), (0, 2)):
        rng = random.Random(n)
        entries, ids, encoded = log.causal_history_encoded(n, rng, heads=heads)
        assert entries == log.causal_history(n, random.Random(n), heads=heads)
        assert ids == [e.message_id for e in entries]
        assert encoded == b"".join(history_field(e) for e in entries)
    log.mark_referenced(["m0"])
    entries, ids, encoded = log.causal_history_encoded(3, random.Random(0))
    assert [e.message_id for e in entries] == ids == ["m5", "m7", "m9"]
    assert encoded == b"".join(history_field(e) for e in entries)
    assert b"hint" in log.causal_history_encoded(4, random.Random(0))[2]


def test_send_hashes_the_filter_positions_once_for_the_outgoing_entry() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, bloom=COMPACT)
    a = MessageChannel("c", "alice", 0, cfg, rng=random.Random(1))
    mid = a.send(b"hello", 1)
    entry = a.outgoing.get(mid)
    assert entry is not None and entry.positions == COMPACT.positions(mid)


def test_a_duplicate_missing_from_the_filter_goes_back_in_and_is_acknowledged() -> None:
    # A resend of a delivered message whose id left our filter (rolled over): it is
    # inserted again (one hashing serves the check, the insert and the
    # acknowledgement) so the sender sees it acknowledged.
    cfg = ChannelConfig(repair=None, bloom=COMPACT)
    a = MessageChannel("c", "alice", 0, cfg, rng=random.Random(1))
    b = MessageChannel("c", "bob", 0, cfg, rng=random.Random(2))
    mid = a.send(b"hello", 1)
    (datagram,) = a.datagrams_to_send()
    b.receive(datagram.data, 2)
    assert mid in b.bloom
    b.bloom = RollingBloomFilter(COMPACT)  # as if rolled over since
    b.receive(datagram.data, 3)
    assert b.stats["duplicates"] == 1 and mid in b.bloom
    assert b.bloom.has_positions(COMPACT.positions(mid))
    assert b.get_timer() is not None  # the acknowledgement sync is scheduled


def test_send_logs_the_retrieval_hint_it_is_given_in_one_change() -> None:
    # The runtime knows the transport's hint of the encoded bytes: the message is
    # logged with it (no separate HintSet) and the next causal history carries it.
    from sdk.sds.journal import HintSet, Logged

    a = MessageChannel("c", "alice", 0, ChannelConfig(), rng=random.Random(1), journal=True)
    seen: list[bytes] = []

    def hint_of(data: bytes) -> bytes:
        seen.append(data)
        return b"H" + data[:3]

    mid = a.send(b"one", 0, retrieval_hint=hint_of)
    (datagram,) = a.datagrams_to_send()
    assert seen == [datagram.data]
    changes = a.drain_changes()
    logged = [c for c in changes if isinstance(c, Logged)]
    assert [(c.message_id, c.retrieval_hint) for c in logged] == [(mid, b"H" + datagram.data[:3])]
    assert not [c for c in changes if isinstance(c, HintSet)]
    a.send(b"two", 1)
    (second,) = a.datagrams_to_send()
    history = decode_message(second.data).causal_history
    assert [(e.message_id, e.retrieval_hint) for e in history] == [(mid, b"H" + datagram.data[:3])]
