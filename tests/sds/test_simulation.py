"""The simulated-network contract of issue #2: 10 participants, 2,000 messages,
30% loss, 5% duplication, reordering, a partition that heals, and a stand-in
store answering retrieval by id. Seeded and deterministic."""

from __future__ import annotations

import pytest

from sdk.sds import COMPACT, WAKU, BloomProfile, ChannelConfig, RepairConfig, decode_message
from sdk.testing.simulation import GroupSimulation, chat_through_outage
from transports.faults import FaultConfig

FAULTS = FaultConfig(loss=0.3, duplication=0.05, delay_ms=20, jitter_ms=80)


def sim_config(profile: BloomProfile) -> ChannelConfig:
    return ChannelConfig(
        bloom=profile,
        resend_interval_ms=2_000,
        possibly_acked_resend_interval_ms=4_000,
        sweep_interval_ms=200,
        sync_interval_ms=2_000,
        retrieval_interval_ms=1_000,
        lost_timeout_ms=0,
        max_resends=None,
        repair=RepairConfig(t_min_ms=3_000, t_max_ms=10_000),
    )


def run(profile: BloomProfile, n: int, messages: int, seed: int) -> GroupSimulation:
    sim = GroupSimulation(n, config=sim_config(profile), faults=FAULTS, seed=seed)
    ids = sim.node_ids
    for i in range(messages):
        if i == messages * 3 // 10:
            sim.partition(ids[: n // 2], ids[n // 2 :])
        if i == messages // 2:
            sim.heal()
        sim.send(ids[sim.rng.randrange(n)], f"message {i}".encode())
        sim.run_for(20)
    assert sim.run_until_quiet(600_000), "did not converge within 10 simulated minutes"
    return sim


@pytest.mark.parametrize("profile", [COMPACT, WAKU], ids=["compact", "waku"])
def test_ten_participants_two_thousand_messages(profile: BloomProfile) -> None:
    sim = run(profile, 10, 2_000, seed=2026)
    sent = sim.all_sent()
    assert len(sent) == 2_000
    assert sim.network.dropped > 0.25 * sim.network.published * 9  # the loss really happened

    dependencies = {
        mid: [e.message_id for e in decode_message(data).causal_history]
        for mid in sent
        for data in sim.store.lookup(sim.channel_id, [mid])  # type: ignore[union-attr]
    }
    reference_log = None
    for node, rec in sim.records.items():
        own = set(rec.sent)
        got = [e.message_id for e in rec.delivered]
        # Exactly once: every message of the others, no repeats.
        assert len(got) == len(set(got)), f"{node} delivered a message twice"
        assert set(got) == sent - own, f"{node} did not deliver everything"
        # Causal order: each delivery comes after its dependencies.
        seen = set(own)
        position = {mid: i for i, mid in enumerate(got)}
        for mid in got:
            for dep in dependencies[mid]:
                assert dep in seen or position.get(dep, len(got)) < position[mid], (
                    f"{node} delivered {mid[:8]} before its dependency {dep[:8]}"
                )
            seen.add(mid)
        log = sim.nodes[node].log.ids()
        reference_log = reference_log or log
        assert log == reference_log, f"{node}'s log differs"
        # Every message this participant sent ended acknowledged.
        assert own <= rec.acknowledged, f"{node} has unacknowledged messages"
        assert not rec.lost and not rec.expired


def test_simulation_is_deterministic() -> None:
    a = run(COMPACT, 5, 200, seed=7)
    b = run(COMPACT, 5, 200, seed=7)
    assert a.nodes["p00"].log.ids() == b.nodes["p00"].log.ids()
    assert [dict(c.stats) for c in a.nodes.values()] == [dict(c.stats) for c in b.nodes.values()]
    assert a.now == b.now
    c = run(COMPACT, 5, 200, seed=8)
    assert [dict(x.stats) for x in c.nodes.values()] != [dict(x.stats) for x in a.nodes.values()]


def test_converges_without_store_through_resend_and_repair() -> None:
    cfg = sim_config(COMPACT)
    sim = GroupSimulation(
        6, config=cfg, faults=FaultConfig(loss=0.2, jitter_ms=50), seed=3, with_store=False
    )
    for i in range(200):
        sim.send(sim.node_ids[i % 6], f"m{i}".encode())
        sim.run_for(50)
    assert sim.run_until_quiet(600_000)
    total = {k: sum(c.stats[k] for c in sim.nodes.values()) for k in ("repairs_sent", "resent")}
    assert total["resent"] + total["repairs_sent"] > 0


@pytest.mark.parametrize(
    ("loss", "outage_ms"), [(0.1, 1_000), (0.1, 5_000), (0.2, 1_000), (0.2, 5_000)]
)
def test_lossy_group_without_store_converges_soon_after_an_outage(
    loss: float, outage_ms: int
) -> None:
    # Issue 20's target with library defaults: 5 participants, no store, one cut
    # off and back; converged within 2 * outage + 5 s of its return. It took
    # 36-365 s when a gap was asked for only at the next sync period or SDS-R round.
    sim = GroupSimulation(
        5,
        faults=FaultConfig(loss=loss, delay_ms=20, jitter_ms=30),
        seed=1,
        with_store=False,
    )
    back_at = chat_through_outage(sim, sim.node_ids[0], outage_ms)
    target = 2 * outage_ms + 5_000
    assert sim.run_until_quiet(back_at + target - sim.now, check=sim.converged)


@pytest.mark.slow
def test_a_participant_cut_off_while_2100_messages_pass_gets_all_from_peers() -> None:
    # Issue 20 item 3, library defaults, no store: 2,100 messages (more than
    # cache_size) go by over 30 minutes while p00 is cut off. The repair cache
    # and the senders' offers keep what p00 has not shown it holds; before, both
    # dropped by count and by age (20 min), and p00 never got the oldest.
    sim = GroupSimulation(
        4, faults=FaultConfig(delay_ms=20, jitter_ms=30), seed=5, with_store=False
    )
    cut, *others = sim.node_ids
    sim.send(others[0], b"hello")
    sim.run_for(3_000)
    away = sim.now
    sim.partition([cut], others)
    missed = set()
    for i in range(2_100):
        missed.add(sim.send(others[i % 3], f"m{i}".encode()))
        sim.run_for(30 * 60_000 // 2_100)
    for peer in others:
        repair = sim.nodes[peer].repair
        assert repair is not None
        # Everything p00 missed; "hello", which everyone has shown, went by count.
        assert {mid for mid, _, _ in repair.cached_items()} == missed
    sim.heal()
    sim.reconnect(cut, away_since=away)
    assert sim.run_until_quiet(60_000, check=sim.converged)
    assert not sim.nodes[cut].lost()
