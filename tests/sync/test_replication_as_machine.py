"""Replication in the machine shape (``sdk.sync.machine``), driven by hand with a
manual clock: bytes in and out, the stall timer, backpressure, closing (its requests
carried out at once, :class:`tests.sync.helpers.LocalReplication`); and the driver
that runs it asks nothing of the store while no session waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sdk.sds.varint import encode_uvarint
from sdk.sync import driver
from sdk.sync import session as session_module
from sdk.sync.driver import SyncConnection
from sdk.sync.errors import LimitExceeded, MalformedMessage
from sdk.sync.events import ConnectionClosed, SessionAborted, SessionDone
from sdk.sync.framing import MAX_FRAME, FrameDecoder, encode_frame
from sdk.sync.messages import Mode, SyncRequest, decode, encode, entry_parts
from sdk.sync.session import WRITE_CHUNK, Replication, SyncConfig
from sdk.sync.store import SyncStore
from sdk.sync.store_work import perform
from tests.sync.helpers import TODO, LocalReplication, entry_ids, history, make_store
from transports.stream import memory_pipe

HISTORY = history(seed=3, operations=600)
STALL = 5_000


def machine(
    entries: Sequence[tuple[bytes, bytes]] = (), *, initiator: bool = True
) -> LocalReplication:
    config = SyncConfig(initiator=initiator, stall_timeout_ms=STALL, mode=Mode.LOG_HEIGHT)
    return LocalReplication(make_store(entries), [TODO], now=0, config=config)


def events(m: LocalReplication) -> list[object]:
    out: list[object] = []
    while (event := m.next_event()) is not None:
        out.append(event)
    return out


def pump(a: LocalReplication, b: LocalReplication, now: int = 0) -> None:
    """Move bytes both ways until neither side has anything to send."""
    while True:
        moved = False
        for src, dst in ((a, b), (b, a)):
            if (data := src.data_to_send()) and dst.wants_data:
                dst.receive_data(data, now)
                moved = True
            elif data:
                raise AssertionError("a side with output to deliver did not want data")
        if not moved:
            return


def test_two_machines_catch_up_over_bytes_and_finish_when_the_peer_closes() -> None:
    a, b = machine(), machine(HISTORY, initiator=False)
    sid = a.request([TODO], 0)
    pump(a, b)
    assert entry_ids(a.store) == entry_ids(b.store)
    assert next(e for e in events(a) if isinstance(e, SessionDone)).session_id == sid
    assert not a.finished
    a.receive_data(b"", 1)
    assert a.finished and isinstance(events(a)[-1], ConnectionClosed)
    assert a.stats.frames_received > 100 and a.stats.bytes_sent > 0


def test_the_stall_timer_aborts_a_session_the_peer_leaves_waiting() -> None:
    a = machine()
    assert a.get_timer() is None  # no session: nothing to wake for
    a.request([TODO], 1_000)
    assert a.get_timer() == 1_000 + STALL
    a.handle_timer(1_000 + STALL - 1)
    assert not [e for e in events(a) if isinstance(e, SessionAborted)]
    a.handle_timer(1_000 + STALL)
    aborted = [e for e in events(a) if isinstance(e, SessionAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, LimitExceeded)
    assert a.get_timer() is None


def test_a_message_from_the_peer_moves_the_stall_timer() -> None:
    a, b = machine(), machine(HISTORY[:5], initiator=False)
    a.request([TODO], 0)
    b.receive_data(a.data_to_send(), 0)
    # b answers later: a heard from the peer then, so its timer moves on.
    a.receive_data(b.data_to_send(), 3_000)
    assert a.get_timer() == 3_000 + STALL


def test_no_data_is_wanted_while_replies_wait_to_be_taken() -> None:
    b = machine(HISTORY, initiator=False)
    assert b.wants_data
    b.receive_data(encode_frame(encode(SyncRequest(0, Mode.LOG_HEIGHT, (TODO,)))), 0)
    assert not b.wants_data  # its Have waits
    out = b.data_to_send()
    assert [type(decode(f)).__name__ for f in FrameDecoder().feed(out)] == ["Have"]
    assert b.wants_data


def test_output_goes_in_writes_of_at_most_write_chunk_and_in_order() -> None:
    a, b = machine(), machine(HISTORY, initiator=False)
    a.request([TODO], 0)
    b.receive_data(a.data_to_send(), 0)
    a.receive_data(b.data_to_send(), 0)  # b's Have
    b.receive_data(a.data_to_send(), 0)  # a's Have: b streams everything
    writes = []
    while data := b.data_to_send():
        writes.append(data)
        # Entries left for the next writes do not stop reading: a peer that streams
        # to us at the same time is read (else two streaming peers would wait forever).
        assert b.wants_data
    frames = FrameDecoder().feed(b"".join(writes))
    assert len(writes) > 1 and max(map(len, writes)) <= WRITE_CHUNK
    assert sum(1 for f in frames if type(decode(f)).__name__ == "EntryMessage") == len(
        entry_ids(b.store)
    )


def test_close_finishes_only_once_everything_queued_went_out() -> None:
    a, b = machine(), machine(HISTORY, initiator=False)
    a.request([TODO], 0)
    b.receive_data(a.data_to_send(), 0)
    a.receive_data(b.data_to_send(), 0)
    b.receive_data(a.data_to_send(), 0)
    b.close_when_sent()
    assert not b.finished
    sent = b""
    while data := b.data_to_send():
        assert not b.finished
        sent += data
    assert b.finished
    a.receive_data(sent, 0)
    assert entry_ids(a.store) == entry_ids(b.store)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\xff" * 6, MalformedMessage),  # a length prefix too long
        (encode_uvarint(MAX_FRAME + 1), LimitExceeded),  # a frame over the limit
        (b"\x03\xff\xff\xff", MalformedMessage),  # a frame that does not decode
    ],
)
def test_a_bad_frame_finishes_the_machine_with_the_error(data: bytes, error: type) -> None:
    a = machine()
    a.receive_data(data, 0)
    closed = [e for e in events(a) if isinstance(e, ConnectionClosed)]
    assert a.finished and isinstance(closed[0].error, error)


async def test_an_idle_connection_asks_nothing_of_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a session the machine has no timer and no request, so the driver sends
    nothing to the store's worker (it used to every second)."""
    performed: list[object] = []
    perform = driver.perform

    def counted(store: object, request: object, prepared: object = None) -> object:
        performed.append(request)
        return perform(store, request, prepared)  # type: ignore[arg-type]

    monkeypatch.setattr(driver, "perform", counted)
    left, right, _ = memory_pipe()
    connection = SyncConnection(Replication([TODO], now=0), left, store=make_store([]))
    async with connection:
        await asyncio.sleep(1.5)
        assert performed == []
        # A session makes requests, through the same perform.
        await connection.request([TODO])
        async with asyncio.timeout(10):
            while not performed:
                await asyncio.sleep(0.01)
    await right.close()


