"""A participant that runs for a long time: memory, restart time and throughput against history.

One channel, two participants (:class:`~sdk.runtime.Node`, each with its own SQLite
file) over the in-memory network, ``COMPACT`` bloom profile, 100-byte payloads.
Both send in turn (``--chunk`` pipelined sends each) and both read their events,
until ``--messages`` (1,000,000; ``--quick``: 100,000) have been sent and delivered.

Figures (JSON lines; printed and appended to ``bench/results/long_run.jsonl``):

* ``long_run.rss_mb`` (tag ``messages``): the process's resident memory after that many
  messages (10k, 100k, 500k, 1M; ``--quick``: 10k, 50k, 100k).
* ``long_run.rss_growth_mb`` (tags ``from``/``to``): growth between the two
  checkpoints, per participant (the process holds two; target <= 50 MB from 100k
  to 1M).
* ``long_run.segment_throughput`` (tag ``segment``): messages per second in each
  tenth of the run; ``long_run.segment_throughput_ratio``: last / first (target >= 0.8).
* ``long_run.segment_cpu_throughput`` (tag ``segment``): messages per CPU second of
  this process in each tenth, and ``long_run.segment_cpu_throughput_ratio`` (last /
  first); ``long_run.segment_written_kb`` (tag ``segment``): kilobytes this process
  wrote (``/proc/self/io``: the WAL and its checkpoints) per message. On a machine
  shared with other work the wall-clock figures above move with its load; these two
  much less.
* ``long_run.join_s`` (tag ``history``): one participant closed and joined again
  on its file: time of ``Node.join`` (target <= 1 s at 1M). Measured on the run's own
  file, and on a file whose history of ``--join-history`` rows (1,000,000) is
  written directly (as fast as SQLite takes rows, not by sending).

With ``--peer waku`` the same run also drives the reference ``@waku/sds`` (the
version ``tests/interop/harness`` pins, 0.0.8): two of its participants in one node
process (``tests/interop/harness/long_run.mjs``) exchange the same 100-byte
messages, with no database (it has none). Its figures carry ``impl=waku`` and
Chorus's ``impl=chorus``; ``long_run.rss_mb`` is then the node process's resident
memory. The reference is given ``--peer-timeout`` seconds (600); if it has not
finished by then it is stopped, and ``long_run.peer_reached`` (tag
``finished``) says how many messages it had exchanged, with the node process's
resident memory at that point (``long_run.rss_mb``, tag ``when=timeout``).

Usage: ``python bench/long_run.py [--quick] [--messages N] [--join-history N]
[--peer waku] [--peer-timeout S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.runtime import Delivery, Node, ReliableChannel
from sdk.runtime.persistence import Persistence
from sdk.sds import COMPACT, ChannelConfig
from transports.memory import MemoryNetwork

CONFIG = ChannelConfig(bloom=COMPACT)
CHANNEL = "long-run"


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of this process, or of process ``pid`` (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def written_bytes() -> int:
    """Bytes this process has caused to be written to storage (Linux ``/proc``)."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _drain(channel: ReliableChannel, counter: list[int]) -> None:
    async for event in channel.events():
        if isinstance(event, Delivery):
            counter[0] += 1


