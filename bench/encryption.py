"""Benchmark of encrypted channels against unencrypted ones, in the same run.

Figures (JSON lines; printed and appended to ``bench/results/encryption.jsonl``):

* ``encryption.mqtt.v311.sqlite.pipelined.throughput`` (msg/s) and the same
  ``.plain`` row: two :class:`~sdk.runtime.Node` on Mosquitto 127.0.0.1:1883, both
  persisting to SQLite, a pipelined sender (``--window`` sends in flight, as in
  ``bench/runtime.py``), the receiver reading :class:`~sdk.runtime.Delivery`
  events; encrypted with :class:`~sdk.encryption.ChannelEncryption` or not.
* ``encryption.throughput_ratio``: encrypted / unencrypted throughput, medians of
  ``--repeat`` interleaved floods (target >= 0.7). ``encryption.cpu_throughput_ratio``:
  the same per CPU second of the process (steadier on a shared machine).
  ``encryption.loop_cpu_ratio``: event loop thread CPU per message, plain / sealed
  (``...plain.loop_cpu_us`` and ``...sealed.loop_cpu_us``): the throughput ratio the
  run would reach where the loop is the bottleneck and a core is free for the
  signature checks a batch hands to a worker thread (the load of a shared machine
  takes that core, and the throughput ratio with it).
* ``encryption.overhead_bytes``: bytes the envelope adds per published message
  (sealed size minus SDS size, averaged over every publish of the encrypted floods;
  target <= 120).
* ``encryption.seal_open_us``: one seal plus one open of a message of
  ``--payload-size`` bytes, without any network (microseconds, median of 5 x 2,000).
* ``encryption.store_ingest_ratio``: a store node's ingest (:class:`store_node.ingest.Ingest`
  into a SQLite archive, in process, no broker) of ``--count`` sealed envelopes / of the same
  messages in clear, messages per second, medians of ``--repeat`` interleaved runs (target
  >= 0.9); ``encryption.store_ingest.sealed`` / ``.plain`` are the rates.

Usage: ``python bench/encryption.py [--quick] [--store-only]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from bench.runtime import CONFIG, _deliveries
from bench.transport import MOSQUITTO, StreamResult, run_stream
from sdk.encryption import ChannelEncryption, Identity, KeyRing, new_epoch
from sdk.runtime import Node
from sdk.sds.message import HistoryEntry, Message, encode_message


class _Measured:
    """Wraps a handle and sums what sealing adds."""

    def __init__(self, inner: ChannelEncryption) -> None:
        self.inner = inner
        self.overhead = inner.overhead
        # What the runtime asks of the handle, passed through: without it the sender
        # would log each message under its clear hash and update it to the envelope's
        # at publish (one more SQL statement per message than a real handle costs).
        self.stable_envelopes = inner.stable_envelopes
        self.sealed = 0
        self.added = 0

    def encrypt(self, clear_payload: bytes) -> bytes:
        out = self.inner.encrypt(clear_payload)
        self.sealed += 1
        self.added += len(out) - len(clear_payload)
        return out

    def decrypt(self, encrypted_payload: bytes) -> bytes:
        return self.inner.decrypt(encrypted_payload)


def _handles(channel_id: str) -> tuple[ChannelEncryption, ChannelEncryption]:
    a, b = Identity.generate(), Identity.generate()
    epoch = new_epoch(0, {"bench-a": a.signing_public, "bench-b": b.signing_public})
    rings = [KeyRing(channel_id), KeyRing(channel_id)]
    for ring in rings:
        ring.add(epoch)
    return ChannelEncryption(rings[0], "bench-a", a), ChannelEncryption(rings[1], "bench-b", b)


async def stream(
    count: int, payload_size: int, db_dir: str, window: int, measured: list[_Measured] | None
) -> StreamResult:
    """One flood between two persisting nodes; encrypted when ``measured`` is a list."""
    from transports.mqtt import MqttTransport

    host, port = MOSQUITTO
    channel_id = f"bench-enc-{time.monotonic_ns()}"
    enc_a: _Measured | None = None
    enc_b: ChannelEncryption | None = None
    if measured is not None:
        handle_a, enc_b = _handles(channel_id)
        enc_a = _Measured(handle_a)
        measured.append(enc_a)
    async with (
        MqttTransport(host, port, protocol="3.1.1", no_local=True) as ta,
        MqttTransport(host, port, protocol="3.1.1", no_local=True) as tb,
    ):
        db_a = os.path.join(db_dir, f"{channel_id}-a.db")
        db_b = os.path.join(db_dir, f"{channel_id}-b.db")
        async with (
            Node(ta, "bench-a", config=CONFIG, db=db_a) as a,
            Node(tb, "bench-b", config=CONFIG, db=db_b) as b,
        ):
            sender = await a.join(channel_id, encryption=enc_a)
            receiver = await b.join(channel_id, encryption=enc_b)

            async def send(payload: bytes) -> None:
                await sender.send(payload)

            return await run_stream(
                send, _deliveries(receiver), count=count, payload_size=payload_size, window=window
            )


def seal_open_us(payload_size: int) -> float:
    """Median microseconds for one seal and one open, no network."""
    enc_a, enc_b = _handles("room")
    enc_a = ChannelEncryption(enc_a.ring, "bench-a", enc_a.identity, cache_size=0)
    messages = [
        encode_message(Message("bench-a", f"m{i}", "room", i + 1, content=bytes(payload_size)))
        for i in range(2_000)
    ]
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for m in messages:
            enc_b.decrypt(enc_a.encrypt(m))
        rounds.append((time.perf_counter() - start) / len(messages) * 1e6)
    return statistics.median(rounds)


async def store_ingest_rate(payloads: list[bytes], folder: str) -> float:
    """Messages per second a store node's ingest archives ``payloads`` (one fresh
    SQLite archive, in process: what differs between clear and sealed is the ingest)."""
    from store_node.archive.sqlite import SqliteArchive
    from store_node.ingest import Ingest
    from transports.base import Envelope, message_hash, topic_for_channel

    topic = topic_for_channel("room")
    envelopes = [Envelope(topic, p, message_hash(topic, p)) for p in payloads]
    archive = SqliteArchive(Path(tempfile.mkdtemp(dir=folder)) / "archive.db")
    archive.migrate()
    ingest = Ingest(archive, batch_interval=0.01)
    await ingest.start()
    archived = "chorus_store_ingest_archived_total"
    start = time.perf_counter()
    for envelope in envelopes:
        await ingest.submit(envelope)
    while ingest.metrics.value(archived) < len(envelopes):
        await asyncio.sleep(0.001)
    took = time.perf_counter() - start
    await ingest.stop()
    archive.close()
    return len(envelopes) / took


async def store_ingest(rec: Recorder, args: argparse.Namespace, folder: str) -> None:
    """Record ``encryption.store_ingest_ratio`` (module docstring)."""
    enc_a, _ = _handles("room")
    enc_a = ChannelEncryption(enc_a.ring, "bench-a", enc_a.identity, cache_size=0)
    clear = [
        encode_message(
            Message(
                "bench-a",
                f"m{i:08d}",
                "room",
                1_700_000_000_000 + i,
                tuple(HistoryEntry(f"m{j:08d}") for j in range(max(0, i - 3), i)),
                content=bytes(args.payload_size),
            )
        )
        for i in range(args.count)
    ]
    sealed = [enc_a.encrypt(m) for m in clear]
    plain_rates, sealed_rates = [], []
    for _ in range(args.repeat):
        plain_rates.append(await store_ingest_rate(clear, folder))
        sealed_rates.append(await store_ingest_rate(sealed, folder))
    tags = {"count": args.count, "payload_bytes": args.payload_size, "repeat": args.repeat}
    plain, sealed_rate = statistics.median(plain_rates), statistics.median(sealed_rates)
    rec.record("encryption.store_ingest.plain", plain, "msg/s", **tags)
    rec.record("encryption.store_ingest.sealed", sealed_rate, "msg/s", **tags)
    rec.record(
        "encryption.store_ingest_ratio",
        sealed_rate / max(plain, 1e-9),
        "ratio",
        target=">= 0.9",
        **tags,
    )


async def main(args: argparse.Namespace) -> None:
    """Interleaved floods, medians recorded."""
    rec = Recorder("encryption")
    rec.run["quick"] = args.quick
    if args.store_only:
        with tempfile.TemporaryDirectory() as tmp:
            await store_ingest(rec, args, tmp)
        return
    common = {
        "protocol": "3.1.1",
        "qos": 1,
        "payload_bytes": args.payload_size,
        "persistence": "sqlite",
        "window": args.window,
        "repeat": args.repeat,
        "count": args.count,
    }
    plain: list[StreamResult] = []
    sealed: list[StreamResult] = []
    measured: list[_Measured] = []
    # Event loop thread CPU per message (the loop runs both nodes in this thread).
    loop_us: dict[str, list[float]] = {"plain": [], "sealed": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for kind, runs, arg in (("plain", plain, None), ("sealed", sealed, measured)):
                start = time.thread_time()
                runs.append(await stream(args.count, args.payload_size, tmp, args.window, arg))
                loop_us[kind].append((time.thread_time() - start) / args.count * 1e6)
    print("# plain floods: " + ", ".join(f"{r.throughput:.0f}" for r in plain), file=sys.stderr)
    print("# sealed floods: " + ", ".join(f"{r.throughput:.0f}" for r in sealed), file=sys.stderr)

    def median(runs: list[StreamResult], key: str) -> float:
        return statistics.median(float(getattr(r, key)) for r in runs)

    name = "encryption.mqtt.v311.sqlite.pipelined"
    rec.record(f"{name}.plain.throughput", median(plain, "throughput"), "msg/s", **common)
    rec.record(f"{name}.throughput", median(sealed, "throughput"), "msg/s", **common)
    rec.record(
        "encryption.throughput_ratio",
        median(sealed, "throughput") / max(median(plain, "throughput"), 1e-9),
        "ratio",
        target=">= 0.7",
        **common,
    )
    rec.record(
        "encryption.cpu_throughput_ratio",
        median(sealed, "cpu_throughput") / max(median(plain, "cpu_throughput"), 1e-9),
        "ratio",
        **common,
    )
    for kind in ("plain", "sealed"):
        rec.record(
            f"{name}.{kind}.loop_cpu_us", statistics.median(loop_us[kind]), "us/msg", **common
        )
    rec.record(
        "encryption.loop_cpu_ratio",
        statistics.median(loop_us["plain"]) / max(statistics.median(loop_us["sealed"]), 1e-9),
        "ratio",
        **common,
    )
    sealed_count = sum(m.sealed for m in measured)
    rec.record(
        "encryption.overhead_bytes",
        sum(m.added for m in measured) / max(sealed_count, 1),
        "bytes/message",
        target="<= 120",
        publishes=sealed_count,
        **common,
    )
    rec.record(
        "encryption.seal_open_us",
        seal_open_us(args.payload_size),
        "us",
        payload_bytes=args.payload_size,
    )
    with tempfile.TemporaryDirectory() as tmp:
        await store_ingest(rec, args, tmp)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5_000)
    parser.add_argument("--payload-size", type=int, default=256)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 messages, one repeat")
    parser.add_argument(
        "--store-only", action="store_true", help="only the store ingest figures (no broker)"
    )
    args = parser.parse_args()
    if args.quick:
        args.count, args.repeat = 1_000, 1
    return args


if __name__ == "__main__":
    asyncio.run(main(_parse()))
