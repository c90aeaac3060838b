"""Benchmark: a store node's other work while it replicates (issue 28).

A real ``store-node serve`` (SQLite archive, a subprocess) archives one channel that
this script publishes to Mosquitto at ``--rate`` messages/s, and answers a 100-id
gRPC lookup every 50 ms and a ``/healthz`` probe every 50 ms, while

* (a) a peer (another process) replicates ``--entries`` entries into the node's
  ``[replication]`` listener (the node's document store starts empty), then
* (b) an empty peer pulls them all from it.

For each catch-up, windows ``before`` (the ``--window`` seconds before it),
``during`` and ``after`` (the ``--window`` seconds after it) report, as JSON lines
(``bench._common.Recorder``, ``bench/results/node_under_sync.jsonl``), tags
``case`` (``push_into_node`` / ``pull_from_node``) and ``window``:

* ``node_sync.lookup_p50_ms`` / ``lookup_p99_ms``: the 100-id gRPC lookup;
* ``node_sync.lookup_in_node_mean_ms``: the node's own mean time per lookup (its
  ``chorus_store_rpc_seconds`` for Query: from the handler's start to the reply built,
  without gRPC's transport), to tell the node's share of the lookup time from the rest;
* ``node_sync.healthz_p99_ms``: ``GET /healthz`` on the metrics listener;
* ``node_sync.archive_rate``: rows archived per second (the node's
  ``chorus_store_ingest_archived_total``, read every 0.25 s), and
  ``node_sync.archive_standstill_s``: the longest time it did not move;
* ``node_sync.node_cpu_s`` (``during``): the node's CPU seconds from just before the
  peer starts to the end of the catch-up (tag ``wall_s``), and its five busiest threads'
  (tag ``threads``, by thread id; ``loop`` is the event loop's);
* ``node_sync.node_waits_per_s`` (``during``): voluntary context switches per second of
  the node's threads alive at both ends of that time (each is a wait, for the GIL or
  for I/O; tag ``loop``: the event loop's), a count the machine's load moves less
  than it moves latencies;
* ``node_sync.catchup_entries_per_s`` (``during`` only): (a) entries over the time
  from the peer connecting until the node's store holds all of them (read from its
  SQLite file), (b) the pulling peer's own session time; with ``verify_ratio``, that
  rate over ``node_sync.verify_one_core_per_s``, ed25519 checks per second on one
  core (libsodium, the project's single check) measured at the start of the run.

Targets (issue 28): during a catch-up lookup p99 and ``/healthz`` p99 <= 50 ms, archive
rate >= 0.8x of before, catch-up >= 0.5x the one-core verify rate. ``load1``, the
machine's load average when each case started, is a tag of every figure. The node, the
peers and this script run in one session: where Linux groups the scheduling by session
(``/proc/sys/kernel/sched_autogroup_enabled``), they share one session's part of the
cores with every other session's load, whatever their ``nice``; compare runs made back
to back.

With ``--separate`` the node's ``[replication]`` has ``process = "separate"`` (what
``store-node serve`` does when the file does not say): it serves the peers from a
child process (``store_node.documents_process``), and ``node_cpu_s`` gets a tag
``child_s``, that child's CPU seconds over the same time (not in ``total``); without
it, ``process = "node"``, replication on the node's own event loop. Compare runs
with and without it back to back (tag ``separate``).

Usage: ``python bench/node_under_sync.py [--entries 20000] [--rate 200] [--window 5]
[--code DIR] [--separate]``; ``--code`` runs the node and the peers from another checkout (e.g. an
export of the base commit), this script's measuring side stays the same. The
20,000-entry store is built once and cached under ``$TMPDIR/chorus-bench/``. Needs
Mosquitto on 127.0.0.1:1883.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A peer runs the code under test (``--code``); the measuring side runs this checkout's.
_CODE = sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv[1:-1] else str(ROOT)
sys.path.insert(0, _CODE if sys.argv[1:2] == ["peer"] else str(ROOT))

from bench._common import Recorder, free_port
from bench.store import payload
from bench.sync import TODO, TODO_SPEC, build_base

PERIOD = 0.05
SAMPLE = 0.25
ARCHIVED = "chorus_store_ingest_archived_total"
QUERY_SECONDS = "chorus_store_rpc_seconds"


@dataclass
class Probes:
    """What the measuring tasks saw: ``(start time, seconds)`` per probe."""

    lookups: list[tuple[float, float]] = field(default_factory=list)
    health: list[tuple[float, float]] = field(default_factory=list)
    #: ``(time, archived so far)``.
    archived: list[tuple[float, float]] = field(default_factory=list)
    #: ``(time, Query seconds so far, Queries so far)``: the node's own timing.
    served: list[tuple[float, float, float]] = field(default_factory=list)
    published: int = 0


def verify_rate(store: Path, seconds: float = 1.0) -> float:
    """ed25519 checks per second on this thread (libsodium, real entries of ``store``)."""
    from sdk.documents.bamboo import decode_entry
    from sdk.documents.verifier import libsodium_accepts

    db = sqlite3.connect(store)
    entries = [
        decode_entry(bytes(r[0])) for r in db.execute("SELECT entry FROM entries LIMIT 2000")
    ]
    db.close()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for e in entries:
            assert libsodium_accepts(e.author, e.encoded, e.signature)
        done += len(entries)
    return done / (time.perf_counter() - start)


def node_config(folder: Path, channel: str, ports: dict[str, int], separate: bool) -> Path:
    (folder / "schemas.json").write_text(json.dumps([TODO_SPEC]))
    process = "separate" if separate else "node"
    path = folder / "node.toml"
    path.write_text(
        f"""
