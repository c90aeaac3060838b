"""The sync examples the README points to run as a user runs them and do what they say.

Each runs by its file's path from a folder outside the checkout, with no PYTHONPATH
(issue 30.4): ``python -m examples.X`` worked only from the checkout's root, since
py-libp2p installs a top-level ``examples`` package of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(name: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as elsewhere:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / f"{name}.py")],
            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(180)
def test_a_phone_catches_up_its_todo_list_from_the_store_node() -> None:
    out = _run("sync_catch_up")
    assert "phone after catch-up:" in out
    live = next(line for line in out.splitlines() if line.startswith("phone in live mode:"))
    for title in ("milk", "bread", "eggs", "coffee", "tea"):
        assert title in live


@pytest.mark.timeout(180)
def test_two_store_nodes_replicate() -> None:
    out = _run("sync_store_nodes")
    last = out.strip().splitlines()[-1]
    assert last.startswith("A:") and "milk" in last and "eggs" in last


@pytest.mark.timeout(180)
def test_a_device_catches_up_a_collection_of_1000_documents() -> None:
    out = _run("collection_catch_up")
    assert "of 1002 documents" in out
    assert "24 operations pulled" in out
    for line in (
        "node has the phone's offline edits: True",
        "phone has the new folders: True",
        "phone heard: the root, renamed live",
        "phone and node agree on all 1002 documents: True",
    ):
        assert line in out, out
