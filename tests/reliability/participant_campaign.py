"""Campaigns for SDK participants under load: kill -9 of participants, kill -9 of the
broker, and partitions, over a real Mosquitto and the real store node.

What a campaign does, end to end, with nothing mocked:

1. starts a private Mosquitto on 127.0.0.1 with the settings of
   ``examples/mosquitto.conf`` (persistence on), and the real ``store-node serve``
   (SQLite archive, the node's durable defaults) archiving one channel;
2. starts ``participants`` processes (``tests/reliability/campaign_participant.py``:
   ``sdk.runtime`` with SQLite persistence, the store node for catch-up), each
   sending ``rate`` messages/s to that channel and recording what it sent and
   what it processed;
3. injects ``faults`` faults at seeded random moments, each lasting ``down`` seconds:

   * ``participants``: SIGKILL one participant, restart it from its database;
   * ``broker``: SIGKILL Mosquitto, restart it (same port, same persistence);
   * ``partition``: cut one participant off the broker through its own
     :class:`~tests.runtime.tcp_proxy.TcpProxy`, alternately by dropping its
     connections (refused until the end) and by holding every byte (a silent
     link that keep-alive must notice), then heal it;

4. tells the participants to stop sending, waits until everything acknowledged
   is delivered and archived (or ``drain_timeout``), stops everything cleanly,
   and checks every record.

The report (:class:`ParticipantCampaignReport`) counts over the messages whose
``send()`` returned (``acknowledged``: the SDK told the application they are
durable, plus the own messages a restarted participant found in its log):
``archived`` (in the store's archive), ``delivered`` (pairs of a message and a
participant other than its sender that processed it, out of
``expected_deliveries``), ``lost`` (acknowledged but missing from the archive
or from some participant's deliveries), ``duplicated`` (a delivery processed
twice by one participant, or two archive rows of one message) and ``corrupt``
(content whose digest differs from the sender's, a message nobody sent, an
archive row that does not check). The target is 0 lost, 0 duplicated, 0 corrupt.

Run it as ``scripts/campaign --target participants|broker|partition`` (``--help``);
``tests/reliability`` runs a short version of each in CI.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from sdk.sds.message import MessageKind
from store_node.archive import open_archive
from store_node.config import load_config
from tests.conftest import PrivateMosquitto, free_port
from tests.reliability.campaign_participant import digest
from tests.reliability.harness import (
    ROOT,
    StoreNodeProcess,
    append_result,
    archive_rows,
    broker_config,
    decode_row,
    write_store_config,
)
from tests.runtime.tcp_proxy import TcpProxy

Target = Literal["participants", "broker", "partition"]


@dataclass
class ParticipantCampaignConfig:
    """One campaign: which fault, how many, the load and the timing."""

    target: Target = "participants"
    faults: int = 3
    participants: int = 3
    #: Messages/s each participant sends.
    rate: float = 10.0
    #: MQTT protocol of the participants and the store node (3.1.1 has no no-local:
    #: the broker echoes own messages, which the runtime drops).
    protocol: Literal[5, "3.1.1"] = 5
    #: Random bytes per message (plus a short name:number prefix).
    size: int = 200
    #: A fault comes uniform(up_min, up_max) seconds after the last one healed.
    up_min: float = 1.5
    up_max: float = 3.0
    #: Seconds a fault lasts (a participant or the broker down, a partition).
    down: float = 1.0
    seed: int = 1
    #: Resume deliveries after the last processed ``seq`` (the documented way);
    #: False replays the whole log after a restart, to show duplicates are caught.
    resume: bool = True
    #: Participants check that the store holds what they published
    #: (``RuntimeOptions.store_confirm_interval``); False: the runtime before.
    store_confirm: bool = True
    #: Longest wait for every delivery and the archive at the end (seconds).
    drain_timeout: float = 120.0
    workdir: Path = field(default_factory=lambda: Path("campaign"))


@dataclass
class ParticipantCampaignReport:
    """What a campaign measured (see the module docstring)."""

    target: str
    participants: int
    faults: int
    protocol: str = "5"
    acknowledged: int = 0
    archived: int = 0
    expected_deliveries: int = 0
    delivered: int = 0
    lost: int = 0
    #: Of ``lost``: missing from the archive / from at least one participant.
    lost_archive: int = 0
    lost_delivery: int = 0
    duplicated: int = 0
    corrupt: int = 0
    #: Messages acknowledged (all participants) when each fault began: faults under load.
    acknowledged_at_fault: list[int] = field(default_factory=list)
    #: A figure, not a target: the longest time between two ``send()`` returns of one
    #: participant (seconds; for ``participants`` it includes the time it was down).
    longest_send_gap_s: float = 0.0
    #: Participant and store-node exits that were not asked for or not clean.
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """The target: nothing acknowledged lost, nothing duplicated or corrupt."""
        return not (self.lost or self.duplicated or self.corrupt or self.errors)

    def json(self) -> str:
        """One JSON line."""
        return json.dumps({**asdict(self), "clean": self.clean})


@dataclass(frozen=True)
class Sent:
    """A message a participant's ``send()`` acknowledged: its sender and content digest."""

    sender: str
    digest: str


