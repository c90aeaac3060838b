"""The runtime's store-failure paths, in process: a store client that fails, times out,
returns nothing or does not archive the channel; catch-up windows owed across such
failures and restarts; and the other background failures surfaced as events
(``NodeFailed``, ``SubscriptionEnded``). The same with real processes is in
``tests/runtime/test_catch_up_obligation.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from sdk.runtime import (
    CatchUpCompleted,
    CatchUpState,
    ChannelNotArchived,
    MessageLost,
    Node,
    NodeFailed,
    RuntimeFailure,
    RuntimeOptions,
    StoreRetrievalFailed,
    StoreUnreachable,
    SubscriptionEnded,
    SyncState,
    SyncStatusChanged,
    wall_clock_ms,
)
from sdk.runtime.catch_up import Backoff, OwedWindows
from sdk.store.client import InMemoryStore
from sdk.store.errors import StoreQueryError
from tests.runtime.helpers import QUIET, ArchivingTransport, Collector, eventually
from transports.base import Envelope, Subscription, Transport, TransportError
from transports.memory import MemoryNetwork

#: No resends, periodic sync or SDS-R: a missed message reaches a participant only
#: through the store, so these tests see exactly what the catch-up does.
#: Quick retries, a short store timeout.
OPTIONS = RuntimeOptions(
    store_timeout=0.25,
    catch_up_retry_min=0.05,
    catch_up_retry_max=0.2,
    store_confirm_interval=0,
)


class FlakyStore:
    """An :class:`InMemoryStore` that can be down (raises UNAVAILABLE), hang (times out)
    or answer nothing; counts the queries it got."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.down = False
        self.hang = False
        self.empty = False
        self.range_queries = 0
        self.id_queries = 0

    async def _gate(self) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise StoreQueryError("UNAVAILABLE", "connection refused")

    async def get_messages(
        self, channel_id: str, message_ids: Sequence[str], retrieval_hints: Sequence[bytes] = ()
    ) -> list[bytes]:
        self.id_queries += 1
        await self._gate()
        if self.empty:
            return []
        return await self.store.get_messages(channel_id, message_ids, retrieval_hints)

    async def messages_between(
        self, channel_id: str, time_start: int, time_end: int | None = None
    ) -> AsyncIterator[list[bytes]]:
        self.range_queries += 1
        await self._gate()
        if self.empty:
            yield []
            return
        async for page in self.store.messages_between(channel_id, time_start, time_end):
            yield page

    async def close(self) -> None:
        pass


async def _away_while_alice_sends(
    tmp_path: Path, net: MemoryNetwork, archive: InMemoryStore, count: int
) -> list[str]:
    """Bob joins, leaves; Alice sends ``count`` (archived) and leaves too."""
    alice = Node(ArchivingTransport(net.transport("alice"), archive), "alice", config=QUIET)
    bob = Node(net.transport("bob"), "bob", db=tmp_path / "bob.db", config=QUIET)
    a_room = await alice.join("room")
    await bob.join("room")
    await bob.close()
    sent = [(await a_room.send(f"m{k}".encode())).message_id for k in range(count)]
    await alice.close()
    return sent


def _catch_up_states(collector: Collector) -> list[CatchUpState]:
    """The catch-up states the channel reported, repeats collapsed."""
    states: list[CatchUpState] = []
    for event in collector.events:
        if isinstance(event, SyncStatusChanged) and (
            not states or states[-1] is not event.status.catch_up
        ):
            states.append(event.status.catch_up)
    return states


# -- the owed window --------------------------------------------------------------------


def test_owed_windows_merge_and_settle() -> None:
    owed = OwedWindows()
    assert owed.add(10, 20) and owed.add(30, 40) and owed.add(15, 32)
    assert owed.windows == ((10, 40),)
    assert not owed.add(12, 18)  # already owed
    assert owed.settle(20, 25)
    assert owed.windows == ((10, 20), (25, 40))
    assert owed.settle(0, 100) and not owed


