"""A transport wrapper that loses, duplicates and delays messages, below the SDK.

For demos and tests of an application over a real broker: the broker delivers
everything, so to watch SDS repair real loss, wrap each participant's
transport. Faults come from the shared seeded
:class:`~transports.faults.FaultInjector`, applied to each copy arriving at
this participant (``plan(<sender>, name)``; the sender is unknown at this
layer, so partitions name the *receiving* participants) and to each publish
(``plan(name, "broker")``: a dropped publish is reported as published, as on
a lossy network).
"""

from __future__ import annotations

import asyncio
import contextlib

from transports.base import Envelope, QueueSubscription, Subscription, Transport, message_hash
from transports.faults import FaultConfig, FaultInjector
from transports.tasks import cancel_and_wait

__all__ = ["LossyTransport"]


class LossyTransport(Transport):
    """Wraps ``inner``; ``faults`` is a shared :class:`FaultInjector` or a config for a new one."""

    def __init__(
        self,
        inner: Transport,
        faults: FaultInjector | FaultConfig,
        name: str,
        *,
        seed: int = 0,
        lose_publishes: bool = True,
    ) -> None:
        self.inner = inner
        self.faults = faults if isinstance(faults, FaultInjector) else FaultInjector(faults, seed)
        self.name = name
        self.lose_publishes = lose_publishes
        self.max_payload_size = inner.max_payload_size
        #: Copies dropped on the way in and publishes dropped on the way out.
        self.dropped_in = 0
        self.dropped_out = 0
        self._pumps: list[asyncio.Task[None]] = []

    async def publish(self, topic: str, payload: bytes) -> bytes:
        """Publish through ``inner`` unless the injector drops this copy."""
        if self.lose_publishes and not self.faults.plan(self.name, "broker"):
            self.dropped_out += 1
            return message_hash(topic, payload)
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        """Subscribe through ``inner``; what arrives passes the injector first."""
        inner_sub = await self.inner.subscribe(topic)
        pump: asyncio.Task[None] | None = None

        def closed(_sub: QueueSubscription) -> None:
            if pump is not None:
                pump.cancel()  # its finally closes the inner subscription

        outer = QueueSubscription(topic, closed)
        pump = asyncio.create_task(self._pump(inner_sub, outer))
        self._pumps.append(pump)
        return outer

    async def _pump(self, inner: Subscription, outer: QueueSubscription) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for envelope in inner:
                if outer.closed:
                    break
                delays = self.faults.plan("broker", self.name)
                if not delays:
                    self.dropped_in += 1
                for delay_ms in delays:
                    if delay_ms:
                        loop.call_later(delay_ms / 1000, self._deliver, outer, envelope)
                    else:
                        outer.deliver(envelope)
        finally:
            outer.end()
            with contextlib.suppress(Exception):
                await inner.close()

    @staticmethod
    def _deliver(outer: QueueSubscription, envelope: Envelope) -> None:
        outer.deliver(envelope)

    async def close(self) -> None:
        """Stop the pumps and close ``inner``."""
        await cancel_and_wait(self._pumps)
        self._pumps.clear()
        await self.inner.close()