def test_two_pure_machines_catch_up_with_requests_carried_out_by_the_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two bare machines (no driver, no store of their own) replicate over bytes on a
    manual clock: every store access is a request this test carries out."""
    stores = {"a": make_store([]), "b": make_store(HISTORY)}
    carrying: list[bool] = []
    for name in ("ingest_many", "entries_for", "sync_range", "log_heights_of", "index"):
        method = getattr(SyncStore, name)

        def watched(self: SyncStore, *args: object, _method=method, **kwargs: object):  # type: ignore[no-untyped-def]
            carrying.append(bool(performing))
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(SyncStore, name, watched)
    performing: list[object] = []
    a = Replication([TODO], now=0, config=SyncConfig(stall_timeout_ms=STALL))
    b = Replication([TODO], now=0, config=SyncConfig(initiator=False, stall_timeout_ms=STALL))
    kinds: set[str] = set()
    clock = 1_000
    sid = a.request([TODO], clock)
    assert a.get_timer() == clock + STALL  # the manual clock's time, not a real one
    moved = True
    while moved:
        moved = False
        clock += 10
        for machine_, store, peer in ((a, stores["a"], b), (b, stores["b"], a)):
            while (request := machine_.next_request()) is not None:
                kinds.add(type(request).__name__)
                performing.append(request)
                result = perform(store, request)
                performing.pop()
                machine_.request_done(request, result, clock)
                moved = True
            if data := machine_.data_to_send():
                peer.receive_data(data, clock)
                moved = True
    assert entry_ids(stores["a"]) == entry_ids(stores["b"])
    done = [e for e in events(a) if isinstance(e, SessionDone)]  # type: ignore[arg-type]
    assert [e.session_id for e in done] == [sid]
    assert done[0].entries_received == len(entry_ids(stores["b"]))
    assert {"StoreBatch", "Reconcile", "Read"} <= kinds
    assert carrying and all(carrying)  # the store was used only by this test's perform
    assert a.get_timer() is None  # no session waits: nothing to wake for


class _Pull:
    """An empty store's machine ``a`` pulling ``HISTORY`` from a full one in
    Log-Height mode, the opening exchanged with every request carried out at once:
    :attr:`stream` is what the full side sends next (its entries, then its SyncDone)."""

    def __init__(self, max_batch: int) -> None:
        self.store = make_store([])
        self.a = Replication(
            [TODO], now=0, config=SyncConfig(mode=Mode.LOG_HEIGHT, max_batch=max_batch)
        )
        self.full = full = machine(HISTORY, initiator=False)
        self.sid = self.a.request([TODO], 0)
        full.receive_data(self.a.data_to_send(), 0)  # the request: full sends its Have
        self.a.receive_data(full.data_to_send(), 0)
        self.carry()  # a's Have is read
        full.receive_data(self.a.data_to_send(), 0)  # a's Have: full plans everything
        self.carry()  # a has nothing to send: its SyncDone follows
        full.receive_data(self.a.data_to_send(), 0)
        self.stream = b"".join(iter(full.data_to_send, b""))

    def carry(self) -> None:
        """Carry out every request ``a`` has, on :attr:`store`."""
        while (request := self.a.next_request()) is not None:
            self.a.request_done(request, perform(self.store, request), 0)


def test_frames_wait_while_a_request_is_out() -> None:
    """What comes while the store is busy with a request is handled, in order, only
    once the answer is in: the peer's SyncDone after its entries ends the session only
    once every batch before it was stored, and its closing only after that."""
    pull = _Pull(max_batch=50)
    store, a, full, sid = pull.store, pull.a, pull.full, pull.sid
    a.receive_data(pull.stream, 0)  # full's entries, then its SyncDone
    a.receive_data(b"", 0)  # the peer closed
    seen: list[object] = []
    ingests = 0
    while (request := a.next_request()) is not None:
        assert a.next_request() is None  # one request at a time
        seen += events(a)
        if type(request).__name__ == "StoreBatch":
            ingests += 1
            assert not [e for e in seen if isinstance(e, SessionDone)]
            assert not a.finished
        a.request_done(request, perform(store, request), 0)
    seen += events(a)
    assert ingests >= len(entry_ids(full.store)) // 50
    assert [e.session_id for e in seen if isinstance(e, SessionDone)] == [sid]
    assert a.finished and entry_ids(store) == entry_ids(full.store)


def test_a_quiet_live_connection_sends_its_announce_as_keepalive() -> None:
    """Live, nothing to push: after ``keepalive_ms`` without a byte either way the machine
    sends its Announce (no wire change, nothing answers it), and again after as long."""
    config = SyncConfig(live_mode=True, stall_timeout_ms=STALL, keepalive_ms=30_000)
    a = LocalReplication(make_store([]), [TODO], now=0, config=config)
    b = machine(HISTORY[:20], initiator=False)
    b.config = SyncConfig(initiator=False, live_mode=True, stall_timeout_ms=STALL)
    a.request([TODO], 0)
    pump(a, b, now=1_000)
    assert a.sessions()[0].phase.name == "LIVE"
    assert a.get_timer() == 1_000 + 30_000  # the last byte either way, then the keepalive
    events(a)
    a.handle_timer(1_000 + 29_999)
    assert a.data_to_send() == b""
    a.handle_timer(1_000 + 30_000)
    frames = FrameDecoder().feed(a.data_to_send())
    assert [type(decode(f)).__name__ for f in frames] == ["Announce"]
    assert a.get_timer() == 31_000 + 30_000
    b.receive_data(encode_frame(frames[0]), 31_000)
    assert b.rejected == 0 and 0 in b.sessions()  # taken, the session goes on
    assert b.data_to_send() == b""  # and not answered


def test_entries_that_come_while_a_batch_is_stored_are_read_into_the_next_one() -> None:
    """Entry frames of the session whose batch is being stored are read as they come
    (overlapping the store's work), up to one short of ``max_batch``; the next batch
    holds them, and nothing else (the peer's SyncDone) is handled before the answer."""
    pull = _Pull(max_batch=50)
    store, a, full, sid = pull.store, pull.a, pull.full, pull.sid
    frames = FrameDecoder().feed(pull.stream)
    a.receive_data(b"".join(map(encode_frame, frames[:50])), 0)
    first = a.next_request()
    assert type(first).__name__ == "StoreBatch" and len(first.entries) == 50  # type: ignore[union-attr]
    read = a.payload_received
    a.receive_data(b"".join(map(encode_frame, frames[50:120])), 0)
    # 49 of the 70 are read at once; the 50th would fill the batch, so it waits.
    parts = [entry_parts(frame) for frame in frames[50:99]]
    assert a.payload_received - read == sum(len(p[1]) + len(p[2]) for p in parts if p)
    assert a.next_request() is None  # still one request at a time
    a.request_done(first, perform(store, first), 0)
    second = a.next_request()
    assert type(second).__name__ == "StoreBatch" and len(second.entries) == 50  # type: ignore[union-attr]
    a.request_done(second, perform(store, second), 0)
    a.receive_data(b"".join(map(encode_frame, frames[120:])), 0)
    a.receive_data(b"", 0)
    seen: list[object] = []
    while (request := a.next_request()) is not None:
        seen += events(a)
        if type(request).__name__ == "StoreBatch":
            assert not [e for e in seen if isinstance(e, SessionDone)]
        a.request_done(request, perform(store, request), 0)
    seen += events(a)
    assert [e.session_id for e in seen if isinstance(e, SessionDone)] == [sid]
    assert entry_ids(store) == entry_ids(full.store)


def test_entries_read_while_a_batch_is_stored_are_bounded_in_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What is read while a batch is stored is held within INBOX_BYTES twice over: the
    next batch takes entries while it holds less, the rest wait in the inbox, and
    reading stops once the inbox holds that much (a peer cannot make a connection
    hold ``max_batch`` large entries)."""
    monkeypatch.setattr(session_module, "INBOX_BYTES", 4_000)
    pull = _Pull(max_batch=1_000)
    store, a = pull.store, pull.a
    frames = FrameDecoder().feed(pull.stream)
    a.receive_data(encode_frame(frames[0]), 0)
    first = a.next_request()
    assert type(first).__name__ == "StoreBatch"
    held = 0
    for frame in frames[1:]:
        if not a.wants_data:
            break
        a.receive_data(encode_frame(frame), 0)
        held += len(frame)
    assert not a.wants_data, "reading went on past the bound"
    assert a._batch_bytes < 4_000 + max(map(len, frames))
    assert a._inbox_bytes >= 4_000 and held < 3 * 4_000 + 2 * max(map(len, frames))
    a.request_done(first, perform(store, first), 0)
    pull.carry()
    assert a.wants_data and a._inbox_bytes == 0
