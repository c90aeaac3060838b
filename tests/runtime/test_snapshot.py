"""Snapshot export/restore of a channel: a restored channel behaves like the original."""

from __future__ import annotations

import random

from sdk.sds import COMPACT, ChannelConfig, MessageChannel, MessageDelivered, RepairConfig
from sdk.sds.snapshot import export_snapshot, restore_snapshot
from sdk.testing.simulation import GroupSimulation
from transports.faults import FaultConfig

CONFIG = ChannelConfig(
    bloom=COMPACT,
    resend_interval_ms=2_000,
    sweep_interval_ms=200,
    sync_interval_ms=2_000,
    retrieval_interval_ms=1_000,
    repair=RepairConfig(t_min_ms=3_000, t_max_ms=10_000),
)


def _restored(channel: MessageChannel, now: int) -> MessageChannel:
    fresh = MessageChannel(
        channel.channel_id, channel.participant_id, now, channel.config, rng=random.Random(1)
    )
    restore_snapshot(fresh, export_snapshot(channel), now, resend_now=False)
    return fresh


def test_round_trip_preserves_durable_state() -> None:
    sim = GroupSimulation(4, config=CONFIG, faults=FaultConfig(loss=0.4), seed=3, with_store=False)
    for i in range(40):
        sim.send(sim.node_ids[i % 4], f"m{i}".encode())
        sim.run_for(50)
    for channel in sim.nodes.values():
        snap = export_snapshot(channel)
        again = export_snapshot(_restored(channel, sim.now))
        assert again.log == snap.log
        assert again.heads == snap.heads
        assert again.outgoing == snap.outgoing
        assert again.missing == snap.missing
        assert again.lost == snap.lost
        assert again.bloom_recent == snap.bloom_recent
        assert again.repair_cache == snap.repair_cache
        assert {r.message_id for r in again.incoming} == {r.message_id for r in snap.incoming}
        assert again.lamport_timestamp >= snap.lamport_timestamp


def test_restored_participant_converges_and_never_redelivers() -> None:
    sim = GroupSimulation(3, config=CONFIG, faults=FaultConfig(loss=0.3), seed=5, with_store=False)
    for i in range(30):
        sim.send(sim.node_ids[i % 3], f"m{i}".encode())
        sim.run_for(40)
    victim = sim.node_ids[1]
    before = {e.message_id for e in sim.records[victim].delivered}
    sim.nodes[victim] = _restored(sim.nodes[victim], sim.now)
    for i in range(30, 40):
        sim.send(sim.node_ids[i % 3], f"m{i}".encode())
        sim.run_for(40)
    assert sim.run_until_quiet(300_000, sim.converged)
    after = [e.message_id for e in sim.records[victim].delivered]
    assert len(after) == len(set(after)), "a message was delivered twice"
    assert before <= set(after)


def test_restore_delivers_buffered_message_whose_dependency_was_logged() -> None:
    alice = MessageChannel("c", "alice", 0, CONFIG)
    bob = MessageChannel("c", "bob", 0, CONFIG)
    alice.send(b"one", 1)
    first = alice.datagrams_to_send()[0].data
    alice.send(b"two", 2)
    second = alice.datagrams_to_send()[0].data
    bob.receive(second, 3)
    assert len(bob.incoming) == 1
    snap = export_snapshot(bob)
    fresh = MessageChannel("c", "bob", 4, CONFIG)
    restore_snapshot(fresh, snap, 4)
    fresh.receive(first, 5)
    delivered = []
    while (ev := fresh.next_event()) is not None:
        if isinstance(ev, MessageDelivered):
            delivered.append(ev.content)
    assert delivered == [b"one", b"two"]
