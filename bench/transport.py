"""Benchmark of the transports: publish->receive throughput and latency.

Figures (one JSON object per line: ``name``, ``value``, ``unit`` and context;
printed and appended to ``bench/results/transport.jsonl``):

* ``mqtt.raw_paho.v311.*`` / ``.v5.*``: the baseline. Plain paho clients with
  their own network threads (``loop_start``), QoS 1, 100 messages in flight,
  publisher and subscriber on the machine's Mosquitto (127.0.0.1:1883).
* ``mqtt.transport.v311.*`` / ``.v5.*``: the same traffic through
  :class:`transports.mqtt.MqttTransport` (asyncio, QoS 1, bounded window).
  ``mqtt.transport.v311.throughput_ratio`` = transport / raw paho.
* ``mqtt.mosquitto.stalled_subscriber.{v311,v5}.kept``: of a 5000-message
  QoS 1 burst, how many reach a subscriber that reads nothing for 2 s (the
  broker's queue limit at work; v5 announces the adapter's Receive Maximum).
* ``mqtt.embedded.v311.*``: MqttTransport through the in-process amqtt broker.
* ``libp2p.gossipsub.*``: two :class:`transports.libp2p.Libp2pTransport` hosts
  on loopback in one process (one trio guest run on one asyncio loop).

Each pair is measured twice: a *flood* (send ``count`` messages as fast as
the sender's backpressure allows; ``throughput`` = messages delivered per
second from the first send to the last arrival) and a *paced* run at
``--rate`` messages/s (libp2p: ``--libp2p-rate``) whose one-way latencies give ``latency_p50`` /
``latency_p99`` (flood latencies measure queueing, not the path). Every
payload carries a sequence number and its send time; ``delivered`` counts
distinct sequence numbers.

Adding rows (e.g. the SDS reliable channel end to end): call
:func:`run_stream` with any ``send(payload) -> awaitable`` and an async
iterator of received payloads, then :func:`report`; see :func:`bench_transport`.

Usage: ``python bench/transport.py [--quick] [--only mqtt|stalled|embedded|libp2p]``
(``--quick`` finishes well under a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from transports.base import Transport

MOSQUITTO = ("127.0.0.1", 1883)
_HEADER = struct.Struct(">QQ")  # sequence number, send time (perf_counter_ns)


@dataclass
class StreamResult:
    """What one send->receive run measured."""

    sent: int
    delivered: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    #: CPU time of this process (every thread) over the run.
    cpu_seconds: float = 0.0

    @property
    def throughput(self) -> float:
        """Distinct messages delivered per second, first send to last arrival."""
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_throughput(self) -> float:
        """Distinct messages delivered per CPU second of this process: steadier than
        :attr:`throughput` on a shared machine, where a multi-threaded baseline gets
        more of the CPU than a single event loop."""
        return self.delivered / self.cpu_seconds if self.cpu_seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        """Latency percentile ``q`` in [0, 100], in milliseconds."""
        if not self.latencies_ms:
            return float("nan")
        if len(self.latencies_ms) == 1:
            return self.latencies_ms[0]
        cuts = statistics.quantiles(self.latencies_ms, n=1000, method="inclusive")
        return cuts[min(int(q * 10) - 1, len(cuts) - 1)]


def make_payload(seq: int, size: int) -> bytes:
    """``size`` bytes starting with the sequence number and the send time."""
    header = _HEADER.pack(seq, time.perf_counter_ns())
    return header + b"\x00" * max(0, size - len(header))


def read_payload(payload: bytes) -> tuple[int, float]:
    """Sequence number and one-way latency in ms of a :func:`make_payload` payload."""
    seq, sent_ns = _HEADER.unpack_from(payload)
    return seq, (time.perf_counter_ns() - sent_ns) / 1e6


async def run_stream(
    send: Callable[[bytes], Awaitable[Any]],
    receive: AsyncIterator[bytes],
    *,
    count: int,
    payload_size: int = 256,
    rate: float | None = None,
    timeout: float = 60.0,
    idle: float = 3.0,
    window: int = 1,
) -> StreamResult:
    """Send ``count`` payloads with ``send`` (paced to ``rate``/s, or flat out) and
    time their arrival on ``receive``. Works for any asyncio send/receive pair:
    a transport, or an SDS channel's send and delivered-message stream.

    ``window`` is how many sends may be in flight at once: 1 awaits each send
    before starting the next (one at a time); more starts each send as a task,
    in order, as soon as fewer than ``window`` are unfinished (a pipelined
    sender, e.g. an application that does not wait for one message's send
    before the next's)."""
    seen: set[int] = set()
    latencies: list[float] = []
    last_arrival = 0.0
    done = asyncio.Event()

    async def receiver() -> None:
        nonlocal last_arrival
        async for payload in receive:
            if len(payload) < _HEADER.size:
                continue
            seq, latency = read_payload(payload)
            if seq in seen or seq >= count:
                continue
            seen.add(seq)
            latencies.append(latency)
            last_arrival = time.perf_counter()
            if len(seen) == count:
                done.set()
                return

    task = asyncio.create_task(receiver())
    slots = asyncio.Semaphore(window)
    in_flight: set[asyncio.Task[None]] = set()

    async def send_one(payload: bytes) -> None:
        try:
            await send(payload)
        finally:
            slots.release()

    start = time.perf_counter()
    cpu_start = time.process_time()
    for seq in range(count):
        if rate is not None:
            due = start + seq / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        if window == 1:
            await send(make_payload(seq, payload_size))
            continue
        await slots.acquire()
        sending = asyncio.create_task(send_one(make_payload(seq, payload_size)))
        in_flight.add(sending)
        sending.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)
    deadline = time.perf_counter() + timeout
    while not done.is_set() and time.perf_counter() < deadline:
        try:
            await asyncio.wait_for(done.wait(), idle)
        except TimeoutError:
            if time.perf_counter() - max(last_arrival, start) > idle:
                break
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    end = last_arrival if seen else time.perf_counter()
    cpu = time.process_time() - cpu_start
    return StreamResult(count, len(seen), end - start, latencies, cpu)


