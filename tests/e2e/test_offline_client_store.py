"""End-to-end, against a real store node over gRPC:

* (issue 4) a client offline during 500 messages on a lossy channel reconnects and
  converges using only the store node;
* (issue 15) both peers offline: alice sends while bob is down and leaves, bob
  restarts and catches up from the store node by time, alice still away;
* the client snippet of ``docs/store-node.md`` runs as written.

The first test, in detail:

Pieces, all real and in one process:

* a :class:`~store_node.node.StoreNode` (SQLite archive in ``tmp_path``, gRPC on
  127.0.0.1, ephemeral port) ingesting the channel from a
  :class:`~transports.memory.MemoryNetwork`. The network itself is lossless, so
  the store's link is too: it is the high-availability cache;
* three online participants (``sdk.runtime.Node``) whose links are lossy
  (:class:`~sdk.runtime.lossy.LossyTransport`: 25 % loss, 5 % duplication,
  jitter that reorders), each with a :class:`GrpcStoreClient` to fill its own gaps;
* client X, which chats a little, goes offline (node and transport closed), misses
  500 messages, and comes back restored from its database with a
  :class:`GrpcStoreClient`.

"Only the store node": X's transport is wrapped in :class:`DropIdsTransport`,
which drops every incoming copy of the 500 messages (original, duplicate,
resend or SDS-R rebroadcast), and SDS-R's ``t_min_ms`` is far beyond the test's
duration. X learns that something is missing from one new message per peer
(not filtered); the causal-history walk back through the store does the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from sdk.runtime import Node, ReliableChannel
from sdk.runtime.lossy import LossyTransport
from sdk.sds import RepairConfig, decode_message
from sdk.store.grpc import GrpcStoreClient
from sdk.testing.waiting import idle
from store_node.config import NodeConfig, parse_config
from store_node.metrics import NodeMetrics
from store_node.node import StoreNode
from tests.e2e.offline_helpers import CountingStoreClient, DropIdsTransport
from tests.runtime.helpers import FAST, QUIET, Collector, converged, eventually
from transports.faults import FaultConfig, FaultInjector
from transports.memory import MemoryNetwork

CHANNEL = "room"
OFFLINE_MESSAGES = 500
PEERS = ("alice", "bob", "carol")
X = "xavier"
#: Each participant's incoming link (the store's is lossless).
LOSSY_LINK = FaultConfig(loss=0.25, duplication=0.05, jitter_ms=20)
#: The fast test periods, with SDS-R out of the picture: its first repair request
#: would come 10 minutes after a gap is seen (the store is asked at once).
CONFIG = dataclasses.replace(FAST, repair=RepairConfig(t_min_ms=600_000, t_max_ms=1_200_000))
SEED = 20261121


def _store_config(tmp_path: Path) -> NodeConfig:
    return parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [CHANNEL], "batch_interval_ms": 10},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        tmp_path,
    )


def _lossy(net: MemoryNetwork, name: str, seed: int) -> LossyTransport:
    # lose_publishes=False: every publish reaches the medium (and so the store);
    # each participant's copies are then lost / duplicated / delayed on arrival.
    return LossyTransport(
        net.transport(name), FaultInjector(LOSSY_LINK, seed), name, lose_publishes=False
    )


def _query_ok(metrics: NodeMetrics) -> float:
    return metrics.value("chorus_store_rpc_total", method="Query", code="OK")


@pytest.mark.timeout(120)
async def test_offline_client_converges_from_the_store_only(tmp_path: Path) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    net = MemoryNetwork()
    metrics = NodeMetrics()
    store_config = _store_config(tmp_path)
    store = StoreNode(store_config, transport=net.transport("store"), metrics=metrics)
    await store.start()
    target = f"127.0.0.1:{store.grpc_port}"
    x_db = tmp_path / "xavier.db"

    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.stop)
        # -- the online peers: lossy links, each with its own store client ----------------
        peer_channels: list[ReliableChannel] = []
        for i, name in enumerate(PEERS):
            transport = _lossy(net, name, SEED + i)
            stack.push_async_callback(transport.close)
            client = GrpcStoreClient(target)
            stack.push_async_callback(client.close)
            node = Node(transport, name, store=client, config=CONFIG)
            stack.push_async_callback(node.close)
            peer_channels.append(await node.join(CHANNEL))
        collectors = [Collector(c) for c in peer_channels]
        for c in collectors:
            stack.push_async_callback(c.stop)

        # -- phase 1: X takes part for a while, then goes offline ------------------------
        x_transport = _lossy(net, X, SEED + 10)
        x_node = Node(x_transport, X, db=x_db, store=GrpcStoreClient(target), config=CONFIG)
        x_channel = await x_node.join(CHANNEL)
        warmup = [*peer_channels, x_channel]
        for round_ in range(2):
            for channel in warmup:
                await channel.send(f"warm-up {round_} from {channel.participant_id}".encode())
        assert await eventually(lambda: converged(warmup, 2 * len(warmup)), timeout=20), (
            "warm-up did not converge"
        )
        before = x_channel.core.log.ids()
        assert x_node.store is not None
        await x_node.close()
        await x_node.store.close()
        await x_transport.close()

        # -- phase 2: 500 messages while X is offline ------------------------------------
        offline_ids: list[str] = []
        for k in range(OFFLINE_MESSAGES):
            sender = peer_channels[k % len(peer_channels)]
            handle = await sender.send(f"offline #{k} from {sender.participant_id}".encode())
            offline_ids.append(handle.message_id)
            if rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0, 0.008))
        offline = set(offline_ids)
        assert len(offline) == OFFLINE_MESSAGES
        total = len(before) + OFFLINE_MESSAGES
        assert await eventually(lambda: converged(peer_channels, total), timeout=40), (
            f"online peers did not converge: {[len(c.core.log) for c in peer_channels]}"
        )
        offline_done = time.monotonic()

        # The store archived every one of them (its link is lossless).
        inspector = GrpcStoreClient(target)
        stack.push_async_callback(inspector.close)
        held: set[str] = set()
        for _ in range(200):
            held = await inspector.presence(CHANNEL, offline_ids)
            if held == offline:
                break
            await asyncio.sleep(0.05)
        assert held == offline, f"store holds {len(held)}/{OFFLINE_MESSAGES}"

        # -- phase 3: X comes back, restored from its db; peers can't give it old content --
        x_filter = DropIdsTransport(_lossy(net, X, SEED + 11), offline)
        stack.push_async_callback(x_filter.close)
        x_store = CountingStoreClient(target)
        stack.push_async_callback(x_store.close)
        queries_before = _query_ok(metrics)
        restart_ms = int(time.time() * 1000)
        x_node = Node(x_filter, db=x_db, store=x_store, config=CONFIG)
        stack.push_async_callback(x_node.close)
        assert x_node.participant_id == X  # restored from the database
        x_channel = await x_node.join(CHANNEL)
        x_collector = Collector(x_channel)
        stack.push_async_callback(x_collector.stop)
        assert x_channel.core.log.ids() == before  # restored, nothing new yet
        reconnected = time.monotonic()

        # Something new from each peer: the only hint X gets of what it missed.
        post_ids = {
            (await c.send(f"back online? from {c.participant_id}".encode())).message_id
            for c in peer_channels
        }
        everyone = [*peer_channels, x_channel]
        final = total + len(post_ids)
        ok = await eventually(lambda: converged(everyone, final), timeout=45)
        assert ok, (
            f"X did not converge: {len(x_channel.core.log)}/{final} "
            f"(store calls {x_store.calls}, returned {len(x_store.returned)}, "
            f"status {x_channel.sync_status})"
        )
        caught_up = time.monotonic()
        expected_deliveries = offline | post_ids
        assert await eventually(
            lambda: len(x_collector.delivered) >= len(expected_deliveries), timeout=10
        )
        # Late copies of what X delivered, as a peer's resend brings them: each must be
        # taken for a duplicate, none delivered again.
        replayer = net.transport("replayer")
        stack.push_async_callback(replayer.close)
        post_records = [r for r in x_channel.history() if r.message_id in post_ids]
        assert len(post_records) == len(post_ids)

        def admitted() -> int:
            return sum(x_filter.admitted[mid] for mid in post_ids)

        def dropped_as_copies() -> int:
            # A copy byte-identical to one X rebroadcast itself (an SDS-R repair) is taken
            # for the broker's echo of X's own publish and dropped before the core
            # (``own_echo``); every other copy reaches the core as a duplicate.
            return x_channel.core.stats["duplicates"] + x_channel.counters["own_echo"]

        admitted_before = admitted()
        copies_before = dropped_as_copies()
        for _ in range(3):  # three rounds: some copies are lost on X's link
            for record in post_records:
                assert record.data is not None
                await replayer.publish(x_channel.topic, record.data)
        assert await eventually(
            lambda: dropped_as_copies() - copies_before >= admitted() - admitted_before > 0
        ), (
            f"copies admitted {admitted() - admitted_before}, taken for duplicates "
            f"{dropped_as_copies() - copies_before}"
        )
        await idle()

        # Same log, same order (Lamport time, id) as every peer.
        x_log = x_channel.core.log.ids()
        for channel in peer_channels:
            assert channel.core.log.ids() == x_log
        assert set(x_log) == set(before) | offline | post_ids

        # Only the store: none of the 500 came through X's transport, all came from the store.
        assert not offline & set(x_filter.admitted)
        assert offline <= set(x_store.returned), (
            f"{len(offline - set(x_store.returned))} offline messages never came from the store"
        )
        # On restart X asks the store for the window it was away, once (one range
        # query, paged). The windows the core asks for gaps found meanwhile only
        # continue it: no stretch of time is fetched twice. Lookups by id fill
        # whatever is left open.
        windows = x_store.windows
        assert windows[0][0] < restart_ms <= (windows[0][1] or 0), windows
        for (_, end), (start, _) in itertools.pairwise(windows):
            assert end is not None and end <= start, windows
        assert x_channel.stats["catch_up_queries"] == len(windows)
        retrieved = x_channel.stats["store_retrieved"] + x_channel.stats["catch_up_retrieved"]
        assert retrieved >= OFFLINE_MESSAGES
        assert _query_ok(metrics) - queries_before >= x_store.calls + x_store.range_calls
        assert x_channel.sync_status.missing == 0 and x_channel.sync_status.lost == 0

        # Delivered exactly once, after the restart, in causal order.
        delivered = Counter(e.message_id for e in x_collector.delivered)
        assert set(delivered) == expected_deliveries
        assert max(delivered.values()) == 1
        history = x_channel.history()
        order = {r.message_id: i for i, r in enumerate(history)}
        assert len(order) == len(history) == final  # every message once in the persisted log
        assert [r.seq for r in history] == sorted(r.seq for r in history)
        for record in history:
            assert record.data is not None
            for dep in decode_message(record.data).causal_history:
                assert dep.message_id in order, f"{dep.message_id} never delivered"
                assert order[dep.message_id] < order[record.message_id], (
                    f"{record.message_id} delivered before its dependency {dep.message_id}"
                )
        # The application's view (events) is the persisted delivery order.
        restart_order = [r.message_id for r in history if r.message_id in expected_deliveries]
        assert [e.message_id for e in x_collector.delivered] == restart_order

        dropped = sum(x_filter.dropped.values())
        await stack.aclose()

    # The archive: each message exactly one row, received at least once.
    archive_path = store_config.archive.path
    with contextlib.closing(sqlite3.connect(archive_path)) as db:
        rows = db.execute(
            "SELECT message_id, COUNT(*), MIN(arrival_count), SUM(arrival_count)"
            " FROM messages WHERE channel_id = ? GROUP BY message_id",
            (CHANNEL,),
        ).fetchall()
        rows_total, arrivals_total = db.execute(
            "SELECT COUNT(*), SUM(arrival_count) FROM messages"
        ).fetchone()
    by_id = {mid: (n, low, arrivals) for mid, n, low, arrivals in rows}
    # Every copy the store received is one row or one counted duplicate of it.
    assert metrics.value("chorus_store_ingest_archived_total") == rows_total
    assert metrics.value("chorus_store_ingest_duplicates_total") == arrivals_total - rows_total
    assert metrics.value("chorus_store_ingest_lost_total") == 0
    assert offline <= set(by_id)
    for mid in offline:
        n, low, _ = by_id[mid]
        assert n == 1, f"{mid} archived {n} times"
        assert low >= 1
    arrivals = sum(by_id[mid][2] for mid in offline)
    print(
        f"\noffline phase {offline_done - started:.1f}s, X caught up in "
        f"{caught_up - reconnected:.2f}s with {x_store.calls} store queries; "
        f"{dropped} copies of old messages dropped at X's transport; "
        f"store arrivals of the 500: {arrivals}; total {time.monotonic() - started:.1f}s"
    )


@pytest.mark.timeout(60)
async def test_both_offline_bob_restarts_and_catches_up_from_the_store_node(
    tmp_path: Path,
) -> None:
    """Issue 15: alice sends while bob is down and leaves; bob restarts with
    ``store=GrpcStoreClient`` and gets everything with alice still away."""
    net = MemoryNetwork()
    metrics = NodeMetrics()
    store = StoreNode(_store_config(tmp_path), transport=net.transport("store"), metrics=metrics)
    await store.start()
    target = f"127.0.0.1:{store.grpc_port}"
    bob_db = tmp_path / "bob.db"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.stop)
        alice = Node(net.transport("alice"), "alice", db=tmp_path / "alice.db", config=QUIET)
        bob_store = GrpcStoreClient(target)
        bob = Node(net.transport("bob"), "bob", db=bob_db, store=bob_store, config=QUIET)
        a_room, b_room = await alice.join(CHANNEL), await bob.join(CHANNEL)
        await a_room.send(b"hi bob")
        assert await eventually(lambda: len(b_room.core.log) == 1, timeout=10)
        await bob.close()
        await bob.transport.close()
        await bob_store.close()

        away = [
            (await a_room.send(f"while you were out #{k}".encode())).message_id for k in range(30)
        ]
        inspector = GrpcStoreClient(target)
        stack.push_async_callback(inspector.close)

        async def away_archived() -> bool:
            return await inspector.presence(CHANNEL, away) == set(away)

        assert await eventually(away_archived)
        await alice.close()
        await alice.transport.close()  # alice stays away from here on

        queries_before = _query_ok(metrics)
        bob_store = CountingStoreClient(target)
        stack.push_async_callback(bob_store.close)
        bob = Node(net.transport("bob"), db=bob_db, store=bob_store, config=QUIET)
        stack.push_async_callback(bob.close)
        b_room = await bob.join(CHANNEL)
        events = Collector(b_room)
        stack.push_async_callback(events.stop)
        assert await eventually(lambda: len(events.delivered) == len(away), timeout=20), (
            b_room.stats
        )
        assert [e.message_id for e in events.delivered] == away
        assert b_room.stats["catch_up_queries"] == 1
        assert b_room.stats["catch_up_retrieved"] >= len(away)
        assert _query_ok(metrics) > queries_before  # the store node answered a Query
        assert b_room.sync_status.missing == 0


def _docs_snippet() -> str:
    """The store-node docs' client snippet, exactly as written there."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "store-node.md").read_text()
    for block in text.split("```python\n")[1:]:
        code = block.split("```", 1)[0]
        if "GrpcStoreClient(" in code:
            return code
    raise AssertionError("docs/store-node.md has no GrpcStoreClient snippet")


