"""A participant killed with SIGKILL mid-stream and restarted loses nothing and repeats nothing.

Bob runs as a subprocess (``tests/runtime/sigkill_peer.py``) against a
private Mosquitto; Alice runs in the test. Bob is killed twice while both are
sending, and restarted with the same database. Afterwards:

* Bob's record of processed deliveries holds each of Alice's messages exactly once;
* Alice delivered each of Bob's messages exactly once (a message Bob sent
  before a crash is neither lost nor sent again as a new message).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.runtime import Node
from tests.conftest import require_module
from tests.runtime.helpers import FAST, Collector, eventually

require_module("paho.mqtt")

from transports.mqtt import MqttTransport  # noqa: E402 - after the check above

REPO = Path(__file__).resolve().parents[2]
N = 60


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line]


@pytest.mark.integration
async def test_sigkill_then_restart_loses_nothing_and_delivers_nothing_twice(
    private_broker, tmp_path: Path
) -> None:
    broker = private_broker()
    out = tmp_path / "bob.out"
    args = [
        sys.executable,
        "-m",
        "tests.runtime.sigkill_peer",
        "--broker",
        broker.url,
        "--db",
        str(tmp_path / "bob.db"),
        "--out",
        str(out),
        "--name",
        "bob",
        "--count",
        str(N),
        "--expect",
        str(N),
        "--interval",
        "0.05",
    ]
    transport = MqttTransport.from_url(broker.url)
    await transport.connect()
    alice = Node(transport, "alice", db=tmp_path / "alice.db", config=FAST)
    room = await alice.join("room")
    collector = Collector(room)

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    kills_done = asyncio.Event()

    async def alice_chats() -> None:
        for k in range(N):
            if k == N - 10:
                # The last ten only after both kills: the kills are mid-stream
                # however slowly Bob restarts (no race against the clock).
                await kills_done.wait()
            await room.send(f"alice-{k}".encode())
            await asyncio.sleep(0.06)

    bob = spawn()
    # Bob creates his output file once he has joined; then both chat.
    assert await eventually(out.exists, timeout=30), bob.poll()
    chat = asyncio.create_task(alice_chats())
    kills = 0
    for _ in range(2):
        # Kill once Bob has made progress since he (re)started.
        target = len(_lines(out)) + 6
        assert await eventually(lambda t=target: len(_lines(out)) >= t, timeout=30), bob.poll()
        os.kill(bob.pid, signal.SIGKILL)
        bob.wait()
        kills += 1
        bob = spawn()
    assert not chat.done(), "Alice finished before the second kill: not mid-stream"
    kills_done.set()
    await chat
    rc = await asyncio.to_thread(bob.wait, 90)
    _stdout, stderr = bob.communicate()
    assert rc == 0, stderr.decode()[-3000:]
    assert kills == 2

    processed = [line.split() for line in _lines(out)]
    ids = [p[1] for p in processed]
    contents = sorted(p[2] for p in processed)
    assert len(ids) == len(set(ids)), "Bob processed a delivery twice"
    assert contents == sorted(f"alice-{k}" for k in range(N)), "Bob lost or repeated a message"
    seqs = [int(p[0]) for p in processed]
    assert seqs == sorted(seqs)

    def alice_has_all() -> bool:
        return sum(1 for e in collector.delivered if e.sender_id == "bob") >= N

    assert await eventually(alice_has_all, timeout=30)
    from_bob = sorted(e.content.decode() for e in collector.delivered if e.sender_id == "bob")
    assert from_bob == sorted(f"bob-{k}" for k in range(N)), (
        "a message of Bob's was lost or re-sent"
    )
    await collector.stop()
    await alice.close()
    await transport.close()