def read_sent(folder: Path, names: Iterable[str]) -> dict[str, Sent]:
    """message id -> :class:`Sent`, from every participant's ``.sent`` file."""
    sent: dict[str, Sent] = {}
    for name in names:
        path = folder / f"{name}.sent"
        if path.exists():
            for line in path.read_text().splitlines():
                message_id, _k, content_digest = line.split()[:3]
                sent[message_id] = Sent(name, content_digest)
    return sent


def longest_send_gap(folder: Path, names: Iterable[str]) -> float:
    """The longest time between two consecutive sends of one participant (seconds),
    from the times in the ``.sent`` files."""
    longest = 0.0
    for name in names:
        path = folder / f"{name}.sent"
        lines = path.read_text().splitlines() if path.exists() else []
        times = [float(f[3]) for f in (line.split() for line in lines) if len(f) > 3]
        longest = max([longest, *(b - a for a, b in itertools.pairwise(times))])
    return round(longest, 1)


def read_delivered(folder: Path, name: str) -> list[list[str]]:
    """The complete lines of ``name``'s ``.delivered`` file, split: seq, id, sender, digest."""
    path = folder / f"{name}.delivered"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines(keepends=True) if "\n" in line]


def tally(
    report: ParticipantCampaignReport,
    sent: dict[str, Sent],
    delivered: dict[str, list[list[str]]],
    archive: Iterable[tuple[str, bytes, int, bytes | None]],
    channel: str,
) -> None:
    """Fill the counts of ``report`` from the records: ``sent`` (what was acknowledged),
    each participant's ``delivered`` lines and the ``archive``'s rows of ``channel``."""
    report.acknowledged = len(sent)
    missing_somewhere: set[str] = set()
    for name, lines in delivered.items():
        ids: Counter[str] = Counter()
        last_seq = 0
        for fields in lines:
            if len(fields) != 4:
                report.corrupt += 1
                continue
            seq, message_id, sender, content_digest = fields
            ids[message_id] += 1
            if int(seq) <= last_seq:
                report.duplicated += 1  # a seq processed again
            last_seq = max(last_seq, int(seq))
            if sent.get(message_id) != Sent(sender, content_digest):
                report.corrupt += 1
        report.duplicated += sum(1 for n in ids.values() if n > 1)
        expected = [m for m, s in sent.items() if s.sender != name]
        report.expected_deliveries += len(expected)
        for message_id in expected:
            if message_id in ids:
                report.delivered += 1
            else:
                missing_somewhere.add(message_id)
    rows: Counter[str] = Counter()
    for message_id, data, size, hint in archive:
        rows[message_id] += 1
        message = decode_row(channel, message_id, data, size, hint)
        if message is None:
            report.corrupt += 1
        elif message.kind is MessageKind.CONTENT:
            got = Sent(message.sender_id, digest(message.content or b""))
            if sent.get(message_id) != got:
                report.corrupt += 1
    report.duplicated += sum(1 for n in rows.values() if n > 1)
    report.archived = sum(1 for m in sent if m in rows)
    report.lost_archive = len(sent) - report.archived
    report.lost_delivery = len(missing_somewhere)
    report.lost = len(missing_somewhere | {m for m in sent if m not in rows})


class _Participant:
    """One ``campaign_participant`` process; killable and restartable from its files."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name = name
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.campaign_participant", *self.args],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    async def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, timeout)


def _complete(
    sent: dict[str, Sent], delivered: dict[str, list[list[str]]], archived: set[str]
) -> bool:
    if not set(sent) <= archived:
        return False
    for name, lines in delivered.items():
        have = {fields[1] for fields in lines if len(fields) == 4}
        if any(s.sender != name and m not in have for m, s in sent.items()):
            return False
    return True


def _archived_ids(config: Path, channel: str) -> set[str]:
    try:
        with open_archive(load_config(config).archive, migrate=False) as archive:
            if not archive.schema_version():
                return set()
            return {row[0] for row in archive_rows(archive, channel)}
    except Exception:
        return set()


async def _until(check: Callable[[], bool], timeout: float) -> bool:
    """Poll ``check`` (in a thread: it reads files and the archive) until it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(0.5)
    return False


