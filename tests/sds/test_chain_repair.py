"""Issue 27 item 5: a group without a store recovers from a partition (chain repair,
docs/sds.md "Chain repair")."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.sds import (
    COMPACT,
    BloomProfile,
    ChannelConfig,
    MessageChannel,
    decode_message,
    encode_message,
)
from sdk.sds.local_log import LocalLog
from sdk.sds.message import HistoryEntry, Message
from sdk.sds.repair import CHAIN_MARK, chain_request, chain_since
from sdk.testing.simulation import GroupSimulation, chat_through_partition
from tests.sds.helpers import T0, make
from transports.faults import FaultConfig


@pytest.mark.parametrize(("loss", "seed"), [(0.0, 1), (0.2, 2)])
def test_a_healed_partition_converges_without_a_store(loss: float, seed: int) -> None:
    # The filter of the compact profile shows only a participant's newest 128-256
    # ids, fewer than either side of the partition lacks of the other's. Before
    # chain repair both sides walked the chain back one causal-history level per
    # repair round and, 120 s after the heal, still held 150-190 messages each
    # behind 2-3 missing ids (954 deliveries missing at 0 % loss, 331 at 20 %).
    sim = GroupSimulation(
        5,
        config=ChannelConfig(bloom=COMPACT),
        faults=FaultConfig(loss=loss, delay_ms=20, jitter_ms=30),
        seed=seed,
        with_store=False,
    )
    healed_at = chat_through_partition(sim, sim.node_ids[3:], 6_000, rate_per_participant=10)
    target = 2 * 6_000 + 5_000
    assert sim.run_until_quiet(healed_at + target - sim.now, check=sim.converged, step_ms=100), {
        p: (len(c.log), len(c.incoming), len(c.missing())) for p, c in sim.nodes.items()
    }
    assert len(sim.nodes["p03"].log) == len(sim.all_sent()) == 550
    assert sum(c.stats["rebroadcast_chain"] for c in sim.nodes.values()) > 0


@settings(
    max_examples=int(os.environ.get("CHORUS_SDS_PARTITION_EXAMPLES", "10")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    partition_ms=st.integers(500, 6_000),
    loss=st.sampled_from([0.0, 0.1, 0.2]),
    rate=st.integers(2, 10),
    cut=st.lists(st.integers(0, 4), min_size=1, max_size=2, unique=True),
    seed=st.integers(0, 2**16),
)
def test_any_healed_partition_converges_within_twice_its_length_and_5_s(
    partition_ms: int, loss: float, rate: int, cut: list[int], seed: int
) -> None:
    """The bound of issue 27 as a property: whatever the partition's length, the
    load, the loss and who is cut off (1 or 2 of 5), every log holds every message
    in the same order within ``2 * partition + 5 s`` of the heal, without a store."""
    sim = GroupSimulation(
        5,
        config=ChannelConfig(bloom=COMPACT),
        faults=FaultConfig(loss=loss, delay_ms=20, jitter_ms=30),
        seed=seed,
        with_store=False,
    )
    healed_at = chat_through_partition(
        sim, [sim.node_ids[i] for i in cut], partition_ms, rate_per_participant=rate
    )
    deadline = healed_at + 2 * partition_ms + 5_000
    assert sim.run_until_quiet(deadline - sim.now, check=sim.converged, step_ms=100)


def test_a_chain_request_is_a_plain_repair_request_with_a_marked_hint() -> None:
    entry = HistoryEntry("m5", b"\x01" * 32, "erin")
    request = chain_request(entry, T0)
    # What @waku/sds reads of a repair request is unchanged: the id and the sender.
    assert (request.message_id, request.sender_id) == ("m5", "erin")
    assert request.retrieval_hint is not None
    assert request.retrieval_hint.startswith(CHAIN_MARK)
    assert chain_since(request) == T0
    assert chain_since(entry) is None
    assert chain_since(HistoryEntry("m5")) is None
    assert chain_since(HistoryEntry("m5", CHAIN_MARK + b"\x00" * 7, "erin")) is None
    sync = Message("dave", "s1", "room", T0, bloom_filter=b"", repair_request=(request,))
    assert decode_message(encode_message(sync)).repair_request == (request,)


#: A filter of 4 ids: a miss is conclusive only for the newest 2 of a log.
TINY = BloomProfile("tiny", capacity=4, error_rate=0.01)


def _chain_group() -> tuple[dict[str, MessageChannel], list[bytes]]:
    """Everyone has heard everyone; then erin, alice, bob and carol get e1 a2 b3 c4
    e5 e6, and dave only e1 and e6 (which names e5). The filter holds 4 ids: as
    the compact one after a partition, it cannot show the whole gap."""
    cfg = ChannelConfig(causal_history_size=1, sync_interval_ms=0, bloom=TINY)
    names = ["erin", "alice", "bob", "carol", "dave"]
    ch = {n: make(n, cfg) for n in names}
    t = T0
    for n in names:
        hello = encode_message_of(ch[n], t)
        for other in names:
            if other != n:
                ch[other].receive(hello, t + 10)
    wire: list[bytes] = []
    for sender in ["erin", "alice", "bob", "carol", "erin", "erin"]:
        t += 100
        ch[sender].send(f"{sender} {len(wire)}".encode(), t)
        data = ch[sender].datagrams_to_send()[0].data
        wire.append(data)
        for n in names:
            if n != sender and (n != "dave" or len(wire) in (1, 6)):
                ch[n].receive(data, t + 10)
    for n in names:
        ch[n].datagrams_to_send()
    return ch, wire


def encode_message_of(channel: MessageChannel, now: int) -> bytes:
    channel.send_sync(now)
    return channel.datagrams_to_send()[-1].data


def test_the_first_holder_answers_a_chain_at_once_and_the_next_when_asked_again() -> None:
    ch, wire = _chain_group()
    dave = ch["dave"]
    e5 = decode_message(wire[4]).message_id
    assert dave.missing() == [e5]
    now = T0 + 2_000
    ask = encode_message_of(dave, now)
    (request,) = decode_message(ask).repair_request
    # Since erin's newest message dave has before the one waiting (e6): e1.
    assert (
        request.message_id == e5
        and chain_since(request) == decode_message(wire[0]).lamport_timestamp
    )
    holders = ["erin", "alice", "bob", "carol"]
    for n in holders:
        ch[n].receive(ask, now + 10)
    answered = {n: ch[n].stats["rebroadcast_chain"] for n in holders}
    # The sender ranks first: it alone answers, with the whole chain a2 b3 c4 e5.
    assert answered == {"erin": 4, "alice": 0, "bob": 0, "carol": 0}
    chain = {decode_message(d).message_id for d in wire[1:5]}
    sent = {decode_message(d.data).message_id for d in ch["erin"].datagrams_to_send()}
    assert chain <= sent
    # Asked again later: the answer did not arrive, so the next holder answers too.
    for n in holders:
        ch[n].datagrams_to_send()
    now += 1_000
    ask = encode_message_of(dave, now)
    for n in holders:
        ch[n].receive(ask, now + 10)
    again = {n: ch[n].stats["rebroadcast_chain"] - answered[n] for n in holders}
    assert again["erin"] == 4
    # (a2 b3 c4: dave's filter is conclusive for the newest 2, so e5 is left to
    # erin, which is heard and offers its own.)
    assert sorted(again[n] for n in holders[1:]) == [0, 0, 3]
    # Delivered, the chain unblocks e6: dave has everything.
    for data in wire[1:5]:
        dave.receive(data, now + 20)
    assert not dave.missing() and len(dave.log) == 6


def test_chain_repair_off_sends_no_chain_request() -> None:
    ch, _ = _chain_group()
    dave = ch["dave"]
    dave.config = ChannelConfig(
        causal_history_size=1, sync_interval_ms=0, chain_requests_per_sync=0
    )
    ask = decode_message(encode_message_of(dave, T0 + 2_000))
    assert all(chain_since(r) is None for r in ask.repair_request)


def test_a_senders_newest_logged_message_before_a_time() -> None:
    log = LocalLog(with_sender=True)
    for lamport, mid, sender in [(10, "e1", "erin"), (20, "a2", "alice"), (70, "e7", "erin")]:
        log.add(mid, lamport, sender)
    assert log.newest_from("erin", None, 100) == (70, None)
    # e7 arrived after the gap; before the message that waits (lamport 60): e1.
    assert log.newest_from("erin", 60, 100) == (10, None)
    assert log.newest_from("bob", 60, 100) == (None, None)
    # A bounded scan says how far back it looked.
    assert log.newest_from("bob", None, 2) == (None, 20)
    assert [mid for _, mid in log.between(10, 70)] == ["a2", "e7"]
