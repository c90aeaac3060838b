"""Chorus and the reference ``@waku/sds`` share a channel and understand each other.

Each test runs real reference participants (``node`` + the pinned ``@waku/sds``)
next to Chorus participants on one manual clock; see ``mixnet.py``. Behaviour
where the two implementations differ on purpose is documented in
``docs/interop.md`` and asserted here as it is, so a change on either side shows.
"""

from __future__ import annotations

import hashlib

import pytest

from sdk.sds import WAKU, BloomFilter, MessageKind, RepairConfig, decode_message
from sdk.sds.repair import chain_since, in_response_group, request_time, response_time

from .jsharness import JsHarness
from .mixnet import MixedNetwork, Node, chorus_config, js_options, message_id_of

#: Runs the reference in node (skipped without node, failed under CHORUS_REQUIRE_SERVICES=1).
pytestmark = pytest.mark.integration


def _ids(n: int, prefix: str = "") -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


def _assert_converged(net: MixedNetwork, expected: set[str]) -> list[str]:
    logs = net.logs()
    first = next(iter(logs.values()))
    assert set(first) == expected, {name: len(log) for name, log in logs.items()}
    for name, log in logs.items():
        assert log == first, f"{name}'s log differs"
    return first


# -- bloom filter ----------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 13])
def test_waku_bloom_filter_is_bit_for_bit_the_reference(harness: JsHarness, offset: int) -> None:
    """Same ids in, same bytes out; and each side finds exactly the other's members.

    ``offset`` reads the reference's filter back from a view into a larger buffer,
    the path of a filter decoded from a received message (see docs/interop.md on
    ``BloomFilter.fromBytes`` and ``byteOffset``).
    """
    members = [*_ids(300, "member"), "sync-abc123", "3f2a-uuid-like-id", "x"]
    others = _ids(2000, "other")
    js_bytes, found = harness.bloom(members, members + others, offset=offset)

    ours = BloomFilter(WAKU)
    for mid in members:
        ours.insert(mid)
    assert ours.to_bytes() == js_bytes
    assert len(js_bytes) == WAKU.size_bytes == 18_752

    theirs = BloomFilter(WAKU, js_bytes)
    assert found[: len(members)] == [True] * len(members)
    assert found[len(members) :] == [mid in theirs for mid in others]


# -- SDS-R rules -----------------------------------------------------------------------


def test_sds_r_timing_and_response_groups_match_the_reference(harness: JsHarness) -> None:
    """T_req, T_resp and response-group membership: the spec leaves ``hash`` open, so
    participants only agree on who answers, and when, if both hash alike."""
    now = 1_700_000_000_000
    config = RepairConfig(t_min_ms=30_000, t_max_ms=120_000, num_response_groups=3)
    options = {"tMin": 30_000, "tMax": 120_000, "numResponseGroups": 3}
    senders = ["alice", "bob", "p07", "0x3f2a9c"]
    cases = [
        {"sender_id": sender, "message_id": mid} for sender in senders for mid in _ids(25, sender)
    ]
    for me in ("alice", "carol"):
        js = harness.participant(me, "room", now, repair_config=options)
        results = harness.call("repair_calc", id=me, now=now, cases=cases)["results"]
        for case, theirs in zip(cases, results, strict=True):
            sender, mid = case["sender_id"], case["message_id"]
            assert theirs == {
                "t_req": request_time(config, me, mid, now),
                "t_resp": response_time(config, me, sender, mid, now),
                "in_group": in_response_group(config, me, sender, mid),
            }, (me, sender, mid)
        assert js.participant_id == me
    groups = {r["in_group"] for r in results}
    assert groups == {True, False}  # three groups: some of each


# -- messages both ways, one order -----------------------------------------------------


def test_messages_both_ways_delivered_in_the_same_order(net: MixedNetwork) -> None:
    """Two Chorus and two reference participants send concurrently for six rounds;
    every one delivers every message once and ends with the identical local log."""
    nodes: list[Node] = [
        net.chorus("c1"),
        net.chorus("c2", chorus_config(causal_history_size=3)),
        net.js("j1"),  # the reference's default causal history: 200
        net.js("j2", js_options(causal_history_size=2)),
    ]
    contents: dict[str, bytes] = {}
    sent_by: dict[str, set[str]] = {n.name: set() for n in nodes}
    for rnd in range(6):
        net.hold()  # everyone sends at the same instant; arrival order differs per node
        for node in nodes:
            content = f"{node.name} says hello in round {rnd}".encode()
            mid = node.send(content)
            contents[mid] = content
            sent_by[node.name].add(mid)
        net.release()
        net.advance(500)

    log = _assert_converged(net, set(contents))
    assert len(log) == 24
    for node in nodes:
        others = set(contents) - sent_by[node.name]
        delivered = node.record.delivered
        assert [mid for mid, _ in delivered if mid in others] == [mid for mid, _ in delivered], (
            "only others' messages are delivered"
        )
        assert sorted(node.record.delivered_ids()) == sorted(others), node.name
        assert all(content == contents[mid] for mid, content in delivered)
        assert not node.record.missing and not node.record.rejected


