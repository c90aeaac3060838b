"""A participant with a long history: a join reads a bounded part of the log, and a
participant that stops reading stops nobody else."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path

from sdk.runtime import Delivery, Node, RuntimeOptions
from sdk.runtime.persistence import Persistence
from tests.runtime.helpers import FAST, eventually
from transports.memory import MemoryNetwork

WINDOW = 100
CONFIG = dataclasses.replace(FAST, log_window=WINDOW)


def write_history(path: Path, count: int) -> None:
    """Participant ``p``'s channel ``room`` with ``count`` messages of ``peer`` in its
    log, written as rows (fast), as the runtime would have written them."""
    Persistence(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO meta (key, value) VALUES ('participant_id', 'p')")
    db.execute(
        "INSERT INTO channel (channel_id, participant_id, lamport, received) "
        "VALUES ('room', 'p', ?, ?)",
        (count, count),
    )
    db.executemany(
        "INSERT INTO log (channel_id, seq, message_id, lamport, sender_id, data) "
        "VALUES ('room', ?, ?, ?, 'peer', x'00')",
        ((i, f"{i:064x}", i) for i in range(1, count + 1)),
    )
    db.commit()
    db.close()


async def _join_steps(path: Path) -> tuple[int, Node]:
    """SQLite virtual-machine steps (in thousands) spent by ``join``, and the node."""
    node = Node(MemoryNetwork().transport("p"), "p", db=path, config=CONFIG)
    await node.__aenter__()
    assert node.persistence is not None
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # go on

    node.persistence._db.set_progress_handler(count, 1000)
    await node.join("room")
    node.persistence._db.set_progress_handler(None, 0)
    return steps[0], node


async def test_a_join_reads_the_same_whatever_the_length_of_the_log(tmp_path: Path) -> None:
    short, long = tmp_path / "short.db", tmp_path / "long.db"
    # The short log already holds more than what a join reads by configuration (the
    # window, the SDS-R cache's 2,000, the store-confirm backlog's 1,000); the long
    # one ten times that.
    write_history(short, 4_000)
    write_history(long, 40_000)
    short_steps, a = await _join_steps(short)
    long_steps, b = await _join_steps(long)
    try:
        # Reading the whole log (or counting it) costs ten times more here.
        assert long_steps <= 1.5 * short_steps + 5, (short_steps, long_steps)
        channel = b.channels["room"]
        assert channel.sync_status.received == 40_000
        log = channel.core.log
        assert len(log) <= WINDOW + (WINDOW >> 4) + 1
        # The oldest message is still known as delivered: through the archive.
        assert "1".zfill(64) not in log and log.has("1".zfill(64), 1)
        assert not log.has("f" * 64, 1)
    finally:
        await a.close()
        await b.close()


async def test_a_participant_that_stops_reading_stops_no_sender() -> None:
    """No database, a reader that never reads: its own queue and subscription fill,
    its copies are dropped and counted, the others keep talking."""
    net = MemoryNetwork(max_pending=20)
    options = RuntimeOptions(event_queue_limit=20)
    a = Node(net.transport("a"), "a", config=FAST, options=options)
    b = Node(net.transport("b"), "b", config=FAST, options=options)
    idle = Node(net.transport("idle"), "idle", config=FAST, options=options)
    async with a, b, idle:
        ca, cb = await a.join("room"), await b.join("room")
        await idle.join("room")  # and never reads its events
        got: list[bytes] = []

        async def read() -> None:
            async for event in cb.events():
                if isinstance(event, Delivery):
                    got.append(event.content)

        reader = asyncio.create_task(read())
        for k in range(300):
            await asyncio.wait_for(ca.send(f"m{k}".encode()), 5)
        assert await eventually(lambda: len(got) == 300)
        assert net.dropped_full["idle"] > 0
        reader.cancel()
