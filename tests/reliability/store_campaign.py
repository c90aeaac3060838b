"""kill -9 campaign for the store node under load over a real Mosquitto.

What it does, end to end, with nothing mocked:

1. starts a private Mosquitto on 127.0.0.1 with the settings of
   ``examples/mosquitto.conf`` (persistence, a raised ``max_queued_messages``),
   so the broker side is the campaign's own;
2. starts the real ``store-node serve`` (SQLite or PostgreSQL archive, MQTT
   transport) in one of three modes: ``durable`` (the node's defaults: acknowledge
   after commit, persistent session), ``persistent`` (persistent session but
   acknowledge on receipt) or ``none`` (acknowledge on receipt, clean session:
   the behaviour before issue 17);
3. runs publishers (one MQTT connection each, QoS 1) at a fixed total rate over
   several channels;
4. SIGKILLs the node at random moments (seeded), leaves it down for a while
   (the broker queues for its session), restarts it, ``kills`` times;
5. stops the publishers, waits until every publish is acknowledged by the
   broker, lets the node drain, stops it with SIGTERM;
6. reads the archive back and checks every row.

The report (:class:`CampaignReport`) counts, over the messages the broker
acknowledged to a publisher (``acknowledged``, i.e. the broker took
responsibility for them): ``archived`` (present in the archive), ``lost``
(absent), ``duplicated`` (present in more than one row), ``corrupt`` (a row
whose bytes do not decode to its columns, whose hash or size is wrong, or
which no publisher sent) plus the database's own integrity problems. The
target is 0 lost, 0 duplicated, 0 corrupt.

Run it as ``scripts/campaign`` (``--help``); ``tests/reliability`` runs a short
version of it in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from sdk.sds.errors import RemoteProtocolError
from sdk.sds.message import decode_message
from store_node.archive import open_archive
from store_node.archive.base import Archive, Criteria
from store_node.config import load_config
from tests.conftest import PrivateMosquitto
from tests.store_node.store_node_helpers import PG_DSN, new_schema, sds_message
from transports.base import message_hash, topic_for_channel
from transports.mqtt import MqttTransport

ROOT = Path(__file__).resolve().parents[2]

#: The shipped broker configuration; the campaign runs under exactly these settings.
SAMPLE_BROKER_CONFIG = ROOT / "examples" / "mosquitto.conf"


def broker_config(persistence_dir: Path) -> str:
    """``examples/mosquitto.conf`` for a private broker: its listener lines dropped
    (:class:`PrivateMosquitto` writes its own) and persistence under ``persistence_dir``."""
    lines = []
    for line in SAMPLE_BROKER_CONFIG.read_text().splitlines():
        key = line.split(" ", 1)[0]
        if key in ("listener", "allow_anonymous"):
            continue
        if key == "persistence_location":
            line = f"persistence_location {persistence_dir}/"
        lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass
class CampaignConfig:
    """One campaign: backend, how many kills, the load and the timing."""

    backend: Literal["sqlite", "postgresql"] = "sqlite"
    kills: int = 3
    publishers: int = 3
    channels: int = 2
    #: Total publish rate over all publishers (messages/s).
    rate: float = 1000.0
    #: The node runs for uniform(up_min, up_max) seconds before each kill.
    up_min: float = 1.5
    up_max: float = 3.0
    #: Seconds the node stays down after a kill.
    down: float = 1.0
    protocol: Literal[5, "3.1.1"] = 5
    #: ``durable``, ``persistent`` or ``none`` (see the module docstring).
    mode: Literal["durable", "persistent", "none"] = "durable"
    seed: int = 1
    #: Longest wait for the archive to catch up at the end (seconds).
    drain_timeout: float = 120.0
    workdir: Path = field(default_factory=lambda: Path("campaign"))


@dataclass
class CampaignReport:
    """What a campaign measured (see the module docstring)."""

    backend: str
    protocol: str
    mode: str
    kills: int
    published: int = 0
    acknowledged: int = 0
    archived: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupt: int = 0
    #: Rows in the archive at each kill.
    archived_at_kill: list[int] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """The target: nothing acknowledged lost, nothing duplicated or corrupt."""
        return not (self.lost or self.duplicated or self.corrupt or self.integrity)

    def json(self) -> str:
        """One JSON line."""
        return json.dumps({**asdict(self), "clean": self.clean})


class _NodeProcess:
    """The real ``store-node serve``; knows when it has started (its log line)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = threading.Event()
        self.starts = 0

    def start(self) -> None:
        self.started.clear()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "store_node.cli", "serve", "--config", str(self.config)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.starts += 1
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        with self.log.open("ab") as out:
            for line in proc.stderr:
                out.write(line)
                out.flush()
                if b'"store node started"' in line:
                    self.started.set()

    async def wait_started(self, timeout: float = 300.0) -> None:
        # Generous: a restarted node reads its session's backlog before the SUBACKs
        # that end its start, and CI machines are shared.
        deadline = time.monotonic() + timeout
        while not self.started.is_set():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"store node exited at start; see {self.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"store node did not start in {timeout} s; see {self.log}")
            await asyncio.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