# -- acknowledgement -------------------------------------------------------------------


def test_acknowledged_by_causal_history_both_ways(net: MixedNetwork) -> None:
    c = net.chorus("c1")
    j = net.js("j1")
    a = c.send(b"chorus asks")
    b = j.send(b"js answers")  # b's causal history holds a
    assert c.record.acknowledged == [a]
    assert c.channel.outgoing_state(a) is None
    c.send(b"chorus follows up")  # its causal history holds b
    assert b in j.record.acknowledged
    unacknowledged, possibly = j.js.sweep_outgoing(net.now)
    assert [mid for mid, _ in unacknowledged] == [] and possibly == []


@pytest.mark.parametrize("offset", [0, 13])
def test_reference_acknowledges_chorus_by_bloom_filter(net: MixedNetwork, offset: int) -> None:
    """Chorus sends no causal history, so only its (waku-profile) filter can acknowledge.

    The reference counts every filter hit, even repeated ones from the same peer,
    against its threshold of 2: the second Chorus message acknowledges.
    """
    c = net.chorus("c1", chorus_config(causal_history_size=0, sync_heads=0))
    j = net.js("j1", offset=offset)
    m = j.send(b"js speaks first")
    # Chorus's filter after receiving m is the reference's own filter (which holds m).
    assert c.channel.bloom.to_bytes() == j.js.filter()
    c.send(b"chorus, no history 1")
    assert j.record.possibly_acknowledged == {m: 1}
    assert m not in j.record.acknowledged
    c.send(b"chorus, no history 2")
    assert j.record.acknowledged == [m]
    unacknowledged, possibly = j.js.sweep_outgoing(net.now)
    assert unacknowledged == [] and possibly == []


def test_chorus_acknowledges_reference_by_bloom_filter(net: MixedNetwork) -> None:
    """A reference message whose causal history no longer holds Chorus's message, but
    whose filter does, acknowledges it. The filter holds a handful of ids, so a hit is
    false with probability ~1e-30 and one peer's filter is enough (sdk/sds/outgoing.py);
    at capacity the waku profile would need two peers, as the reference's threshold."""
    c = net.chorus("c1")
    j1 = net.js("j1", js_options(causal_history_size=1))
    a = c.send(b"chorus message")
    # j1's first message (causal history [a]) is lost on its way to Chorus; its
    # second references only the first, but its filter holds a.
    rule = net.drop(lambda s, r, _d: s == "j1" and r == "c1")
    first = j1.send(b"j1 first")
    net.undrop(rule)
    j1.send(b"j1 second")
    assert first in c.record.missing
    assert c.record.acknowledged == [a]
    assert c.channel.outgoing_state(a) is None
    assert WAKU.acknowledgement_threshold() == 2


def test_retrieval_hints_travel_both_ways(net: MixedNetwork) -> None:
    """A sender's retrieval hint (e.g. a transport hash) reaches the participant that
    misses the message, in either direction, for a store lookup."""
    c = net.chorus("c1")
    j = net.js("j1", resend_ms=None)
    to_chorus = net.drop(lambda s, r, _d: (s, r) == ("j1", "c1"))
    a, out = j.js.send(b"js message with a hint", net.now, hint=b"js-transport-hash")
    for data in out:
        net.broadcast(j, data)
    net.undrop(to_chorus)
    j.send(b"references it")
    assert c.record.missing_hints == {a: b"js-transport-hash"}

    to_js = net.drop(lambda s, r, _d: (s, r) == ("c1", "j1"))
    m = c.send(b"chorus message with a hint")
    c.channel.set_retrieval_hint(m, b"chorus-transport-hash")
    net.undrop(to_js)
    c.send(b"references it")
    assert j.record.missing_hints[m] == b"chorus-transport-hash"


# -- loss: detection and recovery ------------------------------------------------------


def test_message_lost_to_reference_is_detected_and_resent(net: MixedNetwork) -> None:
    c = net.chorus("c1", chorus_config(resend_interval_ms=2_000))
    j = net.js("j1", resend_ms=None)
    rule = net.drop(lambda s, r, _d: (s, r) == ("c1", "j1"))
    a = c.send(b"lost on the way")
    net.undrop(rule)
    b = c.send(b"depends on the lost one")
    assert j.record.missing == {a}
    assert j.log() == []  # b waits in the incoming buffer
    net.advance(3_000)  # Chorus's outgoing sweep resends a (and b)
    assert c.channel.stats["resent"] >= 1
    assert _assert_converged(net, {a, b}) == [a, b]
    assert j.record.delivered_ids() == [a, b]


