"""The store node's four stream listeners against hostile peers, and over mutual TLS.

Every scenario runs against a real :class:`store_node.node.StoreNode` serving
``[replication]``, ``[collection]``, ``[bamboo_p2p]`` and ``[store_sync]`` with
the same small listener limits, on all four listeners at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from sdk.documents.bamboo import decode_entry
from sdk.documents.keys import KeyPair
from sdk.documents.operation import RelationList
from sdk.documents.varu64 import encode_varu64
from sdk.sync.bamboo_p2p import SqliteLogStore, append_entry
from sdk.sync.bamboo_p2p.driver import replicate_range
from sdk.sync.bamboo_p2p.framing import Channel, ChannelFrameDecoder, ChannelFrameMeter
from sdk.sync.bamboo_p2p.framing import encode_frame as encode_channel_frame
from sdk.sync.collection import connect_collection
from sdk.sync.collection.connection import CollectionConnection
from sdk.sync.driver import sync
from sdk.sync.errors import RemoteProtocolError
from sdk.sync.framing import FrameDecoder, FrameMeter, encode_frame
from sdk.sync.rbsr import RangeIndex
from store_node.archive import open_archive
from store_node.config import ArchiveConfig, parse_config
from store_node.errors import ConfigError
from store_node.node import StoreNode
from store_node.store_sync.session import run_session
from tests.documents.helpers import TODO_SCHEMA, todo_fields
from tests.store_node.store_node_helpers import (
    FeedTransport,
    sds_message,
    wait_for,
)
from tests.store_node.tls_certs import Certs, make_certs
from tests.sync.collection_fixtures import FOLDER, FOLDER_ID, new_sync_store
from tests.sync.helpers import KEYS, history, make_store
from transports.base import topic_for_channel
from transports.guarded import GuardedListener, tls_client_context
from transports.stream import Stream, TcpStream, connect_tcp
from transports.tasks import cancel_and_wait

REPO = Path(__file__).resolve().parents[2]
TODO = TODO_SCHEMA.id
NAMES = ("replication", "collection", "bamboo_p2p", "store_sync")
IDLE_S, WRITE_S, FRAME_S = 0.5, 0.5, 1.0
LIMITS: dict[str, Any] = {
    "max_connections": 8,
    "idle_timeout_s": IDLE_S,
    "write_timeout_s": WRITE_S,
    "frame_deadline_s": FRAME_S,
    "max_buffered_bytes": 4 << 20,
}
#: The hostile frame of the issue: one byte short of 1 MiB.
BIG_FRAME = (1 << 20) - 1
HISTORY = history(seed=28, operations=30)
BAMBOO_KEY = KeyPair.from_private_key(bytes(range(32)))
BAMBOO_LOG = (BAMBOO_KEY.public_key, 0)


def schema_file(folder: Path) -> None:
    """The application schemas the node serves: todos and collection folders."""
    items = [
        {
            "name": name,
            "view_id": [schema.id.partition("_")[2]],
            "description": schema.description,
            "fields": {field: str(kind) for field, kind in schema.fields.items()},
        }
        for name, schema in (("todo", TODO_SCHEMA), ("folder", FOLDER))
    ]
    (folder / "schemas.json").write_text(json.dumps(items))


def node_config(folder: Path, **options: Any) -> Any:
    """Every stream section on, with ``options`` as each one's listener options."""
    schema_file(folder)
    docs = {"path": "documents.db", "schema_file": "schemas.json"}
    return parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": ["c"], "batch_interval_ms": 5},
            "grpc": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": ""},
            "replication": {
                "listen": "127.0.0.1:0", "schemas": [TODO], "interval_s": 3600, **docs, **options
            },
            "collection": {"listen": "127.0.0.1:0", **docs, **options},
            "bamboo_p2p": {"listen": "127.0.0.1:0", "path": "bamboo.db", **options},
            "store_sync": {"listen": "127.0.0.1:0", "interval_s": 3600, **options},
        },
        folder,
    )  # fmt: skip


