"""A transport that invents traffic, for running the real ``store-node serve`` in tests.

Configured as ``[transport] kind = "factory"``,
``factory = "tests.store_node.synthetic_transport:create"`` (with the repository
root on ``PYTHONPATH``). Each subscribed channel gets messages 0, 1, 2, ... from the
same deterministic generator the tests use, with every ``duplicate_every``-th
message sent twice and every ``malformed_every``-th followed by garbage. After
``count`` messages (0 = endless) it writes ``<done_dir>/<channel>.done`` and
goes quiet.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.store_node.store_node_helpers import sds_message
from transports.base import Envelope, Subscription, Transport, message_hash


class SyntheticSubscription(Subscription):
    """Generates envelopes for one topic."""

    def __init__(self, topic: str, options: dict[str, object]) -> None:
        self.topic = topic
        self.channel = topic.rsplit("/", 1)[-1]
        self.count = int(options.get("count", 0))  # type: ignore[call-overload]
        self.duplicate_every = int(options.get("duplicate_every", 0))  # type: ignore[call-overload]
        self.malformed_every = int(options.get("malformed_every", 0))  # type: ignore[call-overload]
        self.done_dir = str(options.get("done_dir", ""))
        self._pending: list[bytes] = []
        self._n = 0
        self._closed = asyncio.Event()

    async def __anext__(self) -> Envelope:
        if self._closed.is_set():
            raise StopAsyncIteration
        if not self._pending:
            if self.count and self._n >= self.count:
                if self.done_dir:
                    Path(self.done_dir, f"{self.channel}.done").write_text(str(self._n))
                await self._closed.wait()
                raise StopAsyncIteration
            payload = sds_message(self.channel, self._n)
            self._pending.append(payload)
            if self.duplicate_every and self._n % self.duplicate_every == 0:
                self._pending.append(payload)
            if self.malformed_every and self._n % self.malformed_every == 0:
                self._pending.append(b"\xff\xfe not sds")
            self._n += 1
            if self._n % 100 == 0:
                await asyncio.sleep(0)  # let the writer and gRPC run
        payload = self._pending.pop(0)
        return Envelope(self.topic, payload, message_hash(self.topic, payload))

    async def close(self) -> None:
        self._closed.set()


class SyntheticTransport(Transport):
    """Subscriptions generate traffic; publish is accepted and dropped."""

    def __init__(self, **options: object) -> None:
        self.options = options
        self.subscriptions: list[SyntheticSubscription] = []

    async def publish(self, topic: str, payload: bytes) -> bytes:
        return message_hash(topic, payload)

    async def subscribe(self, topic: str) -> SyntheticSubscription:
        sub = SyntheticSubscription(topic, self.options)
        self.subscriptions.append(sub)
        return sub

    async def close(self) -> None:
        for sub in self.subscriptions:
            await sub.close()


def create(**options: object) -> SyntheticTransport:
    """The factory ``store-node serve`` calls with the ``[transport]`` options."""
    return SyntheticTransport(**options)
