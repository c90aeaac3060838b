"""A chat participant for the SIGKILL/restart test, run as a subprocess.

It sends ``--count`` numbered messages (``<name>-<k>``) and records, in
``--out``, one line per delivery it processed: ``<seq> <message id> <content>``.
Killed at any instant and restarted with the same arguments, it resumes:

* what it already sent it finds in the channel's persisted history, so it
  sends only the rest (a message whose ``send()`` returned is never sent twice);
* what it already processed it finds in ``--out``, and resumes the event
  stream after that ``seq`` (``events(after_seq=...)``), so no delivery is
  lost or processed twice.

It exits 0 once it has every message it expects and its own are acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from sdk.runtime import Delivery, Node
from sdk.sds import decode_message
from tests.runtime.helpers import FAST
from transports.mqtt import MqttTransport


def resume_point(path: str) -> tuple[int, int]:
    """The last seq in ``path`` and its line count; a torn last line (killed
    mid-write) is cut off."""
    if not os.path.exists(path):
        return 0, 0
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "wb") as f:
            f.write(data)
    lines = data.decode().splitlines()
    return (int(lines[-1].split()[0]) if lines else 0), len(lines)


async def main(ns: argparse.Namespace) -> int:
    """Run until done; exit status 0 on success."""
    after, got = resume_point(ns.out)
    transport = MqttTransport.from_url(ns.broker, reconnect_max=1.0)
    await transport.connect()
    async with Node(transport, ns.name, db=ns.db, config=FAST) as node:
        channel = await node.join(ns.channel)
        # What we sent before a crash is in the persisted local log.
        sent_contents = {
            (decode_message(r.data).content or b"").decode()
            for r in channel.history()
            if r.sender_id == ns.name and r.data is not None
        }
        with open(ns.out, "a", buffering=1) as out:

            async def consume() -> None:
                nonlocal got
                async for event in channel.events(after_seq=after):
                    if isinstance(event, Delivery):
                        # Line-buffered: once written, a SIGKILL cannot take it back.
                        out.write(f"{event.seq} {event.message_id} {event.content.decode()}\n")
                        got += 1

            consumer = asyncio.create_task(consume())
            for k in range(ns.count):
                text = f"{ns.name}-{k}"
                if text in sent_contents:
                    continue
                await channel.send(text.encode())
                print(f"sent {text}", flush=True)
                await asyncio.sleep(ns.interval)
            ticks = 0
            while got < ns.expect or len(channel.core.outgoing):
                await asyncio.sleep(0.05)
                ticks += 1
                if ticks % 20 == 0:
                    # Progress for whoever reads stderr when a run hangs.
                    print(
                        f"got {got}/{ns.expect}, unacknowledged {len(channel.core.outgoing)}, "
                        f"{channel.sync_status}, stats {dict(channel.stats)}",
                        file=sys.stderr,
                        flush=True,
                    )
            consumer.cancel()
    await transport.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--channel", default="room")
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--expect", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.02)
    sys.exit(asyncio.run(main(parser.parse_args())))
