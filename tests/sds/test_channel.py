from __future__ import annotations

import pytest

from sdk.sds import (
    COMPACT,
    BloomFilter,
    BloomProfile,
    ChannelConfig,
    EphemeralReceived,
    LocalProtocolError,
    Message,
    MessageAcknowledged,
    MessageDelivered,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageRejected,
    MessageSendExpired,
    MessageSent,
    MessageTooLarge,
    OutgoingState,
    RejectReason,
    RepairConfig,
    decode_message,
    encode_message,
)
from sdk.sds.message import HistoryEntry, MessageKind
from tests.sds.helpers import T0, drain, flush, make

NO_SYNC = ChannelConfig(sync_interval_ms=0, repair=None)


def delivered(events: list[object]) -> list[bytes]:
    return [e.content for e in events if isinstance(e, MessageDelivered)]


def test_send_sets_lamport_history_and_filter() -> None:
    a = make("alice", NO_SYNC)
    mid = a.send(b"one", T0)
    (dg,) = a.datagrams_to_send()
    m = decode_message(dg.data)
    assert m.message_id == mid and dg.message_id == mid
    assert m.lamport_timestamp == T0 + 1  # clock starts at now; max(now, ts + 1)
    assert m.causal_history == ()
    assert m.bloom_filter is not None and len(m.bloom_filter) == 18_752
    a.send(b"two", T0 + 10)
    m2 = decode_message(a.datagrams_to_send()[0].data)
    assert m2.lamport_timestamp == T0 + 10
    assert [e.message_id for e in m2.causal_history] == [mid]
    assert m2.causal_history[0].sender_id is None  # no SDS-R: no sender in history
    assert isinstance(drain(a)[0], MessageSent)


def test_lamport_follows_delivered_messages_from_the_future() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    a.send(b"x", T0 + 50_000)  # alice's clock runs ahead
    flush(a, b, now=T0)
    assert b.lamport_timestamp == T0 + 50_000
    b.send(b"y", T0 + 1)
    assert decode_message(b.datagrams_to_send()[0].data).lamport_timestamp == T0 + 50_001


def test_causal_order_with_buffering_and_missing_event() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    a.send(b"1", T0)
    first = a.datagrams_to_send()[0].data
    a.send(b"2", T0 + 1)
    second = a.datagrams_to_send()[0].data
    b.receive(second, T0 + 2)
    events = drain(b)
    assert delivered(events) == []
    missing = [e for e in events if isinstance(e, MessageMissing)]
    assert [m.message_id for m in missing] == [decode_message(first).message_id]
    assert len(b.incoming) == 1
    b.receive(first, T0 + 3)
    assert delivered(drain(b)) == [b"1", b"2"]
    assert b.log.ids() == a.log.ids()
    assert b.missing() == []


def test_duplicates_are_ignored() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    a.send(b"x", T0)
    data = a.datagrams_to_send()[0].data
    b.receive(data, T0)
    b.receive(data, T0)
    assert delivered(drain(b)) == [b"x"]
    assert b.stats["duplicates"] == 1


def test_own_messages_are_ignored() -> None:
    a = make("alice", NO_SYNC)
    a.send(b"x", T0)
    data = a.datagrams_to_send()[0].data
    drain(a)
    a.receive(data, T0)
    assert drain(a) == [] and a.stats["own_ignored"] == 1


def test_acknowledged_by_causal_history() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    mid = a.send(b"x", T0)
    flush(a, b, now=T0)
    b.send(b"y", T0 + 1)
    drain(a)
    flush(b, a, now=T0 + 2)
    assert MessageAcknowledged("room", mid) in drain(a)
    assert len(a.outgoing) == 0


def test_a_sparse_filter_acknowledges_alone() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, causal_history_size=0)
    a, b = make("alice", cfg), make("bob", cfg)
    mid = a.send(b"x", T0)
    flush(a, b, now=T0)
    drain(a)
    b.send(b"from bob", T0 + 1)  # no causal history: only bob's filter (one id) speaks
    flush(b, a, now=T0 + 2)
    assert MessageAcknowledged("room", mid) in drain(a)


