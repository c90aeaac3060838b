"""The publish queue holds one copy of a content message: a resend of a message still
waiting to be published is dropped (the broker campaign's stall after restarts)."""

from __future__ import annotations

import asyncio

from sdk.runtime import Node
from tests.runtime.helpers import FAST, Collector, eventually
from transports.base import Subscription, Transport
from transports.memory import MemoryNetwork


class _Gated(Transport):
    """Publishes through ``inner`` only once :attr:`open` is set (a broker outage)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.open = asyncio.Event()
        self.max_payload_size = inner.max_payload_size

    async def publish(self, topic: str, payload: bytes) -> bytes:
        await self.open.wait()
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        return await self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


async def test_resends_of_a_message_waiting_to_be_published_are_not_queued_again() -> None:
    net = MemoryNetwork()
    gated = _Gated(net.transport("alice"))
    alice = Node(gated, "alice", config=FAST)
    bob = Node(net.transport("bob"), "bob", config=FAST)
    room, b_room = await alice.join("room"), await bob.join("room")
    b_events = Collector(b_room)
    handle = await room.send(b"stuck")
    # FAST resends every 400 ms; the first copy is held in publish(), one more waits.
    assert await eventually(lambda: room.stats["resends_coalesced"] >= 3, timeout=10)
    waiting = [d for _, d in alice._publish_queue.items if d.message_id == handle.message_id]
    assert len(waiting) == 1
    gated.open.set()
    await handle.acknowledged(timeout=10)
    assert [e.content for e in b_events.delivered] == [b"stuck"]
    await b_events.stop()
    await alice.close()
    await bob.close()