def test_message_lost_to_chorus_is_detected_and_resent(net: MixedNetwork) -> None:
    c = net.chorus("c1")
    j = net.js("j1", resend_ms=2_000)
    rule = net.drop(lambda s, r, _d: (s, r) == ("j1", "c1"))
    a = j.send(b"lost on the way")
    net.undrop(rule)
    b = j.send(b"depends on the lost one")
    assert c.record.missing == {a}
    assert c.log() == []
    net.advance(3_000)  # the reference's outgoing sweep: the application resends a and b
    assert _assert_converged(net, {a, b}) == [a, b]
    assert c.record.delivered_ids() == [a, b]


def test_sds_r_chorus_requests_and_reference_repairs(net: MixedNetwork) -> None:
    """No resends anywhere: Chorus's repair request brings the reference's answer."""
    c = net.chorus("c1", chorus_config(resend_interval_ms=600_000))
    j = net.js("j1", resend_ms=None)
    rule = net.drop(lambda s, r, _d: (s, r) == ("j1", "c1"))
    a = j.send(b"lost on the way")
    net.undrop(rule)
    b = j.send(b"depends on the lost one")
    assert c.record.missing == {a}
    net.advance(5_000)  # past T_req (T_min..T_max = 1..5 s)
    note = c.send(b"chorus carries the repair request")
    request = decode_message(c.channel.repair.cached(note) or b"").repair_request
    assert [e.message_id for e in request] == [a]
    assert request[0].sender_id == "j1"
    net.advance(500)  # the original sender answers at once (T_resp = now)
    types = [e["type"] for e in j.raw_events]
    assert "repair:request-received" in types and "RepairResponseQueued" in types
    assert j.record.repairs_sent == 1
    _assert_converged(net, {a, b, note})
    assert c.record.delivered_ids() == [a, b]


def test_a_chorus_chain_request_is_a_plain_repair_request_to_the_reference(
    net: MixedNetwork,
) -> None:
    """Chain repair (docs/sds.md): the request rides in ``repair_request`` with a
    marked ``retrieval_hint`` that the reference does not read; to it this is an
    ordinary SDS-R request, answered as one."""
    c = net.chorus("c1", chorus_config(resend_interval_ms=600_000))
    j = net.js("j1", resend_ms=None)
    rule = net.drop(lambda s, r, _d: (s, r) == ("j1", "c1"))
    a = j.send(b"lost on the way")
    net.undrop(rule)
    b = j.send(b"depends on the lost one")
    assert c.record.missing == {a}
    c.channel.send_sync(net.now)  # a gap sync, before T_req: it asks for the chain
    (data,) = [d.data for d in c.channel.datagrams_to_send()]
    (request,) = decode_message(data).repair_request
    assert (request.message_id, request.sender_id) == (a, "j1")
    assert chain_since(request) is not None
    net.broadcast(c, data)
    net.advance(500)  # the original sender answers at once (T_resp = now)
    types = [e["type"] for e in j.raw_events]
    assert "repair:request-received" in types and "RepairResponseQueued" in types
    assert j.record.repairs_sent == 1
    assert _assert_converged(net, {a, b}) == [a, b]


def test_sds_r_reference_requests_and_chorus_repairs(net: MixedNetwork) -> None:
    c = net.chorus("c1", chorus_config(resend_interval_ms=600_000))
    j = net.js("j1", resend_ms=None)
    rule = net.drop(lambda s, r, _d: (s, r) == ("c1", "j1"))
    a = c.send(b"lost on the way")
    net.undrop(rule)
    b = c.send(b"depends on the lost one")
    assert j.record.missing == {a}
    net.advance(5_000)
    out = j.js.send_sync(net.now)  # the reference puts due repair requests on its sync
    assert len(out) == 1
    sync = decode_message(out[0])
    assert sync.kind is MessageKind.SYNC
    assert [(e.message_id, e.sender_id) for e in sync.repair_request] == [(a, "c1")]
    c.receive(out[0])
    net.advance(1_500)  # Chorus's next sweep answers (original sender: T_resp = now)
    assert c.record.repairs_sent == 1
    assert c.channel.stats["resent"] == 0
    assert _assert_converged(net, {a, b}) == [a, b]
    assert j.record.delivered_ids() == [a, b]


