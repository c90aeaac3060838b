"""Sessions over real streams: an in-memory pipe that fails, TCP in-process and between processes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.sync.driver import SyncConnection, serve_stream, sync
from sdk.sync.errors import LimitExceeded, SyncError
from sdk.sync.events import Phase, Progress, SessionAborted
from sdk.sync.framing import FrameDecoder, encode_frame
from sdk.sync.messages import Mode, entry_parts
from sdk.sync.session import Replication, SyncConfig
from sdk.testing.waiting import eventually
from tests.documents.helpers import TODO_SCHEMA
from tests.sync.helpers import TODO, closed_subset, entry_ids, history, make_store, views
from transports.stream import PipeFaults, Stream, connect_tcp, memory_pipe, serve_tcp

REPO = Path(__file__).resolve().parents[2]
HISTORY = history(seed=11, operations=300)


def stores(seed: int = 1):
    rng = random.Random(seed)
    return (
        make_store(closed_subset(HISTORY, rng, 0.5)),
        make_store(closed_subset(HISTORY, rng, 0.5)),
    )


def test_frames_survive_any_chunking() -> None:
    payloads = [os.urandom(n) for n in (0, 1, 127, 128, 300, 70_000)]
    wire = b"".join(encode_frame(p) for p in payloads)
    rng = random.Random(3)
    decoder = FrameDecoder()
    out: list[bytes] = []
    pos = 0
    while pos < len(wire):
        step = rng.randint(1, 500)
        out += decoder.feed(wire[pos : pos + step])
        pos += step
    assert out == payloads
    assert decoder.buffered == 0


def test_oversized_frames_are_refused_before_buffering() -> None:
    decoder = FrameDecoder(max_frame=1000)
    with pytest.raises(LimitExceeded):
        decoder.feed(encode_frame(b"x" * 1001)[:3])
    with pytest.raises(SyncError):
        FrameDecoder().feed(b"\xff\xff\xff\xff\xff\xff")


@pytest.mark.parametrize("mode", [Mode.SET_RECONCILIATION, Mode.LOG_HEIGHT])
async def test_sync_over_a_memory_pipe(mode: Mode) -> None:
    a, b = stores()
    union = entry_ids(a) | entry_ids(b)
    left, right, _ = memory_pipe()
    server = asyncio.ensure_future(serve_stream(b, right, [TODO]))
    events: list[object] = []
    done = await sync(a, left, [TODO], mode=mode, on_event=events.append)
    await server
    assert entry_ids(a) == entry_ids(b) == union
    assert views(a) == views(b)
    assert done.entries_received + done.entries_sent > 0
    phases = [e.phase for e in events if isinstance(e, Progress)]
    assert phases[0] is Phase.RECONCILING and phases[-1] is Phase.DONE


class _CutAfterReading:
    """A pipe end that cuts the pipe once its reader has read ``limit`` bytes (no more
    are handed out): what the reader holds when the connection fails is known. A cut
    by bytes written instead drops what was delivered but not yet read, so how much
    arrives depends on how the writer happened to join its frames."""

    def __init__(self, stream: Stream, faults: PipeFaults, limit: int) -> None:
        self.stream, self.faults, self.left = stream, faults, limit
        self.taken = bytearray()

    async def read(self, max_bytes: int = 65536) -> bytes:
        data = await self.stream.read(min(max_bytes, self.left) or 1)
        self.taken += data
        self.left = max(self.left - len(data), 0)
        if not self.left:
            self.faults.cut()
        return data

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)

    async def close(self) -> None:
        await self.stream.close()


async def test_a_cut_session_is_resumed_by_a_new_one() -> None:
    a = make_store([])
    b = make_store(HISTORY)
    left, right, faults = memory_pipe()
    server = asyncio.ensure_future(serve_stream(b, right, [TODO]))
    cut = _CutAfterReading(left, faults, 20_000)
    with pytest.raises(SyncError):
        await sync(a, cut, [TODO], mode=Mode.LOG_HEIGHT)
    await server
    got = entry_ids(a)
    # Cut mid-session: every entry whose frame arrived whole is stored, the last
    # batch too (read before the cut, stored after it).
    arrived = sum(entry_parts(f) is not None for f in FrameDecoder().feed(bytes(cut.taken)))
    assert 0 < len(got) == arrived < len(entry_ids(b))
    assert views(a) != views(b)
    left, right, _ = memory_pipe()
    server = asyncio.ensure_future(serve_stream(b, right, [TODO]))
    done = await sync(a, left, [TODO])
    await server
    assert entry_ids(a) == entry_ids(b)
    assert views(a) == views(b)
    assert done.entries_received == len(entry_ids(b)) - len(got)


async def test_a_stalled_peer_is_cut_off_not_buffered() -> None:
    a, b = stores(2)
    left, right, faults = memory_pipe(PipeFaults(capacity=4096))
    server = asyncio.ensure_future(serve_stream(b, right, [TODO]))
    faults.stall()
    config = SyncConfig(stall_timeout_ms=300)
    with pytest.raises(LimitExceeded):
        await sync(a, left, [TODO], config=config)
    faults.resume()
    await left.close()
    await asyncio.wait_for(server, 5)


async def test_delayed_pipe_and_live_mode() -> None:
    a, b = stores(3)
    left, right, _ = memory_pipe(PipeFaults(delay=0.001))
    server_repl = Replication([TODO], now=0, config=SyncConfig(initiator=False, live_mode=True))
    server = SyncConnection(server_repl, right, store=b)
    client_repl = Replication([TODO], now=0, config=SyncConfig(live_mode=True))
    client = SyncConnection(client_repl, left, store=a)
    async with server, client:
        sid = await client.request([TODO])
        async for event in client.events():
            if isinstance(event, Progress) and event.phase is Phase.LIVE:
                break
        from tests.documents.helpers import todo_fields
        from tests.sync.helpers import KEYS

        published = b.create(KEYS[2], TODO, todo_fields("live"))
        assert await eventually(lambda: a.document(published.document_id) is not None)
        await client.end_live(sid)
        assert await eventually(lambda: not client.replication.sessions())


async def test_tcp_in_process() -> None:
    a, b = stores(4)
    served = asyncio.Event()

    async def handle(stream) -> None:
        await serve_stream(b, stream, [TODO])
        served.set()

    server = await serve_tcp(handle)
    port = server.sockets[0].getsockname()[1]
    async with server:
        stream = await connect_tcp("127.0.0.1", port)
        await sync(a, stream, [TODO])
        await asyncio.wait_for(served.wait(), 10)
    assert entry_ids(a) == entry_ids(b)


def schema_file(tmp_path: Path) -> str:
    path = tmp_path / "schemas.json"
    view_id = TODO_SCHEMA.id.partition("_")[2]
    fields = {name: str(kind) for name, kind in TODO_SCHEMA.fields.items()}
    path.write_text(
        json.dumps(
            [
                {
                    "name": "todo",
                    "view_id": [view_id],
                    "description": TODO_SCHEMA.description,
                    "fields": fields,
                }
            ]
        )
    )
    return str(path)


async def test_tcp_between_two_processes(tmp_path: Path) -> None:
    rng = random.Random(5)
    server_db, client_db = str(tmp_path / "server.db"), str(tmp_path / "client.db")
    server_store = make_store(closed_subset(HISTORY, rng, 0.6), server_db)
    client_store = make_store(closed_subset(HISTORY, rng, 0.6), client_db)
    union = entry_ids(server_store) | entry_ids(client_store)
    server_store.close()
    client_store.close()
    schemas = schema_file(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [sys.executable, "-m", "sdk.sync", "serve", "--db", server_db, "--schema", TODO,
         "--schema-json", schemas],
        stdout=subprocess.PIPE, env=env, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), 60)
        assert line.startswith("listening "), line
        peer = line.split()[1]
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sdk.sync", "sync", "--db", client_db, "--schema", TODO,
             "--schema-json", schemas, peer],
            capture_output=True, env=env, cwd=REPO, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        figures = json.loads(result.stdout)
        assert figures["received"] > 0 and figures["sent"] > 0
    finally:
        server.terminate()
        server.wait(10)
    server_store, client_store = make_store([], server_db), make_store([], client_db)
    assert entry_ids(server_store) == entry_ids(client_store) == union
    assert views(server_store) == views(client_store)


async def test_garbage_on_the_stream_closes_only_that_connection() -> None:
    a, b = stores(6)
    before = entry_ids(b)
    left, right, _ = memory_pipe()
    server = asyncio.ensure_future(serve_stream(b, right, [TODO]))
    await left.write(encode_frame(b"\xa1\x00\x00"))
    await asyncio.wait_for(server, 5)
    assert entry_ids(b) == before
    left2, right2, _ = memory_pipe()
    server2 = asyncio.ensure_future(serve_stream(b, right2, [TODO]))
    await sync(a, left2, [TODO])
    await server2
    assert entry_ids(a) == entry_ids(b)


def test_session_aborted_is_an_event() -> None:
    assert SessionAborted(1, LimitExceeded("x")).session_id == 1


async def test_sync_over_a_libp2p_stream() -> None:
    from transports import libp2p

    a, b = stores(7)
    union = entry_ids(a) | entry_ids(b)
    served = asyncio.Event()
    async with libp2p.Libp2pTransport() as host_b, libp2p.Libp2pTransport() as host_a:

        async def handle(stream) -> None:
            await serve_stream(b, stream, [TODO])
            served.set()

        host_b.handle_streams(handle)
        stream = await host_a.open_stream(host_b.addrs[0])
        done = await asyncio.wait_for(sync(a, stream, [TODO]), 60)
        await asyncio.wait_for(served.wait(), 30)
    assert done.entries_received > 0 and done.entries_sent > 0
    assert entry_ids(a) == entry_ids(b) == union
    assert views(a) == views(b)


class _CountingStream:
    """A stream end that counts its writes."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.writes: list[int] = []
        self.reads: list[int] = []

    async def read(self, max_bytes: int = 65536) -> bytes:
        self.reads.append(max_bytes)
        return await self.inner.read(max_bytes)

    async def write(self, data: bytes) -> None:
        self.writes.append(len(data))
        await self.inner.write(data)

    async def close(self) -> None:
        await self.inner.close()