class _Publishers:
    """``count`` MQTT publishers sharing ``rate`` msg/s over ``channels``."""

    def __init__(self, url_port: int, config: CampaignConfig, channels: list[str]) -> None:
        self.port = url_port
        self.config = config
        self.channels = channels
        #: message id -> channel, for everything handed to a publisher's connection.
        self.sent: dict[str, str] = {}
        self.transports: list[MqttTransport] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for p in range(self.config.publishers):
            t = MqttTransport("127.0.0.1", self.port, protocol=self.config.protocol)
            await t.connect()
            self.transports.append(t)
            self._tasks.append(asyncio.create_task(self._run(p, t)))

    async def _run(self, p: int, transport: MqttTransport) -> None:
        sender = f"pub{p}"
        interval = self.config.publishers / self.config.rate
        next_at = time.monotonic()
        n = 0
        while not self._stop.is_set():
            channel = self.channels[n % len(self.channels)]
            payload = sds_message(channel, n, sender=sender)
            await transport.publish(topic_for_channel(channel), payload)
            self.sent[decode_message(payload).message_id] = channel
            n += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif n % 64 == 0:
                await asyncio.sleep(0)

    async def stop(self) -> int:
        """Stop publishing; wait for every PUBACK. Returns the acknowledged count."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        acknowledged = 0
        for t in self.transports:
            async with asyncio.timeout(60):
                await t.flush()
            if t.stats.publish_rejected:
                raise RuntimeError(f"the broker rejected {t.stats.publish_rejected} publishes")
            acknowledged += t.stats.acknowledged
            await t.close()
        return acknowledged


def _store_config(cfg: CampaignConfig, port: int, channels: list[str]) -> tuple[Path, str]:
    if cfg.backend == "sqlite":
        archive = 'path = "archive.db"'
        schema = ""
    else:
        schema = new_schema()
        archive = f'backend = "postgresql"\ndsn = "{PG_DSN}"\nschema = "{schema}"'
    transport = f'kind = "mqtt"\nhost = "127.0.0.1"\nport = {port}\n'
    transport += f"protocol = {cfg.protocol!r}\n".replace("'", '"')
    if cfg.mode != "durable":
        transport += "manual_ack = false\n"
    if cfg.mode == "none":
        transport += "persistent_session = false\n"
    path = cfg.workdir / "store.toml"
    path.write_text(
        f"[archive]\n{archive}\n\n"
        f"[ingest]\nchannels = {json.dumps(channels)}\nbatch_interval_ms = 50\n\n"
        f"[transport]\n{transport}\n"
        '[grpc]\nlisten = "127.0.0.1:0"\n\n[metrics]\nlisten = ""\n'
    )
    return path, schema


def _archive_count(config: Path) -> int:
    try:
        with open_archive(load_config(config).archive, migrate=False) as archive:
            return archive.count() if archive.schema_version() else 0
    except Exception:
        return 0


def _rows(archive: Archive, channel: str) -> Iterator[tuple[str, bytes, int, bytes | None]]:
    after = None
    while True:
        page = archive.find(
            Criteria(channel_id=channel),
            after=after,
            forward=True,
            limit=1000,
            max_bytes=64 * 1024 * 1024,
            include_data=True,
        )
        for m in page.messages:
            assert m.data is not None
            yield m.message_id, m.data, m.message_size, m.transport_hash
        if page.next_key is None:
            return
        after = page.next_key


def verify(archive: Archive, sent: dict[str, str], report: CampaignReport) -> None:
    """Fill the archive-side counts of ``report`` from ``archive``."""
    report.integrity = archive.check_integrity()
    seen: dict[str, int] = {}
    for channel in sorted(set(sent.values())):
        topic = topic_for_channel(channel)
        for message_id, data, size, hint in _rows(archive, channel):
            seen[message_id] = seen.get(message_id, 0) + 1
            try:
                message = decode_message(data)
            except RemoteProtocolError:
                report.corrupt += 1
                continue
            if (
                message.message_id != message_id
                or message.channel_id != channel
                or size != len(data)
                or hint != message_hash(topic, data)
                or sent.get(message_id) != channel
            ):
                report.corrupt += 1
    report.archived = sum(1 for m in sent if m in seen)
    report.lost = len(sent) - report.archived
    report.duplicated = sum(1 for n in seen.values() if n > 1)


def _drop_schema(schema: str) -> None:
    if schema:
        from store_node.archive.postgres import PostgresArchive

        PostgresArchive(PG_DSN, schema=schema).drop_schema()


async def run_campaign(cfg: CampaignConfig) -> CampaignReport:
    """Run one campaign (see the module docstring) and return its report."""
    began = time.monotonic()
    rng = random.Random(cfg.seed)
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    (cfg.workdir / "mosquitto").mkdir(exist_ok=True)
    broker = PrivateMosquitto(cfg.workdir, broker_config(cfg.workdir.resolve() / "mosquitto"))
    broker.start()
    run = uuid.uuid4().hex[:6]
    channels = [f"campaign-{run}-{i}" for i in range(cfg.channels)]
    config, schema = _store_config(cfg, broker.port, channels)
    node = _NodeProcess(config, cfg.workdir / "store-node.log")
    report = CampaignReport(cfg.backend, str(cfg.protocol), cfg.mode, cfg.kills)
    publishers = _Publishers(broker.port, cfg, channels)
    try:
        node.start()
        await node.wait_started()
        await publishers.start()
        for _ in range(cfg.kills):
            await asyncio.sleep(rng.uniform(cfg.up_min, cfg.up_max))
            node.kill()
            report.archived_at_kill.append(await asyncio.to_thread(_archive_count, config))
            await asyncio.sleep(cfg.down)
            node.start()
            await node.wait_started()
        await asyncio.sleep(rng.uniform(cfg.up_min, cfg.up_max))
        report.acknowledged = await publishers.stop()
        report.published = len(publishers.sent)
        # Let the node catch up with what the broker still holds for it.
        deadline = time.monotonic() + cfg.drain_timeout
        last, still = -1, 0
        while time.monotonic() < deadline:
            count = await asyncio.to_thread(_archive_count, config)
            if count >= report.published:
                break
            still = still + 1 if count == last else 0
            if still >= 20 and cfg.mode != "durable":
                break  # nothing more is coming (the old behaviour loses the rest)
            last = count
            await asyncio.sleep(0.25)
        code = node.terminate()
        if code != 0:
            report.integrity.append(f"store-node exited with {code} on SIGTERM")
        with open_archive(load_config(config).archive, migrate=False) as archive:
            verify(archive, publishers.sent, report)
    finally:
        node.kill()
        with contextlib.suppress(Exception):
            await publishers.stop()
        broker.kill()
        _drop_schema(schema)
    report.seconds = round(time.monotonic() - began, 1)
    return report


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/campaign",
        description="kill -9 campaign for the store node under load over a private Mosquitto",
    )
    p.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--publishers", type=int, default=3)
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--rate", type=float, default=500.0, help="total messages/s")
    p.add_argument("--up-min", type=float, default=2.0)
    p.add_argument("--up-max", type=float, default=5.0)
    p.add_argument("--down", type=float, default=2.0)
    p.add_argument("--protocol", choices=["5", "3.1.1"], default="5")
    p.add_argument(
        "--mode",
        choices=["durable", "persistent", "none"],
        default="durable",
        help="durable: the node's defaults; persistent: persistent session but ack on "
        "receipt; none: ack on receipt and clean session (before issue 17)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path("bench/results/campaign"))
    p.add_argument("--results", type=Path, default=Path("bench/results/campaign.jsonl"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the campaign per backend; print and append one JSON line each. Exit 1 unless clean."""
    ns = _parse(argv)
    backends = ["sqlite", "postgresql"] if ns.backend == "both" else [ns.backend]
    clean = True
    for backend in backends:
        cfg = CampaignConfig(
            backend=backend,
            kills=ns.kills,
            publishers=ns.publishers,
            channels=ns.channels,
            rate=ns.rate,
            up_min=ns.up_min,
            up_max=ns.up_max,
            down=ns.down,
            protocol=5 if ns.protocol == "5" else "3.1.1",
            mode=ns.mode,
            seed=ns.seed,
            workdir=ns.workdir / f"{backend}-{uuid.uuid4().hex[:6]}",
        )
        report = asyncio.run(run_campaign(cfg))
        line = report.json()
        print(line, flush=True)
        ns.results.parent.mkdir(parents=True, exist_ok=True)
        with ns.results.open("a") as out:
            out.write(json.dumps({"ts": time.time(), **json.loads(line)}) + "\n")
        clean = clean and report.clean
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
