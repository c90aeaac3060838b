"""A participant that catches up from a real store node, run as a subprocess by
``tests/runtime/test_catch_up_obligation.py``.

It joins ``--channel`` with its database and a gRPC store client, and records:

* in ``--out``, one line per delivery it processed: ``<seq> <message id> <content>``
  (resumed after the last seq on a restart, like ``tests/runtime/sigkill_peer.py``);
* in ``--status``, one line per change of its sync status: ``<catch-up state> <state>``.

It exits 0 once it processed ``--expect`` deliveries in all and reports itself
synced; with ``--expect -1`` it runs until killed. ``--slow-pages`` waits that long
after each page the store returns (so a test can kill it mid-catch-up).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator

from sdk.runtime import Delivery, Node, RuntimeOptions, SyncState, SyncStatus, SyncStatusChanged
from sdk.store.grpc import GrpcStoreClient
from tests.runtime.helpers import QUIET
from tests.runtime.sigkill_peer import resume_point
from transports.mqtt import MqttTransport

#: No resends, periodic sync or SDS-R: what a participant missed reaches it only
#: through the store (the senders are gone anyway).
CONFIG = dataclasses.replace(
    QUIET,
    # Windows reach back only 0.1 s before the last activity: what was owed from
    # earlier reaches the participant only if it was kept.
    range_margin_ms=100,
)

#: Quick retries and a short overlap (see ``range_margin_ms`` above).
OPTIONS = RuntimeOptions(
    store_timeout=2.0,
    catch_up_overlap=0.5,
    catch_up_retry_min=0.2,
    catch_up_retry_max=1.0,
    store_confirm_interval=0,
)


class SlowStore(GrpcStoreClient):
    """Waits after every page of a time-range query."""

    delay = 0.0

    async def messages_between(
        self, channel_id: str, time_start: int, time_end: int | None = None
    ) -> AsyncIterator[list[bytes]]:
        async for page in super().messages_between(channel_id, time_start, time_end):
            yield page
            await asyncio.sleep(self.delay)


def _line(status: SyncStatus) -> str:
    return f"{status.catch_up.value} {status.state.value}\n"


async def main(ns: argparse.Namespace) -> int:
    """Run until done; exit status 0 on success."""
    after, got = resume_point(ns.out)
    transport = MqttTransport.from_url(ns.broker, reconnect_max=1.0)
    await transport.connect()
    store = SlowStore(ns.store, timeout=2.0, page_size=ns.page_size)
    store.delay = ns.slow_pages
    async with Node(transport, db=ns.db, store=store, config=CONFIG, options=OPTIONS) as node:
        channel = await node.join(ns.channel)
        with open(ns.out, "a", buffering=1) as out, open(ns.status, "a", buffering=1) as status:
            status.write(_line(channel.sync_status))
            async for event in channel.events(after_seq=after):
                if isinstance(event, Delivery):
                    out.write(f"{event.seq} {event.message_id} {event.content.decode()}\n")
                    got += 1
                elif isinstance(event, SyncStatusChanged):
                    status.write(_line(event.status))
                if ns.expect >= 0 and got >= ns.expect:
                    now = channel.sync_status
                    if now.state is SyncState.SYNCED:
                        # Its SyncStatusChanged may still be queued behind this event.
                        status.write(_line(now))
                        break
    await transport.close()
    await store.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--channel", default="room")
    parser.add_argument("--expect", type=int, default=-1)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--slow-pages", type=float, default=0.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
