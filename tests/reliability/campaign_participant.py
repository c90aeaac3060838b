"""One participant of the participant campaign, run as a subprocess that the campaign
SIGKILLs and restarts from its database (``tests/reliability/participant_campaign.py``).

It is an application of ``sdk.runtime`` as docs/runtime.md tells one to write it:
SQLite persistence, a store node for catch-up and missing messages, deliveries
processed exactly once by recording the last ``seq`` and resuming with
``events(after_seq=...)``. It writes, in ``--dir``:

* ``<name>.sent``: ``<message id> <k> <sha256 of the content> [<epoch s>]`` for
  each message whose ``send()`` returned (the application was told it is durable). On a
  restart, an own message of the persisted log that the file lacks (committed,
  then killed before the line was written) is added: the SDK will publish it.
* ``<name>.delivered``: ``<seq> <message id> <sender> <sha256 of the content>``
  for each delivery processed.
* ``<name>.stopped`` once it stopped sending (after ``--stop-file`` appeared).

It sends ``--rate`` messages/s until the stop file appears, then keeps
receiving until SIGTERM, when it closes its node (a clean stop) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import random
import signal
import sys
import time
from pathlib import Path

from sdk.runtime import Delivery, Node, RuntimeOptions
from sdk.sds import RepairConfig, decode_message
from sdk.store.grpc import GrpcStoreClient
from tests.runtime.helpers import FAST
from tests.runtime.sigkill_peer import resume_point
from transports.mqtt import MqttTransport

#: The runtime tests' short periods, with SDS-R after the store's chance (the node
#: refuses a ``t_min_ms`` shorter than ``store_timeout``).
CAMPAIGN_CONFIG = dataclasses.replace(FAST, repair=RepairConfig(t_min_ms=2_500, t_max_ms=5_000))
CAMPAIGN_OPTIONS = RuntimeOptions(store_timeout=2.0, connection_check_interval=0.1)


def content_for(name: str, k: int, size: int) -> bytes:
    """The ``k``-th message of participant ``name``: its name and number, then
    ``size`` seeded random bytes (so corruption anywhere in it shows)."""
    return f"{name}:{k}:".encode() + random.Random(f"{name}:{k}").randbytes(size)


def digest(content: bytes) -> str:
    """What the records hold of a content: its sha256, hex."""
    return hashlib.sha256(content).hexdigest()


def _number(name: str, content: bytes) -> int:
    prefix, k, _ = content.split(b":", 2)
    assert prefix == name.encode(), content[:40]
    return int(k)


def _recorded(path: Path) -> dict[str, int]:
    """message id -> k of the complete lines of a ``.sent`` file (a torn last line is cut)."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return {line.split()[0]: int(line.split()[1]) for line in data.decode().splitlines()}


async def main(ns: argparse.Namespace) -> int:
    """Run until SIGTERM; exit status 0 after a clean close."""
    folder = Path(ns.dir)
    sent_path = folder / f"{ns.name}.sent"
    delivered_path = folder / f"{ns.name}.delivered"
    stop_file = Path(ns.stop_file)
    terminated = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminated.set)

    after, _ = resume_point(str(delivered_path))
    if not ns.resume:
        after = 0  # replay every delivery: what the campaign must catch as duplicates
    recorded = _recorded(sent_path)
    # A short keep-alive: a silent partition ends the connection in seconds.
    transport = MqttTransport.from_url(
        ns.broker, keepalive=3, reconnect_min=0.05, reconnect_max=1.0
    )
    await transport.connect()
    store = GrpcStoreClient(ns.store, timeout=CAMPAIGN_OPTIONS.store_timeout)
    options = CAMPAIGN_OPTIONS
    if not ns.store_confirm:
        options = dataclasses.replace(options, store_confirm_interval=0)
    node = Node(
        transport,
        ns.name,
        store=store,
        db=folder / f"{ns.name}.db",
        config=CAMPAIGN_CONFIG,
        options=options,
    )
    channel = await node.join(ns.channel)
    with sent_path.open("a", buffering=1) as sent, delivered_path.open("a", buffering=1) as out:
        next_k = 0
        for record in channel.history():
            if record.sender_id != ns.name or record.data is None:
                continue
            content = decode_message(record.data).content or b""
            k = _number(ns.name, content)
            next_k = max(next_k, k + 1)
            if record.message_id not in recorded:
                sent.write(f"{record.message_id} {k} {digest(content)}\n")
        if recorded:
            next_k = max(next_k, max(recorded.values()) + 1)

        async def consume() -> None:
            async for event in channel.events(after_seq=after):
                if isinstance(event, Delivery):
                    # Line-buffered: once written, a SIGKILL cannot take it back.
                    out.write(
                        f"{event.seq} {event.message_id} {event.sender_id} "
                        f"{digest(event.content)}\n"
                    )

        consumer = asyncio.create_task(consume())
        interval = 1.0 / ns.rate
        next_at = time.monotonic()
        while not stop_file.exists() and not terminated.is_set():
            content = content_for(ns.name, next_k, ns.size)
            handle = await channel.send(content)
            sent.write(f"{handle.message_id} {next_k} {digest(content)} {time.time():.3f}\n")
            next_k += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        (folder / f"{ns.name}.stopped").touch()
        await terminated.wait()
        consumer.cancel()
    await node.close()
    await store.close()
    await transport.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True, help="mqtt://127.0.0.1:PORT")
    parser.add_argument("--store", required=True, help="the store node's gRPC host:port")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--rate", type=float, default=20.0, help="messages/s")
    parser.add_argument("--size", type=int, default=200, help="random bytes per message")
    parser.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="replay every delivery after a restart (a broken app, for the campaign's check)",
    )
    parser.add_argument(
        "--no-store-confirm",
        dest="store_confirm",
        action="store_false",
        help="do not check that the store holds what was published (the runtime before)",
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
