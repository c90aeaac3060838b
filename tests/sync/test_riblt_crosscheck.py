"""RIBLT against an independent implementation: ``@peerbit/riblt`` from npm.

``@peerbit/riblt`` is the Rust ``riblt`` crate (a port of the paper's Go
reference) compiled to WebAssembly. Its items are u64 with SipHash-2-4 (keys
123, 456) over the item's 8 little-endian bytes as checksum (its
``src/testing.rs``, ``impl Symbol for TestU64``), so Chorus's RIBLT with that
:class:`SymbolFormat` must produce the very same coded symbols, and each side
must decode the other's stream.

``tests/sync/riblt_js/`` pins the version (``package.json``) and its integrity
(``package-lock.json``); it is installed with ``npm ci`` into
``.cache/riblt-node`` on first use (``CHORUS_RIBLT_NODE_CACHE`` overrides). The
tests skip without node/npm, and fail instead under ``CHORUS_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sdk.sync.riblt import CodedSymbol, Decoder, Encoder, SymbolFormat, siphash

SRC = Path(__file__).resolve().parent / "riblt_js"
REPO = SRC.parents[2]
CACHE = Path(os.environ.get("CHORUS_RIBLT_NODE_CACHE", REPO / ".cache" / "riblt-node"))
_FILES = ("package.json", "package-lock.json", "crosscheck.mjs")

_KEY = (123).to_bytes(8, "little") + (456).to_bytes(8, "little")
PEERBIT_FORMAT = SymbolFormat(8, lambda item: siphash(_KEY, item, 2, 4))


def _item(x: int) -> bytes:
    return x.to_bytes(8, "little")


@pytest.fixture(scope="module")
def peerbit() -> Path:
    """The installed cross-check script's folder (skip or fail without node)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        reason = f"{missing[0]} is not on PATH: the @peerbit/riblt cross-check needs node >= 20"
        if os.environ.get("CHORUS_REQUIRE_SERVICES") == "1":
            pytest.fail(reason + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in _FILES:
            shutil.copyfile(SRC / name, CACHE / name)
        want = hashlib.sha256((SRC / "package-lock.json").read_bytes()).hexdigest()
        stamp = CACHE / ".installed"
        installed = CACHE / "node_modules" / "@peerbit" / "riblt" / "package.json"
        if not installed.exists() or (stamp.read_text() if stamp.exists() else "") != want:
            proc = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=CACHE,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0:
                pytest.fail(f"npm ci failed:\n{proc.stdout}\n{proc.stderr}")
            stamp.write_text(want)
    return CACHE


def _run(folder: Path, request: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        ["node", "crosscheck.mjs"],
        cwd=folder,
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def _sets(seed: int, n: int, only_a: int, only_b: int) -> tuple[list[int], list[int], list[int]]:
    rng = random.Random(seed)
    unique: set[int] = set()
    while len(unique) < n + only_a + only_b:
        unique.add(rng.getrandbits(64))
    values = sorted(unique)
    rng.shuffle(values)
    return values[:n], values[n : n + only_a], values[n + only_a :]


def test_identical_coded_symbols_for_the_same_items(peerbit: Path) -> None:
    common, _, _ = _sets(1, 500, 0, 0)
    answer = _run(peerbit, {"encode": {"items": [str(x) for x in common], "count": 400}})
    ours = Encoder(PEERBIT_FORMAT, [_item(x) for x in common]).produce_batch(400)
    theirs = [(int(s), int(h), int(c)) for s, h, c in answer["symbols"]]
    assert [(int.from_bytes(s.sum, "little"), s.checksum, s.count) for s in ours] == theirs


def test_peerbit_decodes_our_symbols(peerbit: Path) -> None:
    common, only_ours, only_theirs = _sets(2, 800, 30, 20)
    encoder = Encoder(PEERBIT_FORMAT, [_item(x) for x in common + only_ours])
    symbols = encoder.produce_batch(200)
    answer = _run(
        peerbit,
        {
            "decode": {
                "items": [str(x) for x in common + only_theirs],
                "symbols": [
                    [str(int.from_bytes(s.sum, "little")), str(s.checksum), str(s.count)]
                    for s in symbols
                ],
            }
        },
    )
    assert answer["decoded"]
    assert sorted(int(x) for x in answer["remote"]) == sorted(only_ours)
    assert sorted(int(x) for x in answer["local"]) == sorted(only_theirs)


def test_we_decode_peerbit_symbols(peerbit: Path) -> None:
    common, only_theirs, only_ours = _sets(3, 800, 25, 25)
    answer = _run(
        peerbit, {"encode": {"items": [str(x) for x in common + only_theirs], "count": 200}}
    )
    decoder = Decoder(PEERBIT_FORMAT, [_item(x) for x in common + only_ours])
    for s, h, c in answer["symbols"]:
        if decoder.add_symbols([CodedSymbol(_item(int(s)), int(h), int(c))]):
            break
    assert decoder.decoded
    assert sorted(int.from_bytes(x, "little") for x in decoder.remote) == sorted(only_theirs)
    assert sorted(int.from_bytes(x, "little") for x in decoder.local) == sorted(only_ours)
