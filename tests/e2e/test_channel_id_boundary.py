"""Issue 19: any channel id either makes the whole trip — join, send, store-node archive,
Parquet export — or is refused where it enters, with the typed error, by every boundary
(``Node.join``, the store node's config) alike.

Everything is real and in one process: a :class:`~store_node.node.StoreNode` with a SQLite
archive ingesting from a :class:`~transports.memory.MemoryNetwork`, a runtime participant on
the same network, and the export read back with pyarrow.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sdk.runtime import Node
from store_node.archive import open_archive
from store_node.config import NodeConfig, parse_config
from store_node.errors import ConfigError
from store_node.export import export_archive
from store_node.node import StoreNode
from tests.runtime.helpers import FAST, eventually
from transports import MAX_CHANNEL_ID_BYTES, InvalidChannelId, validate_channel_id
from transports.memory import MemoryNetwork

#: Characters that stress every layer: MQTT wildcards and separators, NUL and other
#: controls, percent signs and dots (folder names), CJK and astral characters (UTF-8
#: length), a lone surrogate (not UTF-8 at all).
_ALPHABET = st.sampled_from(
    ["a", "Z", "0", "/", "+", "#", "%", ".", "=", " ", "\x00", "\n", "\x85", "語", "😀", "\ud800"]
)
CHANNEL_IDS = st.one_of(
    st.text(_ALPHABET, min_size=0, max_size=12),
    st.text(min_size=1, max_size=24),
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "語", "😀"]), st.integers(60, 260)),
)


def _config(channel: object, root: Path) -> NodeConfig:
    return parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": [channel], "batch_interval_ms": 10},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
        },
        root,
    )


async def _refused_everywhere(channel: str, root: Path) -> None:
    with pytest.raises(ConfigError):
        _config(channel, root)
    net = MemoryNetwork()
    async with Node(net.transport("p"), "p", config=FAST) as node:
        with pytest.raises(InvalidChannelId):
            await node.join(channel)


async def _round_trip(channel: str, root: Path) -> None:
    config = _config(channel, root)
    net = MemoryNetwork()
    store = StoreNode(config, transport=net.transport("store"))
    await store.start()
    try:
        async with Node(net.transport("alice"), "alice", config=FAST) as node:
            room = await node.join(channel)
            await room.send(b"hello")
            assert store.archive is not None
            archive = store.archive
            assert await eventually(lambda: archive.stats().message_count >= 1, timeout=20)
    finally:
        await store.stop()
    archive = open_archive(config.archive)
    try:
        export_archive(archive, root / "export", progress=False)
    finally:
        archive.close()
    table = ds.dataset(root / "export", format="parquet", partitioning="hive").to_table(
        columns=["channel_id", "sender_id", "content_size"]
    )
    assert table.column("channel_id").to_pylist() == [channel]
    assert table.column("sender_id").to_pylist() == ["alice"]
    assert table.column("content_size").to_pylist() == [len(b"hello")]


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(channel=CHANNEL_IDS)
def test_a_channel_id_round_trips_or_is_refused_at_every_boundary(channel: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            validate_channel_id(channel)
        except InvalidChannelId:
            event("refused at the boundary")
            asyncio.run(_refused_everywhere(channel, root))
            return
        assert 0 < len(channel.encode()) <= MAX_CHANNEL_ID_BYTES
        event("round trip")
        asyncio.run(_round_trip(channel, root))