@asynccontextmanager
async def running(
    folder: Path,
    transport: FeedTransport | None = None,
    nodes: list[StoreNode] | None = None,
    **options: Any,
) -> AsyncIterator[dict[str, GuardedListener]]:
    """A started node (fed by ``transport``, appended to ``nodes``); its listeners by
    section name."""
    node = StoreNode(node_config(folder, **options), transport=transport or FeedTransport())
    if nodes is not None:
        nodes.append(node)
    await node.start()
    try:
        assert node.replication and node.collection and node.bamboo_p2p and node.store_sync
        services: dict[str, Any] = {
            "replication": node.replication,
            "collection": node.collection,
            "bamboo_p2p": node.bamboo_p2p,
            "store_sync": node.store_sync,
        }
        listeners = {name: s.listener for name, s in services.items()}
        assert all(listener is not None for listener in listeners.values())
        assert sorted(node.metrics.listeners(), key=lambda x: x.name) == sorted(
            listeners.values(), key=lambda x: x.name
        )
        yield {name: listener for name, listener in listeners.items() if listener is not None}
    finally:
        await node.stop()


def frame_head(name: str, size: int) -> bytes:
    """What a peer of ``name``'s protocol sends to start a frame of ``size`` bytes."""
    if name == "bamboo_p2p":
        return b"\x00\x00\x00" + b"\x00" + encode_varu64(size)  # setup, then a control frame
    head = bytearray()
    while size >= 0x80:
        head.append((size & 0x7F) | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head)


async def until_closed(reader: asyncio.StreamReader, timeout: float = 15.0) -> None:
    """Read (and drop) what the node sends until it closes the connection."""
    async with asyncio.timeout(timeout):
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass


async def on_each(
    listeners: dict[str, GuardedListener],
    scenario: Callable[[str, GuardedListener], Awaitable[None]],
) -> None:
    await asyncio.gather(*(scenario(name, listener) for name, listener in listeners.items()))


async def test_an_idle_connection_is_cut_after_the_idle_timeout(tmp_path: Path) -> None:
    nodes: list[StoreNode] = []
    async with running(tmp_path, None, nodes, **LIMITS) as listeners:

        async def idle(name: str, listener: GuardedListener) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            started = time.monotonic()
            await until_closed(reader)
            held = time.monotonic() - started
            writer.close()
            assert listener.cut["idle"] == 1, (name, listener.cut)
            assert held >= IDLE_S, (name, held)
            await wait_for(lambda: listener.open_connections == 0)

        await on_each(listeners, idle)
        metrics = nodes[0].metrics
        for name in NAMES:  # what /metrics exposes
            labels = {"listener": name}
            assert metrics.value("chorus_store_listener_cut_total", reason="idle", **labels) == 1
            assert metrics.value("chorus_store_listener_accepted_total", **labels) == 1
            assert metrics.value("chorus_store_listener_connections", **labels) == 0


async def test_a_trickling_peer_is_cut_at_the_frame_deadline_and_its_bytes_freed(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, **LIMITS) as listeners:

        async def trickle(name: str, listener: GuardedListener) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(frame_head(name, BIG_FRAME) + bytes(256 * 1024))
            await writer.drain()
            closed = asyncio.create_task(until_closed(reader))
            await wait_for(lambda: listener.buffered_bytes >= 256 * 1024)
            started = time.monotonic()
            # One byte every fifth of the idle timeout: never idle, never done.
            while not closed.done():
                try:
                    writer.write(b"\x00")
                    await writer.drain()
                except ConnectionError:
                    break
                await asyncio.sleep(IDLE_S / 5)
            await closed
            writer.close()
            assert listener.cut == {
                "idle": 0, "write_timeout": 0, "frame_deadline": 1, "memory": 0
            }, name  # fmt: skip
            assert time.monotonic() - started < FRAME_S + 5, name
            await wait_for(lambda: listener.buffered_bytes == 0)

        await on_each(listeners, trickle)


async def test_the_connection_cap_refuses_the_excess_before_any_protocol_byte(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, **{**LIMITS, "idle_timeout_s": 0}) as listeners:

        async def crowd(name: str, listener: GuardedListener) -> None:
            cap = LIMITS["max_connections"]
            held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(cap)]
            await wait_for(lambda: listener.accepted == cap)
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            async with asyncio.timeout(10):
                with contextlib.suppress(ConnectionError):
                    assert await reader.read() == b"", name  # not a byte of the protocol
            writer.close()
            assert listener.refused["capacity"] == 1, name
            assert listener.accepted == cap, name
            for _, w in held:
                w.close()
            await wait_for(lambda: listener.open_connections == 0)

        await on_each(listeners, crowd)


