"""The driver stores and reads off the event loop, and done means the peer stored.

* A session's storage work (a read's checks and commit, the chunks read to send)
  runs on the store's worker thread: the event loop keeps ticking during a
  catch-up, and no store call of the sync runs on the loop's thread.
* The side that opened a session sees it done only once the other side has
  committed everything it pushed (the responder's SyncDone waits for the
  opener's, and for the commit of what came before it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from sdk.sync.driver import serve_stream, sync
from sdk.sync.events import SessionDone, SyncEvent
from sdk.sync.store import SyncStore
from tests.sync.helpers import TODO, entry_ids, history, make_store
from transports.stream import TcpStream, connect_tcp, memory_pipe, serve_tcp

#: Entries of the catch-ups below: enough that a catch-up takes several batches.
ENTRIES = 5_000


@cache
def _published() -> tuple[tuple[bytes, bytes], ...]:
    return tuple(history(28, ENTRIES, authors=4))


def _full() -> SyncStore:
    return make_store(_published())


def _record_threads(store: object, names: tuple[str, ...], seen: list[int]) -> None:
    """Note the thread of every call of ``store``'s methods ``names``."""
    for name in names:
        method = getattr(store, name)

        def recorded(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            seen.append(threading.get_ident())
            return _method(*args, **kwargs)

        setattr(store, name, recorded)


async def test_the_pushing_side_is_done_only_once_the_receiver_committed() -> None:
    full, empty = _full(), make_store([])
    held_at_done: list[int] = []

    def on_event(event: SyncEvent) -> None:
        if isinstance(event, SessionDone):
            # What the receiver has committed at the moment the pusher hears done.
            held_at_done.append(empty.entry_count())

    left, right, _ = memory_pipe()
    server = asyncio.create_task(serve_stream(empty, right, [TODO]))
    done = await sync(full, left, [TODO], on_event=on_event)
    await server
    expected = len(entry_ids(full))
    assert done.entries_sent == expected
    assert held_at_done == [expected]
    assert entry_ids(empty) == entry_ids(full)


async def test_the_loop_keeps_ticking_while_a_catch_up_is_stored() -> None:
    full, empty = _full(), make_store([])
    loop_thread = threading.get_ident()
    store_calls: list[int] = []
    _record_threads(empty, ("ingest_many", "flush"), store_calls)
    _record_threads(full, ("entries_for", "log_documents", "document_logs"), store_calls)
    period, late_after = 0.005, 0.05
    gaps: list[float] = []
    running = True

    async def probe() -> None:
        last = time.monotonic()
        while running:
            await asyncio.sleep(period)
            now = time.monotonic()
            gaps.append(now - last - period)
            last = now

    async def handle(stream: TcpStream) -> None:
        await serve_stream(full, stream, [TODO])

    # Over TCP: a read takes what arrived (up to 1 MiB), so the batches are as large
    # as a store node's.
    server = await serve_tcp(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ticking = asyncio.create_task(probe())
    started = time.monotonic()
    try:
        done = await sync(empty, await connect_tcp("127.0.0.1", port), [TODO])
    finally:
        server.close()
    elapsed = time.monotonic() - started
    running = False
    await ticking
    assert done.entries_received == len(entry_ids(full)) > 0
    assert store_calls and loop_thread not in store_calls
    # The loop turned all along: the time it stood still (ticks later than 50 ms)
    # is a small part of the catch-up. On the old driver, which stored each read
    # on the loop, it was nearly all of it (a handful of ticks in two seconds).
    stalled = sum(gap for gap in gaps if gap > late_after)
    assert stalled < 0.5 * elapsed, f"loop stood still {stalled:.2f} s of {elapsed:.2f} s"


async def test_bamboo_over_a_document_store_stores_and_serves_off_the_loop() -> None:
    from sdk.sync.bamboo_p2p import SqliteLogStore
    from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
    from sdk.sync.bamboo_p2p.driver import replicate_range, serve_bamboo
    from tests.sync.test_bamboo_p2p_documents import documents_with_a_log, receiver

    docs, document_id, log = documents_with_a_log(40)
    served, (client, received) = DocumentLogStore(docs, SqliteLogStore()), receiver()
    loop_thread = threading.get_ident()
    store_calls: list[int] = []
    _record_threads(received, ("ingest_many",), store_calls)
    _record_threads(docs, ("log_entries",), store_calls)
    left, right, _ = memory_pipe()
    server = asyncio.create_task(serve_bamboo(served, right))
    outcome = await replicate_range(client, left, log, 1, end=41)
    await server
    assert outcome.complete
    # Done means stored: the range is through only once the receiver flushed it.
    assert received.log_height(*log) == 41
    assert received.document(document_id) == docs.document(document_id)
    assert store_calls and loop_thread not in store_calls


async def test_collection_sync_serves_and_pulls_off_the_loop() -> None:
    from sdk.documents import KeyPair
    from sdk.sync.collection import CollectionService, connect_collection
    from tests.sync.collection_fixtures import build_collection, new_sync_store, views_of

    served, pulling = new_sync_store(), new_sync_store()
    collection = build_collection([served], KeyPair.from_private_key(bytes(range(32))), 60)
    loop_thread = threading.get_ident()
    store_calls: list[int] = []
    _record_threads(served, ("document", "documents", "operations", "entry"), store_calls)
    _record_threads(pulling, ("ingest_many", "has_entry"), store_calls)
    service = CollectionService(served)
    await service.start()
    try:
        async with await connect_collection(pulling, "127.0.0.1", service.port) as connection:
            snapshot = await connection.snapshot(collection.root)
        during = list(store_calls)
    finally:
        await service.close()
    assert snapshot.documents_pulled == 60
    assert views_of(pulling, collection.root) == views_of(served, collection.root)
    assert during and loop_thread not in during


async def test_a_bamboo_push_is_complete_only_once_the_receiver_stored_it() -> None:
    from sdk.sync.bamboo_p2p import SqliteLogStore
    from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
    from sdk.sync.bamboo_p2p.driver import replicate_range, serve_bamboo
    from tests.sync.test_bamboo_p2p_documents import documents_with_a_log, receiver

    docs, _, log = documents_with_a_log(200)
    (node, node_docs), held_at_done = receiver(), []
    left, right, _ = memory_pipe()
    server = asyncio.create_task(serve_bamboo(node, right))
    # The pusher proposes its own log: the node takes the entries it lacks.
    outcome = await replicate_range(DocumentLogStore(docs, SqliteLogStore()), left, log, 1, end=201)
    held_at_done.append(node_docs.log_height(*log))
    await server
    assert outcome.complete and held_at_done == [201]


async def test_a_store_node_killed_right_after_a_push_is_done_holds_everything(
    tmp_path: Path,
) -> None:
    from tests.conftest import free_port
    from tests.sync.test_store_node import node_config, start_node, wait_listening

    phone = _full()
    pushed = entry_ids(phone)
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    port = free_port()
    proc = start_node(node_config(node_dir, port))
    try:
        await wait_listening(port, proc)
        done = await sync(phone, await connect_tcp("127.0.0.1", port), [TODO])
        proc.kill()  # kill -9 the moment the pushing side hears done
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert done.entries_sent == len(pushed)
    reopened = make_store([], str(node_dir / "documents.db"))
    assert entry_ids(reopened) == pushed
