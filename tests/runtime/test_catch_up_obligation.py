"""Catch-up is an obligation, with real processes: ``store-node serve``, Mosquitto and a
participant subprocess (``tests/runtime/catch_up_peer.py``) that restarts.

* a store node down when the participant restarts: it comes back later and the
  participant gets every missed message, alone, its status going "store
  unreachable", "catching up", "in sync" in that order;
* the same across two restarts with the store down: nothing owed is forgotten;
* the participant killed with SIGKILL in the middle of a catch-up: after a
  restart every message is delivered exactly once;
* a store node that does not archive the channel: a typed event, never "in
  sync", and no publishing again of what it will never hold.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk.runtime import (
    CatchUpState,
    ChannelNotArchived,
    Node,
    RuntimeOptions,
    SyncState,
)
from tests.conftest import PrivateMosquitto, free_port, require_module
from tests.reliability.harness import StoreNodeProcess, archive_count, write_store_config
from tests.runtime.helpers import Collector, eventually

require_module("paho.mqtt")
require_module("grpc")

from sdk.store.grpc import GrpcStoreClient  # noqa: E402 - after the checks above
from tests.runtime.catch_up_peer import CONFIG  # noqa: E402
from transports.mqtt import MqttTransport  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N = 200
pytestmark = pytest.mark.integration


class Scene:
    """A private broker, a store node of ``channels`` on a fixed port, and Bob's files."""

    def __init__(self, broker: PrivateMosquitto, tmp_path: Path, channels: list[str]) -> None:
        self.broker = broker
        self.tmp = tmp_path
        self.grpc = f"127.0.0.1:{free_port()}"
        self.config = tmp_path / "store.toml"
        write_store_config(
            self.config,
            backend="sqlite",
            broker_port=broker.port,
            channels=channels,
            grpc_listen=self.grpc,
        )
        self.store = StoreNodeProcess(self.config, tmp_path / "store.log")
        self.db = tmp_path / "bob.db"
        self.out = tmp_path / "bob.out"
        self.status = tmp_path / "bob.status"
        self.peers: list[subprocess.Popen[bytes]] = []

    async def start_store(self) -> None:
        self.store.start()
        await self.store.wait_started(60)

    async def first_join(self) -> None:
        """Bob joins once (his database then holds the channel) and leaves."""
        transport = MqttTransport.from_url(self.broker.url)
        await transport.connect()
        async with Node(transport, "bob", db=self.db, config=CONFIG) as bob:
            await bob.join("room")
        await transport.close()

    async def alice_sends(self, count: int) -> list[str]:
        """Alice sends ``count`` messages, waits until the store archived them, leaves."""
        transport = MqttTransport.from_url(self.broker.url)
        await transport.connect()
        async with Node(transport, "alice", config=CONFIG) as alice:
            room = await alice.join("room")
            sent = [f"alice-{k}" for k in range(count)]
            for text in sent:
                await room.send(text.encode())
            assert await eventually(lambda: archive_count(self.config) >= count, timeout=60)
        await transport.close()
        return sent

    def bob(self, *extra: str) -> subprocess.Popen[bytes]:
        args = [
            sys.executable,
            "-m",
            "tests.runtime.catch_up_peer",
            "--broker",
            self.broker.url,
            "--store",
            self.grpc,
            "--db",
            str(self.db),
            "--out",
            str(self.out),
            "--status",
            str(self.status),
            *extra,
        ]
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.peers.append(proc)
        return proc

    def lines(self, path: Path) -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    def catch_up_states(self) -> list[str]:
        """Bob's catch-up states in the order he reported them, repeats collapsed."""
        states: list[str] = []
        for line in self.lines(self.status):
            state = line.split()[0]
            if not states or states[-1] != state:
                states.append(state)
        return states

    def saw(self, state: CatchUpState, after: int = 0) -> Callable[[], bool]:
        return lambda: any(
            line.split()[0] == state.value for line in self.lines(self.status)[after:]
        )

    def delivered(self) -> list[tuple[str, str]]:
        """(message id, content) of every delivery Bob processed, across his runs."""
        return [(p[1], p[2]) for p in (line.split() for line in self.lines(self.out))]

    async def finish(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        try:
            rc = await asyncio.to_thread(proc.wait, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        _out, err = proc.communicate()
        assert rc == 0, (self.catch_up_states(), len(self.delivered()), err.decode()[-3000:])

    def close(self) -> None:
        for proc in self.peers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.store.kill()


@pytest.fixture
def scene(
    private_broker: Callable[[], PrivateMosquitto], tmp_path: Path
) -> Callable[[list[str]], Scene]:
    made: list[Scene] = []

    def make(channels: list[str]) -> Scene:
        s = Scene(private_broker(), tmp_path, channels)
        made.append(s)
        return s

    yield make  # type: ignore[misc]
    for s in made:
        s.close()


async def test_a_store_down_at_restart_is_caught_up_from_when_it_returns(scene) -> None:
    s = scene(["room"])
    await s.start_store()
    await s.first_join()
    sent = await s.alice_sends(N)
    s.store.kill()  # Alice is gone, the store node too: Bob restarts alone

    bob = s.bob("--expect", str(N))
    assert await eventually(s.saw(CatchUpState.STORE_UNREACHABLE), timeout=30), bob.poll()
    await asyncio.sleep(3)  # the outage goes on (about 5 s with the store's start)
    await s.start_store()
    await s.finish(bob)

    assert sorted(c for _, c in s.delivered()) == sorted(sent)
    assert len({m for m, _ in s.delivered()}) == N  # each once
    states = s.catch_up_states()
    unreachable = states.index("store_unreachable")
    assert states[unreachable:][-3:] == ["store_unreachable", "catching_up", "idle"], states
    assert s.lines(s.status)[-1] == "idle synced"


async def test_a_window_owed_across_two_restarts_with_the_store_down_is_kept(scene) -> None:
    s = scene(["room"])
    await s.start_store()
    await s.first_join()
    sent = await s.alice_sends(N)
    s.store.kill()

    for _ in range(2):  # two runs of Bob with the store down, each ended by SIGTERM
        seen = len(s.lines(s.status))
        bob = s.bob()
        assert await eventually(s.saw(CatchUpState.STORE_UNREACHABLE, seen), timeout=30)
        # Stay a while: the last activity moves past the owed window (overlap 0.5 s).
        await asyncio.sleep(1.5)
        bob.send_signal(signal.SIGTERM)
        bob.wait(30)
    assert not s.delivered()

    await s.start_store()
    await s.finish(s.bob("--expect", str(N)))
    assert sorted(c for _, c in s.delivered()) == sorted(sent)
    assert len({m for m, _ in s.delivered()}) == N


async def test_a_kill_in_the_middle_of_a_catch_up_delivers_everything_once(scene) -> None:
    s = scene(["room"])
    await s.start_store()
    await s.first_join()
    sent = await s.alice_sends(N)

    # Ten messages a page, 0.1 s after each: the catch-up takes about 2 s.
    bob = s.bob("--page-size", "10", "--slow-pages", "0.1")
    assert await eventually(lambda: len(s.delivered()) >= 60, timeout=30), bob.poll()
    os.kill(bob.pid, signal.SIGKILL)
    bob.wait()
    partial = len(s.delivered())
    assert partial < N, "the catch-up ended before the kill"
    await asyncio.sleep(1)  # later than the overlap after Bob's last activity

    await s.finish(s.bob("--expect", str(N)))
    delivered = s.delivered()
    ids = [m for m, _ in delivered]
    assert len(ids) == len(set(ids)), "a message was delivered twice"
    assert sorted(c for _, c in delivered) == sorted(sent), f"killed after {partial}"


async def test_a_store_that_does_not_archive_the_channel_says_so(scene) -> None:
    s = scene(["another-channel"])
    await s.start_store()
    transport = MqttTransport.from_url(s.broker.url)
    await transport.connect()
    store = GrpcStoreClient(s.grpc, timeout=2.0)
    options = RuntimeOptions(
        store_timeout=2.0,
        store_confirm_interval=0.1,
        catch_up_retry_min=0.1,
        catch_up_retry_max=0.5,
        first_join_history=60,
    )
    async with Node(transport, "alice", store=store, config=CONFIG, options=options) as alice:
        room = await alice.join("room")
        events = Collector(room)
        for k in range(20):
            await room.send(f"alice-{k}".encode())
        assert await eventually(
            lambda: any(isinstance(e, ChannelNotArchived) for e in events.events), timeout=30
        )
        assert room.sync_status.catch_up is CatchUpState.NOT_ARCHIVED
        assert room.sync_status.state is SyncState.SYNCING
        # The catch-up is retried (the operator may add the channel), the event not repeated.
        assert await eventually(lambda: room.stats["catch_up_retries"] >= 2, timeout=30)
        assert await eventually(lambda: not room._unconfirmed, timeout=10)
        assert room.stats["store_republished"] == 0
        assert len([e for e in events.events if isinstance(e, ChannelNotArchived)]) == 1
        assert room.sync_status.state is SyncState.SYNCING
        await events.stop()
    await transport.close()
    await store.close()
