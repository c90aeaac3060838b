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

Run it as ``scripts/campaign`` (``--target store``, the default; ``--help``); ``tests/reliability`` runs a short
version of it in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from sdk.sds.message import decode_message
from store_node.archive import open_archive
from store_node.archive.base import Archive
from store_node.config import load_config
from tests.conftest import PrivateMosquitto
from tests.reliability.harness import (
    StoreNodeProcess,
    archive_count,
    archive_rows,
    broker_config,
    decode_row,
    drop_schema,
    write_store_config,
)
from tests.store_node.store_node_helpers import sds_message
from transports.base import topic_for_channel
from transports.mqtt import MqttTransport


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
    transport = ""
    if cfg.mode != "durable":
        transport += "manual_ack = false\n"
    if cfg.mode == "none":
        transport += "persistent_session = false\n"
    path = cfg.workdir / "store.toml"
    schema = write_store_config(
        path,
        backend=cfg.backend,
        broker_port=port,
        channels=channels,
        protocol=cfg.protocol,
        transport_extra=transport,
    )
    return path, schema


def verify(archive: Archive, sent: dict[str, str], report: CampaignReport) -> None:
    """Fill the archive-side counts of ``report`` from ``archive``."""
    report.integrity = archive.check_integrity()
    seen: dict[str, int] = {}
    for channel in sorted(set(sent.values())):
        for message_id, data, size, hint in archive_rows(archive, channel):
            seen[message_id] = seen.get(message_id, 0) + 1
            if (
                decode_row(channel, message_id, data, size, hint) is None
                or sent.get(message_id) != channel
            ):
                report.corrupt += 1
    report.archived = sum(1 for m in sent if m in seen)
    report.lost = len(sent) - report.archived
    report.duplicated = sum(1 for n in seen.values() if n > 1)


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
    node = StoreNodeProcess(config, cfg.workdir / "store-node.log")
    report = CampaignReport(cfg.backend, str(cfg.protocol), cfg.mode, cfg.kills)
    publishers = _Publishers(broker.port, cfg, channels)
    try:
        node.start()
        await node.wait_started()
        await publishers.start()
        for _ in range(cfg.kills):
            await asyncio.sleep(rng.uniform(cfg.up_min, cfg.up_max))
            node.kill()
            report.archived_at_kill.append(await asyncio.to_thread(archive_count, config))
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
            count = await asyncio.to_thread(archive_count, config)
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
        drop_schema(schema)
    report.seconds = round(time.monotonic() - began, 1)
    return report
