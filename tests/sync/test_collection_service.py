"""Collection sync over real TCP sockets: the service, the client API, listen, bad input."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sdk.documents import KeyPair
from sdk.sync.collection import (
    CollectionChange,
    CollectionConfig,
    CollectionConnection,
    CollectionServer,
    CollectionService,
    ConnectionLost,
    LimitExceeded,
    NotInSnapshot,
    SnapshotTooLarge,
    connect_collection,
    decode_message,
    document_key,
    encode_message,
)
from sdk.sync.collection.messages import (
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    ErrorResponse,
    ListenRequest,
    Notification,
    Request,
    Response,
    SnapshotSymbolsRequest,
    SnapshotSymbolsResponse,
)
from sdk.sync.collection.sedimentree import operation_upload_item
from sdk.sync.framing import FrameDecoder, encode_frame
from sdk.sync.riblt import CodedSymbol
from sdk.sync.store import SyncStore
from transports.guarded import ListenerLimits
from transports.stream import TcpStream, connect_tcp, serve_tcp

from .collection_fixtures import (
    Collection,
    add_child,
    build_collection,
    new_sync_store,
    rename,
    views_of,
)

#: Bound on how long a test waits for something that must happen (a hang guard only).
PATIENCE = 30.0


@pytest.fixture
def key() -> KeyPair:
    return KeyPair.from_private_key(bytes(range(32)))


async def serving(store: SyncStore, config: CollectionConfig | None = None) -> CollectionService:
    service = CollectionService(store, config)
    await service.start()
    return service


def edit_randomly(
    store: SyncStore, rng: random.Random, collection: Collection, edits: int, tag: str
) -> None:
    key = KeyPair.from_private_key(rng.randbytes(32))
    for j in range(edits):
        target = rng.choice(collection.documents)
        if rng.random() < 0.3:
            add_child([store], key, target, f"{tag}{j}")
        else:
            rename([store], key, target, f"{tag}{j}")


# -- convergence ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_two_stores_with_random_collections_converge_over_tcp(seed: int) -> None:
    rng = random.Random(seed)
    store_a, store_b = new_sync_store(), new_sync_store()
    base = KeyPair.from_private_key(rng.randbytes(32))
    n = rng.randint(1, 150)
    collection = build_collection([store_a, store_b], base, n, fanout=rng.randint(1, 5))
    edit_randomly(store_a, rng, collection, rng.randint(0, 20), "a")
    edit_randomly(store_b, rng, collection, rng.randint(0, 20), "b")
    service_a, service_b = await serving(store_a), await serving(store_b)
    try:
        # Each side serves the other: b pulls what a has, then a what b has.
        async with await connect_collection(store_b, "127.0.0.1", service_a.port) as b:
            first = await b.snapshot(collection.root)
        async with await connect_collection(store_a, "127.0.0.1", service_b.port) as a:
            await a.snapshot(collection.root)
        assert views_of(store_a, collection.root) == views_of(store_b, collection.root)
        assert first.documents_pulled == len(first.out_of_sync.changed) + len(
            first.out_of_sync.missing
        )
        async with await connect_collection(store_b, "127.0.0.1", service_a.port) as b:
            again = await b.snapshot(collection.root)
        assert again.out_of_sync.in_sync
        assert (again.round_trips, again.documents_pulled) == (1, 0)
    finally:
        await service_a.close()
        await service_b.close()
    assert service_a.server.snapshot_count == 0  # forgotten with their connections


@pytest.mark.parametrize("seed", [5, 6, 7])
async def test_one_serving_connection_brings_both_sides_up_to_date(seed: int) -> None:
    rng = random.Random(seed)
    node, phone = new_sync_store(), new_sync_store()
    base = KeyPair.from_private_key(rng.randbytes(32))
    collection = build_collection([node, phone], base, rng.randint(20, 120), fanout=3)
    baseline = views_of(node, collection.root)
    edit_randomly(node, rng, collection, rng.randint(1, 15), "node")
    after_node = views_of(node, collection.root)
    node_edited = {d for d in baseline if baseline[d] != after_node[d]}
    offline = KeyPair.from_private_key(rng.randbytes(32))
    only_phone = rng.sample(collection.documents[1:], 4)
    for i, doc in enumerate(only_phone):
        rename([phone], offline, doc, f"offline {i}")
    service = await serving(node)
    try:
        async with await connect_collection(
            phone, "127.0.0.1", service.port, serve=True
        ) as connection:
            snapshot = await connection.snapshot(collection.root)
            assert connection.stats.requests_served > 0  # the node pulled back from us
    finally:
        await service.close()
    assert views_of(node, collection.root) == views_of(phone, collection.root)
    # The node took the phone's edits before answering: the phone sees only what it lacked.
    assert snapshot.out_of_sync.only_local == ()
    assert set(snapshot.out_of_sync.changed) <= node_edited
    assert set(only_phone) - node_edited  # some phone edits the node had to take


async def test_a_reconnecting_device_gets_a_first_batch_sized_from_its_history(
    key: KeyPair,
) -> None:
    node, phone, other = new_sync_store(), new_sync_store(), new_sync_store()
    collection = build_collection([node, phone, other], key, 300)
    service = await serving(node)
    try:
        async with await connect_collection(phone, "127.0.0.1", service.port) as connection:
            assert (await connection.snapshot(collection.root)).round_trips == 1
        for i in range(40):  # 80 differing items: over the first batch of a cold start
            rename([node], key, collection.documents[i], f"edit {i}")
        async with await connect_collection(phone, "127.0.0.1", service.port) as connection:
            warm = await connection.snapshot(collection.root)
        cold_service = await serving(node)
        try:
            async with await connect_collection(
                other, "127.0.0.1", cold_service.port
            ) as connection:
                cold = await connection.snapshot(collection.root)
        finally:
            await cold_service.close()
    finally:
        await service.close()
    assert len(warm.out_of_sync.changed) == len(cold.out_of_sync.changed) == 40
    assert (warm.round_trips, cold.round_trips) == (1, 2)


async def test_progress_counts_every_pulled_document(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 40)
    for i, doc in enumerate(collection.documents[:12]):
        rename([node], key, doc, f"renamed {i}")
    service = await serving(node)
    seen: list[tuple[int, int]] = []
    try:
        async with await connect_collection(phone, "127.0.0.1", service.port) as connection:
            snapshot = await connection.snapshot(
                collection.root, on_progress=lambda done, total: seen.append((done, total))
            )
    finally:
        await service.close()
    assert snapshot.operations_applied == 12
    assert seen[0] == (0, 12) and seen[-1] == (12, 12)
    assert sorted(done for done, _ in seen) == list(range(13))
    assert views_of(node, collection.root) == views_of(phone, collection.root)


# -- listen --------------------------------------------------------------------------------


async def collect(changes: AsyncIterator[CollectionChange], count: int) -> list[CollectionChange]:
    out: list[CollectionChange] = []
    async with asyncio.timeout(PATIENCE):
        async for change in changes:
            out.append(change)
            if len(out) == count:
                break
    return out


async def test_listen_delivers_each_change_once(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 30)
    outside = build_collection([node], key, 3)  # another collection: never notified
    service = await serving(node)
    try:
        async with await connect_collection(phone, "127.0.0.1", service.port) as connection:
            snapshot = await connection.snapshot(collection.root)
            # Made after the snapshot, before listening: not notified on its own,
            # so the next change to that document depends on it; the listener pulls it.
            gap = rename([node], key, collection.documents[5], "in the gap")
            changes = connection.listen(snapshot)
            first = asyncio.ensure_future(collect(changes, 1))
            while not service.server.listener_count:
                await asyncio.sleep(0.01)
            expected = [rename([node], key, collection.documents[1], "one")]
            got = await first
            rename([node], key, outside.root, "elsewhere")
            for i, doc in enumerate([collection.documents[5], collection.root, collection.root]):
                expected.append(rename([node], key, doc, f"change {i}"))
            # A repeat of a stored entry (e.g. replicated again) stores nothing new.
            node.ingest(expected[0].entry, expected[0].operation)
            got += await collect(changes, 3)
            await changes.aclose()
    finally:
        await service.close()
    assert [c.operation_id for c in got] == [p.operation_id for p in expected]
    assert [c.document_id for c in got] == [p.document_id for p in expected]
    # Every change says what it changed, except the one stored by the pull that
    # fetched the gap (its document's new view is in the store all the same).
    assert [bool(c.events) for c in got] == [True, False, True, True]
    assert phone.has_entry(gap.operation_id)
    assert views_of(node, collection.root) == views_of(phone, collection.root)


async def until(condition: Callable[[], object]) -> None:
    async with asyncio.timeout(PATIENCE):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("keepalive", [0.1, None])
async def test_a_quiet_listener_outlives_the_listeners_idle_deadline(
    key: KeyPair, keepalive: float | None
) -> None:
    """A listen with no change for longer than the service's idle deadline stays up:
    the client repeats its listen request when quiet (without: it is cut)."""
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 5)
    service = CollectionService(node, listener=ListenerLimits(idle_timeout_s=0.4))
    await service.start()
    assert service.listener is not None
    try:
        async with await connect_collection(
            phone, "127.0.0.1", service.port, keepalive=keepalive
        ) as connection:
            snapshot = await connection.snapshot(collection.root)
            first = asyncio.ensure_future(collect(connection.listen(snapshot), 1))
            await until(lambda: service.server.listener_count)
            if keepalive is None:
                assert await first == []  # the listener hung up: a clean end
                assert service.listener.cut["idle"] == 1
                return
            asked = connection.stats.requests_sent
            await until(lambda: connection.stats.requests_sent >= asked + 8)  # 0.8 s quiet
            assert service.listener.cut["idle"] == 0 and not connection.closed.is_set()
            live = rename([node], key, collection.root, "after a quiet while")
            (change,) = await first
    finally:
        await service.close()
    assert change.operation_id == live.operation_id


async def test_a_listener_that_falls_behind_is_cut(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 10)
    service = await serving(node)
    config = CollectionConfig(max_pending_notifications=3)
    try:
        async with await connect_collection(
            phone, "127.0.0.1", service.port, config=config
        ) as connection:
            snapshot = await connection.snapshot(collection.root)
            changes = connection.listen(snapshot)
            first = asyncio.ensure_future(collect(changes, 1))
            while not service.server.listener_count:
                await asyncio.sleep(0.01)
            rename([node], key, collection.root, "read")
            await first
            for i in range(10):  # the phone does not read these
                rename([node], key, collection.documents[1 + i % 9], f"unread {i}")
            async with asyncio.timeout(PATIENCE):
                await connection.closed.wait()
            assert isinstance(connection.error, LimitExceeded)
            with pytest.raises(LimitExceeded):
                async with asyncio.timeout(PATIENCE):
                    async for _ in changes:
                        pass
    finally:
        await service.close()


# -- bad input over a real socket ----------------------------------------------------------


async def raw_peer(
    answer: Callable[[Request], Awaitable[list[bytes]]],
) -> tuple[asyncio.Server, int]:
    """A TCP peer that answers each decoded request with the frames ``answer`` gives."""

    async def handle(stream: TcpStream) -> None:
        frames = FrameDecoder(1 << 24)
        while data := await stream.read():
            for frame in frames.feed(data):
                request = decode_message(frame)
                assert isinstance(request, Request)
                for out in await answer(request):
                    await stream.write(encode_frame(out))

    server = await serve_tcp(handle)
    return server, int(server.sockets[0].getsockname()[1])


async def test_symbols_that_never_peel_end_in_a_typed_error(key: KeyPair) -> None:
    phone = new_sync_store()
    collection = build_collection([phone], key, 20)
    rng = random.Random(3)
    asked = 0

    async def garbage(request: Request) -> list[bytes]:
        nonlocal asked
        asked += 1
        symbols = tuple(CodedSymbol(rng.randbytes(48), rng.getrandbits(64), 3) for _ in range(40))
        body = (
            CreateSnapshotResponse(b"s" * 16, symbols)
            if isinstance(request.body, CreateSnapshotRequest)
            else SnapshotSymbolsResponse(symbols)
        )
        return [encode_message(Response(request.request_id, body))]

    server, port = await raw_peer(garbage)
    config = CollectionConfig(max_snapshot_documents=50)
    async with server, await connect_collection(phone, "127.0.0.1", port, config=config) as c:
        with pytest.raises(LimitExceeded):
            await c.snapshot(collection.root)
    # Bounded: the decoder gave up after its symbol limit, not after a timeout.
    assert asked * 40 <= config.max_symbols(20 + 50) + 40


async def test_unknown_and_foreign_snapshot_ids_are_refused(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 10)
    service = await serving(node)
    try:
        async with await connect_collection(phone, "127.0.0.1", service.port) as one:
            snapshot = await one.snapshot(collection.root)
            theirs = snapshot.out_of_sync.snapshot_id
            async with await connect_collection(phone, "127.0.0.1", service.port) as other:
                for body in (SnapshotSymbolsRequest(b"\x01" * 16), SnapshotSymbolsRequest(theirs),
                             ListenRequest(theirs)):  # fmt: skip
                    response = await other.request(Request(bytes(16), body))
                    assert isinstance(response.body, ErrorResponse)
                    assert response.body.message.startswith("UnknownSnapshot")
            # The owner's id still works on its own connection.
            response = await one.request(Request(bytes(16), SnapshotSymbolsRequest(theirs)))
            assert isinstance(response.body, SnapshotSymbolsResponse)
    finally:
        await service.close()


async def test_a_snapshot_above_the_limit_is_refused(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node], key, 30)
    service = await serving(node, CollectionConfig(max_snapshot_documents=10))
    try:
        async with await connect_collection(phone, "127.0.0.1", service.port) as connection:
            with pytest.raises(SnapshotTooLarge):
                await connection.snapshot(collection.root)
            assert not connection.closed.is_set()  # the refusal is an answer, not a cut
    finally:
        await service.close()
    assert service.server.snapshot_count == 0


async def test_a_notification_outside_the_snapshot_is_refused(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 10)
    outside = build_collection([node], key, 1)
    real = CollectionServer(node)
    record = node.operations(outside.root)[0]
    stored = node.entry(record.id)
    assert stored is not None
    foreign = Notification(
        "mallory", document_key(outside.root), operation_upload_item(record, *stored)
    )

    async def answer(request: Request) -> list[bytes]:
        response = encode_message(real.handle("phone", request, 0))
        if isinstance(request.body, ListenRequest):
            return [response, encode_message(foreign)]
        return [response]

    server, port = await raw_peer(answer)
    async with server, await connect_collection(phone, "127.0.0.1", port) as connection:
        snapshot = await connection.snapshot(collection.root)
        with pytest.raises(NotInSnapshot):
            await collect(connection.listen(snapshot), 1)
    assert not phone.has_entry(record.id)


async def test_garbage_ends_that_connection_only(key: KeyPair) -> None:
    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 10)
    rename([node], key, collection.root, "new")
    service = await serving(node)
    try:
        bad = await connect_tcp("127.0.0.1", service.port)
        await bad.write(encode_frame(b"\x07garbage"))
        async with asyncio.timeout(PATIENCE):
            assert await bad.read() == b""  # the service hung up
        await bad.close()
        oversized = await connect_tcp("127.0.0.1", service.port)
        await oversized.write(b"\xff\xff\xff\xff\x0f")  # a frame length far over the limit
        async with asyncio.timeout(PATIENCE):
            assert await oversized.read() == b""
        await oversized.close()
        async with await connect_collection(phone, "127.0.0.1", service.port) as connection:
            snapshot = await connection.snapshot(collection.root)
        assert snapshot.operations_applied == 1
    finally:
        await service.close()


async def test_a_peer_that_stops_answering_times_out(key: KeyPair) -> None:
    phone = new_sync_store()
    collection = build_collection([phone], key, 3)

    async def silent(request: Request) -> list[bytes]:
        return []

    server, port = await raw_peer(silent)
    async with server:
        stream = await connect_tcp("127.0.0.1", port)
        async with CollectionConnection(phone, stream, timeout=0.2) as connection:
            with pytest.raises(ConnectionLost):
                await connection.snapshot(collection.root)


@pytest.mark.timeout(120)
async def test_collection_sync_over_a_libp2p_stream(key: KeyPair) -> None:
    from sdk.sync.collection.service import LIBP2P_PROTOCOL
    from transports import libp2p

    node, phone = new_sync_store(), new_sync_store()
    collection = build_collection([node, phone], key, 50)
    for i in range(5):
        rename([node], key, collection.documents[i * 7], f"over libp2p {i}")
    service = CollectionService(node)
    async with libp2p.Libp2pTransport() as node_host, libp2p.Libp2pTransport() as phone_host:
        service.serve_libp2p(node_host)
        stream = await phone_host.open_stream(node_host.addrs[0], LIBP2P_PROTOCOL)
        async with CollectionConnection(phone, stream) as connection:
            snapshot = await asyncio.wait_for(connection.snapshot(collection.root), PATIENCE)
            changes = connection.listen(snapshot)
            first = asyncio.ensure_future(collect(changes, 1))
            while not service.server.listener_count:
                await asyncio.sleep(0.01)
            live = rename([node], key, collection.root, "live over libp2p")
            (change,) = await first
            await changes.aclose()
        await service.close()
    assert snapshot.operations_applied == 5
    assert change.operation_id == live.operation_id
    assert views_of(node, collection.root) == views_of(phone, collection.root)
