"""Benchmark of the reliable-channel runtime end to end, against raw paho in the same run.

Figures (JSON lines, the convention of ``bench/transport.py``; printed and
appended to ``bench/results/runtime.jsonl``):

* ``mqtt.raw_paho.v311.*``: the baseline, measured in this run: two plain paho
  clients (network threads, QoS 1, 100 in flight) on Mosquitto 127.0.0.1:1883.
* ``runtime.mqtt.v311.*``: one :class:`~sdk.runtime.Node` sends with
  ``await channel.send(payload)``, another receives
  :class:`~sdk.runtime.Delivery` events; both over
  :class:`~transports.mqtt.MqttTransport` (QoS 1, MQTT 3.1.1, ``no_local=True``
  as ``docs/runtime.md`` recommends: a 3.1.1 broker still sends the sender its
  own messages, the adapter drops them on arrival instead of queueing them for
  the runtime; raw paho's publisher subscribes to nothing)
  on the same Mosquitto; ``compact`` bloom profile; no database.
* ``runtime.mqtt.v311.sqlite.*``: the same with both nodes persisting to SQLite
  (WAL, ``synchronous=NORMAL``; every send committed before it is published,
  every delivery before it is handed over).
* ``runtime.mqtt.v311.pipelined.*`` / ``runtime.mqtt.v311.sqlite.pipelined.*``:
  the same two, with a pipelined sender: up to ``--window`` (64) sends in
  flight, each ``await channel.send(payload)`` its own task started in order
  (what an application does that does not wait for one message's send before
  the next's). Sends made in the same event-loop turn share one commit, so this
  is the row that shows the group commit; the one-at-a-time rows above pay one
  commit per message on the sender by construction (each ``send`` returns only
  once its own message is committed).
* ``runtime.libp2p.gossipsub.*`` (with ``--libp2p``): the same between two
  :class:`~transports.libp2p.Libp2pTransport` hosts on loopback (no ratio: the
  baseline is ``bench/transport.py``'s libp2p row).
* ``*.cpu_throughput_ratio``: the same comparison per CPU second of the process
  (deliveries / ``time.process_time()``, every thread): raw paho runs three
  threads and the runtime one event loop, so under load from other processes
  wall-clock ratios move against the runtime; this one moves less.
* ``*.throughput_ratio``: runtime throughput / raw paho throughput (target >= 0.5
  with SQLite, judged on the pipelined row: raw paho's own publisher keeps 100
  messages in flight, so the pipelined sender is the like-for-like comparison),
  medians of ``--repeat`` interleaved floods.
* ``runtime.mqtt.v311.ack_latency_p50`` / ``_p99`` (seconds): two idle peers with the
  runtime's defaults (``ChannelConfig()``, ``RuntimeOptions()``) on Mosquitto; one
  sends a message every ``--ack-gap`` seconds, the other only reads its events;
  time from ``send`` to ``handle.acknowledged()`` (target p50 <= 2 s, p99 <= 5 s).
  ``--only ack`` runs just this part.

Throughput is a flood (send ``count`` as fast as backpressure allows;
delivered per second from the first send to the last delivery); latency
percentiles come from a paced run at ``--rate``/s, one way, send call to
delivery event. Payloads are ``--payload-size`` bytes of content (the SDS
envelope adds ids, a 328-byte filter and the causal history).

Usage: ``python bench/runtime.py [--quick] [--only ack|throughput]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from bench.transport import MOSQUITTO, StreamResult, raw_paho, run_stream
from bench.transport import report as _record
from sdk.runtime import Delivery, Node, ReliableChannel
from sdk.sds import COMPACT, ChannelConfig

CONFIG = ChannelConfig(bloom=COMPACT, causal_history_size=2)


async def _deliveries(channel: ReliableChannel) -> AsyncIterator[bytes]:
    async for event in channel.events():
        if isinstance(event, Delivery):
            yield event.content


async def runtime_stream(
    count: int, payload_size: int, rate: float | None, db_dir: str | None, window: int = 1
) -> StreamResult:
    """One flood or paced run between two nodes on Mosquitto."""
    from transports.mqtt import MqttTransport

    host, port = MOSQUITTO
    channel_id = f"bench-{time.monotonic_ns()}"
    async with (
        MqttTransport(host, port, protocol="3.1.1", no_local=True) as ta,
        MqttTransport(host, port, protocol="3.1.1", no_local=True) as tb,
    ):
        db_a = os.path.join(db_dir, f"{channel_id}-a.db") if db_dir else None
        db_b = os.path.join(db_dir, f"{channel_id}-b.db") if db_dir else None
        async with (
            Node(ta, "bench-a", config=CONFIG, db=db_a) as a,
            Node(tb, "bench-b", config=CONFIG, db=db_b) as b,
        ):
            sender = await a.join(channel_id)
            receiver = await b.join(channel_id)

            async def send(payload: bytes) -> None:
                await sender.send(payload)

            return await run_stream(
                send,
                _deliveries(receiver),
                count=count,
                payload_size=payload_size,
                rate=rate,
                window=window,
            )


async def ack_latencies(samples: int, gap: float, timeout: float) -> list[float]:
    """Send ``samples`` messages between two idle default nodes; seconds to acknowledgement."""
    from transports.mqtt import MqttTransport

    host, port = MOSQUITTO
    channel_id = f"bench-ack-{time.monotonic_ns()}"
    latencies: list[float] = []
    async with (
        MqttTransport(host, port, protocol="3.1.1") as ta,
        MqttTransport(host, port, protocol="3.1.1") as tb,
        Node(ta, "bench-ack-a") as a,
        Node(tb, "bench-ack-b") as b,
    ):
        sender = await a.join(channel_id)
        receiver = await b.join(channel_id)

        async def read() -> None:
            async for _ in receiver.events():
                pass

        reader = asyncio.create_task(read())
        for k in range(samples):
            await asyncio.sleep(gap)
            started = time.monotonic()
            handle = await sender.send(f"ack probe {k}".encode())
            try:
                await handle.acknowledged(timeout=timeout)
            except TimeoutError:
                latencies.append(float("inf"))
                continue
            latencies.append(time.monotonic() - started)
        reader.cancel()
    return latencies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def runtime_libp2p_stream(count: int, payload_size: int, rate: float | None) -> StreamResult:
    """One run between two nodes on two libp2p GossipSub hosts on loopback."""
    from transports.base import topic_for_channel
    from transports.libp2p import Libp2pTransport

    channel_id = f"bench-{time.monotonic_ns()}"
    async with (
        Libp2pTransport() as ta,
        Libp2pTransport(bootstrap=[ta.addrs[0]]) as tb,
        Node(ta, "bench-a", config=CONFIG) as a,
        Node(tb, "bench-b", config=CONFIG) as b,
    ):
        sender = await a.join(channel_id)
        receiver = await b.join(channel_id)
        await ta.wait_for_peers(topic_for_channel(channel_id), 1)

        async def send(payload: bytes) -> None:
            await sender.send(payload)

        return await run_stream(
            send, _deliveries(receiver), count=count, payload_size=payload_size, rate=rate
        )


async def main(args: argparse.Namespace) -> None:
    """Run every figure; floods are repeated and interleaved, medians recorded."""
    rec = Recorder("runtime")
    rec.run["quick"] = args.quick
    if args.only in (None, "ack"):
        lat = await ack_latencies(args.ack_samples, args.ack_gap, args.ack_timeout)
        done = [x for x in lat if x != float("inf")]
        print(f"# ack latencies (s): {[round(x, 2) for x in lat]}", file=sys.stderr)
        tags = {
            "protocol": "3.1.1",
            "samples": len(lat),
            "timed_out": len(lat) - len(done),
            "timeout_s": args.ack_timeout,
            "gap_s": args.ack_gap,
            "config": "defaults",
        }
        rec.record("runtime.mqtt.v311.ack_latency_p50", _percentile(lat, 0.5), "s", **tags)
        rec.record("runtime.mqtt.v311.ack_latency_p99", _percentile(lat, 0.99), "s", **tags)
        if args.only == "ack":
            return
    common = {"protocol": "3.1.1", "payload_bytes": args.payload_size, "qos": 1}
    # (name, persistent, window): one await send() at a time, and a pipelined sender
    # with up to --window sends in flight (concurrent sends share one commit).
    variants = (
        ("runtime.mqtt.v311", False, 1),
        ("runtime.mqtt.v311.sqlite", True, 1),
        ("runtime.mqtt.v311.pipelined", False, args.window),
        ("runtime.mqtt.v311.sqlite.pipelined", True, args.window),
    )
    floods: dict[str, list[StreamResult]] = {"mqtt.raw_paho.v311": []}
    for name, _, _ in variants:
        floods[name] = []
    with tempfile.TemporaryDirectory() as tmp:
        # Interleaved repetitions: on a shared machine the load changes by the second,
        # so each comparison is made between runs close in time.
        for _ in range(args.repeat):
            floods["mqtt.raw_paho.v311"].append(
                await asyncio.to_thread(raw_paho, "3.1.1", args.count, args.payload_size, None)
            )
            for name, persistent, window in variants:
                floods[name].append(
                    await runtime_stream(
                        args.count, args.payload_size, None, tmp if persistent else None, window
                    )
                )
        paced = {
            "mqtt.raw_paho.v311": await asyncio.to_thread(
                raw_paho, "3.1.1", args.latency_count, args.payload_size, args.rate
            )
        }
        for name, persistent, window in variants:
            paced[name] = await runtime_stream(
                args.latency_count,
                args.payload_size,
                args.rate,
                tmp if persistent else None,
                window,
            )

    def median_by(runs: list[StreamResult], key: str) -> StreamResult:
        ordered = sorted(runs, key=lambda r: float(getattr(r, key)))
        return ordered[len(ordered) // 2]

    def median(name: str) -> StreamResult:
        return median_by(floods[name], "throughput")

    raw = median("mqtt.raw_paho.v311")
    _record(
        rec, "mqtt.raw_paho.v311", raw, paced["mqtt.raw_paho.v311"], repeat=args.repeat, **common
    )
    for name, persistent, window in variants:
        flood = median(name)
        extra = {
            **common,
            "bloom": "compact",
            "persistence": "sqlite" if persistent else "none",
            "window": window,
            "repeat": args.repeat,
        }
        print(
            f"# {name}: floods "
            + ", ".join(f"{r.throughput:.0f}" for r in floods[name])
            + " msg/s; raw "
            + ", ".join(f"{r.throughput:.0f}" for r in floods["mqtt.raw_paho.v311"])
            + " msg/s; per CPU second "
            + ", ".join(f"{r.cpu_throughput:.0f}" for r in floods[name])
            + " vs raw "
            + ", ".join(f"{r.cpu_throughput:.0f}" for r in floods["mqtt.raw_paho.v311"]),
            file=sys.stderr,
        )
        _record(rec, name, flood, paced[name], **extra)
        rec.record(
            f"{name}.throughput_ratio",
            flood.throughput / raw.throughput if raw.throughput else 0.0,
            "x",
            baseline="mqtt.raw_paho.v311.throughput (median of the same run)",
            **extra,
        )
        raw_cpu = median_by(floods["mqtt.raw_paho.v311"], "cpu_throughput").cpu_throughput
        ours_cpu = median_by(floods[name], "cpu_throughput").cpu_throughput
        rec.record(
            f"{name}.cpu_throughput_ratio",
            ours_cpu / raw_cpu if raw_cpu else 0.0,
            "x",
            baseline="mqtt.raw_paho.v311 deliveries per process CPU second (median, same run)",
            **extra,
        )
    if args.libp2p:
        flood = await runtime_libp2p_stream(args.libp2p_count, args.payload_size, None)
        paced = await runtime_libp2p_stream(args.latency_count, args.payload_size, args.rate)
        _record(
            rec,
            "runtime.libp2p.gossipsub",
            flood,
            paced,
            hosts=2,
            payload_bytes=args.payload_size,
            bloom="compact",
            persistence="none",
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (under a minute)")
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--latency-count", type=int, default=None)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--payload-size", type=int, default=256)
    parser.add_argument(
        "--window", type=int, default=64, help="sends in flight in the pipelined rows"
    )
    parser.add_argument("--repeat", type=int, default=None, help="flood repetitions (median)")
    parser.add_argument("--libp2p", action="store_true", help="add the libp2p GossipSub rows")
    parser.add_argument("--libp2p-count", type=int, default=None)
    parser.add_argument("--only", choices=("ack", "throughput"), default=None)
    parser.add_argument("--ack-samples", type=int, default=None)
    parser.add_argument("--ack-gap", type=float, default=1.0, help="idle seconds between probes")
    parser.add_argument("--ack-timeout", type=float, default=120.0)
    ns = parser.parse_args()
    ns.count = ns.count or (3_000 if ns.quick else 20_000)
    ns.latency_count = ns.latency_count or (300 if ns.quick else 2_000)
    ns.repeat = ns.repeat or (3 if ns.quick else 5)
    ns.libp2p_count = ns.libp2p_count or (500 if ns.quick else 3_000)
    ns.ack_samples = ns.ack_samples or (10 if ns.quick else 50)
    asyncio.run(main(ns))