async def test_a_store_down_at_restart_is_retried_until_the_window_is_caught_up(
    tmp_path: Path,
) -> None:
    net = MemoryNetwork()
    archive = InMemoryStore()
    sent = await _away_while_alice_sends(tmp_path, net, archive, 20)
    store = FlakyStore(archive)
    store.down = True
    bob = Node(
        net.transport("bob2"), db=tmp_path / "bob.db", store=store, config=QUIET, options=OPTIONS
    )
    room = await bob.join("room")
    events = Collector(room)
    assert await eventually(lambda: store.range_queries >= 3, timeout=10)  # retried
    status = room.sync_status
    assert status.state is SyncState.SYNCING
    assert status.catch_up is CatchUpState.STORE_UNREACHABLE
    assert status.store_down_since is not None and status.owed_from is not None
    unreachable = [e for e in events.events if isinstance(e, StoreUnreachable)]
    assert len(unreachable) == 1  # once per outage, however many retries
    assert any(isinstance(e, StoreRetrievalFailed) for e in events.events)

    store.down = False
    assert await eventually(lambda: len(events.delivered) == 20, timeout=10), room.stats
    assert [d.message_id for d in events.delivered] == sent
    assert await eventually(lambda: room.sync_status.state is SyncState.SYNCED, timeout=5)
    assert room.sync_status.catch_up is CatchUpState.IDLE
    assert _catch_up_states(events)[-3:] == [
        CatchUpState.STORE_UNREACHABLE,
        CatchUpState.CATCHING_UP,
        CatchUpState.IDLE,
    ]
    assert any(isinstance(e, CatchUpCompleted) for e in events.events)
    await events.stop()
    await bob.close()


async def test_a_window_owed_across_two_restarts_is_not_forgotten(tmp_path: Path) -> None:
    net = MemoryNetwork()
    archive = InMemoryStore()
    sent = await _away_while_alice_sends(tmp_path, net, archive, 10)
    store = FlakyStore(archive)
    store.down = True
    # Each restart's own window reaches back only 50 ms before the last activity, and
    # each run's clock is 10 s later: what the first window owed is kept, or lost.
    config = dataclasses.replace(QUIET, range_margin_ms=50)
    options = dataclasses.replace(OPTIONS, catch_up_overlap=0)

    def node(k: int) -> Node:
        return Node(
            net.transport(f"bob{k}"),
            db=tmp_path / "bob.db",
            store=store,
            config=config,
            options=options,
            clock=lambda: wall_clock_ms() + 10_000 * k,
        )

    for k in (1, 2):  # two restarts with the store down: the window stays owed
        bob = node(k)
        room = await bob.join("room")
        await room.send(f"bob is back {k}".encode())  # active: the restart window moves on
        queries = store.range_queries
        assert await eventually(lambda q=queries: store.range_queries >= q + 2, timeout=10)
        await bob.close()
    store.down = False
    bob = node(3)
    room = await bob.join("room")
    events = Collector(room)
    assert await eventually(lambda: len(events.delivered) == 10, timeout=10), room.stats
    assert [d.message_id for d in events.delivered] == sent
    assert await eventually(lambda: room.sync_status.state is SyncState.SYNCED, timeout=5)
    await events.stop()
    await bob.close()


async def test_a_store_that_times_out_leaves_the_window_owed(tmp_path: Path) -> None:
    net = MemoryNetwork()
    archive = InMemoryStore()
    await _away_while_alice_sends(tmp_path, net, archive, 5)
    store = FlakyStore(archive)
    store.hang = True
    bob = Node(
        net.transport("bob2"), db=tmp_path / "bob.db", store=store, config=QUIET, options=OPTIONS
    )
    room = await bob.join("room")
    events = Collector(room)
    assert await eventually(
        lambda: any(
            isinstance(e, StoreRetrievalFailed) and "TimeoutError" in e.error for e in events.events
        ),
        timeout=10,
    )
    assert room.sync_status.catch_up is CatchUpState.STORE_UNREACHABLE
    store.hang = False
    assert await eventually(lambda: len(events.delivered) == 5, timeout=10), room.stats
    await events.stop()
    await bob.close()


