"""``python -m sdk.sync.bamboo_p2p replicate`` as a new user meets it (issue 30.3).

Before: a log the peer does not have (or a range past its end) waited 38 s and printed
``{"complete": false, "peer_reason": 128}`` with no word on what 128 means; a malformed
``--author`` was a ``ValueError`` traceback; nothing said how much moved.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sdk.documents import KeyPair
from sdk.sync.bamboo_p2p import CancelReason, SqliteLogStore, append_entry
from sdk.sync.bamboo_p2p.__main__ import STALL_TIMEOUT, main
from sdk.sync.bamboo_p2p.driver import serve_bamboo
from transports.stream import TcpStream, serve_tcp, stop_tcp_server

REPO = Path(__file__).resolve().parents[2]
KEY = KeyPair.from_private_key(bytes(range(32)))
AUTHOR = KEY.public_key.hex()
N = 20
PAYLOADS = [b"entry %d of the served log" % i for i in range(N)]


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[str]:
    store = SqliteLogStore(str(tmp_path / "server.db"))
    for payload in PAYLOADS:
        append_entry(store, KEY, 0, payload)
    store.flush()
    tasks: set[asyncio.Task[object]] = set()

    async def handle(stream: TcpStream) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        await serve_bamboo(store, stream)

    server = await serve_tcp(handle, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        await stop_tcp_server(server, tasks)
        store.close()


async def replicate(tmp_path: Path, *args: str) -> tuple[int, dict[str, object], str]:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sdk.sync.bamboo_p2p", "replicate", "--db",
         str(tmp_path / "phone.db"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


async def test_a_range_reports_what_moved_and_names_the_cancel_code(
    tmp_path: Path, peer: str
) -> None:
    code, out, stderr = await replicate(
        tmp_path, "--author", AUTHOR, "--start", "1", "--end", str(N), peer
    )
    assert code == 0 and stderr == "", stderr
    assert out["complete"] is True
    reason = CancelReason(out["peer_reason"])
    assert reason in (CancelReason.END_OF_RANGE, CancelReason.CONFIRM)
    assert out["peer_reason_name"] == reason.name.lower()
    assert out["peer_reason_meaning"] == reason.meaning
    assert out["entries_received"] == out["payloads_received"] == N
    assert out["entries_sent"] == out["payloads_sent"] == out["payload_bytes_sent"] == 0
    assert out["payload_bytes_received"] == sum(len(p) for p in PAYLOADS)
    assert isinstance(out["wire_bytes_received"], int)
    assert out["wire_bytes_received"] > sum(len(p) for p in PAYLOADS)
    assert isinstance(out["wire_bytes_sent"], int) and out["wire_bytes_sent"] > 0


@pytest.mark.parametrize(
    ("author", "start", "end", "missing"),
    [
        (KeyPair.from_private_key(bytes(range(1, 33))).public_key.hex(), 1, 5, 1),  # no log
        (AUTHOR, N + 5, N + 10, N + 1),  # past the end of the peer's log
    ],
    ids=["unknown-log", "past-the-end"],
)
async def test_a_log_or_range_the_peer_lacks_fails_fast_in_words(
    tmp_path: Path, peer: str, author: str, start: int, end: int, missing: int
) -> None:
    assert STALL_TIMEOUT <= 5
    code, out, stderr = await replicate(
        tmp_path, "--author", author, "--start", str(start), "--end", str(end), peer
    )
    assert code == 1
    assert out["complete"] is False and out["stalled"] is True
    # We gave up (the peer confirms with 131), not the peer after its own 30 s (128).
    assert out["peer_reason"] == int(CancelReason.CONFIRM)
    assert isinstance(out["seconds"], float) and out["seconds"] < 20  # was 38 s
    detail = out["detail"]
    assert isinstance(detail, str)
    assert f"neither side holds entry {missing}, so the peer does not have log" in detail
    assert f"/0 from entry {missing} on" in detail
    assert stderr == f"python -m sdk.sync.bamboo_p2p: replicate: {detail}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--author", "xyz", "--start", "1"], "--author must be an ed25519 public key"),
        (["--author", "ab" * 31, "--start", "1"], "--author must be an ed25519 public key"),
        (["--start", "0"], "--start must be a sequence number"),
        (["--start", "5", "--end", "2"], "--end must be at least --start (5), got 2"),
        (["--start", "2", "--lower", "3"], "--lower must be in 1..--start (2), got 3"),
        (["--start", "1", "--log-id", "-1"], "--log-id must be in 0..2^64-1"),
        (["--start", "1", "--offset", "-4"], "--offset must not be negative"),
        (["--start", "1", "--stall-timeout", "0"], "--stall-timeout must be a positive"),
        (["--start", "x"], "argument --start: invalid int value: 'x'"),
        (["--start", "1", "--peer-typo"], "unrecognized arguments: --peer-typo"),
        (["--start", "1", "--db", "/nonexistent-folder/phone.db"], "--db /nonexistent-folder"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    base = ["replicate", "--db", str(tmp_path / "phone.db"), "--author", AUTHOR]
    with pytest.raises(SystemExit) as exit_:
        main([*base, *args, "127.0.0.1:1"])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("python -m sdk.sync.bamboo_p2p: ")
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err


def test_a_peer_that_is_not_host_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["replicate", "--db", "phone.db", "--author", AUTHOR, "--start", "1", "nowhere"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "python -m sdk.sync.bamboo_p2p: PEER must be HOST:PORT, got 'nowhere'\n"
    )


def test_every_cancel_code_is_named_and_explained_in_the_docs() -> None:
    text = (REPO / "docs" / "bamboo-p2p.md").read_text()
    rows = dict(re.findall(r"^\| (\d{3}) \| `(\w+)` \| [^|]+ \|", text, re.M))
    assert {int(code): name for code, name in rows.items()} == {
        int(reason): reason.name for reason in CancelReason
    }
    assert all(reason.meaning for reason in CancelReason)