def _full_filter_with(profile: BloomProfile, message_id: str, seed: int) -> bytes:
    # A filter at capacity (fill ~ 1 - e^-(k/bits per element)) holding message_id.
    f = BloomFilter(profile)
    for i in range(profile.capacity - 1):
        f.insert(f"filler-{seed}-{i}")
    f.insert(message_id)
    return f.to_bytes()


def test_full_filters_from_distinct_peers_reach_the_target() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, bloom=COMPACT)
    a = make("alice", cfg)
    mid = a.send(b"x", T0)
    a.datagrams_to_send()
    drain(a)

    def sync_from(peer: str, seed: int) -> bytes:
        return encode_message(
            Message(
                peer, f"sync-{peer}-{seed}", "room", T0, (), _full_filter_with(COMPACT, mid, seed)
            )
        )

    # Four peers seen: more than the three full compact filters the target needs.
    for peer in ("bob", "carol", "dave", "erin"):
        a.receive(encode_message(Message(peer, f"hello-{peer}", "room", T0)), T0)
    a.receive(sync_from("bob", 1), T0 + 1)
    assert MessagePossiblyAcknowledged("room", mid, 1) in drain(a)
    assert a.outgoing_state(mid) is OutgoingState.POSSIBLY_ACKNOWLEDGED
    a.receive(sync_from("bob", 2), T0 + 2)  # the same peer again is not new evidence
    assert not [e for e in drain(a) if isinstance(e, MessageAcknowledged)]
    a.receive(sync_from("carol", 3), T0 + 3)
    assert MessagePossiblyAcknowledged("room", mid, 2) in drain(a)
    a.receive(sync_from("dave", 4), T0 + 4)
    assert MessageAcknowledged("room", mid) in drain(a)  # 3 full compact filters: ~1e-6


def test_every_peer_seen_having_the_id_acknowledges_it() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, bloom=COMPACT)
    a = make("alice", cfg)
    mid = a.send(b"x", T0)
    a.datagrams_to_send()
    for peer in ("bob", "carol"):
        a.receive(encode_message(Message(peer, f"hello-{peer}", "room", T0)), T0)
    drain(a)
    full = _full_filter_with(COMPACT, mid, 1)
    a.receive(encode_message(Message("bob", "s1", "room", T0, (), full)), T0 + 1)
    assert a.outgoing_state(mid) is OutgoingState.POSSIBLY_ACKNOWLEDGED
    a.receive(encode_message(Message("carol", "s2", "room", T0, (), full)), T0 + 2)
    assert MessageAcknowledged("room", mid) in drain(a)  # both peers of a 3-person group


def test_resend_schedule_and_expiry() -> None:
    cfg = ChannelConfig(
        sync_interval_ms=0,
        repair=None,
        resend_interval_ms=1_000,
        sweep_interval_ms=100,
        max_resends=2,
    )
    a = make("alice", cfg)
    mid = a.send(b"x", T0)
    original = a.datagrams_to_send()[0].data
    drain(a)
    assert a.get_timer() == T0 + 100
    a.handle_timer(T0 + 999)
    assert a.datagrams_to_send() == []
    a.handle_timer(T0 + 1_000)
    resent = a.datagrams_to_send()
    assert [d.data for d in resent] == [original]  # the same bytes, same id
    assert drain(a) == [MessageSent("room", mid, 1)]
    a.handle_timer(T0 + 2_000)
    assert len(a.datagrams_to_send()) == 1
    a.handle_timer(T0 + 3_000)
    assert drain(a)[-1] == MessageSendExpired("room", mid, 2)
    assert len(a.outgoing) == 0
    assert a.get_timer() is None