def report(
    rec: Recorder, prefix: str, flood: StreamResult, paced: StreamResult, **extra: Any
) -> None:
    """Record throughput (from ``flood``) and latency (from ``paced``) under ``prefix``."""
    rec.record(
        f"{prefix}.throughput",
        flood.throughput,
        "msg/s",
        sent=flood.sent,
        delivered=flood.delivered,
        **extra,
    )
    for q in (50, 99):
        rec.record(
            f"{prefix}.latency_p{q}",
            paced.percentile(q),
            "ms",
            sent=paced.sent,
            delivered=paced.delivered,
            rate=round(paced.sent / paced.seconds, 1) if paced.seconds else None,
            **extra,
        )


async def payloads(transport: Transport, topic: str) -> AsyncIterator[bytes]:
    """Subscribe ``transport`` to ``topic`` and yield payloads (subscribed on first use)."""
    sub = await transport.subscribe(topic)
    try:
        async for env in sub:
            yield env.payload
    finally:
        await sub.close()


async def bench_transport(
    sender: Transport,
    receiver: Transport,
    topic: str,
    *,
    count: int,
    latency_count: int,
    rate: float,
    payload_size: int,
    after_subscribe: Callable[[str], Awaitable[None]] | None = None,
) -> tuple[StreamResult, StreamResult]:
    """Flood run and paced run from ``sender`` to ``receiver`` over ``topic``."""
    results = []
    for run, (n, r) in enumerate(((count, None), (latency_count, rate))):
        sub = await receiver.subscribe(f"{topic}/{run}")
        if after_subscribe is not None:
            await after_subscribe(f"{topic}/{run}")

        async def stream(sub: Any = sub) -> AsyncIterator[bytes]:
            async for env in sub:
                yield env.payload

        t = f"{topic}/{run}"

        async def send(payload: bytes, t: str = t) -> None:
            await sender.publish(t, payload)

        result = await run_stream(send, stream(), count=n, rate=r, payload_size=payload_size)
        print(
            f"# {topic} run {run}: {result.delivered}/{result.sent} in {result.seconds:.2f} s",
            file=sys.stderr,
        )
        results.append(result)
        await sub.close()
    return results[0], results[1]


# ---------------------------------------------------------------- raw paho


