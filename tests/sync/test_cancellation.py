"""Closing a sync connection never swallows the caller's cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when its caller is
cancelled as the inner awaitable completes, dropping the cancellation.
``SyncConnection.aclose`` used it for its last flush, so a replication loop
(``ReplicationService.run``) cancelled just as a session closed went on looping,
and whoever awaited it hung (seen in
``tests/sync/test_store_node.py::test_the_service_syncs_with_its_peers_in_process``).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from sdk.sync.driver import SyncConnection
from sdk.sync.session import Replication, SyncConfig
from tests.sync.helpers import TODO, closed_subset, history, make_store
from transports.stream import memory_pipe


async def test_a_cancellation_arriving_as_the_last_flush_completes_propagates() -> None:
    store = make_store(closed_subset(history(seed=5, operations=20), random.Random(2), 0.5))
    left, right, _ = memory_pipe()
    connection = SyncConnection(Replication((TODO,), now=0, config=SyncConfig()), left, store=store)
    connection.start()
    closer: asyncio.Task[None] | None = None
    drain = connection._drain

    async def drain_then_cancelled() -> None:
        await drain()
        assert closer is not None
        closer.cancel()  # the caller is cancelled in the turn the drain completes

    connection._drain = drain_then_cancelled  # type: ignore[method-assign]
    closer = asyncio.ensure_future(connection.aclose())
    with pytest.raises(asyncio.CancelledError):
        await closer
    # ...and the close still finished: tasks stopped, stream closed, waiters woken.
    assert connection.closed.is_set()
    assert all(task.done() for task in connection._tasks)
    assert await right.read() == b""