async def test_queued_frames_go_out_in_few_writes() -> None:
    """A catch-up's Entry frames are joined into writes of up to WRITE_CHUNK bytes."""
    from sdk.sync.driver import WRITE_CHUNK

    a, b = make_store([]), make_store(HISTORY)
    left, right, _ = memory_pipe()
    counting = _CountingStream(right)
    server = asyncio.ensure_future(serve_stream(b, counting, [TODO]))  # type: ignore[arg-type]
    done = await sync(a, left, [TODO], mode=Mode.LOG_HEIGHT)
    await server
    assert done.entries_received == len(HISTORY) == len(entry_ids(a))
    assert len(counting.writes) < len(HISTORY) // 10
    assert max(counting.writes) < WRITE_CHUNK + 1024


async def test_reads_take_what_is_queued_up_to_read_size() -> None:
    """A catch-up's receiver asks for READ_SIZE bytes per read, so one batch can hold
    more than the ~250 Entry frames of 64 KiB."""
    from sdk.sync.driver import READ_SIZE

    a, b = make_store([]), make_store(HISTORY)
    left, right, _ = memory_pipe()
    counting = _CountingStream(left)
    server = asyncio.ensure_future(serve_stream(b, right, [TODO]))
    await sync(a, counting, [TODO], mode=Mode.LOG_HEIGHT)  # type: ignore[arg-type]
    await server
    assert counting.reads and set(counting.reads) == {READ_SIZE} and READ_SIZE >= 1 << 20


