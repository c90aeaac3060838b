"""Store-to-store sync: wire codec, the archive's sync index, sessions between two sides.

The reconciliation property test runs the real session code over an in-memory
pipe between two in-memory sides with random differences; the index tests use
both archive backends; ``test_store_sync_nodes.py`` runs real nodes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.sds.message import decode_message
from sdk.sync import rbsr
from sdk.sync.errors import LimitExceeded, MalformedMessage, UnexpectedEntry
from sdk.sync.framing import encode_frame
from store_node.archive.base import Archive
from store_node.errors import ConfigError
from store_node.ingest import Ingest
from store_node.store_sync import wire
from store_node.store_sync.config import parse_store_sync
from store_node.store_sync.index import ArchiveIndex, FloorView, sync_key
from store_node.store_sync.service import ArchiveSide
from store_node.store_sync.session import ReconciliationParams, SessionLimits, run_session
from tests.store_node.store_node_helpers import BASE_MS, archive_row, sds_message
from transports.base import message_hash, topic_for_channel
from transports.stream import PipeFaults, memory_pipe

T = TypeVar("T")


class MemorySide:
    """A side whose archive is a dict; accepted messages are recorded, then indexed."""

    def __init__(self, messages: list[tuple[str, bytes]]) -> None:
        self.index = rbsr.RangeIndex()
        self.data: dict[bytes, tuple[str, bytes]] = {}
        self.accepted: list[bytes] = []
        for channel, payload in messages:
            self._add(channel, payload)

    def _add(self, channel: str, payload: bytes) -> bytes:
        digest = message_hash(topic_for_channel(channel), payload)
        key = sync_key(decode_message(payload).lamport_timestamp, digest)
        self.index.insert(key)
        self.data[key] = (channel, payload)
        return key

    def source(self) -> rbsr.RangeSource:
        return self.index

    async def call(self, fn: Callable[[], T]) -> T:
        return fn()

    async def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        return [self.data[k] for k in keys if k in self.data]

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        self.accepted.append(self._add(channel_id, data))

    async def committed(self) -> None:
        return None


def _messages(n: int, seed: int, prefix: str) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        channel = rng.choice(["c", "d"])
        # Clustered times: many keys share a millisecond, so the hash half orders them.
        out.append((channel, sds_message(channel, i, sender=prefix, lamport=BASE_MS + i // 3)))
    return out


async def _reconcile(a: MemorySide, b: MemorySide, params: ReconciliationParams) -> None:
    left, right, _ = memory_pipe()
    await asyncio.wait_for(
        asyncio.gather(
            run_session(left, a, initiator=True, params=params),
            run_session(right, b, initiator=False, params=params),
        ),
        30,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    common=st.integers(0, 300),
    only_a=st.integers(0, 60),
    only_b=st.integers(0, 60),
    seed=st.integers(0, 2**32 - 1),
    branching=st.sampled_from([2, 4, 16]),
)
def test_two_archives_with_random_differences_end_equal(
    common: int, only_a: int, only_b: int, seed: int, branching: int
) -> None:
    shared = _messages(common, seed, "s")
    a_extra = _messages(only_a, seed + 1, "a")
    b_extra = _messages(only_b, seed + 2, "b")
    a = MemorySide(shared + a_extra)
    b = MemorySide(shared + b_extra)
    a_before, b_before = set(a.data), set(b.data)
    asyncio.run(_reconcile(a, b, ReconciliationParams(branching=branching, threshold=branching)))
    assert set(a.data) == set(b.data) == a_before | b_before
    # Exactly the differences crossed, each once: 0 missing, 0 duplicates.
    assert sorted(a.accepted) == sorted(b_before - a_before)
    assert sorted(b.accepted) == sorted(a_before - b_before)
    assert len(a.accepted) == only_b and len(b.accepted) == only_a


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 120),
    floor=st.integers(0, 140),
    ranges=st.lists(st.tuples(st.integers(0, 140), st.integers(0, 140)), max_size=8),
    seed=st.integers(0, 1000),
)
def test_the_floor_view_is_the_set_of_keys_at_or_above_the_floor(
    n: int, floor: int, ranges: list[tuple[int, int]], seed: int
) -> None:
    rng = random.Random(seed)
    index = rbsr.RangeIndex(fanout=4)
    keys = sorted({rng.randrange(140).to_bytes(2, "big") + rng.randbytes(2) for _ in range(n)})
    index.update(inserts=keys)
    low = floor.to_bytes(2, "big")
    view = FloorView(index, low)
    model = [k for k in keys if k >= low]
    assert len(view) == len(model)
    assert view.first() == (model[0] if model else None)
    assert list(view.keys_in(None, None)) == model
    for a, b in ranges:
        lo, hi = a.to_bytes(2, "big"), b.to_bytes(2, "big")
        if lo < hi:
            expected = [k for k in model if lo <= k < hi]
        else:  # circular: [lo, end) then [start, hi)
            expected = [k for k in model if k >= lo] + [k for k in model if k < hi]
        assert list(view.keys_in(lo, hi)) == expected
        summary = view.summary(lo, hi)
        assert summary.count == len(expected)
        assert summary.total == sum(rbsr.lift(k) for k in expected) % 2**128
        cuts = view.split(lo, hi, 4)
        assert all(c in expected for c in cuts) and len(cuts) <= 3
        if len(expected) >= 4:
            assert len(cuts) == 3 and cuts == [c for c in expected if c in cuts]


def test_messages_older_than_either_floor_are_not_synced() -> None:
    old = [("c", sds_message("c", i, sender="o", lamport=BASE_MS + i)) for i in range(40)]
    new = [("c", sds_message("c", i, sender="n", lamport=BASE_MS + 1000 + i)) for i in range(40)]
    a = MemorySide(old[:20] + new[:20])
    b = MemorySide(old[20:] + new[20:])
    left, right, _ = memory_pipe()

    async def run() -> None:
        # A keeps everything; B's retention dropped what is older than BASE_MS + 500.
        await asyncio.gather(
            run_session(left, a, initiator=True, floor_ms=0),
            run_session(right, b, initiator=False, floor_ms=BASE_MS + 500),
        )

    asyncio.run(run())
    assert len(a.accepted) == len(b.accepted) == 20
    for side in (a, b):
        times = {int.from_bytes(k[:8], "big") for k in side.accepted}
        assert min(times) >= BASE_MS + 1000


async def test_both_sides_pushing_more_than_the_pipe_holds_do_not_deadlock() -> None:
    def big(prefix: str) -> list[tuple[str, bytes]]:
        return [
            ("c", sds_message("c", i, sender=prefix, content=bytes([i % 251]) * 4000))
            for i in range(60)
        ]

    a, b = MemorySide(big("a")), MemorySide(big("b"))
    # 240 KB each way through a pipe that holds 16 KB (frames of at most 8 KB): each
    # side must keep reading the other's pushes while it pushes its own.
    left, right, _ = memory_pipe(PipeFaults(capacity=16 * 1024))
    limits = SessionLimits(max_frame=8 * 1024)
    await asyncio.wait_for(
        asyncio.gather(
            run_session(left, a, initiator=True, limits=limits),
            run_session(right, b, initiator=False, limits=limits),
        ),
        30,
    )
    assert len(a.accepted) == len(b.accepted) == 60


def test_equal_archives_take_one_round_trip() -> None:
    shared = _messages(500, 7, "s")
    a, b = MemorySide(shared), MemorySide(shared)
    left, right, _ = memory_pipe()

    async def run() -> tuple[int, int]:
        sa, sb = await asyncio.gather(
            run_session(left, a, initiator=True), run_session(right, b, initiator=False)
        )
        return sa.rounds_sent, sa.bytes_sent + sb.bytes_sent

    rounds, size = asyncio.run(run())
    assert rounds == 1
    assert a.accepted == b.accepted == []
    # Two Hellos, one fingerprint with its bound, one Terminal, two Dones.
    assert size < 100


# -- wire ----------------------------------------------------------------------------

KEYS = st.binary(min_size=wire.KEY_SIZE, max_size=wire.KEY_SIZE)
RANGE_MESSAGES = st.one_of(
    st.builds(rbsr.EmptySet, st.booleans()),
    st.builds(rbsr.LowerBound, KEYS),
    st.builds(rbsr.Payload, KEYS),
    st.builds(rbsr.Payload, KEYS, st.booleans(), KEYS),
    st.builds(rbsr.EmptyPayload, KEYS),
    st.builds(rbsr.Done, KEYS),
    st.builds(rbsr.Fingerprint, st.binary(min_size=16, max_size=16), KEYS),
    st.just(rbsr.Terminal()),
)
WIRE_MESSAGES = st.one_of(
    st.builds(wire.Hello, st.integers(0, 255), st.integers(0, 2**64 - 1)),
    st.builds(wire.Ranges, st.lists(RANGE_MESSAGES, min_size=1, max_size=20).map(tuple)),
    st.builds(
        wire.Messages,
        st.lists(
            st.tuples(
                st.text(min_size=1, max_size=20).filter(lambda c: len(c.encode()) <= 256),
                st.binary(min_size=1, max_size=300),
            ),
            min_size=1,
            max_size=5,
        ).map(tuple),
    ),
    st.just(wire.Finished()),
)


@settings(max_examples=300, deadline=None)
@given(message=WIRE_MESSAGES)
def test_wire_round_trips(message: wire.WireMessage) -> None:
    assert wire.decode(wire.encode(message)) == message


# Garbage and mutated messages: the ``store_sync_wire`` target of tests/fuzz.


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty"),
        (b"\x09", "unknown message type"),
        (b"\x02", "without a range"),
        (b"\x02\x01" + b"k" * 39, "truncated"),
        (b"\x02\x00\x02", "not 0 or 1"),
        (b"\x03\x00", "channel id of 0"),
        (b"\x03\x01c\x80\x80\x80\x80\x80", "varint too long"),
        (b"\x03\x01\xff\x01x", "not UTF-8"),
        (b"\x04\x00", "after Done"),
        (b"\x01\x01\x00", "truncated floor"),
        (b"\x01\x01" + bytes(9), "after Hello"),
    ],
)
def test_wire_rejects_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason):
        wire.decode(data)


def test_an_oversized_sds_message_is_refused_before_use() -> None:
    data = wire.encode(wire.Messages((("c", b"x" * 2000),)))
    with pytest.raises(MalformedMessage, match="2000 bytes"):
        wire.decode(data, max_message_size=1000)


# -- sessions against a bad peer ---------------------------------------------------------


async def _against(frames: list[bytes], side: MemorySide, **limits: float) -> Exception:
    ours, theirs, _ = memory_pipe()
    for frame in frames:
        await theirs.write(encode_frame(frame))
    with pytest.raises(Exception) as info:
        await run_session(ours, side, initiator=False, limits=SessionLimits(**limits))  # type: ignore[arg-type]
    return info.value  # type: ignore[return-value]


async def test_an_unrequested_message_ends_the_session() -> None:
    side = MemorySide([])
    hello = wire.encode(wire.Hello())
    push = wire.encode(wire.Messages((("c", sds_message("c", 1)),)))
    err = await _against([hello, push], side)
    assert isinstance(err, UnexpectedEntry)
    assert side.accepted == []


async def test_a_wrong_version_and_a_silent_peer_are_typed_errors() -> None:
    other_version = b"\x01\x02" + bytes(8)
    assert isinstance(await _against([other_version], MemorySide([])), MalformedMessage)
    err = await _against([wire.encode(wire.Hello())], MemorySide([]), idle_timeout_s=0.2)
    assert isinstance(err, LimitExceeded)


async def test_a_round_over_the_bound_is_refused() -> None:
    key = bytes(40)
    big = wire.encode(wire.Ranges(tuple(rbsr.Payload(key) for _ in range(1500))))
    err = await _against([wire.encode(wire.Hello()), big], MemorySide([]), max_round_messages=1000)
    assert isinstance(err, LimitExceeded)


# -- the archive's index (both backends) -------------------------------------------------


def _sync_keys(archive: Archive) -> set[bytes]:
    return {sync_key(lamport, digest) for _, lamport, digest in archive.sync_keys_after(0, 10**6)}


async def test_the_index_follows_the_archive_and_survives_reopen(archive: Archive) -> None:
    archive.write_batch([archive_row("c", i) for i in range(300)])
    index = ArchiveIndex(archive)
    try:
        ix = await index.call(index.open)
        assert set(ix.iter_from(None)) == _sync_keys(archive)
        archive.write_batch([archive_row("d", i, lamport=BASE_MS) for i in range(50)])
        assert await index.call(index.catch_up) == 50
        assert len(ix) == 350
        fp = ix.summary(None, None)
    finally:
        await asyncio.to_thread(index.close)
    again = ArchiveIndex(archive)
    try:
        ix = await again.call(again.open)
        assert ix.watermark > 0 and ix.summary(None, None) == fp
        # Retention deletes under the index: verify notices and rebuilds.
        deleted = archive.delete_older_than(BASE_MS + 100)
        assert deleted > 0
        assert await again.call(again.verify) is False
        assert again.index is not None
        assert set(again.index.iter_from(None)) == _sync_keys(archive)
        assert len(again.index) == archive.count()
        loaded = await again.call(lambda: again.load(sorted(_sync_keys(archive))[:5]))
        assert len(loaded) == 5
    finally:
        await asyncio.to_thread(again.close)


async def test_two_archives_heal_through_ingest(archive: Archive, tmp_path: Path) -> None:
    from store_node.archive.sqlite import SqliteArchive

    other = SqliteArchive(tmp_path / "other.db")
    other.migrate()
    archive.write_batch([archive_row("c", i) for i in range(400)])
    other.write_batch([archive_row("c", i) for i in range(400) if i % 7] + [archive_row("d", 1)])
    sides = []
    for a in (archive, other):
        index = ArchiveIndex(a)
        await index.call(index.open)
        ingest = Ingest(a, batch_interval=0.005)
        await ingest.start()
        sides.append((index, ingest))
    try:
        left, right, _ = memory_pipe()
        sa, sb = await asyncio.gather(
            run_session(left, ArchiveSide(*sides[0]), initiator=True),
            run_session(right, ArchiveSide(*sides[1]), initiator=False),
        )
        # Committed before the sessions returned: nothing to wait for.
        assert archive.count() == other.count() == 401
        assert (sa.messages_received, sb.messages_received) == (1, 58)
        assert archive.stats().total_arrivals == 401  # nothing ingested twice
    finally:
        for index, ingest in sides:
            await ingest.stop()
            await asyncio.to_thread(index.close)
        other.close()


# -- config ----------------------------------------------------------------------------


def test_config_section() -> None:
    config = parse_store_sync({"listen": "127.0.0.1:0", "peers": ["h:1"], "interval_s": 5})
    assert config.enabled and config.peers == ("h:1",) and config.interval_s == 5.0
    assert config.window_s is None and parse_store_sync({"window_s": 60}).window_s == 60.0
    assert not parse_store_sync({}).enabled
    for bad in (
        {"peers": "h:1"},
        {"peers": ["nohost"]},
        {"interval_s": 0},
        {"window_s": -1},
        {"branching": 1},
        {"threshold": 2, "branching": 4},
        {"what": 1},
        [],
    ):
        with pytest.raises(ConfigError):
            parse_store_sync(bad)


def test_the_service_floor_is_the_later_of_retention_and_window(tmp_path: Path) -> None:
    import time

    from store_node.archive.sqlite import SqliteArchive
    from store_node.store_sync.service import StoreSyncService

    archive = SqliteArchive(tmp_path / "a.db")
    ingest = Ingest(archive)
    day_ms = 86_400_000
    service = StoreSyncService(parse_store_sync({}), archive, ingest)
    assert service.floor_ms() == 0
    service = StoreSyncService(parse_store_sync({}), archive, ingest, max_age_days=2)
    now = int(time.time() * 1000)
    assert now - 2 * day_ms - 60_000 < service.floor_ms() <= now - 2 * day_ms
    windowed = parse_store_sync({"window_s": 3600})
    service = StoreSyncService(windowed, archive, ingest, max_age_days=2)
    assert now - 3_600_000 - 60_000 < service.floor_ms() <= now
    service.index.close()


async def test_stop_ends_a_stalled_session_and_closes_the_listener(tmp_path: Path) -> None:
    from store_node.archive.sqlite import SqliteArchive
    from store_node.store_sync.service import StoreSyncService
    from transports.stream import connect_tcp

    archive = SqliteArchive(tmp_path / "a.db")
    archive.migrate()
    ingest = Ingest(archive)
    await ingest.start()
    service = StoreSyncService(parse_store_sync({"listen": "127.0.0.1:0"}), archive, ingest)
    await service.start()
    client = await connect_tcp("127.0.0.1", service.port)
    # A peer that says Hello and then nothing: the session waits (idle timeout 60 s).
    await client.write(encode_frame(wire.encode(wire.Hello())))
    assert isinstance(wire.decode((await client.read())[1:]), wire.Hello)
    await asyncio.wait_for(service.stop(), 15)
    assert await asyncio.wait_for(client.read(), 5) == b""
    with pytest.raises(OSError):
        await connect_tcp("127.0.0.1", service.port)
    await client.close()
    await ingest.stop()
    archive.close()