def raw_paho(
    protocol: str,
    count: int,
    payload_size: int,
    rate: float | None,
    timeout: float = 60.0,
    idle: float = 3.0,
) -> StreamResult:
    """The baseline: two plain paho clients with their network threads, QoS 1."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    version = MQTTProtocolVersion.MQTTv5 if protocol == "5" else MQTTProtocolVersion.MQTTv311
    topic = f"chorus/bench/raw/{time.monotonic_ns()}"
    seen: set[int] = set()
    latencies: list[float] = []
    last = [0.0]
    done = threading.Event()
    subscribed = threading.Event()
    connected = threading.Event()

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        seq, latency = read_payload(msg.payload)
        if seq in seen:
            return
        seen.add(seq)
        latencies.append(latency)
        last[0] = time.perf_counter()
        if len(seen) == count:
            done.set()

    sub = paho.Client(CallbackAPIVersion.VERSION2, protocol=version)
    sub.on_message = on_message
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.on_connect = lambda c, *a: c.subscribe(topic, qos=1)
    pub = paho.Client(CallbackAPIVersion.VERSION2, protocol=version)
    pub.max_inflight_messages_set(100)
    pub.on_connect = lambda *a: connected.set()
    sub.connect(*MOSQUITTO)
    pub.connect(*MOSQUITTO)
    sub.loop_start()
    pub.loop_start()
    try:
        if not (subscribed.wait(10) and connected.wait(10)):
            raise RuntimeError("raw paho clients did not connect to Mosquitto")
        start = time.perf_counter()
        cpu_start = time.process_time()
        for seq in range(count):
            if rate is not None:
                delay = start + seq / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            pub.publish(topic, make_payload(seq, payload_size), qos=1)
        deadline = time.perf_counter() + timeout
        while not done.wait(idle) and time.perf_counter() < deadline:
            if time.perf_counter() - max(last[0], start) > idle:
                break  # Mosquitto dropped the rest
        end = last[0] if seen else time.perf_counter()
        cpu = time.process_time() - cpu_start
        return StreamResult(count, len(seen), end - start, latencies, cpu)
    finally:
        pub.disconnect()
        sub.disconnect()
        pub.loop_stop()
        sub.loop_stop()


def burst_to_stalled_subscriber(protocol: str, count: int, stall: float = 2.0) -> int:
    """How many of a ``count``-message QoS 1 burst a subscriber that does not read
    for ``stall`` seconds still gets from Mosquitto (the rest the broker drops
    past ``max_queued_messages``). On MQTT 5 the subscriber announces the
    adapter's default Receive Maximum, as :class:`MqttTransport` does."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from transports.mqtt import MqttTransport

    topic = f"chorus/bench/stalled/{time.monotonic_ns()}"
    got: set[bytes] = set()
    v5 = protocol == "5"
    sub = paho.Client(
        CallbackAPIVersion.VERSION2,
        protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
    )
    sub.on_message = lambda c, u, m: got.add(bytes(m.payload[:8]))
    if v5:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.ReceiveMaximum = MqttTransport(protocol=5)._receive_maximum
        sub.connect(*MOSQUITTO, properties=props)
    else:
        sub.connect(*MOSQUITTO)
    sub.subscribe(topic, qos=1)
    for _ in range(20):
        sub.loop(0.02)
    pub = paho.Client(CallbackAPIVersion.VERSION2)
    pub.max_inflight_messages_set(100)
    pub.connect(*MOSQUITTO)
    pub.loop_start()
    try:
        for i in range(count):
            pub.publish(topic, i.to_bytes(8, "big") + b"\x00" * 248, qos=1)
        time.sleep(stall)  # the subscriber reads nothing meanwhile
        idle_since = time.perf_counter()
        while time.perf_counter() - idle_since < 1.0:
            before = len(got)
            sub.loop(0.05)
            if len(got) != before:
                idle_since = time.perf_counter()
        return len(got)
    finally:
        pub.disconnect()
        pub.loop_stop()
        sub.disconnect()


# ---------------------------------------------------------------- suites