[archive]
path = "archive.db"
[ingest]
channels = ["{channel}"]
[transport]
kind = "mqtt"
host = "127.0.0.1"
port = 1883
[grpc]
listen = "127.0.0.1:{ports["grpc"]}"
[metrics]
listen = "127.0.0.1:{ports["metrics"]}"
[log]
level = "warning"
[replication]
listen = "127.0.0.1:{ports["replication"]}"
path = "documents.db"
schemas = ["{TODO.id}"]
schema_file = "schemas.json"
interval_s = 3600
process = "{process}"
"""
    )
    return path


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    return status, body


async def wait_ready(port: int, node: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise RuntimeError("store-node serve exited")
        try:
            status, _ = await http_get(port, "/readyz")
            if status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("store-node serve did not get ready")


async def publish(channel: str, rate: float, probes: Probes, stop: asyncio.Event) -> None:
    from transports.base import topic_for_channel
    from transports.mqtt import MqttTransport

    topic = topic_for_channel(channel)
    async with MqttTransport(host="127.0.0.1", port=1883) as transport:
        start = time.monotonic()
        while not stop.is_set():
            await transport.publish(topic, payload(channel, probes.published))
            probes.published += 1
            delay = start + probes.published / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


async def lookups(channel: str, port: int, probes: Probes, stop: asyncio.Event) -> None:
    from bench.store import message_id
    from sdk.store.grpc import GrpcStoreClient

    rng = random.Random(1)
    async with GrpcStoreClient(f"127.0.0.1:{port}", timeout=60) as client:
        next_at = time.monotonic()
        while not stop.is_set():
            known = max(probes.published - 400, 1)  # published two seconds ago
            ids = [message_id(channel, rng.randrange(known)) for _ in range(100)]
            start = time.monotonic()
            await client.get_messages(channel, ids)
            probes.lookups.append((start, time.monotonic() - start))
            next_at += PERIOD
            await asyncio.sleep(max(next_at - time.monotonic(), 0))


async def health(port: int, probes: Probes, stop: asyncio.Event) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        start = time.monotonic()
        status, _ = await http_get(port, "/healthz")
        if status == 200:
            probes.health.append((start, time.monotonic() - start))
        next_at += PERIOD
        await asyncio.sleep(max(next_at - time.monotonic(), 0))


async def archived(port: int, probes: Probes, stop: asyncio.Event) -> None:
    while not stop.is_set():
        now = time.monotonic()
        _, body = await http_get(port, "/metrics")
        spent = count = 0.0
        for line in body.decode().splitlines():
            if line.startswith(ARCHIVED):
                probes.archived.append((now, float(line.split()[-1])))
            elif line.startswith(QUERY_SECONDS + '_sum{method="Query"}'):
                spent = float(line.split()[-1])
            elif line.startswith(QUERY_SECONDS + '_count{method="Query"}'):
                count = float(line.split()[-1])
        probes.served.append((now, spent, count))
        await asyncio.sleep(SAMPLE)


def entry_count(path: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return int(db.execute("SELECT count(*) FROM entries").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


async def run_peer(code: Path, db: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "peer", "--db", str(db),
         "--port", str(port), "--code", str(code)],
        stdout=subprocess.PIPE, cwd=code, env=dict(os.environ, PYTHONPATH=str(code)),
    )  # fmt: skip


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of process ``pid`` (key ``total``) and of each of its threads (by
    thread id: Python does not name its threads for the OS), from Linux ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")

    def seconds(stat: Path) -> float:
        fields = stat.read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / tick

    out = {"total": seconds(Path(f"/proc/{pid}/stat"))}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out[task.name] = seconds(task / "stat")
        except OSError:
            continue
    return out


def child_cpu(pid: int) -> float:
    """CPU seconds of the children of process ``pid`` still running (Linux ``/proc``)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    return sum(thread_cpu(int(kid))["total"] for kid in kids if Path(f"/proc/{kid}").exists())


