"""Demo: a group chat of several participants converging over a lossy network.

By default (``scripts/demo`` or ``python examples/demo.py``) it runs for real:
an MQTT broker embedded in this process (amqtt on 127.0.0.1, a port the OS
picks; ``--broker mqtt://127.0.0.1:1883`` uses Mosquitto instead), one
:class:`~sdk.runtime.Node` per participant, each on its own MQTT connection
wrapped in a :class:`~sdk.runtime.lossy.LossyTransport` that drops 30% of what
arrives and of what is published, duplicates 5% and reorders — loss below the
SDK, which SDS repairs with resends, store retrieval and SDS-R. An in-memory
stand-in store archives what reaches the broker and answers the participants'
store retrievals. Every participant sends a few
lines; at the end each prints what it delivered and the demo checks that all
local logs hold the same messages in the same order (exit status 0).

The live demo ends with a short analytics report over what was archived: a real
store node (:class:`store_node.node.StoreNode`, SQLite in a temporary folder)
subscribes to the demo channel on the same broker for the whole run, then its
archive is exported to Parquet and the Spark report (``store_node.analytics``,
local mode, 127.0.0.1, UI off) prints messages, participants, delivery delay
percentiles, rebroadcasts and loss as the archive saw them. Spark needs Java 17+;
without it the demo says what to install and skips that step. ``--no-analytics``
skips it, ``--report DIR`` keeps the Parquet export and the report's tables
and plots. The exit status depends only on convergence.

``--simulated`` runs the manual-clock version instead: the SDS core on a
simulated network with a partition, no real time, no sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

if not __package__:
    # Run as a file (`python examples/demo.py`, from any folder): this
    # checkout's packages come first. (`python -m examples.demo` works only in the
    # checkout's root: elsewhere `examples` is py-libp2p's package of that name.)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.runtime import Delivery, Node, ReliableChannel, RuntimeOptions
from sdk.runtime.archiving import ArchivingTransport
from sdk.runtime.lossy import LossyTransport
from sdk.sds import COMPACT, WAKU, ChannelConfig, RepairConfig
from sdk.store.client import InMemoryStore
from sdk.testing.simulation import GroupSimulation
from transports.faults import FaultConfig, FaultInjector

CHANNEL = "demo-room"
LINES = [
    "hi all",
    "anyone up for lunch?",
    "the build is green again",
    "ship it",
    "who broke the coffee machine",
    "meeting moved to 3pm",
]


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit status 0 when every participant converged."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=5)
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--loss", type=float, default=0.3)
    parser.add_argument("--profile", choices=["waku", "compact"], default="compact")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--broker", help="mqtt://host:port of a running broker (default: embedded amqtt)"
    )
    parser.add_argument(
        "--simulated", action="store_true", help="manual-clock simulation, no sockets"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to converge")
    parser.add_argument(
        "--no-analytics",
        action="store_true",
        help="skip the store node and the Spark report at the end of the live demo",
    )
    parser.add_argument(
        "--report",
        metavar="DIR",
        help="keep the Parquet export and the analytics report (tables, plots) in DIR",
    )
    ns = parser.parse_args(argv)
    if ns.simulated:
        return simulated(ns)
    unavailable = None if ns.no_analytics else analytics_unavailable()
    workdir = Path(tempfile.mkdtemp(prefix="chorus-demo-"))
    try:
        ns.archive_dir = None if ns.no_analytics or unavailable else workdir
        status = asyncio.run(live(ns))
        if unavailable:
            print(f"analytics skipped: {unavailable}")
        elif ns.archive_dir is not None:
            analytics_report(workdir, Path(ns.report) if ns.report else None)
        return status
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def analytics_unavailable() -> str | None:
    """Why the Spark report cannot run here (and what to install), or ``None`` if it can."""
    try:
        import pyspark  # noqa: F401

        from store_node.analytics.errors import JavaNotFoundError
        from store_node.analytics.session import find_java
    except ImportError as exc:
        return f"PySpark is not installed ({exc}); run scripts/bootstrap"
    try:
        find_java()
    except JavaNotFoundError as exc:
        return str(exc)  # names the package: sudo apt install openjdk-17-jre-headless
    return None


@contextlib.asynccontextmanager
async def store_node(url: str, protocol: str, folder: Path | None) -> AsyncIterator[Any]:
    """A real store node archiving the demo channel into ``folder`` (none when ``None``)."""
    if folder is None:
        yield None
        return
    from store_node.config import parse_config
    from store_node.node import StoreNode
    from transports.mqtt import MqttTransport

    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [CHANNEL], "batch_interval_ms": 20},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        folder,
    )
    transport = MqttTransport.from_url(url, protocol=protocol)  # type: ignore[arg-type]
    await transport.connect()
    node = StoreNode(config, transport=transport)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()  # closes the transport after archiving what it already received


def analytics_report(folder: Path, keep: Path | None) -> None:
    """Export the store node's archive and print the Spark report's short summary.

    The export and the report go to ``keep`` (``export/``, ``report/``) when given, else
    next to the archive in ``folder`` (a temporary folder).
    """
    from store_node.analytics.report import run_report
    from store_node.analytics.session import build_session
    from store_node.archive import open_archive
    from store_node.config import ArchiveConfig
    from store_node.export import export_archive

    started = time.monotonic()
    base = keep or folder
    print("analytics: exporting the store node's archive and running the Spark report ...")
    with open_archive(ArchiveConfig(path=folder / "archive.db")) as archive:
        export = export_archive(archive, base / "export", progress=False, overwrite=True)
    if not export.rows:
        print("analytics skipped: the store node archived nothing")
        return
    from pyspark.sql import SparkSession

    had_session = SparkSession.getActiveSession() is not None
    spark = build_session(
        "local[2]",
        app_name="chorus-demo",
        extra_conf={
            # A few hundred messages: small and quick beats the 10M-message defaults.
            "spark.driver.memory": "1g",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    try:
        result = run_report(spark, base / "export", base / "report")
    finally:
        if not had_session:  # a caller's session (a notebook, the tests) keeps running
            spark.stop()
    print(result.summary)
    kept = f"; export and report (tables, plots) kept in {keep}" if keep else ""
    print(f"analytics: {time.monotonic() - started:.1f} s{kept}")


async def live(ns: argparse.Namespace) -> int:
    """Participants over a real MQTT broker with loss injected below the SDK."""

    if ns.broker:
        return await _run_live(ns, ns.broker, "3.1.1")
    from transports.embedded_broker import embedded_broker

    async with embedded_broker() as url:
        return await _run_live(ns, url, "3.1.1")


async def _run_live(ns: argparse.Namespace, url: str, protocol: str) -> int:
    # The store node subscribes before anyone joins, and stops after everyone left.
    async with store_node(url, protocol, getattr(ns, "archive_dir", None)) as store_node_:
        status = await _chat_live(ns, url, protocol)
    if store_node_ is not None:
        archived = store_node_.metrics.value("chorus_store_ingest_archived_total")
        # SDS's sync and ephemeral messages are archived too; the report counts them apart.
        print(
            f"store node: archived {archived:.0f} distinct messages of {CHANNEL} "
            "(content, sync and ephemeral)"
        )
    return status


async def _chat_live(ns: argparse.Namespace, url: str, protocol: str) -> int:
    from transports.mqtt import MqttTransport

    config = ChannelConfig(
        bloom=COMPACT if ns.profile == "compact" else WAKU,
        resend_interval_ms=600,
        possibly_acked_resend_interval_ms=1_200,
        sweep_interval_ms=50,
        sync_interval_ms=500,
        retrieval_interval_ms=300,
        repair=RepairConfig(t_min_ms=1_000, t_max_ms=4_000),
    )
    options = RuntimeOptions(store_timeout=1.0)
    faults = FaultInjector(
        FaultConfig(loss=ns.loss, duplication=0.05, delay_ms=5, jitter_ms=60), seed=ns.seed
    )
    store = InMemoryStore()
    rng = random.Random(ns.seed)
    names = [f"p{i:02d}" for i in range(ns.participants)]
    print(
        f"{ns.participants} participants over MQTT at {url}, {ns.messages} messages, "
        f"{ns.loss:.0%} loss and 5% duplication injected below the SDK, reordering, "
        f"'{ns.profile}' bloom profile"
    )
    mqtt = [MqttTransport.from_url(url, protocol=protocol) for _ in names]  # type: ignore[arg-type]
    for t in mqtt:
        await t.connect()
    lossy = [
        LossyTransport(ArchivingTransport(t, store), faults, n)
        for t, n in zip(mqtt, names, strict=True)
    ]
    nodes = [
        Node(t, n, config=config, store=store, options=options)
        for t, n in zip(lossy, names, strict=True)
    ]
    channels: list[ReliableChannel] = [await node.join(CHANNEL) for node in nodes]
    delivered: dict[str, list[Delivery]] = {n: [] for n in names}

    async def listen(name: str, channel: ReliableChannel) -> None:
        async for event in channel.events():
            if isinstance(event, Delivery):
                delivered[name].append(event)

    listeners = [asyncio.create_task(listen(n, c)) for n, c in zip(names, channels, strict=True)]
    sent: dict[str, int] = dict.fromkeys(names, 0)
    started = time.monotonic()
    for i in range(ns.messages):
        k = rng.randrange(len(names))
        await channels[k].send(f"{LINES[i % len(LINES)]} (#{i})".encode())
        sent[names[k]] += 1
        await asyncio.sleep(0.02)

    def converged() -> bool:
        logs = [c.core.log.ids() for c in channels]
        return len(logs[0]) == ns.messages and all(log == logs[0] for log in logs)

    deadline = time.monotonic() + ns.timeout
    while not converged() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    done = converged()
    elapsed = time.monotonic() - started
    for name, channel in zip(names, channels, strict=True):
        last = delivered[name][-1].content.decode() if delivered[name] else "-"
        stats = channel.stats
        print(
            f"{name}: sent {sent[name]:3d}, delivered {len(delivered[name]):3d}, "
            f"store retrievals {stats['store_retrieved']:3d}, resent {stats['resent']:3d}; "
            f"last delivered: {last!r}"
        )
    dropped = sum(t.dropped_in + t.dropped_out for t in lossy)
    print(f"faults: {dropped} copies dropped below the SDK; {elapsed:.1f} s")
    for listener in listeners:
        listener.cancel()
    for node in nodes:
        await node.close()
    for t in mqtt:
        await t.close()
    if done:
        print(
            f"CONVERGED: all {len(names)} logs hold the same {ns.messages} messages "
            "in the same order"
        )
        return 0
    print("NOT CONVERGED", file=sys.stderr)
    return 1


def simulated(ns: argparse.Namespace) -> int:
    """The manual-clock version: a simulated network with a partition; no real time."""
    config = ChannelConfig(
        bloom=COMPACT if ns.profile == "compact" else WAKU,
        resend_interval_ms=2_000,
        possibly_acked_resend_interval_ms=4_000,
        sweep_interval_ms=200,
        sync_interval_ms=2_000,
        retrieval_interval_ms=1_000,
        repair=RepairConfig(t_min_ms=3_000, t_max_ms=10_000),
    )
    sim = GroupSimulation(
        ns.participants,
        config=config,
        faults=FaultConfig(loss=ns.loss, duplication=0.05, delay_ms=30, jitter_ms=120),
        seed=ns.seed,
        channel_id=CHANNEL,
    )
    names = sim.node_ids
    half = len(names) // 2
    print(
        f"{ns.participants} participants, {ns.messages} messages, {ns.loss:.0%} loss, "
        f"5% duplication, reordering, '{ns.profile}' bloom profile"
    )
    for i in range(ns.messages):
        if i == ns.messages // 3:
            print(f"-- partition: {names[:half]} | {names[half:]}")
            sim.partition(names[:half], names[half:])
        if i == 2 * ns.messages // 3:
            print("-- partition healed")
            sim.heal()
        sender = names[sim.rng.randrange(len(names))]
        text = f"{LINES[i % len(LINES)]} (#{i})"
        sim.send(sender, text.encode())
        sim.run_for(100)
    done = sim.run_until_quiet(600_000)

    for name in names:
        rec = sim.records[name]
        last = rec.delivered[-1].content.decode() if rec.delivered else "-"
        print(
            f"{name}: sent {len(rec.sent):3d}, delivered {len(rec.delivered):3d}, "
            f"acknowledged {len(rec.acknowledged):3d}; last delivered: {last!r}"
        )
    logs = {tuple(c.log.ids()) for c in sim.nodes.values()}
    net = sim.network
    print(
        f"network: {net.published} broadcasts, {net.dropped} copies dropped, "
        f"{sim.store_queries} store lookups; {sim.bytes_on_wire / max(1, sim.datagrams):.0f} "
        f"bytes per datagram"
    )
    if done and len(logs) == 1:
        count = len(sim.all_sent())
        print(f"CONVERGED: all {len(names)} logs hold the same {count} messages in the same order")
        return 0
    print("NOT CONVERGED", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
