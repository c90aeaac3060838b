"""Benchmark of p2panda replication: set reconciliation against Log-Height, same run.

Two document stores share ``n`` logs (one todo document each, 50 per author);
then ``d`` logs differ, split between the two directions (half of them a log
the other side lacks, half a log the other side holds at a lower height). For
each ``d`` and each mode:

* ``sync.overhead_bytes``: bytes on the wire in both directions excluding the
  entry and operation bytes (frame prefixes included), measured on a lockstep
  in-memory run (each side answers everything it has before the other moves);
* ``sync.round_trips``: request/answer turns of that lockstep run until both
  sides are done;
* ``sync.bytes_per_diff``: overhead bytes per differing log (``d > 0``);
* ``sync.log_height_over_rbsr_bytes``: Log-Height overhead over set
  reconciliation overhead at that ``d`` (same stores, same run);
* ``sync.wall_time``: the same sync over a loopback TCP connection;
* ``sync.catchup_entries_per_s``: an empty store catching up all ``n`` entries
  over loopback TCP, validated (signature, links, schema) and stored. Tag
  ``peers``: ``two processes`` (the full store served by ``python -m sdk.sync
  serve``, the empty one here: the figure issue 12 asks for) and ``one process``
  (both peers on this process's event loop, as measured before). With
  ``--behind F``, also a store that holds a random fraction ``F`` of the logs
  catching up the rest (tag ``holds``, ``d`` the entries it lacked).

Targets (issue 12): d=0 in 1 round trip and under 200 bytes; reconciliation
bytes per differing log <= 3 KB and round trips <= 2*ceil(log_b(n)) + 2; at
d=10 at least 100x fewer bytes than Log-Height; catch-up >= 10k entries/s.
Each figure has tags ``n``, ``d``, ``mode``; targets are printed with them.

``sync.catchup_entries_per_s`` carries ``cpu_entries_per_s`` too (entries over the
CPU seconds of both peers, all threads; with two processes also
``receiver_cpu_entries_per_s``, and ``first_entry_s``, seconds from connecting
until the first entry is stored): on a shared machine the wall figure moves
with the load, the CPU one much less.

Usage: ``python bench/sync.py [--quick] [--n N] [--branching B --threshold T]
[--part-threshold P] [--no-catchup | --catchup-only] [--behind F]`` (quick:
n = 10k; full: n = 100k; b = 4, threshold 8, part threshold 1: ``SyncConfig``'s
defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.documents import KeyPair, Schema
from sdk.sync.driver import SyncConnection, serve_stream
from sdk.sync.events import SessionDone
from sdk.sync.framing import encode_frame
from sdk.sync.messages import Mode
from sdk.sync.session import Replication, SyncConfig
from sdk.sync.store import SyncStore
from tests.sync.helpers import LocalReplication
from transports.stream import connect_tcp, serve_tcp

#: The schema as ``python -m sdk.sync --schema-json`` reads it (the serving process).
TODO_SPEC = {
    "name": "todo",
    "view_id": ["0020" + "11" * 32],
    "description": "A shared todo item",
    "fields": {"title": "str", "done": "bool"},
}
TODO = Schema.application(
    TODO_SPEC["name"], tuple(TODO_SPEC["view_id"]), TODO_SPEC["description"], TODO_SPEC["fields"]
)
MODES = {"rbsr": Mode.SET_RECONCILIATION, "log_height": Mode.LOG_HEIGHT}
BRANCHING = 4
THRESHOLD = SyncConfig().threshold
PART_THRESHOLD = SyncConfig().part_threshold


def open_store(path: Path) -> SyncStore:
    store = SyncStore(str(path))
    store.add_schema(TODO)
    return store


def build_base(path: Path, n: int) -> list[tuple[KeyPair, str]]:
    """``n`` logs: one document per log, 50 logs per author; returns (key, document) pairs."""
    store = open_store(path)
    docs: list[tuple[KeyPair, str]] = []
    key = KeyPair.generate()
    for i in range(n):
        if i % 50 == 0:
            key = KeyPair.generate()
        published = store.create(key, TODO.id, {"title": f"item {i}", "done": False})
        docs.append((key, published.document_id))
    store.close()
    return docs


def diverge(a: SyncStore, b: SyncStore, docs: list[tuple[KeyPair, str]], d: int) -> None:
    """``d`` differing logs: half ahead on ``a``, half on ``b``; half new logs, half grown."""
    for i in range(d):
        side = a if i % 2 == 0 else b
        if (i // 2) % 2 == 0:
            side.create(KeyPair.generate(), TODO.id, {"title": f"new {i}", "done": False})
        else:
            key, doc = docs[i]
            side.update(key, doc, {"done": True})


def everything_to_send(replication: LocalReplication) -> list[bytes]:
    """All a side has to send now (``messages_to_send`` hands entries out a chunk at a time)."""
    out: list[bytes] = []
    while more := replication.messages_to_send():
        out += more
    return out


def lockstep(
    a: SyncStore,
    b: SyncStore,
    mode: Mode,
    branching: int = BRANCHING,
    threshold: int = THRESHOLD,
    part_threshold: int = PART_THRESHOLD,
) -> tuple[int, int, int]:
    """(overhead bytes both ways, round trips, entries moved) of one session, in memory."""
    shape = {"branching": branching, "threshold": threshold, "part_threshold": part_threshold}
    ra = LocalReplication(a, [TODO.id], now=0, config=SyncConfig(mode=mode, **shape))
    rb = LocalReplication(b, [TODO.id], now=0, config=SyncConfig(initiator=False, **shape))
    ra.request([TODO.id], 0)
    wire = 0
    round_trips = 0
    to_b = everything_to_send(ra)
    while to_b:
        wire += sum(len(encode_frame(data)) for data in to_b)
        rb.receive_many(to_b, 0)
        to_a = everything_to_send(rb)
        # A turn B answers is a round trip; A's last SyncDone alone is one way.
        round_trips += bool(to_a)
        wire += sum(len(encode_frame(data)) for data in to_a)
        ra.receive_many(to_a, 0)
        to_b = everything_to_send(ra)
    done = [e for e in iter(ra.next_event, None) if isinstance(e, SessionDone)]
    assert done, "session did not finish"
    payload = ra.payload_sent + ra.payload_received
    ra.close()
    rb.close()
    return wire - payload, round_trips, done[0].entries_received + done[0].entries_sent


async def over_tcp(a: SyncStore, b: SyncStore, mode: Mode) -> tuple[float, int]:
    """Wall time of one session over loopback TCP and the entries it moved."""
    finished = asyncio.Event()

    async def handle(stream: object) -> None:
        await serve_stream(b, stream, [TODO.id])  # type: ignore[arg-type]
        finished.set()

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    async with server:
        start = time.perf_counter()
        stream = await connect_tcp("127.0.0.1", port)
        replication = Replication([TODO.id], now=0, config=SyncConfig(mode=mode))
        async with SyncConnection(replication, stream, store=a) as connection:
            sid = await connection.request([TODO.id], mode=mode)
            done = await connection.wait_session(sid)
        await finished.wait()
        elapsed = time.perf_counter() - start
    return elapsed, done.entries_received + done.entries_sent


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def catchup_two_processes(
    a: SyncStore, full: Path, folder: Path, mode: Mode
) -> tuple[float, int, float, float, float]:
    """Catch up ``a`` from ``full`` served by another process over loopback TCP.

    Returns wall seconds, entries moved, this (receiving) process's CPU seconds
    and the serving process's CPU seconds, all from connecting to the end, and
    the seconds from connecting until the first entry was stored.
    """
    schema_json = folder / "todo-schema.json"
    schema_json.write_text(json.dumps([TODO_SPEC]))
    root = Path(__file__).resolve().parents[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "sdk.sync", "serve", "--db", str(full), "--schema", TODO.id,
         "--schema-json", str(schema_json)],
        stdout=subprocess.PIPE, text=True, cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = await asyncio.to_thread(server.stdout.readline)
        host, _, port = line.split()[1].rpartition(":")
        server_cpu = _cpu_seconds(server.pid)
        first: list[float] = []
        unlisten = a.add_listener(lambda _: first or first.append(time.perf_counter()))
        cpu, start = time.process_time(), time.perf_counter()
        stream = await connect_tcp(host, int(port))
        replication = Replication([TODO.id], now=0, config=SyncConfig(mode=mode))
        async with SyncConnection(replication, stream, store=a) as connection:
            sid = await connection.request([TODO.id], mode=mode)
            done = await connection.wait_session(sid)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        server_cpu = _cpu_seconds(server.pid) - server_cpu
        unlisten()
    finally:
        server.terminate()
        server.wait(10)
    first_entry = (first[0] if first else time.perf_counter()) - start
    return elapsed, done.entries_received + done.entries_sent, cpu, server_cpu, first_entry


def record_catchup(
    rec: Recorder, a: SyncStore, full: Path, folder: Path, name: str, n: int, **tags: object
) -> None:
    """Catch ``a`` up from ``full`` in two processes, check it holds all ``n`` entries, close
    it and record ``sync.catchup_entries_per_s`` with its CPU and first-entry tags."""
    elapsed, moved, cpu, server_cpu, first_entry = asyncio.run(
        catchup_two_processes(a, full, folder, MODES[name])
    )
    assert a.entry_count() == n, (a.entry_count(), n)
    a.close()
    rec.record("sync.catchup_entries_per_s", moved / elapsed, "entries/s", n=n, mode=name,
               peers="two processes",
               cpu_entries_per_s=round(moved / max(cpu + server_cpu, 1e-9)),
               receiver_cpu_entries_per_s=round(moved / cpu),
               first_entry_s=round(first_entry, 3), **tags)  # fmt: skip


def holding_part(base: Path, path: Path, fraction: float, seed: int = 1) -> int:
    """A store at ``path`` with a random ``fraction`` of ``base``'s logs (whole logs, in
    order); returns its entry count."""
    rng = random.Random(seed)
    db = sqlite3.connect(base)
    rows = db.execute("SELECT author, log_id, entry, payload FROM entries "
                      "ORDER BY author, log_id, seq_num").fetchall()  # fmt: skip
    db.close()
    store = open_store(path)
    keep: dict[tuple[str, int], bool] = {}
    for author, log_id, entry, payload in rows:
        if keep.setdefault((author, log_id), rng.random() < fraction):
            store.ingest(bytes(entry), bytes(payload))
    count = store.entry_count()
    store.close()
    return count


def copies(base: Path, folder: Path, tag: str) -> tuple[Path, Path]:
    pa, pb = folder / f"{tag}-a.db", folder / f"{tag}-b.db"
    shutil.copy(base, pa)
    shutil.copy(base, pb)
    return pa, pb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 10k instead of 100k")
    parser.add_argument("--n", type=int, help="override n")
    parser.add_argument("--branching", type=int, default=BRANCHING, help="rbsr branching b")
    parser.add_argument("--threshold", type=int, default=THRESHOLD, help="rbsr list threshold")
    parser.add_argument("--part-threshold", type=int, default=PART_THRESHOLD,
                        help="rbsr: a split's parts this small go as keys")  # fmt: skip
    parser.add_argument("--no-catchup", action="store_true", help="skip the catch-up figures")
    parser.add_argument("--catchup-only", action="store_true",
                        help="only the two-process catch-up figures (for A/B runs)")  # fmt: skip
    parser.add_argument("--behind", type=float, metavar="F",
                        help="also catch up a store holding a random fraction F of the logs "
                             "(two processes; tag holds=F)")  # fmt: skip
    args = parser.parse_args()
    n = args.n or (10_000 if args.quick else 100_000)
    ds = [d for d in (0, 1, 10, 100, 1000) if d <= n]
    rec = Recorder("sync")
    rt_target = 2 * math.ceil(math.log(n, args.branching)) + 2
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base = folder / "base.db"
        t0 = time.perf_counter()
        docs = build_base(base, n)
        print(f"# built {n} logs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for d in [] if args.catchup_only else ds:
            overhead: dict[str, int] = {}
            for name, mode in MODES.items():
                pa, pb = copies(base, folder, f"{name}-{d}")
                a, b = open_store(pa), open_store(pb)
                diverge(a, b, docs, d)
                a.close()  # closing checkpoints the WAL, so the copies are whole
                b.close()
                shutil.copy(pa, folder / "tcp-a.db")
                shutil.copy(pb, folder / "tcp-b.db")
                a, b = open_store(pa), open_store(pb)
                wire, trips, moved = lockstep(
                    a, b, mode, args.branching, args.threshold, args.part_threshold
                )
                a.close()
                b.close()
                overhead[name] = wire
                tags = {"n": n, "d": d, "mode": name, "b": args.branching,
                        "threshold": args.threshold,
                        "part_threshold": args.part_threshold}  # fmt: skip
                zero = d == 0 and name == "rbsr"
                rec.record("sync.overhead_bytes", wire, "bytes", **tags,
                           target="< 200 at d=0" if zero else None)  # fmt: skip
                rec.record("sync.round_trips", trips, "round trips", **tags,
                           target=f"<= {rt_target}" if name == "rbsr" else None)  # fmt: skip
                if d:
                    rec.record("sync.bytes_per_diff", wire / d, "bytes", **tags,
                               target="<= 3072" if name == "rbsr" else None)  # fmt: skip
                ta, tb = open_store(folder / "tcp-a.db"), open_store(folder / "tcp-b.db")
                elapsed, moved_tcp = asyncio.run(over_tcp(ta, tb, mode))
                ta.close()
                tb.close()
                rec.record("sync.wall_time", elapsed, "s", **tags, entries=moved_tcp)
            ratio = overhead["log_height"] / max(overhead["rbsr"], 1)
            target = ">= 100 at d=10" if d == 10 else None
            rec.record("sync.log_height_over_rbsr_bytes", ratio, "ratio", n=n, d=d,
                       mode="log_height/rbsr", b=args.branching, threshold=args.threshold,
                       target=target)  # fmt: skip
        for name, mode in MODES.items():
            if args.no_catchup:
                break
            empty = folder / f"empty-{name}.db"
            full = folder / f"full-{name}.db"
            shutil.copy(base, full)
            record_catchup(rec, open_store(empty), full, folder, name, n, d=n, target=">= 10000")
            if args.catchup_only:
                continue
            empty.unlink()
            shutil.copy(base, full)
            a, b = open_store(empty), open_store(full)
            cpu = time.process_time()
            elapsed, moved = asyncio.run(over_tcp(a, b, mode))
            cpu = time.process_time() - cpu
            assert a.entry_count() == n, (a.entry_count(), n)
            a.close()
            b.close()
            rec.record("sync.catchup_entries_per_s", moved / elapsed, "entries/s", n=n, d=n,
                       mode=name, peers="one process",
                       cpu_entries_per_s=round(moved / cpu))  # fmt: skip
        for name in MODES:
            if args.behind is None:
                break
            part, full = folder / f"part-{name}.db", folder / f"full-{name}.db"
            for old in folder.glob(f"part-{name}.db*"):
                old.unlink()
            held = holding_part(base, part, args.behind)
            shutil.copy(base, full)
            record_catchup(rec, open_store(part), full, folder, name, n, d=n - held,
                           holds=args.behind)  # fmt: skip


if __name__ == "__main__":
    main()