def test_irretrievably_lost_detected_by_both(net: MixedNetwork) -> None:
    """Both declare a never-recovered dependency lost. Chorus then delivers what waited
    for it; the reference drops it undelivered (docs/interop.md)."""
    c = net.chorus("c1", chorus_config(lost_timeout_ms=10_000, max_resends=0, repair=None))
    j = net.js("j1", js_options(timeout_lost_ms=10_000, repair=False), resend_ms=None)
    to_js = net.drop(lambda s, r, _d: (s, r) == ("c1", "j1"))
    a = c.send(b"chorus message never seen by js")
    net.undrop(to_js)
    b = c.send(b"chorus message depending on it")
    to_chorus = net.drop(lambda s, r, _d: (s, r) == ("j1", "c1"))
    x = j.send(b"js message never seen by chorus")
    net.undrop(to_chorus)
    y = j.send(b"js message depending on it")
    assert a in j.record.missing and x in c.record.missing
    net.advance(12_000)
    assert c.record.lost == {x}
    assert y in c.log()
    assert j.record.lost == {a}
    assert b not in j.log()  # the reference's behaviour, not the spec's requirement


# -- sync and ephemeral ----------------------------------------------------------------


def test_sync_messages_understood_both_ways(net: MixedNetwork) -> None:
    c = net.chorus("c1", chorus_config(resend_interval_ms=2_000))
    j = net.js("j1", resend_ms=2_000)
    a = c.send(b"chorus content")
    j.send_sync()  # history [a]: acknowledges a; not logged, not in the filter
    assert c.record.acknowledged == [a]
    assert c.record.sync_received == 1
    assert c.log() == [a] and c.channel.bloom.count == 0  # a sync never enters the filter

    m = j.send(b"js content")
    filter_before = j.js.filter()
    c.send_sync()
    assert j.record.acknowledged == [m]
    assert j.record.sync_received == 1
    assert j.log() == [a, m] and j.js.filter() == filter_before

    # A sync that references a message the receiver lacks reveals the gap.
    to_js = net.drop(lambda s, r, _d: (s, r) == ("c1", "j1"))
    hidden_c = c.send(b"chorus content js misses")
    net.undrop(to_js)
    to_chorus = net.drop(lambda s, r, _d: (s, r) == ("j1", "c1"))
    hidden_j = j.send(b"js content chorus misses")
    net.undrop(to_chorus)
    c.send_sync()
    j.send_sync()
    assert hidden_c in j.record.missing
    assert hidden_j in c.record.missing
    net.advance(3_000)  # both resend
    _assert_converged(net, {a, m, hidden_c, hidden_j})


def test_ephemeral_messages_understood_both_ways(net: MixedNetwork) -> None:
    c = net.chorus("c1")
    j = net.js("j1")
    filter_before = j.js.filter()
    out: list[bytes] = []
    c.channel.send_ephemeral(b"chorus is typing", net.now)
    for dg in c.channel.datagrams_to_send():
        assert dg.kind is MessageKind.EPHEMERAL
        out.append(dg.data)
        assert j.js.receive(dg.data, net.now) == "ephemeral"
    j._drain()
    assert [(s, body) for _, s, body in j.record.ephemeral] == [("c1", b"chorus is typing")]
    assert j.log() == [] and j.js.filter() == filter_before
    assert not j.record.delivered and not j.record.rejected

    j.send_ephemeral(b"js is typing")
    assert [(s, body) for _, s, body in c.record.ephemeral] == [("j1", b"js is typing")]
    assert c.log() == [] and c.channel.bloom.count == 0
    assert len(c.channel.outgoing) == 0
    unacknowledged, possibly = j.js.sweep_outgoing(net.now)
    assert unacknowledged == [] and possibly == []
    assert message_id_of(out[0]) != c.record.ephemeral[0][0]


# -- everything at once ----------------------------------------------------------------


def test_lossy_mixed_group_converges(harness: JsHarness) -> None:
    """20 % loss, resends, syncs, SDS-R on both sides, and a store as the spec assumes.

    The store matters for the reference: it asks for each repair only once, so a
    lost request leaves it waiting for a store (see
    ``test_reference_requests_a_repair_only_once``).
    """
    net = MixedNetwork(harness, loss=0.2, seed=7, store=True)
    cfg = chorus_config(
        resend_interval_ms=2_000,
        possibly_acked_resend_interval_ms=4_000,
        sync_interval_ms=3_000,
        max_resends=None,
    )
    nodes: list[Node] = [
        net.chorus("c1", cfg),
        net.chorus("c2", cfg),
        net.js("j1", resend_ms=2_000, sync_ms=3_000),
        net.js("j2", js_options(causal_history_size=2), resend_ms=2_000, sync_ms=3_000),
    ]
    sent: set[str] = set()
    for i in range(24):
        sent.add(nodes[i % 4].send(f"message {i} from {nodes[i % 4].name}".encode()))
        net.advance(300, step_ms=100)
    for _ in range(120):
        logs = net.logs()
        if all(set(log) == sent for log in logs.values()):
            break
        net.advance(1_000)
    _assert_converged(net, sent)
    assert net.dropped > 0
