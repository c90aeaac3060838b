"""Benchmark: a store node's memory under 300 hostile connections on a stream listener.

Starts ``store-node serve`` (a subprocess, SQLite, every stream section on, the
listener options at their defaults unless given) and, on each chosen listener,
opens ``--peers`` connections that each send a frame announcing 1 MiB - 1 bytes,
all of it but its last 1,000 bytes, then one byte every ``--trickle-s`` seconds
(the peer of issue 28). Figures (JSON lines, tag ``listener``):

* ``listeners.rss_before_mb``: the node's resident memory before the peers;
* ``listeners.rss_peak_mb``: the highest sample (every 0.1 s) while they are connected;
* ``listeners.rss_after_mb``: 3 s after the last of them is gone;
* ``listeners.all_cut_s``: seconds from the first connection until the node had
  cut every one (bounded by ``frame_deadline_s`` plus a watchdog tick);
* ``listeners.cut``: connections cut, tag ``reason`` (from ``/metrics``);
* ``listeners.buffered_peak_mb``: the listener's own count of partly received
  frame bytes at its highest (``chorus_store_listener_buffered_bytes``).

Before issue 28 (measured then): 300 such peers on ``[replication]`` took the
node from 98 to 608 MB, still 567 MB after they closed, and none was cut.

Usage: ``python bench/listeners.py [--listener replication|collection|bamboo_p2p|
store_sync|all] [--peers 300] [--frame-deadline S] [--max-buffered-bytes N]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import Recorder, ensure_repo_on_path, free_port

ensure_repo_on_path()

from sdk.documents.varu64 import encode_varu64
from tests.documents.helpers import TODO_SCHEMA

REPO = Path(__file__).resolve().parent.parent
NAMES = ("replication", "collection", "bamboo_p2p", "store_sync")
FRAME = (1 << 20) - 1


def frame_head(name: str, size: int) -> bytes:
    if name == "bamboo_p2p":
        return b"\x00\x00\x00\x00" + encode_varu64(size)
    head = bytearray()
    while size >= 0x80:
        head.append((size & 0x7F) | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head)


def write_config(folder: Path, ports: dict[str, int], options: dict[str, object]) -> Path:
    view_id = TODO_SCHEMA.id.partition("_")[2]
    fields = {name: str(kind) for name, kind in TODO_SCHEMA.fields.items()}
    (folder / "schemas.json").write_text(
        json.dumps(
            [{"name": "todo", "view_id": [view_id], "description": TODO_SCHEMA.description,
              "fields": fields}]
        )
    )  # fmt: skip
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items())
    docs = 'path = "documents.db"\nschema_file = "schemas.json"\n'
    text = f"""
[archive]
path = "archive.db"

[ingest]
channels = []

[grpc]
listen = "127.0.0.1:{ports["grpc"]}"

[metrics]
listen = "127.0.0.1:{ports["metrics"]}"

[replication]
listen = "127.0.0.1:{ports["replication"]}"
schemas = ["{TODO_SCHEMA.id}"]
interval_s = 3600
{docs}{extra}
[collection]
listen = "127.0.0.1:{ports["collection"]}"
{docs}{extra}
[bamboo_p2p]
listen = "127.0.0.1:{ports["bamboo_p2p"]}"
path = "bamboo.db"
{extra}
[store_sync]
listen = "127.0.0.1:{ports["store_sync"]}"
{extra}"""
    path = folder / "node.toml"
    path.write_text(text)
    return path


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def sample(text: str, name: str, listener: str, reason: str | None = None) -> float:
    labels = f'listener="{listener}"' + (f',reason="{reason}"' if reason else "")
    pattern = re.escape(name) + r"\{" + re.escape(labels) + r"\} ([0-9.e+]+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


async def wait_up(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"store-node exited with {process.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit("store-node did not start listening")


async def hostile(name: str, port: int, trickle_s: float, open_: list[int]) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    open_[0] += 1
    try:
        writer.write(frame_head(name, FRAME) + bytes(FRAME - 1000))
        await writer.drain()
        reading = asyncio.create_task(reader.read())
        while not reading.done():
            await asyncio.wait({reading}, timeout=trickle_s)
            if not reading.done():
                writer.write(b"\x00")
                await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        open_[0] -= 1
        writer.close()


async def attack(
    rec: Recorder, name: str, ports: dict[str, int], pid: int, ns: argparse.Namespace
) -> None:
    before = rss_mb(pid)
    open_ = [0]
    started = time.monotonic()
    peers = [
        asyncio.create_task(hostile(name, ports[name], ns.trickle_s, open_))
        for _ in range(ns.peers)
    ]
    peak = before
    buffered_peak = 0.0
    all_cut = None
    metric = "chorus_store_listener_buffered_bytes"
    while any(not p.done() for p in peers) and time.monotonic() - started < ns.timeout:
        await asyncio.sleep(0.1)
        peak = max(peak, rss_mb(pid))
        buffered_peak = max(
            buffered_peak, sample(await asyncio.to_thread(scrape, ports["metrics"]), metric, name)
        )
    if all(p.done() for p in peers):
        all_cut = time.monotonic() - started
    for p in peers:
        p.cancel()
    await asyncio.gather(*peers, return_exceptions=True)
    await asyncio.sleep(3)
    after = rss_mb(pid)
    text = await asyncio.to_thread(scrape, ports["metrics"])
    tags = {"listener": name, "peers": ns.peers}
    rec.record("listeners.rss_before_mb", before, "MB", **tags)
    rec.record("listeners.rss_peak_mb", peak, "MB", **tags)
    rec.record("listeners.rss_after_mb", after, "MB", **tags)
    rec.record("listeners.buffered_peak_mb", buffered_peak / 2**20, "MB", **tags)
    if all_cut is not None:
        rec.record("listeners.all_cut_s", all_cut, "s", **tags)
    for reason in ("idle", "write_timeout", "frame_deadline", "memory"):
        value = sample(text, "chorus_store_listener_cut_total", name, reason)
        rec.record("listeners.cut", value, "connections", reason=reason, **tags)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listener", default="replication", choices=[*NAMES, "all"])
    parser.add_argument("--peers", type=int, default=300)
    parser.add_argument("--trickle-s", type=float, default=1.0)
    parser.add_argument("--frame-deadline", type=float, default=None)
    parser.add_argument("--max-buffered-bytes", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this")
    ns = parser.parse_args()
    options: dict[str, object] = {"max_connections": max(256, ns.peers + 10)}
    if ns.frame_deadline is not None:
        options["frame_deadline_s"] = ns.frame_deadline
    if ns.max_buffered_bytes is not None:
        options["max_buffered_bytes"] = ns.max_buffered_bytes
    rec = Recorder("listeners")
    with tempfile.TemporaryDirectory() as tmp:
        ports = {name: free_port() for name in (*NAMES, "grpc", "metrics")}
        config = write_config(Path(tmp), ports, options)
        process = subprocess.Popen(
            [sys.executable, "-m", "store_node.cli", "serve", "--config", str(config)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for name in NAMES:
                await wait_up(ports[name], process)
            await asyncio.sleep(1)
            for name in NAMES if ns.listener == "all" else (ns.listener,):
                await attack(rec, name, ports, process.pid, ns)
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