async def test_an_empty_answer_for_a_missing_message_asks_again_then_gives_it_up() -> None:
    net = MemoryNetwork()
    archive = InMemoryStore()
    store = FlakyStore(archive)
    store.empty = True  # answers, but never has the message
    config = dataclasses.replace(QUIET, lost_timeout_ms=1_500, range_margin_ms=0)
    alice = Node(net.transport("alice"), "alice", config=config)
    bob = Node(net.transport("bob"), "bob", store=store, config=config, options=OPTIONS)
    a_room, b_room = await alice.join("room"), await bob.join("room")
    events = Collector(b_room)
    net.partition([{"alice"}, {"bob"}])
    first = (await a_room.send(b"bob never hears this")).message_id
    await alice._publish_queue.drained.wait()  # published into the partition
    await net.quiesce()
    net.heal()
    await a_room.send(b"this one needs it")
    assert await eventually(lambda: b_room.sync_status.missing == 1, timeout=5)
    assert b_room.sync_status.state is SyncState.SYNCING
    assert await eventually(lambda: store.id_queries >= 2, timeout=10)  # reported again
    assert not any(isinstance(e, StoreRetrievalFailed) for e in events.events)
    assert await eventually(
        lambda: any(isinstance(e, MessageLost) and e.message_id == first for e in events.events),
        timeout=10,
    )
    assert await eventually(lambda: len(events.delivered) == 1, timeout=5)
    assert b_room.sync_status.lost == 1
    await events.stop()
    await alice.close()
    await bob.close()


# -- a store that does not archive the channel ------------------------------------------


async def test_a_store_that_does_not_archive_the_channel_is_said_once_and_never_synced(
    tmp_path: Path,
) -> None:
    net = MemoryNetwork()
    archive = InMemoryStore(channels={"elsewhere"})
    await _away_while_alice_sends(tmp_path, net, InMemoryStore(), 3)
    bob = Node(
        net.transport("bob2"), db=tmp_path / "bob.db", store=archive, config=QUIET, options=OPTIONS
    )
    room = await bob.join("room")
    events = Collector(room)
    assert await eventually(
        lambda: room.sync_status.catch_up is CatchUpState.NOT_ARCHIVED, timeout=5
    )
    assert await eventually(lambda: room.stats["catch_up_retries"] >= 3, timeout=10)
    refused = [e for e in events.events if isinstance(e, ChannelNotArchived)]
    assert len(refused) == 1 and "does not archive" in refused[0].error
    assert room.sync_status.state is SyncState.SYNCING
    assert all(
        e.status.state is SyncState.SYNCING
        for e in events.events
        if isinstance(e, SyncStatusChanged)
    )
    await events.stop()
    await bob.close()


async def test_republishing_stops_for_a_store_that_does_not_archive_the_channel() -> None:
    net = MemoryNetwork()
    store = InMemoryStore(channels={"elsewhere"})
    options = RuntimeOptions(store_timeout=0.25, store_confirm_interval=0.05)
    alice = Node(net.transport("alice"), "alice", store=store, config=QUIET, options=options)
    room = await alice.join("room")
    events = Collector(room)
    for k in range(20):
        await room.send(f"m{k}".encode())
    assert await eventually(lambda: room.sync_status.catch_up is CatchUpState.NOT_ARCHIVED)
    assert await eventually(lambda: not room._unconfirmed, timeout=5)
    await room.send(b"one more")  # not even checked
    await asyncio.sleep(0)
    assert not room._unconfirmed
    assert room.stats["store_republished"] == 0
    assert len([e for e in events.events if isinstance(e, ChannelNotArchived)]) == 1
    await events.stop()
    await alice.close()