async def test_300_hostile_half_frames_stay_within_the_byte_budget_and_leave_nothing(
    tmp_path: Path,
) -> None:
    """300 peers each send 64 KiB of a 1 MiB - 1 frame and stop: each listener holds at
    most its budget (the rest are cut for memory), and nothing once they are gone."""
    budget = 4 << 20
    options = {**LIMITS, "max_connections": 400, "idle_timeout_s": 0, "frame_deadline_s": 0}
    async with running(tmp_path, **{**options, "max_buffered_bytes": budget}) as listeners:
        for name, listener in listeners.items():  # one listener after the other
            peak = 0

            async def hostile(
                name: str = name, listener: GuardedListener = listener
            ) -> asyncio.StreamWriter:
                nonlocal peak
                _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
                writer.write(frame_head(name, BIG_FRAME) + bytes(64 * 1024))
                await writer.drain()
                peak = max(peak, listener.buffered_bytes)
                return writer

            writers = await asyncio.gather(*(hostile() for _ in range(300)))
            await wait_for(lambda: listener.accepted == 300)  # noqa: B023
            held = budget // (64 * 1024)
            await wait_for(lambda: listener.cut["memory"] >= 300 - held - 1)  # noqa: B023
            assert peak <= budget and listener.buffered_bytes <= budget, name
            assert listener.buffered_bytes > budget // 2, name  # those within it are held
            for writer in writers:
                writer.close()
            await wait_for(lambda: listener.open_connections == 0)  # noqa: B023
            assert listener.buffered_bytes == 0, name


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "pki")


def tls_options(certs: Certs, *allowed: str) -> dict[str, Any]:
    return {
        **LIMITS,
        "idle_timeout_s": 5.0,
        "frame_deadline_s": 5.0,
        "handshake_timeout_s": 1.0,  # the plain-TCP peer never completes a handshake
        "tls_cert": str(certs.server.cert),
        "tls_key": str(certs.server.key),
        "tls_client_ca": str(certs.ca),
        "tls_client_fingerprints": list(allowed),
    }


async def test_a_peer_without_credentials_is_refused_before_any_protocol_byte(
    tmp_path: Path, certs: Certs
) -> None:
    async with running(tmp_path, **tls_options(certs, certs.client.fingerprint)) as listeners:
        attempts: list[tuple[str, ssl.SSLContext | None]] = [
            ("tls", None),  # plain TCP: its bytes are not a TLS handshake
            ("tls", tls_client_context(certs.ca)),  # TLS without a client certificate
            ("tls", tls_client_context(certs.ca, certs.stranger.cert, certs.stranger.key)),
            (  # signed by the CA, but not on the allow-list
                "peer_not_allowed",
                tls_client_context(certs.ca, certs.other_client.cert, certs.other_client.key),
            ),
        ]

        async def strangers(name: str, listener: GuardedListener) -> None:
            expected = dict.fromkeys(listener.refused, 0)
            for n, (reason, context) in enumerate(attempts):
                try:
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", listener.port, ssl=context
                    )
                    writer.write(frame_head(name, 3) + b"hi!")
                    await until_closed(reader)
                    writer.close()
                except (ssl.SSLError, ConnectionError):
                    pass  # refused during the handshake
                await wait_for(lambda n=n: sum(listener.refused.values()) == n + 1)
                expected[reason] += 1
                assert listener.refused == expected, (name, n)
            assert listener.accepted == 0, name  # no handler ever ran, no byte was read

        await on_each(listeners, strangers)


