"""Bamboo point-to-point over real streams: an in-memory pipe, TCP in-process and
between two processes, and a peer cut off over a real socket."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p import (
    CancelReason,
    Channel,
    CreditViolation,
    Endpoint,
    EndpointConfig,
    LogStore,
    MemoryLogStore,
    RequestStalled,
    Role,
    SetupInfo,
    SqliteLogStore,
    append_entry,
    lower_pool,
    resume_offset,
)
from sdk.sync.bamboo_p2p.driver import (
    BAMBOO_P2P_PROTOCOL,
    BambooConnection,
    ConnectionLost,
    replicate_range,
    serve_bamboo,
)
from tests.sync.test_bamboo_p2p_endpoint import frame, proposal
from transports.stream import Stream, TcpStream, connect_tcp, memory_pipe, serve_tcp

REPO = Path(__file__).resolve().parents[2]
KEY = KeyPair.from_private_key(bytes(range(32)))
LOG = (KEY.public_key, 0)


def fill(store: LogStore, n: int) -> LogStore:
    for i in range(n):
        append_entry(store, KEY, 0, b"entry %d of the served log" % i)
    store.flush()
    return store


def same_entries(store: LogStore, source: LogStore, seqs: list[int]) -> None:
    for seq in seqs:
        entry, original = store.entry(LOG, seq), source.entry(LOG, seq)
        assert entry is not None and original is not None, seq
        assert entry.hash == original.hash
        entry.verify_signature()


async def test_full_range_and_live_updates_over_a_memory_pipe() -> None:
    server, phone = fill(MemoryLogStore(), 50), MemoryLogStore()
    a, b, _ = memory_pipe()
    served = BambooConnection(Endpoint(Role.REACTIVE, server), b)
    async with served, BambooConnection(Endpoint(Role.PROACTIVE, phone), a) as client:
        outcome = await client.replicate(LOG, 1, end=50)
        assert outcome.complete and outcome.peer_reason is not None
        assert phone.payload_sequence_numbers(LOG) == list(range(1, 51))
        live = await client.propose(LOG, 51, lower=50)
        append_entry(server, KEY, 0, b"live")  # the store tells the driver: no wake() needed
        while phone.payload(LOG, 51) is None:
            await asyncio.sleep(0.01)
        append_entry(server, KEY, 0, b"the end", end_of_log=True)
        # The open range closes itself after the end-of-log entry.
        ended = await client.wait_request(live)
        assert ended.complete
        assert phone.end_of_log(LOG) == 52
    same_entries(phone, server, list(range(1, 53)))


async def test_a_request_nobody_can_complete_is_given_up_over_a_stream() -> None:
    server, phone = fill(MemoryLogStore(), 10), MemoryLogStore()
    a, b, _ = memory_pipe()
    served = BambooConnection(Endpoint(Role.REACTIVE, server), b, stall_timeout=None)
    client = BambooConnection(Endpoint(Role.PROACTIVE, phone), a, stall_timeout=0.2)
    async with served, client:
        # The upper certificate pool of 10 reaches 13: nobody has 11..13.
        outcome = await client.replicate(LOG, 1, end=10, upper=13)
    assert not outcome.complete
    assert isinstance(outcome.stalled, RequestStalled)
    assert (outcome.stalled.seq_num, outcome.stalled.payload) == (11, False)
    assert outcome.peer_reason is CancelReason.CONFIRM
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 11))


async def test_tcp_between_two_processes_full_range_and_sparse_newest(tmp_path: Path) -> None:
    n = 300
    server_db = str(tmp_path / "server.db")
    source = fill(SqliteLogStore(server_db), n)
    assert isinstance(source, SqliteLogStore)
    source.close()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    server = subprocess.Popen(
        [sys.executable, "-m", "sdk.sync.bamboo_p2p", "serve", "--db", server_db],
        stdout=subprocess.PIPE, env=env, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = await asyncio.to_thread(server.stdout.readline)
        assert line.startswith("listening "), line
        host, _, port = line.split()[1].rpartition(":")
        full = SqliteLogStore(str(tmp_path / "full.db"))
        outcome = await replicate_range(full, await connect_tcp(host, int(port)), LOG, 1, end=n)
        assert outcome.complete
        phone = SqliteLogStore(str(tmp_path / "phone.db"))
        newest = await replicate_range(phone, await connect_tcp(host, int(port)), LOG, n, end=n)
        assert newest.complete
    finally:
        server.terminate()
        server.wait(10)
    source = SqliteLogStore(server_db)
    assert full.sequence_numbers(LOG) == full.payload_sequence_numbers(LOG) == list(range(1, n + 1))
    same_entries(full, source, list(range(1, n + 1)))
    for seq in range(1, n + 1):
        assert full.payload(LOG, seq) == source.payload(LOG, seq)
    # The newest entry and its lower certificate pool: verified, nothing else.
    assert phone.sequence_numbers(LOG) == sorted([*lower_pool(n), n])
    assert phone.payload_sequence_numbers(LOG) == [n]
    same_entries(phone, source, phone.sequence_numbers(LOG))


async def test_a_peer_spending_credit_it_was_not_given_is_cut_off_over_tcp() -> None:
    server_store = fill(MemoryLogStore(), 5)
    served: asyncio.Future[BambooConnection] = asyncio.get_running_loop().create_future()

    async def handle(stream: TcpStream) -> None:
        served.set_result(
            await serve_bamboo(server_store, stream, EndpointConfig(initial_credit=1))
        )

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        # A hand-written peer: setup, then two proposals on one credit.
        writer.write(SetupInfo().encode() + frame(Channel.CONTROL, proposal(0)))
        await writer.drain()
        writer.write(frame(Channel.CONTROL, proposal(2, start=9, end=9, upper_certpool=9)))
        await writer.drain()
        connection = await asyncio.wait_for(served, 30)
        assert isinstance(connection.error, CreditViolation)
        # Cut off: the server closed the connection (what it had sent, then EOF).
        while await asyncio.wait_for(reader.read(65536), 30):
            pass
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_request_on_a_closed_connection_raises() -> None:
    a, b, faults = memory_pipe()
    served = BambooConnection(Endpoint(Role.REACTIVE, fill(MemoryLogStore(), 3)), b)
    async with served, BambooConnection(Endpoint(Role.PROACTIVE, MemoryLogStore()), a) as c:
        request = await c.propose(LOG, 1)
        faults.cut()
        try:
            await c.wait_request(request)
        except ConnectionLost:
            pass
        else:
            raise AssertionError("the request outlived its connection")


async def test_replicate_over_a_libp2p_stream() -> None:
    from transports import libp2p

    server, phone = fill(MemoryLogStore(), 40), MemoryLogStore()
    served = asyncio.Event()
    async with libp2p.Libp2pTransport() as host_b, libp2p.Libp2pTransport() as host_a:

        async def handle(stream: libp2p.Libp2pStream) -> None:
            await serve_bamboo(server, stream)
            served.set()

        host_b.handle_streams(handle, BAMBOO_P2P_PROTOCOL)
        stream = await host_a.open_stream(host_b.addrs[0], BAMBOO_P2P_PROTOCOL)
        outcome = await asyncio.wait_for(replicate_range(phone, stream, LOG, 1, end=40), 60)
        await asyncio.wait_for(served.wait(), 30)
    assert outcome.complete
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 41))
    same_entries(phone, server, list(range(1, 41)))


async def test_a_proposal_dropped_by_overlap_resolution_ends_its_wait() -> None:
    a, b = fill(MemoryLogStore(), 20), MemoryLogStore()
    b.copy_entries(a, LOG, list(range(1, 21)))  # type: ignore[attr-defined]
    left, right, _ = memory_pipe()
    async with (
        BambooConnection(Endpoint(Role.PROACTIVE, a), left) as client,
        BambooConnection(Endpoint(Role.REACTIVE, b), right) as server,
    ):
        while not (client.endpoint.credit and server.endpoint.credit):
            await asyncio.sleep(0.01)
        # Both propose before either hears of the other's: the later start is dropped.
        ours = await client.propose(LOG, 1, end=20)
        theirs = await server.propose(LOG, 5, end=20)
        dropped, kept = await asyncio.gather(server.wait_request(theirs), client.wait_request(ours))
    assert dropped.dropped and not dropped.complete
    assert kept.complete and not kept.dropped
    try:
        await client.wait_request(ours)  # forgotten once returned
    except ValueError:
        pass
    else:
        raise AssertionError("a finished request was still known")


class CutAfter:
    """A stream whose incoming side ends after ``left`` bytes (the link broke there)."""

    def __init__(self, inner: Stream, left: int) -> None:
        self.inner, self.left = inner, left

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self.left <= 0:
            return b""
        data = await self.inner.read(min(max_bytes, self.left))
        self.left -= len(data)
        return data

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_payload_cut_with_the_connection_is_resumed_at_its_offset() -> None:
    """The connection breaks inside a 2.5 MB payload; the prefix received is kept in the
    SQLite store, and the next connection moves only the rest (proposal flag 5)."""
    big = bytes(i % 251 for i in range(2_500_000))
    server = MemoryLogStore()
    for payload in (b"first", big, b"third"):
        append_entry(server, KEY, 0, payload)
    phone = SqliteLogStore()
    config = EndpointConfig(max_payload=4 * 1024 * 1024)
    a, b, _ = memory_pipe()
    serving = asyncio.ensure_future(serve_bamboo(server, b))
    with pytest.raises(ConnectionLost):
        await replicate_range(phone, CutAfter(a, 1_500_000), LOG, 1, end=3, config=config)
    await serving
    offset = resume_offset(phone, LOG, 2)
    assert offset is not None and 0 < offset < len(big)
    assert phone.payload_sequence_numbers(LOG) == [1]
    a, b, _ = memory_pipe()
    serving = asyncio.ensure_future(serve_bamboo(server, b))
    outcome = await replicate_range(phone, a, LOG, 2, end=3, offset=offset, config=config)
    served = await serving
    assert outcome.complete
    assert phone.payload(LOG, 2) == big and phone.payload_sequence_numbers(LOG) == [1, 2, 3]
    assert resume_offset(phone, LOG, 2) is None
    assert served.stats.data_bytes_sent < len(big) - offset + 4096


def test_the_cli_resumes_a_cut_payload_and_syncs_payloads_only_compressed(tmp_path: Path) -> None:
    """``python -m sdk.sync.bamboo_p2p replicate --resume`` / ``--payload-only`` against
    ``serve --compression-window``."""
    server_db, phone_db = str(tmp_path / "server.db"), str(tmp_path / "phone.db")
    source = SqliteLogStore(server_db)
    for i in range(10):
        append_entry(source, KEY, 0, b"a payload that repeats itself %d " % i * (40 if i else 2000))
    source.flush()
    phone = SqliteLogStore(phone_db)
    for seq in range(1, 11):
        entry = source.entry(LOG, seq)
        assert entry is not None
        phone.put_entry(entry)  # metadata only, e.g. after a sparse or NOTIFY sync
    first = source.payload(LOG, 1)
    assert first is not None
    phone.put_partial_payload(LOG, 1, first[:30_000])  # a transfer cut there
    phone.close()
    source.close()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    server = subprocess.Popen(
        [sys.executable, "-m", "sdk.sync.bamboo_p2p", "serve", "--db", server_db,
         "--compression-window", "65536"],
        stdout=subprocess.PIPE, env=env, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        peer = server.stdout.readline().split()[1]
        common = [sys.executable, "-m", "sdk.sync.bamboo_p2p", "replicate", "--db", phone_db,
                  "--author", KEY.public_key.hex(), "--compression-window", "65536"]  # fmt: skip
        for args in (["--start", "1", "--end", "1", "--resume"],
                     ["--start", "1", "--end", "10", "--payload-only"]):  # fmt: skip
            done = subprocess.run(
                [*common, *args, peer], env=env, cwd=REPO, capture_output=True, text=True
            )
            assert done.returncode == 0 and '"complete": true' in done.stdout, done.stdout
    finally:
        server.terminate()
        server.wait(10)
    phone = SqliteLogStore(phone_db)
    source = SqliteLogStore(server_db)
    assert phone.payload_sequence_numbers(LOG) == list(range(1, 11))
    for seq in range(1, 11):
        assert phone.payload(LOG, seq) == source.payload(LOG, seq)
    assert phone.partial_payload(LOG, 1) is None


async def test_the_last_write_is_stored_before_the_peer_sees_the_stream_close() -> None:
    """When the connection ends, what the machine still has to write (here the prefix of
    a payload the cut left half-received) is in the store before the stream closes."""
    big = bytes(i % 251 for i in range(2_500_000))
    server = MemoryLogStore()
    for payload in (b"first", big):
        append_entry(server, KEY, 0, payload)
    phone = SqliteLogStore()
    kept_at_close: list[int | None] = []

    class RecordingCut(CutAfter):
        async def close(self) -> None:
            kept_at_close.append(resume_offset(phone, LOG, 2))
            await super().close()

    a, b, _ = memory_pipe()
    serving = asyncio.ensure_future(serve_bamboo(server, b))
    config = EndpointConfig(max_payload=4 * 1024 * 1024)
    with pytest.raises(ConnectionLost):
        await replicate_range(phone, RecordingCut(a, 1_500_000), LOG, 1, end=2, config=config)
    await serving
    assert kept_at_close and kept_at_close[0] is not None