def thread_waits(pid: int) -> dict[str, int]:
    """Voluntary context switches of each live thread of process ``pid`` (by thread id):
    each is a wait, for the GIL or for I/O; from Linux ``/proc``."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    out[task.name] = int(line.split()[1])
        except OSError:
            continue
    return out


def _p(samples: list[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0] * 1000 if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000


def report(rec: Recorder, probes: Probes, case: str, window: str, t0: float, t1: float,
           tags: dict[str, object]) -> None:  # fmt: skip
    looks = [s for t, s in probes.lookups if t0 <= t < t1]
    checks = [s for t, s in probes.health if t0 <= t < t1]
    points = [(t, n) for t, n in probes.archived if t0 <= t <= t1]
    rate = standstill = float("nan")
    if len(points) >= 2:
        rate = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
        standstill, since = 0.0, points[0]
        for t, n in points[1:]:
            if n > since[1]:
                since = (t, n)
            standstill = max(standstill, t - since[0])
    served = [(s, n) for t, s, n in probes.served if t0 <= t <= t1]
    in_node = float("nan")
    if len(served) >= 2 and served[-1][1] > served[0][1]:
        in_node = (served[-1][0] - served[0][0]) / (served[-1][1] - served[0][1]) * 1000
    figures = {
        "lookup_p50_ms": _p(looks, 50),
        "lookup_in_node_mean_ms": in_node,
        "lookup_p99_ms": _p(looks, 99),
        "healthz_p99_ms": _p(checks, 99),
        "archive_rate": rate,
        "archive_standstill_s": standstill,
    }
    units = {"archive_rate": "rows/s", "archive_standstill_s": "s"}
    for name, value in figures.items():
        rec.record(f"node_sync.{name}", value, units.get(name, "ms"), case=case, window=window,
                   lookups=len(looks), seconds=round(t1 - t0, 2), **tags)  # fmt: skip


async def measure(args: argparse.Namespace, full: Path, rec: Recorder) -> None:
    code = Path(args.code).resolve()
    folder = Path(tempfile.mkdtemp(prefix="node-under-sync-"))
    channel = f"nus-{uuid.uuid4().hex[:8]}"
    ports = {"grpc": free_port(), "metrics": free_port(), "replication": free_port()}
    one_core = verify_rate(full)
    tags: dict[str, object] = {"entries": args.entries, "code": args.label,
                               "separate": args.separate}  # fmt: skip
    rec.record("node_sync.verify_one_core_per_s", one_core, "checks/s", **tags)
    node = subprocess.Popen(
        [sys.executable, "-m", "store_node.cli", "serve", "--config",
         str(node_config(folder, channel, ports, args.separate))],
        cwd=code, env=dict(os.environ, PYTHONPATH=str(code)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    probes, stop = Probes(), asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await wait_ready(ports["metrics"], node)
        tasks = [
            asyncio.create_task(publish(channel, args.rate, probes, stop)),
            asyncio.create_task(archived(ports["metrics"], probes, stop)),
        ]
        await asyncio.sleep(3)  # a few seconds of messages to look up
        tasks += [
            asyncio.create_task(lookups(channel, ports["grpc"], probes, stop)),
            asyncio.create_task(health(ports["metrics"], probes, stop)),
        ]
        node_db = folder / "documents.db"
        for case in ("push_into_node", "pull_from_node"):
            await asyncio.sleep(args.window)
            load1 = os.getloadavg()[0]
            case_tags = {**tags, "load1": round(load1, 2)}
            before, cpu_before = time.monotonic(), thread_cpu(node.pid)
            child_before = child_cpu(node.pid)
            waits_before = thread_waits(node.pid)
            if case == "push_into_node":
                peer_db = folder / "peer-full.db"
                shutil.copy(full, peer_db)
            else:
                peer_db = folder / "peer-empty.db"
            peer = await run_peer(code, peer_db, ports["replication"])
            assert peer.stdout is not None
            out = json.loads(await asyncio.to_thread(peer.stdout.read))
            peer.wait()
            start = time.monotonic() - (time.time() - out["connected_at"])
            if case == "push_into_node":
                # Until the node has stored them all (the peer's done may come sooner).
                while entry_count(node_db) < args.entries:
                    await asyncio.sleep(0.05)
                end = time.monotonic()
                extra = {"peer_done_s": round(out["seconds"], 3)}
            else:
                assert out["received"] == args.entries, out
                end = start + out["seconds"]
                extra = {}
            rate = args.entries / (end - start)
            # Where the node's CPU went from just before the peer started to the end: the
            # process, and its busiest threads (the event loop's id is the process id).
            cpu_after, wall = thread_cpu(node.pid), time.monotonic() - before
            child_s = round(child_cpu(node.pid) - child_before, 2)
            waits_after = thread_waits(node.pid)
            spent = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_after.items()}
            busiest = sorted((k for k in spent if k != "total"), key=lambda k: -spent[k])[:5]
            threads = {("loop" if k == str(node.pid) else k): round(spent[k], 2) for k in busiest}
            rec.record("node_sync.node_cpu_s", spent["total"], "s", case=case,
                       window="during", wall_s=round(wall, 2), threads=threads,
                       child_s=child_s, **case_tags)  # fmt: skip
            waits = {k: n - waits_before[k] for k, n in waits_after.items() if k in waits_before}
            rec.record("node_sync.node_waits_per_s", sum(waits.values()) / wall, "waits/s",
                       case=case, window="during", loop=round(waits.get(str(node.pid), 0) / wall),
                       **case_tags)  # fmt: skip
            report(rec, probes, case, "before", before - args.window, before, case_tags)
            report(rec, probes, case, "during", start, end, case_tags)
            rec.record("node_sync.catchup_entries_per_s", rate, "entries/s", case=case,
                       window="during", verify_ratio=round(rate / one_core, 3),
                       target_ratio=0.5, **extra, **case_tags)  # fmt: skip
            await asyncio.sleep(args.window)
            report(rec, probes, case, "after", end, end + args.window, case_tags)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
        shutil.rmtree(folder, ignore_errors=True)


async def peer(args: argparse.Namespace) -> None:
    """One session with the node: push a full store into it, or pull into an empty one."""
    from sdk.sync.driver import sync
    from sdk.sync.store import SyncStore
    from transports.stream import connect_tcp

    store = SyncStore(args.db)
    store.add_schema(TODO)
    connected_at, start = time.time(), time.perf_counter()
    stream = await connect_tcp("127.0.0.1", args.port)
    done = await sync(store, stream, [TODO.id])
    seconds = time.perf_counter() - start
    store.close()
    print(json.dumps({"received": done.entries_received, "sent": done.entries_sent,
                      "seconds": seconds, "connected_at": connected_at}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "peer"])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--code", default=str(ROOT), help="checkout the node and peers run from")
    parser.add_argument("--label", default="this", help="tag 'code' of the figures")
    parser.add_argument(
        "--separate", action="store_true", help='[replication] process = "separate"'
    )
    parser.add_argument("--db")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.mode == "peer":
        asyncio.run(peer(args))
        return
    cache = Path(tempfile.gettempdir()) / "chorus-bench" / f"node-under-sync-{args.entries}.db"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        build_base(partial, args.entries)
        partial.rename(cache)
    asyncio.run(measure(args, cache, Recorder("node_under_sync")))


if __name__ == "__main__":
    main()