def test_possibly_acknowledged_messages_resend_less_often() -> None:
    cfg = ChannelConfig(
        sync_interval_ms=0,
        repair=None,
        bloom=COMPACT,
        resend_interval_ms=1_000,
        possibly_acked_resend_interval_ms=5_000,
        sweep_interval_ms=100,
    )
    a = make("alice", cfg)
    mid = a.send(b"x", T0)
    a.datagrams_to_send()
    a.receive(encode_message(Message("carol", "hello", "room", T0)), T0)  # a second peer
    full = _full_filter_with(COMPACT, mid, 0)
    a.receive(encode_message(Message("bob", "sync-1", "room", T0, (), full)), T0)
    assert a.outgoing_state(mid) is OutgoingState.POSSIBLY_ACKNOWLEDGED
    a.handle_timer(T0 + 1_000)
    assert len(a.datagrams_to_send()) == 1
    a.handle_timer(T0 + 2_000)
    assert a.datagrams_to_send() == []  # next resend at +1000 + 5000
    a.handle_timer(T0 + 6_000)
    assert len(a.datagrams_to_send()) == 1


def test_sync_message_backoff_and_suppression() -> None:
    cfg = ChannelConfig(sync_interval_ms=1_000, repair=None)
    a, b = make("alice", cfg), make("bob", cfg)
    t_a = a.get_timer()
    assert t_a is not None and T0 + 1_000 <= t_a <= T0 + 2_000
    # Bob hears Alice's message just before his sync was due: his wait restarts.
    t_b = b.get_timer()
    assert t_b is not None
    a.send(b"x", t_b - 1)
    flush(a, b, now=t_b - 1)
    b.handle_timer(t_b)
    assert b.datagrams_to_send() == []
    t_b2 = b.get_timer()
    assert t_b2 is not None and t_b2 >= t_b - 1 + 1_000
    b.handle_timer(t_b2)
    (sync,) = b.datagrams_to_send()
    m = decode_message(sync.data)
    assert sync.kind is MessageKind.SYNC and not m.content
    assert [e.message_id for e in m.causal_history] == a.log.ids()
    # A sync message is not logged, buffered or delivered.
    assert len(b.outgoing) == 0 and len(b.log) == 1
    a.receive(sync.data, t_b2)
    assert delivered(drain(a)) == [] and a.stats["sync_received"] == 1


def test_sync_acknowledges_and_reveals_missing() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None)
    a, b, c = make("alice", cfg), make("bob", cfg), make("carol", cfg)
    mid = a.send(b"x", T0)
    flush(a, b, now=T0)  # carol misses it
    b.send_sync(T0 + 1)
    drain(a)
    flush(b, a, c, now=T0 + 2)
    assert MessageAcknowledged("room", mid) in drain(a)
    assert [e.message_id for e in drain(c) if isinstance(e, MessageMissing)] == [mid]


def test_ephemeral_messages() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    mid = a.send_ephemeral(b"typing...", T0)
    (dg,) = a.datagrams_to_send()
    m = decode_message(dg.data)
    assert m.lamport_timestamp is None and m.causal_history == () and m.bloom_filter is None
    assert len(a.outgoing) == 0 and len(a.log) == 0
    b.receive(dg.data, T0)
    assert drain(b) == [EphemeralReceived("room", mid, "alice", b"typing...")]
    assert len(b.log) == 0
    assert a.send_ephemeral(b"typing...", T0) != mid  # ids stay unique


