"""Run the reference ``@waku/sds`` from Python: install it, start the harness, talk to it.

The JavaScript side lives in ``tests/interop/harness/`` (``package.json`` pins the
exact ``@waku/sds`` version, ``package-lock.json`` pins its dependencies). It is
installed with ``npm ci`` into a cache folder — ``.cache/interop-node`` in the
repository unless ``CHORUS_INTEROP_CACHE`` says otherwise — the first time it is
needed and again only when the lockfile changes. The benchmark uses the same
installation.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HARNESS_SRC = Path(__file__).resolve().parent / "harness"
REPO = HARNESS_SRC.parents[2]
CACHE = Path(os.environ.get("CHORUS_INTEROP_CACHE", REPO / ".cache" / "interop-node"))
#: Files copied next to the installed node_modules (scripts resolve @waku/sds from there).
_FILES = ("package.json", "package-lock.json", "harness.mjs", "bench.mjs", "long_run.mjs")


class HarnessError(RuntimeError):
    """The harness could not be installed, started, or refused a command."""


def node_missing_reason() -> str | None:
    """Why the interop tests cannot run here, or ``None`` when node and npm are present."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not on PATH: the @waku/sds interop tests need node >= 20 and npm"
    return None


def ensure_harness(cache: Path = CACHE) -> Path:
    """Install the harness and its pinned ``@waku/sds`` into ``cache``; return that folder.

    Safe to call from concurrent processes (a file lock serializes installs).
    """
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in _FILES:
            src = HARNESS_SRC / name
            if src.exists():
                shutil.copyfile(src, cache / name)
        want = hashlib.sha256((HARNESS_SRC / "package-lock.json").read_bytes()).hexdigest()
        stamp = cache / ".installed"
        installed = cache / "node_modules" / "@waku" / "sds" / "package.json"
        if not installed.exists() or (stamp.read_text() if stamp.exists() else "") != want:
            proc = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=cache,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0:
                raise HarnessError(f"npm ci failed in {cache}:\n{proc.stdout}\n{proc.stderr}")
            stamp.write_text(want)
    return cache


def b64(data: bytes) -> str:
    """Bytes as the harness expects them."""
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    """Bytes from the harness."""
    return base64.b64decode(text)


class JsHarness:
    """One ``node harness.mjs`` process hosting any number of reference participants."""

    def __init__(self, cache: Path | None = None) -> None:
        folder = ensure_harness(cache or CACHE)
        # stderr to a file: a chatty child must never block on a full pipe.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            ["node", str(folder / "harness.mjs")],
            cwd=folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self.version: str = self.call("version")["version"]

    def call(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """Send one command and return its response; raise :class:`HarnessError` on failure."""
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            raise HarnessError(f"harness died: {self._stderr_text()}") from None
        line = proc.stdout.readline()
        if not line:
            raise HarnessError(f"harness died during {cmd!r}: {self._stderr_text()}")
        response: dict[str, Any] = json.loads(line)
        if not response.pop("ok"):
            raise HarnessError(f"{cmd} failed: {response.get('error')}")
        return response

    def _stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-4000:]

    def participant(
        self, participant_id: str, channel_id: str, now: int, **options: Any
    ) -> JsParticipant:
        """A new reference ``MessageChannel`` (options as the harness's ``new`` command)."""
        self.call("new", id=participant_id, channel=channel_id, now=now, **options)
        return JsParticipant(self, participant_id)

    def bloom(
        self, ids: list[str], lookup: list[str] | None = None, offset: int = 0
    ) -> tuple[bytes, list[bool]]:
        """A fresh reference filter (default options) holding ``ids``, and lookups in it
        after reading it back with ``fromBytes`` from a view at ``offset``."""
        r = self.call("bloom", ids=ids, lookup=lookup or [], offset=offset)
        return unb64(r["filter_b64"]), r["found"]

    def close(self) -> None:
        """Stop the process."""
        if self._proc.poll() is None:
            with contextlib.suppress(HarnessError):
                self.call("quit")
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


class JsParticipant:
    """One reference participant in a :class:`JsHarness`; every method takes ``now``."""

    def __init__(self, harness: JsHarness, participant_id: str) -> None:
        self.harness = harness
        self.participant_id = participant_id

    def _call(self, cmd: str, now: int, **fields: Any) -> dict[str, Any]:
        return self.harness.call(cmd, id=self.participant_id, now=now, **fields)

    def send(self, content: bytes, now: int, hint: bytes | None = None) -> tuple[str, list[bytes]]:
        """``pushOutgoingMessage`` + ``processTasks``: the id and the bytes to broadcast."""
        fields: dict[str, Any] = {"content_b64": b64(content)}
        if hint is not None:
            fields["hint_b64"] = b64(hint)
        r = self._call("send", now, **fields)
        return r["message_id"], [unb64(d) for d in r["out"]]

    def send_ephemeral(self, content: bytes, now: int) -> list[bytes]:
        """``pushOutgoingEphemeralMessage``: the bytes to broadcast."""
        return [unb64(d) for d in self._call("ephemeral", now, content_b64=b64(content))["out"]]

    def send_sync(self, now: int) -> list[bytes]:
        """``pushOutgoingSyncMessage``: the bytes to broadcast (none with an empty history)."""
        return [unb64(d) for d in self._call("sync", now)["out"]]

    def receive(self, data: bytes, now: int, hint: bytes | None = None, offset: int = 0) -> str:
        """Decode, ``pushIncomingMessage``, ``processTasks``; return the kind the reference saw.

        ``offset`` hands the bytes over as a view at that offset into a larger
        buffer, the way a transport frame carries them.
        """
        fields: dict[str, Any] = {"data_b64": b64(data), "offset": offset}
        if hint is not None:
            fields["hint_b64"] = b64(hint)
        kind: str = self._call("receive", now, **fields)["kind"]
        return kind

    def sweep_incoming(self, now: int) -> list[str]:
        """``sweepIncomingBuffer``: deliver what became ready; return ids still missing."""
        missing: list[str] = self._call("sweep_in", now)["missing"]
        return missing

    def sweep_outgoing(self, now: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
        """``sweepOutgoingBuffer``: (unacknowledged, possibly acknowledged) as (id, bytes)."""
        r = self._call("sweep_out", now)

        def listed(items: list[dict[str, str]]) -> list[tuple[str, bytes]]:
            return [(i["message_id"], unb64(i["data_b64"])) for i in items]

        return listed(r["unacknowledged"]), listed(r["possibly_acknowledged"])

    def sweep_repair(self, now: int) -> list[bytes]:
        """``sweepRepairIncomingBuffer``: SDS-R responses due now."""
        return [unb64(d) for d in self._call("sweep_repair", now)["out"]]

    def events(self) -> list[dict[str, Any]]:
        """Drain the recorded events."""
        events: list[dict[str, Any]] = self.harness.call("events", id=self.participant_id)["events"]
        return events

    def log(self) -> list[str]:
        """The local history's ids, in order."""
        ids: list[str] = self.harness.call("log", id=self.participant_id)["ids"]
        return ids

    def filter(self) -> bytes:
        """The participant's current bloom filter, serialized."""
        return unb64(self.harness.call("filter", id=self.participant_id)["filter_b64"])