async def test_the_republish_rate_toward_a_store_that_lacks_our_messages_is_bounded() -> None:
    net = MemoryNetwork()
    store = InMemoryStore()  # archives the channel, but never gets our messages
    interval = 0.05
    options = RuntimeOptions(
        store_timeout=0.25,
        store_confirm_interval=interval,
        store_confirm_max_interval=0.4,
        store_republish_limit=30,
    )
    alice = Node(net.transport("alice"), "alice", store=store, config=QUIET, options=options)
    room = await alice.join("room")
    for k in range(200):
        await room.send(f"m{k}".encode())
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await eventually(lambda: room.stats["store_republish_deferred"] > 0, timeout=10)
    before = room.stats["store_republished"]
    await asyncio.sleep(1.0)  # measuring a rate: the span is the measurement itself
    elapsed = loop.time() - started
    republished = room.stats["store_republished"] - before
    # At most the budget per interval (plus one interval of slack for the edges); the
    # old check republished all 200 every interval (about 4,000 here).
    assert republished <= 30 * (elapsed / interval + 1), republished
    assert republished > 0
    await alice.close()


# -- the other background failures ------------------------------------------------------


async def test_a_failed_commit_is_a_node_failed_event_and_stops_the_node(tmp_path: Path) -> None:
    net = MemoryNetwork()
    node = Node(net.transport("alice"), "alice", db=tmp_path / "a.db", config=QUIET)
    room = await node.join("room")
    events = Collector(room)
    assert node.persistence is not None

    def broken(batches: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    node.persistence.write = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeFailure):
        await room.send(b"never saved")
    assert await eventually(lambda: any(isinstance(e, NodeFailed) for e in events.events))
    failed = next(e for e in events.events if isinstance(e, NodeFailed))
    assert "disk I/O error" in failed.error
    with pytest.raises(RuntimeFailure):
        await room.send(b"after the failure")
    await events.stop()
    await node.close()


class _EndingTransport:
    """A memory transport whose subscriptions end, with an error or without."""

    def __init__(self, inner: Transport, error: bool) -> None:
        self.inner = inner
        self.error = error
        self.max_payload_size = inner.max_payload_size

    async def publish(self, topic: str, payload: bytes) -> bytes:
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        return _EndingSubscription(self.error)

    async def close(self) -> None:
        await self.inner.close()


class _EndingSubscription:
    def __init__(self, error: bool) -> None:
        self.error = error

    def __aiter__(self) -> _EndingSubscription:
        return self

    async def __anext__(self) -> Envelope:
        await asyncio.sleep(0.01)
        if self.error:
            raise TransportError("connection lost for good")
        raise StopAsyncIteration

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("error", [True, False])
async def test_a_subscription_that_ends_is_a_subscription_ended_event(error: bool) -> None:
    net = MemoryNetwork()
    transport = _EndingTransport(net.transport("alice"), error)
    node = Node(transport, "alice", config=QUIET)  # type: ignore[arg-type]
    room = await node.join("room")
    events = Collector(room)
    assert await eventually(lambda: any(isinstance(e, SubscriptionEnded) for e in events.events))
    ended = next(e for e in events.events if isinstance(e, SubscriptionEnded))
    assert ("connection lost for good" in ended.error) is error
    await events.stop()
    await node.close()


def test_chat_status_says_why_it_is_not_in_sync() -> None:
    from examples.chat import describe_status
    from sdk.runtime import SyncStatus

    now = 1_700_000_600_000
    down = SyncStatus(
        SyncState.SYNCING,
        3,
        0,
        0,
        CatchUpState.STORE_UNREACHABLE,
        owed_from=now - 600_000,
        owed_to=now,
        store_down_since=now - 30_000,
        store_error="StoreQueryError: UNAVAILABLE: connection refused",
    )
    said = describe_status(down, {}, 0, now)
    assert said.startswith("not in sync: the store node is unreachable since ")
    assert "(10 minutes ago)" in said and "retrying" in said
    catching = dataclasses.replace(down, catch_up=CatchUpState.CATCHING_UP, pages=2)
    said = describe_status(catching, {}, 0, now)
    assert said.startswith("catching up from the store: what was sent since ")
    assert "2 pages received so far" in said
    refused = dataclasses.replace(down, catch_up=CatchUpState.NOT_ARCHIVED)
    assert "does not archive this channel" in describe_status(refused, {}, 0, now)
    synced = SyncStatus(SyncState.SYNCED, 3, 0, 0)
    assert describe_status(synced, {}, 0, now).startswith("in sync;")


