"""Shared helpers of the runtime tests: fast configs, an archiving transport, polling."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from sdk.runtime import Delivery, Node, ReliableChannel
from sdk.runtime.archiving import ArchivingTransport  # noqa: F401 - re-exported for the tests
from sdk.sds import COMPACT, ChannelConfig, RepairConfig
from sdk.testing.waiting import eventually  # noqa: F401 - re-exported for the tests

#: Protocol periods shortened so tests converge in about a second.
FAST = ChannelConfig(
    bloom=COMPACT,
    causal_history_size=3,
    resend_interval_ms=400,
    possibly_acked_resend_interval_ms=800,
    max_resends=50,
    sweep_interval_ms=50,
    sync_interval_ms=300,
    retrieval_interval_ms=200,
    repair=RepairConfig(t_min_ms=300, t_max_ms=1_200),
)

#: FAST without resends, periodic sync or SDS-R: a message a participant missed can
#: reach it only through the store, so a test sees exactly what catch-up does.
QUIET = dataclasses.replace(
    FAST,
    resend_interval_ms=600_000,
    possibly_acked_resend_interval_ms=600_000,
    sync_interval_ms=0,
    repair=None,
)


def converged(channels: list[ReliableChannel], total: int) -> bool:
    """Every channel's local log holds ``total`` messages, in the same order."""
    logs = [c.core.log.ids() for c in channels]
    return len(logs[0]) == total and all(log == logs[0] for log in logs)


class Collector:
    """Consumes a channel's events in the background and keeps its deliveries."""

    def __init__(self, channel: ReliableChannel) -> None:
        self.channel = channel
        self.delivered: list[Delivery] = []
        self.events: list[object] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.channel.events():
            self.events.append(event)
            if isinstance(event, Delivery):
                self.delivered.append(event)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def close_all(nodes: list[Node]) -> None:
    """Close nodes (ignoring order)."""
    for node in nodes:
        await node.close()
