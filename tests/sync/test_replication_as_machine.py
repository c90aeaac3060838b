"""Replication in the machine shape (``sdk.sync.machine``), driven by hand with a
manual clock: bytes in and out, the stall timer, backpressure, closing (its requests
carried out at once, :class:`~sdk.sync.store_work.LocalReplication`); and the driver
that runs it asks nothing of the store while no session waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sdk.sds.varint import encode_uvarint
from sdk.sync import driver
from sdk.sync.driver import SyncConnection
from sdk.sync.errors import LimitExceeded, MalformedMessage
from sdk.sync.events import ConnectionClosed, SessionAborted, SessionDone
from sdk.sync.framing import MAX_FRAME, FrameDecoder, encode_frame
from sdk.sync.messages import Mode, SyncRequest, decode, encode
from sdk.sync.session import WRITE_CHUNK, Replication, SyncConfig
from sdk.sync.store_work import LocalReplication
from tests.sync.helpers import TODO, entry_ids, history, make_store
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

    def counted(store: object, request: object) -> object:
        performed.append(request)
        return perform(store, request)  # type: ignore[arg-type]

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