def test_listener_options_are_validated_alike_in_every_section(
    tmp_path: Path, certs: Certs
) -> None:
    config = node_config(tmp_path, **tls_options(certs, certs.client.fingerprint.upper()))
    for name in NAMES:
        listener = getattr(config, name).listener
        assert listener.limits.max_connections == LIMITS["max_connections"]
        assert listener.limits.idle_timeout_s == 5.0
        assert listener.tls is not None
        assert listener.tls.client_fingerprints == {certs.client.fingerprint}
    bad_options: list[dict[str, Any]] = [
        {"idle_timeout_s": -1},
        {"max_connections": 0},
        {"max_buffered_bytes": True},
        {"tls_cert": str(certs.server.cert)},  # no key
        {"tls_cert": str(certs.server.cert), "tls_key": str(certs.client.key)},  # not its key
        {"tls_cert": "missing.pem", "tls_key": "missing.key"},
        {"tls_client_ca": str(certs.ca)},  # no server certificate
        {"tls_client_fingerprints": ["abc"]},
        {"peer_tls_cert": str(certs.client.cert)},  # no key
    ]
    for bad in bad_options:
        for name in NAMES:
            section = {"listen": "127.0.0.1:0", **bad}
            if name == "replication":
                section["schemas"] = [TODO]
            with pytest.raises(ConfigError, match=name):
                parse_config({name: section}, tmp_path)
    bad_channels: list[dict[str, list[str]]] = [
        {"abc": ["c"]},
        {certs.client.fingerprint: []},
        {"x" * 64: ["c"]},
        {certs.client.fingerprint: ["c", "c"]},
    ]
    for channels in bad_channels:
        with pytest.raises(ConfigError, match="peer_channels"):
            parse_config(
                {"store_sync": {**tls_options(certs), "peer_channels": channels}}, tmp_path
            )
    with pytest.raises(ConfigError, match="needs tls_client_ca"):
        parse_config({"store_sync": {"peer_channels": {certs.client.fingerprint: ["c"]}}})


class StopsReading:
    """A client stream that stops reading after ``after`` bytes (and never reads again)."""

    def __init__(self, stream: Stream, after: int) -> None:
        self.stream = stream
        self.after = after
        self.received = 0

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self.received >= self.after:
            await asyncio.get_running_loop().create_future()
        data = await self.stream.read(max_bytes)
        self.received += len(data)
        return data

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)

    async def close(self) -> None:
        await self.stream.close()


async def connect_small(port: int) -> Stream:
    """A client connection with a small receive buffer (the kernel holds little for a
    client that does not read, so the node's writes wait soon)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    return TcpStream(reader, writer)


def big_documents(path: Path, count: int = 40, size: int = 100_000) -> None:
    """``count`` todos of ``size``-character titles in the document store at ``path``."""
    store = make_store([], str(path))
    for n in range(count):
        store.create(KEYS[0], TODO, todo_fields(f"{n:04d}" + "x" * size))
    store.close()


def big_log(path: Path, count: int = 40, size: int = 100_000) -> None:
    """A Bamboo log of ``count`` payloads of ``size`` bytes in the log store at ``path``."""
    store = SqliteLogStore(str(path))
    for n in range(count):
        append_entry(store, BAMBOO_KEY, 0, bytes([n % 256]) * size)
    store.flush()
    store.close()


async def test_a_client_that_stops_reading_is_cut_after_the_write_timeout(
    tmp_path: Path,
) -> None:
    """A catch-up of megabytes to a client that reads 64 KiB and stops: replication and
    Bamboo point-to-point cut it off once one write waited the write timeout."""
    big_documents(tmp_path / "documents.db")
    big_log(tmp_path / "bamboo.db")
    options = {**LIMITS, "idle_timeout_s": 0, "frame_deadline_s": 0}
    async with running(tmp_path, **options) as listeners:
        replication, bamboo = listeners["replication"], listeners["bamboo_p2p"]
        phone = make_store([])
        pulls = [
            asyncio.create_task(
                sync(
                    phone,
                    StopsReading(await connect_small(replication.port), 64 * 1024),
                    [TODO],
                )
            ),
            asyncio.create_task(
                replicate_range(
                    SqliteLogStore(":memory:"),
                    StopsReading(await connect_small(bamboo.port), 64 * 1024),
                    BAMBOO_LOG,
                    1,
                    end=40,
                    stall_timeout=None,
                )
            ),
        ]
        try:
            for listener in (replication, bamboo):
                await wait_for(lambda: listener.cut["write_timeout"] == 1)  # noqa: B023
                await wait_for(lambda: listener.open_connections == 0)  # noqa: B023
                assert listener.cut["idle"] == listener.cut["frame_deadline"] == 0
        finally:
            await cancel_and_wait(pulls)


async def feed_big_messages(
    transport: FeedTransport, archive: Path, count: int = 120, size: int = 50_000
) -> None:
    """Publish ``count`` messages of ``size`` bytes on channel ``c``; wait until archived."""
    for n in range(count):
        payload = sds_message("c", n, content=bytes([n % 256]) * size)
        await transport.publish(topic_for_channel("c"), payload)
    reader = open_archive(ArchiveConfig(path=archive), migrate=False)
    try:
        await wait_for(lambda: reader.count() == count)
    finally:
        reader.close()


def big_collection(path: Path, count: int = 40, size: int = 100_000) -> str:
    """A root folder linking ``count`` folders of ``size``-character titles, in the
    document store at ``path``; the root's id."""
    store = new_sync_store(str(path))
    children = [
        store.create(KEYS[0], FOLDER_ID, {"title": f"{n:04d}" + "x" * size, "children": []})
        for n in range(count)
    ]
    links = RelationList(tuple(child.document_id for child in children))
    root = store.create(KEYS[0], FOLDER_ID, {"title": "root", "children": links}).document_id
    store.close()
    return root


