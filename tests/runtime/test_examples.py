"""The demo runs and converges, live over the embedded broker and simulated."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from examples import demo
from tests.conftest import require_module

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_live_demo_over_the_embedded_broker_converges(capsys: pytest.CaptureFixture[str]) -> None:
    require_module("amqtt")
    # The analytics step has its own test (tests/e2e/test_archive_report.py).
    assert (
        demo.main(["--participants", "3", "--messages", "20", "--timeout", "60", "--no-analytics"])
        == 0
    )
    assert "CONVERGED" in capsys.readouterr().out


def test_simulated_demo_converges(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--simulated", "--messages", "30"]) == 0
    assert "CONVERGED" in capsys.readouterr().out


@pytest.mark.integration
async def test_two_terminals_chat_over_mosquitto(private_broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    require_module("paho.mqtt")
    broker = private_broker()

    async def terminal(name: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "examples" / "chat.py"),  # as the README runs it
            "--name",
            name,
            "--db",
            str(tmp_path / f"{name}.db"),
            "--broker",
            broker.url,
            cwd=tmp_path,  # outside the checkout
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )

    async def read_until(proc: asyncio.subprocess.Process, needle: str) -> str:
        assert proc.stdout is not None
        seen = ""
        async with asyncio.timeout(30):
            while needle not in seen:
                line = await proc.stdout.readline()
                if not line:
                    break
                seen += line.decode()
        return seen

    alice, bob = await terminal("alice"), await terminal("bob")
    assert "joined #lobby" in await read_until(alice, "joined")
    assert "joined #lobby" in await read_until(bob, "joined")
    assert alice.stdin is not None and bob.stdin is not None
    alice.stdin.write(b"hi bob\n")
    await alice.stdin.drain()
    assert "[alice] hi bob" in await read_until(bob, "[alice] hi bob")
    alice.stdin.write(b"/status\n")
    await alice.stdin.drain()
    assert "in sync" in await read_until(alice, "in sync")
    bob.stdin.write(b"hello alice\n")
    await bob.stdin.drain()
    assert "[bob] hello alice" in await read_until(alice, "[bob] hello alice")
    assert "✓ hi bob" in await read_until(alice, "✓ hi bob")
    for proc in (alice, bob):
        assert proc.stdin is not None
        proc.stdin.write(b"/quit\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.wait(), 20) == 0


def test_chat_status_is_said_in_words() -> None:
    from examples.chat import describe_status
    from sdk.runtime import SyncState, SyncStatus

    synced = describe_status(SyncStatus(SyncState.SYNCED, 12, 0, 0), {}, 0)
    assert synced == (
        "in sync; 12 messages received from others; everything you sent is acknowledged"
    )
    syncing = describe_status(
        SyncStatus(SyncState.SYNCING, 1, 3, 1), {"catch_up_retrieved": 5, "publish_failed": 1}, 2
    )
    assert syncing == (
        "catching up: 3 messages missing, being fetched; 1 message received from others; "
        "1 message lost for good; 2 messages of yours awaiting acknowledgement; "
        "5 messages fetched from the store; 1 publish failed (retried)"
    )
