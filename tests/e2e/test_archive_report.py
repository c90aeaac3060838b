"""End to end: SDS participants -> store node archive -> Parquet export -> Spark report.

Three real participants (``sdk.runtime.Node`` over the memory transport) chat in two
channels, ``0042`` (which Spark's partition inference would turn into the integer 42) and
``general``. A real :class:`~store_node.node.StoreNode` (SQLite in ``tmp_path``) archives
both channels from its own node on the same network. The link to the store is scripted,
message by message, so every number of the report is known in advance:

* each sender's copies reach the store after a fixed delay (alice 100 ms, bob 300 ms,
  carol 700 ms), the delivery delays the report must find;
* three copies are delivered more than once (rebroadcasts as the archive sees them);
* one message of ``0042`` never reaches the store while the participants all receive it:
  the next two messages name it in their causal history (``causal_history_size = 2``), so
  the archive sees one lost message and two missing references.

The links between participants are instant and lossless, and resends, sync messages and
SDS-R are switched off, so the only traffic is what the test sends. Then ``store-node
export`` and ``store-node analytics report`` run through the CLI entry point, and the test
reads the files they wrote.

The README's demo (``examples/demo.py``) ends the same way over its own store node; two
smaller tests check that it prints the report, and that without Java it says what to
install and still exits 0.
"""

from __future__ import annotations

import asyncio
import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk.runtime import Node, ReliableChannel, RuntimeOptions
from sdk.sds import ChannelConfig
from sdk.testing.waiting import eventually
from store_node import cli
from store_node.config import parse_config
from store_node.node import StoreNode
from tests.conftest import require_module
from transports.faults import FaultInjector
from transports.memory import MemoryNetwork

pytestmark = pytest.mark.integration

#: One-way delay of each sender's copies to the store, in ms.
DELAY_MS = {"alice": 100, "bob": 300, "carol": 700}
#: Scheduling slack on a loaded 2-core machine: a measured delay is at least the constructed
#: one (the Lamport time is taken before the publish; a few ms less if Lamport ran ahead of
#: the clock) and at most this much more.
SLACK_MS = 250
CH_NUM = "0042"
CH_GEN = "general"
#: (channel, sender, copies the store receives: 0 = lost on the way to the store).
TRAFFIC: list[tuple[str, str, int]] = [
    (CH_NUM, "alice", 1),
    (CH_NUM, "bob", 1),
    (CH_NUM, "carol", 2),  # rebroadcast
    (CH_NUM, "alice", 1),
    (CH_NUM, "bob", 1),
    (CH_NUM, "carol", 0),  # never archived; referenced by the next two messages
    (CH_NUM, "alice", 1),
    (CH_NUM, "bob", 2),  # rebroadcast, and references the lost message
    (CH_NUM, "carol", 1),
    (CH_NUM, "alice", 1),
    (CH_NUM, "bob", 1),
    (CH_NUM, "carol", 1),
    (CH_GEN, "alice", 1),
    (CH_GEN, "bob", 3),  # two rebroadcasts
    (CH_GEN, "alice", 1),
    (CH_GEN, "bob", 1),
    (CH_GEN, "alice", 1),
    (CH_GEN, "bob", 1),
]
LOST_INDEX = 5


class ScriptedStoreLink(FaultInjector):
    """Participants reach each other at once; the store gets :attr:`copies` after a delay."""

    def __init__(self) -> None:
        super().__init__()
        #: Copies of the next publish that reach the store (the test sets it per message).
        self.copies = 1

    def plan(self, sender: str, recipient: str) -> list[int]:
        if recipient != "store":
            return [0]
        return [DELAY_MS[sender]] * self.copies


def _channel_config() -> ChannelConfig:
    # Only the test's messages: no resends within the test, no sync messages, no SDS-R.
    return ChannelConfig(
        causal_history_size=2,
        resend_interval_ms=600_000,
        possibly_acked_resend_interval_ms=600_000,
        sync_interval_ms=0,
        repair=None,
    )


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    # A short step: the chat's measured delays must not wait on the poll.
    if not await eventually(predicate, timeout, step=0.005):
        raise AssertionError("condition not reached in time")