async def test_a_collection_client_that_stops_reading_is_cut_after_the_write_timeout(
    tmp_path: Path,
) -> None:
    """A client pulls a collection of megabytes and stops reading after 64 KiB: the
    node's collection listener cuts it after the write timeout."""
    root = big_collection(tmp_path / "documents.db")
    options = {**LIMITS, "idle_timeout_s": 0, "frame_deadline_s": 0}
    async with running(tmp_path, **options) as listeners:
        listener = listeners["collection"]
        stream = StopsReading(await connect_small(listener.port), 64 * 1024)
        connection = CollectionConnection(new_sync_store(), stream, timeout=None)
        connection.start()
        pull = asyncio.create_task(connection.snapshot(root))
        try:
            await wait_for(lambda: listener.cut["write_timeout"] == 1)
            await wait_for(lambda: listener.open_connections == 0)
            assert listener.cut["idle"] == listener.cut["frame_deadline"] == 0
        finally:
            await cancel_and_wait([pull])
            await connection.aclose()


async def test_a_store_node_that_stops_reading_is_cut_after_the_write_timeout(
    tmp_path: Path,
) -> None:
    """A peer store node with nothing asks for an archive of megabytes and stops
    reading after 64 KiB: the node's store-sync listener cuts it after the write timeout."""
    options = {**LIMITS, "idle_timeout_s": 0, "frame_deadline_s": 0}
    transport = FeedTransport()
    async with running(tmp_path, transport, **options) as listeners:
        await feed_big_messages(transport, tmp_path / "archive.db")
        listener = listeners["store_sync"]
        stream = StopsReading(await connect_small(listener.port), 64 * 1024)
        session = asyncio.create_task(run_session(stream, EmptySide(), initiator=True))
        try:
            await wait_for(lambda: listener.cut["write_timeout"] == 1)
            await wait_for(lambda: listener.open_connections == 0)
            assert listener.cut["idle"] == listener.cut["frame_deadline"] == 0
        finally:
            await cancel_and_wait([session])


class EmptySide:
    """A store-sync side with an empty archive that keeps nothing it is sent."""

    def __init__(self) -> None:
        self.index = RangeIndex()

    def source(self) -> RangeIndex:
        return self.index

    async def call(self, fn: Callable[[], Any]) -> Any:
        return fn()

    async def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        return []

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        pass

    async def committed(self) -> None:
        return None