def test_missing_reported_again_then_lost_and_dependents_delivered() -> None:
    cfg = ChannelConfig(
        sync_interval_ms=0,
        repair=None,
        sweep_interval_ms=100,
        retrieval_interval_ms=1_000,
        lost_timeout_ms=5_000,
    )
    a, b = make("alice", cfg), make("bob", cfg)
    lost_id = a.send(b"lost", T0)
    a.datagrams_to_send()
    a.send(b"after", T0 + 1)
    flush(a, b, now=T0 + 1)
    assert [e.message_id for e in drain(b) if isinstance(e, MessageMissing)] == [lost_id]
    b.handle_timer(T0 + 1_001)
    assert [e.message_id for e in drain(b) if isinstance(e, MessageMissing)] == [lost_id]
    b.handle_timer(T0 + 5_001)
    events = drain(b)
    assert MessageLost("room", lost_id) in events
    assert delivered(events) == [b"after"]
    assert b.lost() == {lost_id}


def test_a_lamport_time_far_ahead_is_delivered_but_moves_our_clock_only_so_far() -> None:
    # @waku/sds adopts any Lamport time; rejecting its later messages would cut a
    # mixed channel in two (issue 20).
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, max_lamport_drift_ms=1_000)
    a, b = make("alice", cfg), make("bob", cfg)
    a.send(b"from the future", T0 + 10 * 86_400_000)
    flush(a, b, now=T0)
    assert delivered(drain(b)) == [b"from the future"]
    assert b.lamport_timestamp == T0 + 1_000
    assert b.stats["lamport_ahead"] == 1
    a.send(b"and later", T0 + 10 * 86_400_000 + 5)
    flush(a, b, now=T0 + 5)
    assert delivered(drain(b)) == [b"and later"]


def test_a_lamport_time_beyond_2_63_is_rejected_and_changes_nothing() -> None:
    b = make("bob", NO_SYNC)
    b.receive(encode_message(Message("alice", "x", "room", 1 << 63, content=b"x")), T0)
    (event,) = drain(b)
    assert isinstance(event, MessageRejected) and event.reason is RejectReason.LAMPORT_DRIFT
    assert b.lamport_timestamp == T0 and len(b.log) == 0


def test_verify_message_ids() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, verify_message_ids=True)
    b = make("bob", cfg)
    forged = Message("alice", "f" * 64, "room", T0, content=b"x")
    b.receive(encode_message(forged), T0)
    (event,) = drain(b)
    assert isinstance(event, MessageRejected)
    assert event.reason is RejectReason.MESSAGE_ID_MISMATCH
    a = make("alice", cfg)
    a.send(b"x", T0)
    flush(a, b, now=T0)
    assert delivered(drain(b)) == [b"x"]


def test_full_incoming_buffer_rejects_new_and_keeps_buffered() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, max_incoming_buffer=2)
    a, b = make("alice", cfg), make("bob", cfg)
    a.send(b"0", T0)
    first = a.datagrams_to_send()[0].data
    for i in range(1, 5):
        a.send(str(i).encode(), T0 + i)
    later = [d.data for d in a.datagrams_to_send()]
    for data in later:
        b.receive(data, T0 + 10)
    assert len(b.incoming) == 2
    assert b.stats["rejected.incoming_buffer_full"] == 2
    drain(b)
    b.receive(first, T0 + 11)
    assert delivered(drain(b)) == [b"0", b"1", b"2"]
    for data in later:  # the rejected ones come back as resends
        b.receive(data, T0 + 12)
    assert delivered(drain(b)) == [b"3", b"4"]


def test_garbage_becomes_an_event() -> None:
    b = make("bob", NO_SYNC)
    b.receive(b"\x0a\xff", T0)
    (event,) = drain(b)
    assert isinstance(event, MessageRejected) and event.reason is RejectReason.DECODE
    assert event.channel_id == ""


def test_a_message_of_another_channel_is_rejected_as_an_event() -> None:
    b = make("bob", NO_SYNC)
    other = Message("alice", "i", "elsewhere", T0, content=b"x")
    b.receive(encode_message(other), T0)
    (event,) = drain(b)
    assert isinstance(event, MessageRejected) and event.reason is RejectReason.FOREIGN_CHANNEL
    assert event.sender_id == "alice" and b.stats["foreign_channel"] == 1
    assert len(b.log) == 0