async def bench_mqtt(rec: Recorder, args: argparse.Namespace) -> None:
    from transports.mqtt import MqttTransport

    host, port = MOSQUITTO
    for protocol in ("3.1.1", "5"):
        tag = "v311" if protocol == "3.1.1" else "v5"
        common = {"protocol": protocol, "payload_bytes": args.payload_size, "qos": 1}
        raw_flood = await asyncio.to_thread(raw_paho, protocol, args.count, args.payload_size, None)
        raw_paced = await asyncio.to_thread(
            raw_paho, protocol, args.latency_count, args.payload_size, args.rate
        )
        report(rec, f"mqtt.raw_paho.{tag}", raw_flood, raw_paced, **common)
        proto: Any = 5 if protocol == "5" else "3.1.1"
        async with (
            MqttTransport(host, port, protocol=proto) as a,
            MqttTransport(host, port, protocol=proto) as b,
        ):
            flood, paced = await bench_transport(
                a,
                b,
                f"chorus/bench/transport/{time.monotonic_ns()}",
                count=args.count,
                latency_count=args.latency_count,
                rate=args.rate,
                payload_size=args.payload_size,
            )
        report(rec, f"mqtt.transport.{tag}", flood, paced, **common)
        rec.record(
            f"mqtt.transport.{tag}.throughput_ratio",
            flood.throughput / raw_flood.throughput if raw_flood.throughput else 0.0,
            "x",
            baseline=f"mqtt.raw_paho.{tag}.throughput",
            **common,
        )


async def bench_stalled(rec: Recorder, args: argparse.Namespace) -> None:
    count = 5000
    for protocol, tag in (("3.1.1", "v311"), ("5", "v5")):
        kept = await asyncio.to_thread(burst_to_stalled_subscriber, protocol, count)
        rec.record(
            f"mqtt.mosquitto.stalled_subscriber.{tag}.kept",
            kept,
            "msg",
            sent=count,
            stall_s=2.0,
            note="QoS 1 burst to a subscriber not reading; Mosquitto defaults drop the rest",
        )


async def bench_embedded(rec: Recorder, args: argparse.Namespace) -> None:
    from transports.embedded_broker import embedded_broker
    from transports.mqtt import MqttTransport

    async with (
        embedded_broker() as url,
        MqttTransport.from_url(url, protocol="3.1.1") as a,
        MqttTransport.from_url(url, protocol="3.1.1") as b,
    ):
        flood, paced = await bench_transport(
            a,
            b,
            "chorus/bench/embedded",
            count=max(args.count // 4, 100),
            latency_count=args.latency_count,
            rate=args.rate,
            payload_size=args.payload_size,
        )
    report(
        rec,
        "mqtt.embedded.v311",
        flood,
        paced,
        broker="amqtt (in-process)",
        payload_bytes=args.payload_size,
        qos=1,
    )


async def bench_libp2p(rec: Recorder, args: argparse.Namespace) -> None:
    from transports.libp2p import Libp2pTransport

    topic = "chorus/bench/libp2p"
    async with Libp2pTransport() as a, Libp2pTransport(bootstrap=[a.addrs[0]]) as b:

        async def wait_mesh(t: str) -> None:
            # The sender must know the receiver subscribes before publishing.
            await a.wait_for_peers(t, 1)

        flood, paced = await bench_transport(
            a,
            b,
            topic,
            count=args.libp2p_count,
            latency_count=args.libp2p_latency_count,
            rate=args.libp2p_rate,
            payload_size=args.payload_size,
            after_subscribe=wait_mesh,
        )
    report(
        rec,
        "libp2p.gossipsub",
        flood,
        paced,
        hosts=2,
        payload_bytes=args.payload_size,
        note="both hosts in one process and one trio guest run",
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, < 60 s")
    parser.add_argument(
        "--only", choices=["mqtt", "stalled", "embedded", "libp2p"], action="append"
    )
    parser.add_argument("--payload-size", type=int, default=256)
    parser.add_argument("--rate", type=float, default=200.0, help="paced-run rate, msg/s")
    # py-libp2p tops out at a few hundred msg/s on this machine: pace below that,
    # or the latency measures a growing queue.
    parser.add_argument("--libp2p-rate", type=float, default=50.0, help="libp2p paced rate")
    args = parser.parse_args()
    args.count = 3000 if args.quick else 30000
    args.libp2p_count = 500 if args.quick else 5000
    args.latency_count = 300 if args.quick else 2000
    args.libp2p_latency_count = 100 if args.quick else 500
    rec = Recorder("transport")
    rec.run["quick"] = args.quick
    suites = args.only or ["mqtt", "stalled", "embedded", "libp2p"]
    if "mqtt" in suites:
        await bench_mqtt(rec, args)
    if "stalled" in suites:
        await bench_stalled(rec, args)
    if "embedded" in suites:
        await bench_embedded(rec, args)
    if "libp2p" in suites:
        await bench_libp2p(rec, args)


if __name__ == "__main__":
    asyncio.run(main())