class _FillingStream:
    """A stream whose bytes arrive as a socket's would: 256 KiB per event-loop turn
    (what asyncio's transport reads per turn), a read taking what has arrived."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.arrived = 0
        self.taken = 0
        self.reads: list[int] = []

    async def _arrive(self) -> None:
        while self.arrived < len(self.data):
            self.arrived = min(self.arrived + 256 * 1024, len(self.data))
            await asyncio.sleep(0)

    async def read(self, max_bytes: int = 65536) -> bytes:
        while self.taken == self.arrived:
            if self.taken == len(self.data):
                await asyncio.sleep(3600)  # the peer keeps the stream open
            await asyncio.sleep(0)
        end = min(self.arrived, self.taken + max_bytes)
        chunk, self.taken = self.data[self.taken : end], end
        self.reads.append(len(chunk))
        return chunk

    async def write(self, data: bytes) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_what_arrives_while_a_batch_is_stored_makes_the_next_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a batch of a catch-up is stored more arrives; the driver goes on reading
    (up to the machine's bound) and what came meanwhile is stored as the next batch,
    far larger than one turn's 256 KiB."""
    from sdk.sync import driver
    from sdk.sync.messages import EntryMessage, Have, SyncRequest, encode
    from sdk.sync.session_state import StoreBatch

    opening = [SyncRequest(0, Mode.LOG_HEIGHT, (TODO,)), Have(0, ())]
    head = b"".join(encode_frame(encode(m)) for m in opening)
    entries = b"".join(encode_frame(encode(EntryMessage(0, e, o))) for e, o in HISTORY)
    data = head + entries * (2 * 1024 * 1024 // len(entries) + 1)
    per_turn = 256 * 1024 * len(HISTORY) // len(entries)
    batches: list[int] = []
    perform = driver.perform

    def counted(store: object, request: object, prepared: object = None) -> object:
        if isinstance(request, StoreBatch):
            batches.append(len(request.entries))
        return perform(store, request, prepared)  # type: ignore[arg-type]

    monkeypatch.setattr(driver, "perform", counted)
    stream = _FillingStream(data)
    replication = Replication([TODO], now=0, config=SyncConfig(initiator=False))
    connection = SyncConnection(replication, stream, store=make_store([]))  # type: ignore[arg-type]
    arriving = asyncio.ensure_future(stream._arrive())
    connection.start()
    try:
        async with asyncio.timeout(60):
            while sum(batches) < len(HISTORY) * 4:
                await asyncio.sleep(0.01)
    finally:
        await arriving
        await connection.aclose()
    assert max(batches) > per_turn
