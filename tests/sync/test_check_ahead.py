"""Signatures checked ahead: while a batch is stored, the driver decodes the entries the
machine reads into the next batch and starts their signature checks
(``SyncConnection._check_ahead``); ``store_work.perform`` takes them over, and drops
them when the batch stops before their end."""

from __future__ import annotations

from typing import Any

import pytest

from sdk.documents.bamboo import SignatureChecks, decode_entry
from sdk.sync import driver, store_work
from sdk.sync.errors import InvalidEntry
from sdk.sync.session import SyncConfig
from sdk.sync.session_state import BatchStored, StoreBatch
from sdk.sync.store_work import perform
from tests.sync.helpers import TODO, entry_ids, history, make_store
from transports.stream import TcpStream, connect_tcp, serve_tcp

HISTORY = history(seed=11, operations=1_500)


def prepared(entries: list[tuple[bytes, bytes]], count: int) -> store_work.Prepared:
    """The first ``count`` entries decoded, their checks started, as the driver does."""
    checks = SignatureChecks.growing(len(entries))
    decoded = [decode_entry(entry) for entry, _ in entries[:count]]
    for entry in decoded:
        checks.add(entry)
    return decoded, checks


def test_a_batch_with_entries_checked_ahead_is_stored_whole() -> None:
    store, entries = make_store([]), HISTORY[:300]
    request = StoreBatch(1, (TODO,), list(entries), [], 1_000)
    result = perform(store, request, prepared(entries, 120))
    assert isinstance(result, BatchStored) and result.error is None
    assert result.accepted == 300 and entry_ids(store) == entry_ids(make_store(entries))


def test_a_batch_that_stops_among_the_entries_checked_ahead_keeps_what_came_before() -> None:
    """An operation that does not decode, before the end of the entries checked ahead:
    the checks (of more entries than the batch now holds) are dropped, the entries
    before it are stored and the session's error is the bad entry."""
    entries = list(HISTORY[:300])
    entries[50] = (entries[50][0], b"\xff" + entries[50][1])
    store = make_store([])
    result = perform(store, StoreBatch(1, (TODO,), entries, [], 1_000), prepared(entries, 120))
    assert isinstance(result.error, InvalidEntry)
    assert entry_ids(store) == entry_ids(make_store(HISTORY[:50]))


@pytest.mark.parametrize("other_connection", [False, True])
async def test_a_catch_up_stores_batches_whose_signatures_were_checked_ahead(
    monkeypatch: pytest.MonkeyPatch, other_connection: bool
) -> None:
    """Unless another connection of the store checks its own next batch ahead (one at
    a time per store): then every batch is checked as the worker decodes it."""
    full, empty = make_store(HISTORY), make_store([])
    other = object()
    if other_connection:
        empty.checking_ahead = other
    ahead: list[int] = []
    carry_out = store_work.perform

    def recording(store: Any, request: object, prepared: Any = None) -> Any:
        if isinstance(request, StoreBatch):
            ahead.append(len(prepared[0]) if prepared is not None else 0)
        return carry_out(store, request, prepared)

    monkeypatch.setattr(driver, "perform", recording)

    async def handle(stream: TcpStream) -> None:
        await driver.serve_stream(full, stream, [TODO])

    server = await serve_tcp(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        stream = await connect_tcp("127.0.0.1", port)
        done = await driver.sync(empty, stream, [TODO], config=SyncConfig(max_batch=100))
    finally:
        server.close()
    assert done.entries_received == len(HISTORY)
    assert entry_ids(empty) == entry_ids(full)
    if other_connection:
        assert sum(ahead) == 0 and empty.checking_ahead is other
    else:
        assert sum(ahead) > 0, ahead  # some batches came with their entries checked ahead
        assert empty.checking_ahead is None  # given back