async def run(args: argparse.Namespace, rec: Recorder, tmp: Path) -> None:
    total = args.messages
    checkpoints = sorted({c for c in args.checkpoints if c <= total} | {total})
    segment = max(1, total // 10)
    net = MemoryNetwork()
    payload = b"x" * 100
    db_a, db_b = tmp / "a.db", tmp / "b.db"
    a = Node(net.transport("a"), "long-a", config=CONFIG, db=db_a)
    b = Node(net.transport("b"), "long-b", config=CONFIG, db=db_b)
    async with a, b:
        ca, cb = await a.join(CHANNEL), await b.join(CHANNEL)
        got_a, got_b = [0], [0]
        readers = [asyncio.create_task(_drain(ca, got_a)), asyncio.create_task(_drain(cb, got_b))]
        rss = {0: rss_mb()}
        sent = 0
        by = [0, 0]  # sent by a, by b
        seg_start, seg_sent = time.perf_counter(), 0
        seg_cpu, seg_written = time.process_time(), written_bytes()
        throughputs: list[float] = []
        cpu_throughputs: list[float] = []
        next_cp = 0
        turn = 0
        while sent < total:
            channel = ca if turn % 2 == 0 else cb
            turn += 1
            n = min(args.chunk, total - sent)
            await asyncio.gather(*(channel.send(payload) for _ in range(n)))
            sent += n
            seg_sent += n
            by[(turn - 1) % 2] += n
            # The other has it before the figure is taken: delivered, not just sent.
            while got_a[0] < by[1] or got_b[0] < by[0]:
                await asyncio.sleep(0.001)
            if seg_sent >= segment or sent == total:
                now = time.perf_counter()
                throughputs.append(seg_sent / (now - seg_start))
                rec.record(
                    "long_run.segment_throughput",
                    throughputs[-1],
                    "msg/s",
                    impl="chorus",
                    segment=len(throughputs),
                    to=sent,
                )
                cpu, written = time.process_time(), written_bytes()
                cpu_throughputs.append(seg_sent / max(cpu - seg_cpu, 1e-9))
                rec.record(
                    "long_run.segment_cpu_throughput",
                    cpu_throughputs[-1],
                    "msg/cpu-s",
                    impl="chorus",
                    segment=len(cpu_throughputs),
                )
                rec.record(
                    "long_run.segment_written_kb",
                    (written - seg_written) / 1024 / seg_sent,
                    "KB/msg",
                    impl="chorus",
                    segment=len(cpu_throughputs),
                )
                seg_start, seg_sent = now, 0
                seg_cpu, seg_written = cpu, written
            while next_cp < len(checkpoints) and sent >= checkpoints[next_cp]:
                rss[checkpoints[next_cp]] = rss_mb()
                rec.record(
                    "long_run.rss_mb", rss[checkpoints[next_cp]], "MB", impl="chorus", messages=sent
                )
                next_cp += 1
        if len(throughputs) > 1:
            rec.record(
                "long_run.segment_throughput_ratio",
                throughputs[-1] / throughputs[0],
                "ratio",
                impl="chorus",
                segments=len(throughputs),
            )
            rec.record(
                "long_run.segment_cpu_throughput_ratio",
                cpu_throughputs[-1] / cpu_throughputs[0],
                "ratio",
                impl="chorus",
                segments=len(cpu_throughputs),
            )
        base = 100_000 if 100_000 in rss and total > 100_000 else checkpoints[0]
        rec.record(
            "long_run.rss_growth_mb",
            (rss[total] - rss[base]) / 2,
            "MB",
            impl="chorus",
            per="participant",
            **{"from": base, "to": total},
        )
        for task in readers:
            task.cancel()
    await _join_time(rec, net, db_a, "long-a", history=total)
    if args.join_history:
        path = tmp / "synthetic.db"
        write_history(path, "long-s", CHANNEL, args.join_history)
        await _join_time(rec, net, path, "long-s", history=args.join_history, synthetic=True)


async def _join_time(
    rec: Recorder,
    net: MemoryNetwork,
    db: Path,
    participant: str,
    *,
    history: int,
    synthetic: bool = False,
) -> None:
    node = Node(net.transport(f"{participant}-again-{history}"), participant, config=CONFIG, db=db)
    async with node:
        started = time.perf_counter()
        await node.join(CHANNEL)
        elapsed = time.perf_counter() - started
    rec.record("long_run.join_s", elapsed, "s", impl="chorus", history=history, synthetic=synthetic)


def run_waku(args: argparse.Namespace, rec: Recorder) -> None:
    """The same exchange between two ``@waku/sds`` participants in one node process."""
    from tests.interop.jsharness import ensure_harness, node_missing_reason

    reason = node_missing_reason()
    if reason is not None:
        print(f"long_run: no waku peer: {reason}", file=sys.stderr)
        return
    folder = ensure_harness()
    version = json.loads((folder / "node_modules" / "@waku" / "sds" / "package.json").read_text())[
        "version"
    ]
    total = args.messages
    params = {"messages": total, "chunk": args.chunk, "checkpoints": args.checkpoints}
    proc = subprocess.Popen(
        ["node", str(folder / "long_run.mjs"), json.dumps(params)],
        cwd=folder,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    tags = {"impl": "waku", "waku_sds": version}
    rss: dict[int, float] = {}
    throughputs: list[float] = []
    reached, finished = 0, False
    started = time.monotonic()
    deadline = started + args.peer_timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not finished and time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = proc.stdout.readline()
            if not line:
                break  # node exited (an error is on its stderr)
            item = json.loads(line)
            kind = item["kind"]
            if kind == "rss":
                rss[item["messages"]] = item["rss_mb"]
                if item["messages"]:
                    rec.record(
                        "long_run.rss_mb", item["rss_mb"], "MB", messages=item["messages"], **tags
                    )
            elif kind == "segment":
                throughputs.append(item["msg_per_s"])
                reached = max(reached, item["to"])
                rec.record(
                    "long_run.segment_throughput",
                    item["msg_per_s"],
                    "msg/s",
                    segment=item["segment"],
                    to=item["to"],
                    **tags,
                )
            elif kind == "progress":
                reached = max(reached, item["messages"])
            elif kind == "done":
                reached, finished = item["messages"], True
    if not finished:
        if proc.poll() is None:
            rec.record(
                "long_run.rss_mb",
                rss_mb(proc.pid),
                "MB",
                messages=reached,
                when="timeout",
                **tags,
            )
        proc.kill()
    proc.wait()
    rec.record(
        "long_run.peer_reached",
        reached,
        "messages",
        finished=finished,
        seconds=round(time.monotonic() - started, 1),
        **tags,
    )
    if finished and len(throughputs) > 1:
        rec.record(
            "long_run.segment_throughput_ratio",
            throughputs[-1] / throughputs[0],
            "ratio",
            segments=len(throughputs),
            **tags,
        )
    points = sorted(m for m in rss if m)
    if len(points) > 1:
        base = 100_000 if 100_000 in rss and points[-1] > 100_000 else points[0]
        rec.record(
            "long_run.rss_growth_mb",
            (rss[points[-1]] - rss[base]) / 2,
            "MB",
            per="participant",
            **{"from": base, "to": points[-1]},
            **tags,
        )


def write_history(path: Path, participant: str, channel_id: str, count: int) -> None:
    """A channel whose log holds ``count`` delivered messages, written as rows."""
    Persistence(path).close()  # the schema
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("INSERT INTO meta (key, value) VALUES ('participant_id', ?)", (participant,))
    db.execute(
        "INSERT INTO channel (channel_id, participant_id, lamport) VALUES (?, ?, ?)",
        (channel_id, participant, count + 1),
    )
    data = b"\x00" * 200
    db.executemany(
        "INSERT INTO log (channel_id, seq, message_id, lamport, sender_id, data) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        ((channel_id, i, f"{i:064x}", i, "peer", data) for i in range(1, count + 1)),
    )
    db.commit()
    db.close()
    Persistence(path).close()  # keys the rows by id, as the runtime's sessions leave them


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k messages")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--chunk", type=int, default=64, help="pipelined sends per turn")
    parser.add_argument("--join-history", type=int, default=1_000_000)
    parser.add_argument(
        "--peer", choices=["waku"], default=None, help="also run the reference @waku/sds"
    )
    parser.add_argument(
        "--peer-timeout", type=float, default=600.0, help="seconds the reference is given"
    )
    args = parser.parse_args()
    if args.messages is None:
        args.messages = 100_000 if args.quick else 1_000_000
    args.checkpoints = (
        [10_000, 50_000, 100_000] if args.quick else [10_000, 100_000, 500_000, 1_000_000]
    )
    rec = Recorder("long_run")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args, rec, Path(tmp)))
    if args.peer == "waku":
        run_waku(args, rec)


if __name__ == "__main__":
    main()
