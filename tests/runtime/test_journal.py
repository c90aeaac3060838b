"""The core's durable-change journal (``sdk.sds.journal``): replaying what a live
channel drained into a fresh channel gives exactly the live channel's snapshot,
whatever the network did (hypothesis drives loss, duplication, reordering, timers)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.runtime import Node
from sdk.sds import ChannelConfig, MessageChannel, RepairConfig
from sdk.sds.bloom import COMPACT
from sdk.sds.journal import (
    ClockAdvanced,
    HeadsChanged,
    Logged,
    OutgoingRemoved,
    OutgoingSaved,
)
from sdk.sds.snapshot import export_snapshot
from tests.runtime.helpers import FAST, eventually
from tests.runtime.journal_replay import replay
from transports.faults import FaultConfig
from transports.memory import MemoryNetwork

CONFIG = ChannelConfig(
    bloom=COMPACT,
    causal_history_size=1,
    resend_interval_ms=300,
    possibly_acked_resend_interval_ms=600,
    max_resends=2,
    sweep_interval_ms=100,
    sync_interval_ms=500,
    retrieval_interval_ms=200,
    lost_timeout_ms=1_500,
    max_incoming_buffer=8,
    repair=RepairConfig(t_min_ms=200, t_max_ms=800, cache_size=4),
)

# One step of the world: (kind, participant, index, amount).
step = st.tuples(
    st.sampled_from(["send", "deliver", "drop", "duplicate", "tick", "drain"]),
    st.integers(0, 2),
    st.integers(0, 50),
    st.integers(1, 900),
)


def _run(steps: list[tuple[str, int, int, int]], seed: int) -> list[object]:
    now = 1_000
    names = ["alice", "bob", "carol"]
    rng = random.Random(seed)
    channels = [
        MessageChannel(
            "room", n, now, CONFIG, rng=random.Random(rng.getrandbits(32)), journal=(i == 0)
        )
        for i, n in enumerate(names)
    ]
    watched = channels[0]
    wire: list[tuple[int, bytes]] = []  # (receiver, bytes) in flight
    drained: list[object] = []

    def collect() -> None:
        for i, ch in enumerate(channels):
            for dg in ch.datagrams_to_send():
                wire.extend((j, dg.data) for j in range(len(channels)) if j != i)
            while ch.next_event() is not None:
                pass

    counter = 0
    for kind, who, index, amount in steps:
        if kind == "send":
            counter += 1
            channels[who].send(f"{names[who]} {counter}".encode(), now)
        elif kind == "deliver" and wire:
            receiver, data = wire.pop(index % len(wire))
            channels[receiver].receive(data, now)
        elif kind == "drop" and wire:
            wire.pop(index % len(wire))
        elif kind == "duplicate" and wire:
            wire.append(wire[index % len(wire)])
        elif kind == "tick":
            now += amount
            for ch in channels:
                timer = ch.get_timer()
                if timer is not None and timer <= now:
                    ch.handle_timer(now)
        elif kind == "drain":
            drained += watched.drain_changes()
        collect()
        if kind == "deliver" and index % 7 == 0 and len(watched.log):
            watched.set_retrieval_hint(watched.log.ids()[-1], b"hint")
    drained += watched.drain_changes()

    fresh = MessageChannel("room", "alice", 0, CONFIG)
    replay(fresh, drained)  # type: ignore[arg-type]
    live, again = export_snapshot(watched), export_snapshot(fresh)
    # Beyond cache_size the live repair cache also keeps, in memory only, what
    # some peer has not shown it holds (sdk/sds/repair.py); the journal, like a
    # restart, keeps the newest cache_size of it.
    assert CONFIG.repair is not None
    kept = min(len(live.repair_cache), CONFIG.repair.cache_size)
    assert again.repair_cache == live.repair_cache[len(live.repair_cache) - kept :]
    assert dataclasses.replace(again, repair_cache=[]) == dataclasses.replace(live, repair_cache=[])
    return drained


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(step, max_size=120), st.integers(0, 2**32 - 1))
def test_replaying_drained_changes_rebuilds_the_live_snapshot(
    steps: list[tuple[str, int, int, int]], seed: int
) -> None:
    _run(steps, seed)


def test_a_resend_after_a_later_send_keeps_the_buffer_order() -> None:
    """Send, send again, then the first is resent: replay updates it in place."""
    _run([("send", 0, 0, 1), ("tick", 0, 0, 150), ("send", 0, 0, 1), ("tick", 0, 0, 150)], 0)


def test_a_busy_run_journals_every_kind_of_change() -> None:
    """One long seeded run that reaches sends, deliveries, acknowledgements,
    expiry, missing, lost and buffered messages (so the property above is not vacuous)."""
    rng = random.Random(7)
    kinds = ["send"] * 3 + ["deliver"] * 6 + ["drop"] * 2 + ["duplicate", "tick", "tick", "drain"]
    steps = [
        (rng.choice(kinds), rng.randrange(3), rng.randrange(50), rng.randrange(1, 900))
        for _ in range(2_000)
    ]
    kinds = {type(c).__name__ for c in _run(steps, 7)}
    assert kinds >= {
        "Logged",
        "HintSet",
        "OutgoingSaved",
        "OutgoingRemoved",
        "IncomingAdded",
        "IncomingRemoved",
        "MissingSaved",
        "MissingRemoved",
        "LostAdded",
        "LostRemoved",
        "FilterInserted",
        "ClockAdvanced",
        "HeadsChanged",
    }
    # And the journal of a channel that is not journaling stays empty.
    plain = MessageChannel("room", "x", 0, CONFIG)
    plain.send(b"hi", 1)
    assert plain.drain_changes() == []


def test_drain_reports_clock_and_heads_once() -> None:
    channel = MessageChannel("room", "alice", 1_000, CONFIG, journal=True)
    mid = channel.send(b"one", 1_000)
    changes = channel.drain_changes()
    kinds = [type(c) for c in changes]
    assert kinds == [Logged, OutgoingSaved, ClockAdvanced, HeadsChanged]
    assert changes[-1] == HeadsChanged((mid,), ())
    assert channel.drain_changes() == []  # nothing changed since
    channel.abandon(mid, "refused")
    assert channel.drain_changes() == [OutgoingRemoved(mid, "failed:refused")]


async def test_the_database_holds_exactly_the_live_snapshot(tmp_path: Path) -> None:
    """The runtime writes only drained changes; loading them back gives the live state."""
    net = MemoryNetwork(FaultConfig(loss=0.3, duplication=0.1, jitter_ms=20), seed=3)
    config = dataclasses.replace(FAST, lost_timeout_ms=400, max_resends=3)
    nodes = [
        Node(net.transport(n), n, db=tmp_path / f"{n}.db", config=config) for n in ("a", "b", "c")
    ]
    rooms = [await node.join("room") for node in nodes]
    for k in range(30):
        await rooms[k % 3].send(f"m{k}".encode())
        await asyncio.sleep(0.005)
    # Mid-protocol (losses repaired or not yet, resends going on): any moment will do,
    # as long as each room has taken in most of the traffic.
    assert await eventually(lambda: all(len(room.core.log) >= 20 for room in rooms))
    for node, room in zip(nodes, rooms, strict=True):
        node.mark_dirty(room)
        await node._flushed()  # what the live core holds is committed
        live = export_snapshot(room.core)
        assert node.persistence is not None
        stored = node.persistence.load_channel(
            "room", bloom_keep=len(live.bloom_recent), cache_size=config.repair.cache_size
        )
        assert stored is not None
        saved = stored.snapshot
        assert saved.lamport_timestamp == live.lamport_timestamp
        assert saved.log == live.log
        assert (saved.heads, saved.referenced) == (live.heads, live.referenced)
        assert sorted(saved.outgoing, key=str) == sorted(live.outgoing, key=str)
        assert sorted(saved.incoming, key=str) == sorted(live.incoming, key=str)
        assert sorted(saved.missing, key=str) == sorted(live.missing, key=str)
        assert saved.lost == live.lost
        assert saved.bloom_recent == live.bloom_recent
    for node in nodes:
        await node.close()