async def _chat(tmp_path: Path) -> dict[str, str]:
    """Run the traffic through a real store node; return the lost message's id (and more)."""
    link = ScriptedStoreLink()
    network = MemoryNetwork(link)
    config = parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [CH_NUM, CH_GEN], "batch_interval_ms": 5},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )
    store = StoreNode(config, transport=network.transport("store"))
    await store.start()
    members = {CH_NUM: ["alice", "bob", "carol"], CH_GEN: ["alice", "bob"]}
    nodes = {
        name: Node(
            network.transport(name), name, config=_channel_config(), options=RuntimeOptions()
        )
        for name in DELAY_MS
    }
    rooms: dict[tuple[str, str], ReliableChannel] = {}
    for channel, names in members.items():
        for name in names:
            rooms[channel, name] = await nodes[name].join(channel)
    lost = ""
    try:
        for i, (channel, sender, copies) in enumerate(TRAFFIC):
            link.copies = copies
            handle = await rooms[channel, sender].send(f"{channel} message {i}".encode())
            if i == LOST_INDEX:
                lost = handle.message_id
            # Every member holds it before the next send: causal histories are then exactly
            # the previous two messages of the channel.
            held = [rooms[channel, n].core.log for n in members[channel]]
            mid = handle.message_id
            await _until(lambda held=held, mid=mid: all(mid in log.ids() for log in held))
            link.copies = 1
            # Lamport time is max(now, last + 1): sends in one millisecond would run ahead
            # of the clock and shorten the measured delays by a millisecond or two.
            await asyncio.sleep(0.003)
        await network.quiesce()  # the delayed copies to the store have arrived
        assert store.ingest is not None
        await _until(lambda: store.ingest is not None and store.ingest.pending == 0)
    finally:
        for node in nodes.values():
            await node.close()
        await store.stop()
    received = store.metrics.value("chorus_store_ingest_received_total")
    assert received == sum(c for _, _, c in TRAFFIC)
    return {"lost": lost}


