"""Every listener a user can start is guarded: ``python -m sdk.sync serve`` (through
:func:`transports.stream.serve_tcp`) drops idle and trickling peers and refuses more
than its cap."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sdk.sync.framing import encode_frame
from tests.sync.helpers import TODO

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def cli_server(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """A ``python -m sdk.sync serve`` with 2 connections, 2 s idle, 0.5 s per frame."""
    server = subprocess.Popen(
        [sys.executable, "-m", "sdk.sync", "serve", "--db", str(tmp_path / "s.db"),
         "--schema", TODO, "--max-connections", "2", "--idle-timeout", "2",
         "--frame-deadline", "0.5"],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        async with asyncio.timeout(60):
            line = await asyncio.to_thread(server.stdout.readline)
        assert line.startswith("listening "), line
        host, _, port = line.split()[1].rpartition(":")
        yield host, int(port)
    finally:
        server.terminate()
        server.wait(10)


async def closed_after(reader: asyncio.StreamReader, limit: float) -> float:
    """Seconds until the server closes the connection (at most ``limit``)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.timeout(limit):
        with contextlib.suppress(ConnectionResetError):
            assert await reader.read() == b""
    return loop.time() - start


async def test_cli_server_refuses_over_its_cap_and_drops_idle_peers(
    cli_server: tuple[str, int],
) -> None:
    host, port = cli_server
    first = await asyncio.open_connection(host, port)
    second = await asyncio.open_connection(host, port)
    loop = asyncio.get_running_loop()
    opened = loop.time()
    third_reader, third_writer = await asyncio.open_connection(host, port)
    # The third is over the cap: closed at once, long before the idle deadline.
    assert await closed_after(third_reader, 1.9) < 1.9
    idle = [asyncio.ensure_future(closed_after(r, 8)) for r, _ in (first, second)]
    assert not any(task.done() for task in idle)  # the two admitted ones are still open
    await asyncio.gather(*idle)
    # Idle ones are dropped at the 2 s deadline (plus a watchdog tick), not before.
    assert 1.9 <= loop.time() - opened < 8
    for _, writer in (first, second, (third_reader, third_writer)):
        writer.close()


async def test_cli_server_drops_a_trickling_peer_at_the_frame_deadline(
    cli_server: tuple[str, int],
) -> None:
    host, port = cli_server
    reader, writer = await asyncio.open_connection(host, port)
    frame = encode_frame(b"x" * 1000)

    async def trickle() -> None:
        # One byte every 0.1 s keeps the connection far from idle (2 s).
        with contextlib.suppress(ConnectionError):
            for i in range(len(frame)):
                writer.write(frame[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0.1)

    sender = asyncio.ensure_future(trickle())
    try:
        # Cut at the 0.5 s frame deadline; the whole frame would take 100 s.
        assert await closed_after(reader, 8) < 6
    finally:
        sender.cancel()
        writer.close()