async def test_with_credentials_every_protocol_works_over_tls(tmp_path: Path, certs: Certs) -> None:
    history = HISTORY
    served = tmp_path / "a"
    served.mkdir()
    big_log(served / "bamboo.db", count=5, size=100)
    context = tls_client_context(certs.ca, certs.client.cert, certs.client.key)
    async with running(served, **tls_options(certs, certs.client.fingerprint)) as listeners:

        def dial(name: str) -> Awaitable[Stream]:
            return connect_tcp("127.0.0.1", listeners[name].port, ssl=context)

        phone = make_store(history)
        done = await sync(phone, await dial("replication"), [TODO])
        assert done.entries_sent == len(history)

        root = decode_entry(history[0][0]).id
        laptop = make_store([])
        async with await connect_collection(
            laptop, "127.0.0.1", listeners["collection"].port, ssl=context
        ) as connection:
            snapshot = await connection.snapshot(root)
        assert snapshot.out_of_sync.snapshot_keys

        logs = SqliteLogStore(":memory:")
        outcome = await replicate_range(logs, await dial("bamboo_p2p"), BAMBOO_LOG, 1, end=5)
        assert outcome.complete and logs.payload_sequence_numbers(BAMBOO_LOG) == [1, 2, 3, 4, 5]

        peer = f"127.0.0.1:{listeners['store_sync'].port}"
        other = StoreNode(
            parse_config(
                {
                    "archive": {"path": "b.db"},
                    "ingest": {"channels": ["c"], "batch_interval_ms": 5},
                    "grpc": {"listen": "127.0.0.1:0"},
                    "metrics": {"listen": ""},
                    "store_sync": {
                        "peers": [peer],
                        "interval_s": 3600,
                        "peer_tls_ca": str(certs.ca),
                        "peer_tls_cert": str(certs.client.cert),
                        "peer_tls_key": str(certs.client.key),
                    },
                },
                tmp_path,
            ),
            transport=FeedTransport(),
        )
        await other.start()
        try:
            assert other.store_sync is not None
            stats = await other.store_sync.sync_with(peer)
            assert stats.rounds_sent >= 1
        finally:
            await other.stop()
        for name, listener in listeners.items():
            assert listener.accepted >= 1 and not any(listener.refused.values()), name


@pytest.mark.parametrize("seed", range(5))
def test_the_frame_meters_agree_with_the_decoders_on_any_chunking(seed: int) -> None:
    """What a meter counts as partly received is what its decoder holds, read by read."""
    rng = random.Random(seed)
    bodies = [rng.randbytes(rng.choice((0, 1, 127, 128, 300, 20_000))) for _ in range(40)]
    sync_stream = b"".join(encode_frame(body) for body in bodies)
    bamboo_frames = b"".join(encode_channel_frame(Channel.CONTROL, body) for body in bodies if body)
    for stream, meter, decoder, setup in (
        (sync_stream, FrameMeter(), FrameDecoder(), b""),
        (bamboo_frames, ChannelFrameMeter(), ChannelFrameDecoder(), b"\x03\xf8\x01\x00"),
    ):
        meter.feed(setup)
        assert meter.partial == 0 and meter.completed == (1 if setup else 0)
        frames = meter.completed
        pos = 0
        while pos < len(stream):
            step = rng.randint(1, 3000)
            chunk, pos = stream[pos : pos + step], pos + step
            meter.feed(chunk)
            frames += len(decoder.feed(chunk))
            assert meter.partial == decoder.buffered
            assert meter.completed == frames


def test_a_meter_fed_a_header_its_decoder_refuses_neither_raises_nor_holds_it() -> None:
    """The decoder ends such a connection; its meter just counts the read as done."""
    for meter, garbage in (
        (FrameMeter(), b"\xff" * 20),  # a length prefix over 5 bytes
        (ChannelFrameMeter(), b"\x00\x00\x00" + b"\x07" * 20),  # setup, then channel 7
    ):
        meter.feed(garbage)
        assert meter.partial == 0 and meter.completed >= 1