def test_filter_of_another_profile_is_ignored() -> None:
    a = make("alice", ChannelConfig(sync_interval_ms=0, repair=None, bloom=COMPACT))
    b = make("bob", NO_SYNC)
    b.send(b"x", T0)
    b.datagrams_to_send()
    a.send(b"y", T0)
    flush(a, b, now=T0)
    assert b.stats["filter_size_mismatch"] == 1
    assert delivered(drain(b)) == [b"y"]


def test_send_rejects_misuse() -> None:
    a = make("alice", NO_SYNC)
    with pytest.raises(LocalProtocolError):
        a.send(b"", T0)
    with pytest.raises(LocalProtocolError, match="max_message_size"):
        a.send(b"x" * 300_000, T0)
    assert len(a.log) == 0 and len(a.outgoing) == 0


def test_a_send_over_the_callers_size_limit_changes_nothing() -> None:
    # The transport's limit is passed in; the core's encoding decides (one size rule).
    a = make("alice", NO_SYNC)
    clock = a.clock.value
    limit = a.config.bloom.size_bytes + 500  # a sync-sized envelope fits, 1 KB more does not
    with pytest.raises(MessageTooLarge) as info:
        a.send(b"x" * 1_000, T0 + 5, max_size=limit)
    assert info.value.limit == limit and info.value.size > limit
    with pytest.raises(MessageTooLarge):
        a.send_ephemeral(b"x" * (limit + 1), T0 + 5, max_size=limit)
    assert a.clock.value == clock and len(a.log) == 0 and len(a.outgoing) == 0
    assert a.datagrams_to_send() == []
    fits = a.send(b"x" * 10, T0 + 5, max_size=limit)
    assert a.log.get(fits) is not None


def test_identical_content_from_two_senders_gets_distinct_ids() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    assert a.send(b"ok", T0) != b.send(b"ok", T0)
    assert a.send(b"ok", T0) != a.send(b"ok", T0)


def test_sds_r_repair_round_trip() -> None:
    repair = RepairConfig(t_min_ms=1_000, t_max_ms=5_000)
    cfg = ChannelConfig(sync_interval_ms=0, repair=repair, sweep_interval_ms=100, lost_timeout_ms=0)
    a, b, c = make("alice", cfg), make("bob", cfg), make("carol", cfg)
    lost_id = a.send(b"lost for carol", T0)
    flush(a, b, now=T0)
    b.send(b"bob replies", T0 + 1)
    (reply,) = [d.data for d in b.datagrams_to_send()]
    m = decode_message(reply)
    assert m.causal_history[0].sender_id == "alice"  # SDS-R: sender in history
    a.receive(reply, T0 + 2)
    c.receive(reply, T0 + 2)
    assert lost_id in c.repair.outgoing_requests()  # type: ignore[union-attr]
    t_req = c.repair.outgoing_requests()[lost_id]  # type: ignore[union-attr]
    assert T0 + 2 + 1_000 <= t_req < T0 + 2 + 5_000
    # Carol's next message after T_req carries the repair request.
    c.send(b"carol asks", t_req)
    (ask,) = [d.data for d in c.datagrams_to_send()]
    assert [e.message_id for e in decode_message(ask).repair_request] == [lost_id]
    a.receive(ask, t_req + 1)
    b.receive(ask, t_req + 1)
    # Alice, the original sender, has distance 0: she answers at once.
    assert a.repair.incoming_requests()[lost_id] == t_req + 1  # type: ignore[union-attr]
    a.handle_timer(t_req + 100)
    rebroadcast = [d.data for d in a.datagrams_to_send()]
    assert len(rebroadcast) == 1 and decode_message(rebroadcast[0]).message_id == lost_id
    # Bob sees the rebroadcast and drops his own pending response.
    b.receive(rebroadcast[0], t_req + 101)
    assert lost_id not in b.repair.incoming_requests()  # type: ignore[union-attr]
    c.receive(rebroadcast[0], t_req + 101)
    assert b"lost for carol" in delivered(drain(c))
    assert c.log.ids() == a.log.ids() == b.log.ids()


