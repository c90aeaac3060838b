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
from transports.stream import TcpStream, connect_tcp, memory_pipe, serve_tcp


async def test_a_cancellation_arriving_as_the_last_flush_completes_propagates() -> None:
    store = make_store(closed_subset(history(seed=5, operations=20), random.Random(2), 0.5))
    left, right, _ = memory_pipe()
    connection = SyncConnection(Replication(store, (TODO,), now=0, config=SyncConfig()), left)
    connection.start()
    closer: asyncio.Task[None] | None = None
    flush = connection._flush

    async def flush_then_cancelled() -> None:
        await flush()
        assert closer is not None
        closer.cancel()  # the caller is cancelled in the turn the flush completes

    connection._flush = flush_then_cancelled  # type: ignore[method-assign]
    closer = asyncio.ensure_future(connection.aclose())
    with pytest.raises(asyncio.CancelledError):
        await closer
    # ...and the close still finished: tasks stopped, stream closed, waiters woken.
    assert connection.closed.is_set()
    assert all(task.done() for task in connection._tasks)
    assert await right.read() == b""


async def test_a_closer_cancelled_mid_close_does_not_cancel_the_other_closers() -> None:
    """Every ``TcpStream.close`` waits on the writer's one close future; cancelling one
    waiter (a read loop stopped while it closes) must not cancel it under the others
    (the hang of ``test_a_peer_spending_credit_it_was_not_given_is_cut_off_over_tcp``)."""
    accepted: asyncio.Future[TcpStream] = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    async def handle(stream: TcpStream) -> None:
        accepted.set_result(stream)
        await release.wait()

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    client = await connect_tcp("127.0.0.1", port)
    stream = await accepted
    try:
        first = asyncio.ensure_future(stream.close())
        await asyncio.sleep(0)  # the first closer now waits on the close future
        first.cancel()
        second = asyncio.ensure_future(stream.close())
        await asyncio.wait([first, second])
        assert first.cancelled()
        assert not second.cancelled() and second.exception() is None
    finally:
        release.set()
        await client.close()
        server.close()
        await server.wait_closed()