async def run_participant_campaign(cfg: ParticipantCampaignConfig) -> ParticipantCampaignReport:
    """Run one campaign (see the module docstring) and return its report."""
    began = time.monotonic()
    rng = random.Random(cfg.seed)
    folder = cfg.workdir.resolve()
    (folder / "mosquitto").mkdir(parents=True, exist_ok=True)
    broker = PrivateMosquitto(folder, broker_config(folder / "mosquitto"))
    await asyncio.to_thread(broker.start)
    channel = f"campaign-{uuid.uuid4().hex[:6]}"
    grpc_port = free_port()
    config = folder / "store.toml"
    write_store_config(
        config,
        backend="sqlite",
        broker_port=broker.port,
        channels=[channel],
        protocol=cfg.protocol,
        grpc_listen=f"127.0.0.1:{grpc_port}",
    )
    node = StoreNodeProcess(config, folder / "store-node.log")
    report = ParticipantCampaignReport(
        cfg.target, cfg.participants, cfg.faults, protocol=str(cfg.protocol)
    )
    names = [f"p{i}" for i in range(cfg.participants)]
    proxies: dict[str, TcpProxy] = {}
    participants: dict[str, _Participant] = {}
    stop_file = folder / "stop"
    try:
        node.start()
        await node.wait_started()
        for name in names:
            port = broker.port
            if cfg.target == "partition":
                proxies[name] = TcpProxy(broker.port)
                await proxies[name].start()
                port = proxies[name].port
            args = [
                *("--broker", f"mqtt://127.0.0.1:{port}?protocol={cfg.protocol}"),
                *("--store", f"127.0.0.1:{grpc_port}"),
                *("--dir", str(folder), "--name", name, "--channel", channel),
                *("--stop-file", str(stop_file), "--rate", str(cfg.rate)),
                *("--size", str(cfg.size)),
            ]
            if not cfg.resume:
                args.append("--no-resume")
            if not cfg.store_confirm:
                args.append("--no-store-confirm")
            participants[name] = _Participant(name, args, folder / f"{name}.log")
            participants[name].start()
        joined = await _until(
            lambda: all((folder / f"{n}.delivered").exists() for n in names), 120.0
        )
        if not joined:
            raise RuntimeError(f"participants did not join; see the logs in {folder}")

        for fault in range(cfg.faults):
            await asyncio.sleep(rng.uniform(cfg.up_min, cfg.up_max))
            report.acknowledged_at_fault.append(len(read_sent(folder, names)))
            victim = participants[rng.choice(names)]
            with (folder / "faults.log").open("a") as log:
                log.write(f"{time.time():.3f} {cfg.target} {victim.name}\n")
            if cfg.target == "participants":
                victim.kill()
                await asyncio.sleep(cfg.down)
                victim.start()
            elif cfg.target == "broker":
                broker.kill()
                await asyncio.sleep(cfg.down)
                await asyncio.to_thread(broker.start)
            else:
                proxy = proxies[victim.name]
                if fault % 2 == 0:
                    proxy.cut()
                    await asyncio.sleep(cfg.down)
                    proxy.restore()
                else:
                    proxy.pause()
                    await asyncio.sleep(cfg.down)
                    proxy.resume()
            for p in participants.values():
                if p.exited() is not None:
                    report.errors.append(f"{p.name} exited with {p.exited()}; see {p.log}")
                    p.start()
        await asyncio.sleep(rng.uniform(cfg.up_min, cfg.up_max))
        stop_file.touch()
        stopped = await _until(
            lambda: all((folder / f"{n}.stopped").exists() for n in names), 120.0
        )
        if not stopped:
            report.errors.append("a participant did not stop sending in 120 s")

        def complete() -> bool:
            sent = read_sent(folder, names)
            delivered = {n: read_delivered(folder, n) for n in names}
            return _complete(sent, delivered, _archived_ids(config, channel))

        await _until(complete, cfg.drain_timeout)
        for p in participants.values():
            code = await p.terminate()
            if code != 0:
                report.errors.append(f"{p.name} exited with {code} on SIGTERM; see {p.log}")
        code = await asyncio.to_thread(node.terminate)
        if code != 0:
            report.errors.append(f"store-node exited with {code} on SIGTERM")
        with open_archive(load_config(config).archive, migrate=False) as archive:
            report.errors.extend(archive.check_integrity())
            tally(
                report,
                read_sent(folder, names),
                {n: read_delivered(folder, n) for n in names},
                archive_rows(archive, channel),
                channel,
            )
        report.longest_send_gap_s = longest_send_gap(folder, names)
    finally:
        for p in participants.values():
            p.kill()
        node.kill()
        for proxy in proxies.values():
            await proxy.close()
        broker.kill()
    report.seconds = round(time.monotonic() - began, 1)
    return report


def run(cfg: ParticipantCampaignConfig, results: Path) -> ParticipantCampaignReport:
    """Run ``cfg``, print its JSON line and append it to ``results``."""
    report = asyncio.run(run_participant_campaign(cfg))
    line = report.json()
    print(line, flush=True)
    append_result(results, line)
    return report