async def test_the_sync_command_lines_dial_a_tls_listener_with_a_client_certificate(
    tmp_path: Path, certs: Certs
) -> None:
    served = tmp_path / "node"
    served.mkdir()
    big_log(served / "bamboo.db", count=3, size=10)
    make_store(HISTORY, str(served / "documents.db")).close()
    tls = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client.cert)]
    tls += ["--tls-key", str(certs.client.key)]
    async with running(served, **tls_options(certs, certs.client.fingerprint)) as listeners:

        async def run(*argv: str) -> dict[str, Any]:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *argv, stdout=asyncio.subprocess.PIPE, cwd=REPO
            )
            out, _ = await process.communicate()
            assert process.returncode == 0, out
            return dict(json.loads(out.decode().strip().splitlines()[-1]))

        schema_file(tmp_path)
        pulled = await run(
            "sdk.sync", "sync", "--db", str(tmp_path / "phone.db"), "--schema", TODO,
            "--schema-json", str(tmp_path / "schemas.json"), *tls,
            f"127.0.0.1:{listeners['replication'].port}",
        )  # fmt: skip
        assert pulled["received"] == len(HISTORY)
        replicated = await run(
            "sdk.sync.bamboo_p2p", "replicate", "--db", str(tmp_path / "logs.db"),
            "--author", BAMBOO_KEY.public_key.hex(), "--start", "1", "--end", "3", *tls,
            f"127.0.0.1:{listeners['bamboo_p2p'].port}",
        )  # fmt: skip
        assert replicated["complete"]
        plain = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sdk.sync.bamboo_p2p", "replicate",
            "--db", str(tmp_path / "logs.db"), "--author", BAMBOO_KEY.public_key.hex(),
            "--start", "1", f"127.0.0.1:{listeners['bamboo_p2p'].port}",
            stdout=asyncio.subprocess.PIPE, cwd=REPO,
        )  # fmt: skip
        await plain.communicate()
        assert plain.returncode != 0
        assert listeners["bamboo_p2p"].refused["tls"] == 1


async def test_store_sync_limits_each_peer_to_its_channels(tmp_path: Path, certs: Certs) -> None:
    """A peer listed for channel ``c`` gets ``c`` and not ``d``, and what it sends of ``d``
    is dropped; a peer signed by the CA but not listed is not served."""

    def config(archive: str, store_sync: dict[str, Any]) -> Any:
        return parse_config(
            {
                "archive": {"path": archive},
                "ingest": {"channels": ["c", "d"], "batch_interval_ms": 5},
                "grpc": {"listen": "127.0.0.1:0"},
                "metrics": {"listen": ""},
                "store_sync": {"interval_s": 3600, **store_sync},
            },
            tmp_path,
        )

    async def feed(node: StoreNode, transport: FeedTransport, sender: str) -> None:
        for channel in ("c", "d"):
            for n in range(5):
                await transport.publish(
                    topic_for_channel(channel), sds_message(channel, n, sender=sender)
                )
        archive = node.archive
        assert archive is not None
        # Its own ten are archived; a node with peers may already have pulled the served
        # node's ``c`` in its start-up session, so ``c`` can hold more than its own five.
        await wait_for(
            lambda: (
                archive.stats().channels.get("d") == 5 and archive.stats().channels.get("c", 0) >= 5
            )
        )

    served_transport = FeedTransport()
    tls = tls_options(certs)
    served = StoreNode(
        config(
            "served.db",
            {
                "listen": "127.0.0.1:0",
                **{k: v for k, v in tls.items() if k.startswith("tls_")},
                "peer_channels": {certs.client.fingerprint: ["c"]},
            },
        ),
        transport=served_transport,
    )
    await served.start()
    try:
        await feed(served, served_transport, "server")
        assert served.store_sync is not None
        peer = f"127.0.0.1:{served.store_sync.port}"
        for client, archive, expected in (
            (certs.client, "phone.db", {"c": 10, "d": 5}),
            (certs.other_client, "other.db", {"c": 5, "d": 5}),
        ):
            transport = FeedTransport()
            node = StoreNode(
                config(
                    archive,
                    {
                        "peers": [peer],
                        "peer_tls_ca": str(certs.ca),
                        "peer_tls_cert": str(client.cert),
                        "peer_tls_key": str(client.key),
                    },
                ),
                transport=transport,
            )
            await node.start()
            try:
                await feed(node, transport, client.cert.stem)
                assert node.store_sync is not None and node.archive is not None
                with contextlib.suppress(OSError, RemoteProtocolError):
                    await node.store_sync.sync_with(peer)
                mine = node.archive
                await wait_for(lambda: mine.stats().channels == expected)  # noqa: B023
            finally:
                await node.stop()
        assert served.archive is not None
        assert served.archive.stats().channels == {"c": 10, "d": 5}  # the phone's d dropped
    finally:
        await served.stop()
