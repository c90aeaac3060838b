"""Two store nodes on real SQLite: one notices ids it lacks and heals them from its
``[store_sync]`` peer (issue 27.4).

Each node has its own in-test transport, so a test decides exactly what each one
receives: the gap is what one node never got. The count is read where an operator
reads it, ``/metrics`` and ``/readyz`` over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sdk.sds.message import decode_message
from store_node.archive.base import Archive, Criteria
from store_node.config import parse_config
from store_node.node import StoreNode
from tests.conftest import free_port
from tests.store_node.store_node_helpers import FeedTransport, sds_message, wait_for
from transports.base import topic_for_channel

CHANNEL = "c"
TOPIC = topic_for_channel(CHANNEL)


def _node(tmp_path: Path, name: str, store_sync: dict[str, Any]) -> StoreNode:
    config = parse_config(
        {
            "archive": {"path": f"{name}.db"},
            "ingest": {"channels": [CHANNEL], "batch_interval_ms": 5},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": "127.0.0.1:0"},
            "store_sync": store_sync,
        },
        tmp_path,
    )
    return StoreNode(config, transport=FeedTransport())


def _messages(n: int) -> tuple[list[bytes], list[str]]:
    """``n`` messages of one sender, each naming the two before it in its causal history."""
    payloads: list[bytes] = []
    ids: list[str] = []
    for i in range(n):
        payloads.append(sds_message(CHANNEL, i, history=tuple(ids[-2:])))
        ids.append(decode_message(payloads[-1]).message_id)
    return payloads, ids


async def _feed(node: StoreNode, payloads: list[bytes]) -> None:
    assert isinstance(node.transport, FeedTransport)
    for payload in payloads:
        await node.transport.publish(TOPIC, payload)


def _get(node: StoreNode, path: str) -> tuple[int, str]:
    assert node.metrics_address is not None
    url = f"http://127.0.0.1:{node.metrics_address[1]}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scraped(node: StoreNode, name: str) -> float:
    for line in _get(node, "/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the exposition")


def _readyz_missing(node: StoreNode) -> object:
    status, body = _get(node, "/readyz")
    assert status == 200, body  # a gap never makes a node unready
    return json.loads(body).get("details", {}).get("referenced_missing")


def _ids(archive: Archive | None) -> set[str]:
    assert archive is not None
    page = archive.find(
        Criteria(channel_id=CHANNEL),
        after=None,
        forward=True,
        limit=10_000,
        max_bytes=1 << 30,
        include_data=False,
    )
    return {m.message_id for m in page.messages}


async def test_the_missing_count_goes_to_zero_once_the_peer_provides(tmp_path: Path) -> None:
    a = _node(tmp_path, "a", {"listen": "127.0.0.1:0"})
    await a.start()
    assert a.store_sync is not None
    peer = f"127.0.0.1:{a.store_sync.port}"
    # No periodic session in this test's lifetime: only the gap can make b sync.
    b = _node(tmp_path, "b", {"peers": [peer], "interval_s": 3600})
    await b.start()
    try:
        assert b.store_sync is not None
        await wait_for(lambda: peer in b.store_sync.last)  # type: ignore[union-attr]
        payloads, ids = _messages(21)
        await _feed(a, payloads)
        # b misses 10..19; message 20 names 18 and 19.
        await _feed(b, payloads[:10] + payloads[20:])
        await wait_for(lambda: b.metrics.value("chorus_store_referenced_missing") == 2)
        # The early session waits GAP_SYNC_DELAY_S (2 s): the count is visible meanwhile.
        assert await asyncio.to_thread(_readyz_missing, b) == 2
        assert await asyncio.to_thread(_scraped, b, "chorus_store_referenced_missing") == 2

        await wait_for(lambda: b.metrics.value("chorus_store_referenced_missing") == 0, 30)
        assert await asyncio.to_thread(_readyz_missing, b) == 0
        assert await asyncio.to_thread(_scraped, b, "chorus_store_referenced_missing") == 0
        assert b.metrics.value("chorus_store_referenced_recovered_total") == 2
        assert b.metrics.value("chorus_store_store_sync_gap_requests_total") == 1
        # The session healed the whole gap, not only the two ids message 20 names.
        # (Its stats replace the start-up session's when it returns, after its commits.)
        await wait_for(lambda: b.store_sync.last[peer].messages_received == 10)  # type: ignore[union-attr]
        assert _ids(b.archive) == set(ids)
    finally:
        await b.stop()
        await a.stop()


async def test_a_node_restarted_after_an_outage_asks_its_peer_without_any_participant(
    tmp_path: Path,
) -> None:
    port = free_port()
    peer = f"127.0.0.1:{port}"
    payloads, ids = _messages(33)
    b_store_sync = {"peers": [peer], "interval_s": 3600}
    # b runs while its peer is down, and gets 0..9 and 30..32: the broker dropped 10..29.
    b = _node(tmp_path, "b", b_store_sync)
    await b.start()
    await _feed(b, payloads[:10] + payloads[30:])
    await wait_for(lambda: b.metrics.value("chorus_store_referenced_missing") == 2)
    await b.stop()

    # b restarts, its peer still down, and nobody sends anything.
    b = _node(tmp_path, "b", b_store_sync)
    await b.start()
    a: StoreNode | None = None
    try:
        await wait_for(lambda: _readyz_missing(b) == 2)
        # Its start-up session and the early one the gap asked for both failed: from
        # here only retrying a silent peer, with backoff, can heal it.
        await wait_for(lambda: b.store_sync.failures.get(peer, 0) >= 2)  # type: ignore[union-attr]
        # The peer comes up; it was running during b's outage and holds everything.
        a = _node(tmp_path, "a", {"listen": peer})
        await a.start()
        await _feed(a, payloads)
        await wait_for(lambda: a.metrics.value("chorus_store_ingest_archived_total") == 33)

        # b retries its peer (backoff from 2 s) because it knows it lacks ids.
        await wait_for(lambda: _ids(b.archive) == set(ids), 30)
        await wait_for(lambda: _readyz_missing(b) == 0)
        assert b.metrics.value("chorus_store_referenced_recovered_total") == 2
        # The session's stats are recorded when it returns, after its commits.
        assert b.store_sync is not None
        await wait_for(lambda: peer in b.store_sync.last)  # type: ignore[union-attr]
        assert b.store_sync.last[peer].messages_received == 20
    finally:
        await b.stop()
        if a is not None:
            await a.stop()