@pytest.fixture
def session_spark(spark: Any) -> Iterator[Any]:
    """The shared session, its SQL settings restored afterwards.

    ``build_session`` (the CLI's, the demo's) returns the running session and applies its
    settings to it (adaptive execution on, more shuffle partitions): the other tests keep the
    fixture's tiny-input settings.
    """
    from store_node.analytics.session import base_conf, local_conf

    keys = [k for k in {**base_conf(), **local_conf()} if spark.conf.isModifiable(k)]
    before = {k: spark.conf.get(k, None) for k in keys}
    yield spark
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_store_archive_export_and_report(
    session_spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spark = session_spark
    facts = asyncio.run(_chat(tmp_path))

    # store-node export, through the CLI and a configuration file like an operator's.
    (tmp_path / "store.toml").write_text('[archive]\npath = "archive.db"\n[metrics]\nlisten = ""\n')
    export = tmp_path / "export"
    assert cli.main(["export", "--config", str(tmp_path / "store.toml"), "--out", str(export)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 17
    assert (export / "channel=0042").is_dir() and (export / "channel=general").is_dir()

    # store-node analytics report, through the CLI; it reuses the session's Spark.
    out = tmp_path / "report"
    argv = ["analytics", "report", "--input", str(export), "--out", str(out)]
    assert cli.main([*argv, "--master", "local[1]"]) == 0
    printed = capsys.readouterr().out
    assert "Chorus archive report" in printed and "report written to" in printed
    assert spark.sparkContext._jsc is not None  # the CLI left the shared session running

    # The files.
    report = json.loads((out / "report.json").read_text())
    for name in ("channels", "delivery_delay", "rebroadcasts", "loss_by_channel"):
        assert (out / "tables" / f"{name}.csv").stat().st_size > 0
        assert (out / "tables" / f"{name}.json").stat().st_size > 0
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert plots == [
        "delay_percentiles.png",
        "hour_of_day.png",
        "message_sizes.png",
        "reliability.png",
        "volume_over_time.png",
    ]
    for png in (out / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.txt").read_text()
    assert summary.strip() == printed.split("report written to")[0].strip()
    assert set(report["files"]) >= {"summary.txt", "report.json", "plots/reliability.png"}

    # Message counts per channel; "0042" stays a string in CSV and JSON alike.
    channels = {r["channel_id"]: r for r in json.loads((out / "tables/channels.json").read_text())}
    assert set(channels) == {CH_NUM, CH_GEN}
    assert channels[CH_NUM]["messages"] == 11 and channels[CH_NUM]["participants"] == 3
    assert channels[CH_GEN]["messages"] == 6 and channels[CH_GEN]["participants"] == 2
    assert {r["channel_id"] for r in _csv(out / "tables/channels.csv")} == {CH_NUM, CH_GEN}
    totals = report["totals"]
    assert totals["messages"] == 17 and totals["channels"] == 2 and totals["senders"] == 3
    kinds = totals["messages_by_kind"]
    assert sum(kinds.values()) == 17
    # The headline counts content apart from SDS's sync and ephemeral messages.
    other = kinds["sync"] + kinds["ephemeral"]
    assert f"{kinds['content']} content messages (plus {other} sync/ephemeral: " in summary
    assert "in 2 channels from 3 senders" in summary

    # Rebroadcasts: 0042 has two messages archived twice, general one archived three times.
    rebroadcasts = {
        r["channel_id"]: r for r in json.loads((out / "tables/rebroadcasts.json").read_text())
    }
    assert rebroadcasts[CH_NUM]["rebroadcasts"] == 2
    assert rebroadcasts[CH_NUM]["rebroadcast_messages"] == 2
    assert rebroadcasts[CH_NUM]["copies"] == 13
    assert rebroadcasts[CH_GEN]["rebroadcasts"] == 2
    assert rebroadcasts[CH_GEN]["rebroadcast_messages"] == 1
    assert totals["rebroadcasts"]["rebroadcasts"] == 4
    assert totals["rebroadcasts"]["copies"] == 21
    assert totals["rebroadcasts"]["rebroadcast_fraction"] == pytest.approx(4 / 21)

    # Loss as the archive sees it: one id, named twice, never archived.
    missing = json.loads((out / "tables/missing_messages.json").read_text())
    assert [(m["channel_id"], m["message_id"], m["references"]) for m in missing] == [
        (CH_NUM, facts["lost"], 2)
    ]
    loss = {
        r["channel_id"]: r for r in json.loads((out / "tables/loss_by_channel.json").read_text())
    }
    assert loss[CH_NUM]["missing_messages"] == 1 and loss[CH_NUM]["missing_references"] == 2
    assert loss[CH_NUM]["loss_fraction"] == pytest.approx(1 / 12)
    assert loss[CH_GEN]["missing_messages"] == 0 and loss[CH_GEN]["missing_references"] == 0
    assert totals["loss"]["missing_messages"] == 1 and totals["loss"]["missing_references"] == 2
    by_sender = {
        (r["channel_id"], r["sender_id"]): r["missing_references"]
        for r in json.loads((out / "tables/loss_by_sender.json").read_text())
    }
    # The two messages after the lost one: alice's (index 6) and bob's (index 7).
    assert by_sender[CH_NUM, "alice"] == 1 and by_sender[CH_NUM, "bob"] == 1
    assert by_sender.get((CH_NUM, "carol"), 0) == 0
    assert totals["causal_order_violations"]["violating_pairs"] == 0

    # Delivery delays: 0042 holds alice 4 x 100 ms, bob 4 x 300 ms, carol 3 x 700 ms, so
    # p50 (rank 5 of 0..10) is one of bob's and p95/p99 are carol's; general holds alice
    # 3 x 100 ms and bob 3 x 300 ms.
    delays = {
        r["channel_id"]: r for r in json.loads((out / "tables/delivery_delay.json").read_text())
    }

    def near(value: float, constructed: int) -> bool:
        return constructed - 5 <= value <= constructed + SLACK_MS

    d = delays[CH_NUM]
    assert d["messages"] == 11
    assert near(d["delay_min_ms"], 100) and near(d["delay_p50_ms"], 300)
    assert near(d["delay_p95_ms"], 700) and near(d["delay_p99_ms"], 700)
    assert near(d["delay_max_ms"], 700)
    g = delays[CH_GEN]
    assert g["messages"] == 6 and near(g["delay_min_ms"], 100) and near(g["delay_max_ms"], 300)
    # Overall, 17 delays: 7 x 100, 7 x 300, 3 x 700 -> p50 rank 8 is bob's, p95/p99 carol's.
    overall = totals["delivery_delay"]
    assert overall["messages"] == 17
    assert near(overall["delay_p50_ms"], 300) and near(overall["delay_p99_ms"], 700)
    assert near(overall["delay_p95_ms"], 700)


def test_demo_ends_with_the_report_over_what_its_store_node_archived(
    session_spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's demo: convergence, then the Spark summary (reusing the session's Spark)."""
    spark = session_spark
    require_module("amqtt")
    from examples import demo

    assert demo.main(["--participants", "3", "--messages", "12", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "CONVERGED" in out and "store node: archived" in out
    summary = out.split("Chorus archive report", 1)[1]
    # The demo's own 12 messages, apart from SDS's sync messages, from the three participants.
    assert "  12 content messages (plus " in summary
    assert "from 3 senders" in summary
    assert "busiest channel: demo-room" in summary
    assert "delivery delay (ms, exact): p50" in summary and "rebroadcasts:" in summary
    assert "loss:" in summary
    assert spark.sparkContext._jsc is not None  # the demo left the shared session running


def test_demo_without_java_says_what_to_install_and_still_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("amqtt")
    from examples import demo

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))  # PySpark would launch this
    assert demo.main(["--participants", "2", "--messages", "6", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "CONVERGED" in out
    skipped = [line for line in out.splitlines() if line.startswith("analytics skipped")]
    assert len(skipped) == 1 and "openjdk-17-jre-headless" in skipped[0]
    assert "Chorus archive report" not in out and "store node: archived" not in out