class _Reconnecting:
    """A memory transport with the ``connected`` flag the node watches."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.up = True
        #: Times the node saw the connection down.
        self.seen_down = 0
        self.max_payload_size = inner.max_payload_size

    @property
    def connected(self) -> bool:
        self.seen_down += not self.up
        return self.up

    async def publish(self, topic: str, payload: bytes) -> bytes:
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        return await self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_transport_reconnect_retries_an_owed_window_at_once(tmp_path: Path) -> None:
    net = MemoryNetwork()
    archive = InMemoryStore()
    await _away_while_alice_sends(tmp_path, net, archive, 5)
    store = FlakyStore(archive)
    store.down = True
    # The backoff alone would wait a minute: only the reconnect can bring the retry.
    options = dataclasses.replace(
        OPTIONS, catch_up_retry_min=60, catch_up_retry_max=60, connection_check_interval=0.02
    )
    transport = _Reconnecting(net.transport("bob2"))
    bob = Node(transport, db=tmp_path / "bob.db", store=store, config=QUIET, options=options)  # type: ignore[arg-type]
    room = await bob.join("room")
    events = Collector(room)
    assert await eventually(
        lambda: room.sync_status.catch_up is CatchUpState.STORE_UNREACHABLE, timeout=5
    )
    store.down = False
    transport.up = False
    assert await eventually(lambda: transport.seen_down > 0)
    assert store.range_queries == 1 and room.stats["reconnects"] == 0
    transport.up = True
    assert await eventually(lambda: len(events.delivered) == 5, timeout=5), room.stats
    assert room.stats["reconnects"] == 1
    assert await eventually(lambda: room.sync_status.state is SyncState.SYNCED, timeout=5)
    await events.stop()
    await bob.close()


async def test_a_reconnect_starts_the_catch_up_backoff_over_once(tmp_path: Path) -> None:
    """A reconnect tries the owed windows at once and starts the backoff over, once: the
    node's request and the window away the core then asks for are one attempt (they
    were two, each resetting the backoff)."""
    net = MemoryNetwork()
    archive = InMemoryStore()
    await _away_while_alice_sends(tmp_path, net, archive, 5)
    store = FlakyStore(archive)
    store.down = True
    options = dataclasses.replace(
        OPTIONS, catch_up_retry_min=60, catch_up_retry_max=60, connection_check_interval=0.02
    )
    transport = _Reconnecting(net.transport("bob2"))
    bob = Node(transport, db=tmp_path / "bob.db", store=store, config=QUIET, options=options)  # type: ignore[arg-type]
    room = await bob.join("room")
    assert await eventually(
        lambda: room.sync_status.catch_up is CatchUpState.STORE_UNREACHABLE, timeout=5
    )
    resets: list[int] = []

    class Counting(Backoff):
        __slots__ = ()

        def reset(self) -> None:
            resets.append(self.attempts)
            super().reset()

    old = room._backoff
    room._backoff = Counting(old.minimum, old.maximum, random.Random(0))
    room._backoff.attempts = old.attempts
    queries = store.range_queries
    transport.up = False
    assert await eventually(lambda: transport.seen_down > 0)
    transport.up = True
    assert await eventually(lambda: room.stats["reconnects"] == 1, timeout=5)
    assert await eventually(lambda: room._retry_at is not None, timeout=5)  # failed again
    assert len(resets) == 1 and store.range_queries == queries + 1
    assert room.sync_status.catch_up is CatchUpState.STORE_UNREACHABLE
    await bob.close()
