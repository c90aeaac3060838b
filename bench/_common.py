"""Shared helpers for the benchmark scripts: JSON-lines output and the results folder."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


class Recorder:
    """Prints one JSON object per figure; appends them to ``bench/results/<name>.jsonl``."""

    def __init__(self, bench: str) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.path = RESULTS / f"{bench}.jsonl"
        self.run = {
            "bench": bench,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": _commit(),
            "python": platform.python_version(),
        }

    def record(self, name: str, value: float, unit: str, **extra: Any) -> None:
        """Emit one figure."""
        line = {"name": name, "value": round(value, 4), "unit": unit, **extra, **self.run}
        text = json.dumps(line, sort_keys=False)
        print(text, flush=True)
        with self.path.open("a") as fh:
            fh.write(text + "\n")


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def ensure_repo_on_path() -> None:
    """Let ``python bench/x.py`` import the project without installing it."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and this process has not handed
    out before (the kernel may give a just-closed port again, so a node's listeners could
    otherwise share one)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
