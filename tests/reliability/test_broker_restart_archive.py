"""A broker killed with SIGKILL must not cost the store node what participants sent.

Found by the broker campaign (``scripts/campaign --target broker``): Mosquitto
writes its persistence every ``autosave_interval`` (30 s in the shipped
configuration), so a broker killed with SIGKILL forgets the store node's
persistent session (and what it had queued for it). Participants that reconnect
before the store node publish into a broker where nobody holds the store's
subscription: their peers get the messages and acknowledge them, so SDS never
resends them, and the archive never gets them. Offline participants then cannot
catch them up from the store.

Here the store node is held (SIGSTOP) across the broker's restart so that the
participants reconnect first, every time; the campaign sees the same order by
chance. The sender's runtime must check that the store holds what it published
and publish again what it does not (``RuntimeOptions.store_confirm_interval``).
"""

from __future__ import annotations

import shutil
import signal
import uuid
from pathlib import Path

import pytest

from sdk.runtime import Node, RuntimeOptions
from sdk.store.grpc import GrpcStoreClient
from store_node.archive import open_archive
from store_node.config import load_config
from tests.conftest import PrivateMosquitto, free_port, skip_or_fail
from tests.reliability.campaign_participant import CAMPAIGN_CONFIG
from tests.reliability.harness import (
    StoreNodeProcess,
    archive_rows,
    broker_config,
    write_store_config,
)
from tests.runtime.helpers import Collector, eventually
from transports.mqtt import MqttTransport

pytestmark = pytest.mark.integration


def _archived(config: Path, channel: str) -> set[str]:
    with open_archive(load_config(config).archive, migrate=False) as archive:
        if not archive.schema_version():
            return set()
        return {row[0] for row in archive_rows(archive, channel)}


async def test_messages_published_while_the_store_lost_its_session_are_archived(
    tmp_path: Path,
) -> None:
    if shutil.which("mosquitto") is None:
        skip_or_fail("the mosquitto binary is not installed (the test runs a private broker)")
    (tmp_path / "mosquitto").mkdir()
    broker = PrivateMosquitto(tmp_path, broker_config(tmp_path / "mosquitto"))
    broker.start()
    channel = f"restart-{uuid.uuid4().hex[:6]}"
    grpc_port = free_port()
    config = tmp_path / "store.toml"
    write_store_config(
        config,
        backend="sqlite",
        broker_port=broker.port,
        channels=[channel],
        grpc_listen=f"127.0.0.1:{grpc_port}",
    )
    node = StoreNodeProcess(config, tmp_path / "store-node.log")
    options = RuntimeOptions(store_timeout=2.0, store_confirm_interval=1.0)
    store = GrpcStoreClient(f"127.0.0.1:{grpc_port}", timeout=2.0)
    transports = [
        MqttTransport("127.0.0.1", broker.port, reconnect_min=0.05, reconnect_max=0.5)
        for _ in range(2)
    ]
    nodes: list[Node] = []
    try:
        node.start()
        await node.wait_started()
        for t in transports:
            await t.connect()
        alice = Node(
            transports[0],
            "alice",
            store=store,
            db=tmp_path / "a.db",
            config=CAMPAIGN_CONFIG,
            options=options,
        )
        bob = Node(transports[1], "bob", db=tmp_path / "b.db", config=CAMPAIGN_CONFIG)
        nodes = [alice, bob]
        a_room, b_room = await alice.join(channel), await bob.join(channel)
        b_events = Collector(b_room)
        first = (await a_room.send(b"before the restart")).message_id
        assert await eventually(lambda: first in _archived(config, channel), timeout=30)

        assert node.proc is not None
        node.proc.send_signal(signal.SIGSTOP)  # the store node reconnects last
        broker.kill()
        broker.start()
        assert await eventually(lambda: all(t.connected for t in transports), timeout=30)
        handles = [await a_room.send(f"after {k}".encode()) for k in range(5)]
        for handle in handles:
            await handle.acknowledged(timeout=30)  # Bob has them: SDS will not resend
        assert len(b_events.delivered) == 6
        node.proc.send_signal(signal.SIGCONT)

        wanted = {h.message_id for h in handles}
        assert await eventually(lambda: wanted <= _archived(config, channel), timeout=30), (
            f"archived {len(wanted & _archived(config, channel))} of the 5 messages sent "
            f"after the broker restart; alice's counters {dict(a_room.stats)}"
        )
        assert a_room.stats["store_republished"] >= 5
        await b_events.stop()
    finally:
        for n in nodes:
            await n.close()
        for t in transports:
            await t.close()
        await store.close()
        if node.proc is not None:
            node.proc.send_signal(signal.SIGCONT)
        node.kill()
        broker.kill()