@pytest.mark.timeout(60)
async def test_the_store_node_docs_client_snippet_runs_as_written(tmp_path: Path) -> None:
    net = MemoryNetwork()
    store = StoreNode(_store_config(tmp_path), transport=net.transport("store"))
    await store.start()
    # The snippet's channel is "general"; the test's store node archives CHANNEL.
    snippet = _docs_snippet().replace("127.0.0.1:50051", f"127.0.0.1:{store.grpc_port}")
    snippet = snippet.replace('"general"', repr(CHANNEL))
    snippet = snippet.replace('"me.db"', repr(str(tmp_path / "me.db")))
    body = "".join(f"    {line}\n" for line in snippet.splitlines())
    namespace: dict[str, object] = {}
    exec(  # the documented code, in an async function with its free names as arguments
        "async def snippet(transport, missing_ids, retrieval_hints, my_sent_ids, "
        f"went_offline_ms):\n{body}    return room\n",
        namespace,
    )
    try:
        alice = Node(net.transport("alice"), "alice", config=QUIET)
        a_room = await alice.join(CHANNEL)
        went_offline_ms = int(time.time() * 1000) - 1_000
        sent = [(await a_room.send(f"docs {k}".encode())).message_id for k in range(3)]
        probe = GrpcStoreClient(f"127.0.0.1:{store.grpc_port}")

        async def all_archived() -> bool:
            return await probe.presence(CHANNEL, sent) == set(sent)

        assert await eventually(all_archived)
        await probe.close()
        run = namespace["snippet"]
        room = await run(  # type: ignore[operator]
            net.transport("me"), sent[:1], [], sent, went_offline_ms
        )
        assert isinstance(room, ReliableChannel)
        assert room.closed  # the snippet's `async with Node` closed it
        assert set(room.core.log.ids()) == set(sent)  # the catch-up fed the core
        await alice.close()
    finally:
        await store.stop()
