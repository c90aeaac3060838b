"""The sync examples the README points to run as a user runs them and do what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(180)
def test_a_phone_catches_up_its_todo_list_from_the_store_node() -> None:
    out = _run("examples.sync_catch_up")
    assert "phone after catch-up:" in out
    live = next(line for line in out.splitlines() if line.startswith("phone in live mode:"))
    for title in ("milk", "bread", "eggs", "coffee", "tea"):
        assert title in live


@pytest.mark.timeout(180)
def test_two_store_nodes_replicate() -> None:
    out = _run("examples.sync_store_nodes")
    last = out.strip().splitlines()[-1]
    assert last.startswith("A:") and "milk" in last and "eggs" in last


@pytest.mark.timeout(180)
def test_a_device_catches_up_a_collection_of_1000_documents() -> None:
    out = _run("examples.collection_catch_up")
    assert "of 1002 documents" in out
    assert "24 operations pulled" in out
    for line in (
        "node has the phone's offline edits: True",
        "phone has the new folders: True",
        "phone heard: the root, renamed live",
        "phone and node agree on all 1002 documents: True",
    ):
        assert line in out, out