def test_timer_is_none_when_idle_without_sync() -> None:
    assert make("alice", NO_SYNC).get_timer() is None


def test_forged_copy_with_unresolvable_dependency_does_not_block_the_real_message() -> None:
    a, b = make("alice", NO_SYNC), make("bob", NO_SYNC)
    a.send(b"real", T0)
    real = a.datagrams_to_send()[0].data
    m = decode_message(real)
    forged = Message(
        m.sender_id,
        m.message_id,
        m.channel_id,
        m.lamport_timestamp,
        (HistoryEntry("never-existed"),),
        content=b"fake",
    )
    b.receive(encode_message(forged), T0)
    b.receive(real, T0 + 1)
    assert delivered(drain(b)) == [b"real"]
    assert len(b.incoming) == 0


def test_verified_ids_cover_the_causal_history() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, verify_message_ids=True)
    a, b = make("alice", cfg), make("bob", cfg)
    a.send(b"one", T0)
    flush(a, b, now=T0)
    a.send(b"two", T0 + 1)
    m = decode_message(a.datagrams_to_send()[0].data)
    tampered = Message(
        m.sender_id,
        m.message_id,
        m.channel_id,
        m.lamport_timestamp,
        (HistoryEntry("other"),),
        m.bloom_filter,
        m.content,
    )
    b.receive(encode_message(tampered), T0 + 2)
    (event,) = [e for e in drain(b) if isinstance(e, MessageRejected)]
    assert event.reason is RejectReason.MESSAGE_ID_MISMATCH


def test_incoming_buffer_is_bounded_by_bytes_in_all_and_per_sender() -> None:
    base = ChannelConfig(sync_interval_ms=0, repair=None, causal_history_size=1, bloom=COMPACT)
    probe = make("alice", base)
    probe.send(b"first, never delivered", T0)
    probe.send(bytes(600) + b"0", T0 + 1)
    size = len(probe.datagrams_to_send()[1].data)
    cfg = ChannelConfig(
        sync_interval_ms=0,
        repair=None,
        causal_history_size=1,
        bloom=COMPACT,
        max_incoming_bytes=4 * size + size // 2,
        max_incoming_bytes_per_sender=3 * size + size // 2,
    )
    b = make("bob", cfg)
    for name in ("alice", "carol"):
        a = make(name, cfg)
        a.send(b"first, never delivered", T0)
        a.datagrams_to_send()
        for i in range(5):
            a.send(bytes(600) + str(i).encode(), T0 + 1 + i)
        for dg in a.datagrams_to_send():
            b.receive(dg.data, T0 + 10)
    # alice: 3 messages fit her bound; carol: only 1 more fits the bound in all.
    assert b.incoming.bytes_held == sum(len(p.data) for p in b.incoming.pending()) == 4 * size
    assert b.incoming.bytes_from("alice") == 3 * size
    assert b.incoming.bytes_from("carol") == size
    assert b.stats["rejected.incoming_buffer_full"] == 6
    rejected = [e for e in drain(b) if isinstance(e, MessageRejected)]
    assert {e.sender_id for e in rejected} == {"alice", "carol"}


def test_incoming_bytes_are_released_on_delivery() -> None:
    cfg = ChannelConfig(sync_interval_ms=0, repair=None, causal_history_size=1, bloom=COMPACT)
    a, b = make("alice", cfg), make("bob", cfg)
    a.send(b"first", T0)
    first = a.datagrams_to_send()[0].data
    a.send(b"second", T0 + 1)
    flush(a, b, now=T0 + 2)
    assert b.incoming.bytes_held > 0
    b.receive(first, T0 + 3)
    assert b.incoming.bytes_held == 0 and b.incoming.bytes_from("alice") == 0
