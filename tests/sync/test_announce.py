"""Announce over a pub/sub transport, and fuzzing of every decoder that takes peer bytes."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.sync.announce import (
    Announcements,
    decode_announcement,
    encode_announcement,
    listen_announcements,
    publish_announcement,
    supersedes,
)
from sdk.sync.errors import MalformedMessage, SyncError
from sdk.sync.framing import FrameDecoder
from sdk.sync.messages import Announce, encode
from sdk.sync.session import Replication
from sdk.testing.waiting import eventually, idle
from tests.sync.helpers import TODO, LocalReplication, make_store
from transports.memory import MemoryNetwork


def test_announcement_wraps_aquadoggos_bytes() -> None:
    announce = Announce(7, (TODO,))
    data = encode_announcement("peer-a", announce)
    assert data.endswith(encode(announce))
    assert decode_announcement(data) == ("peer-a", announce)


def test_board_keeps_only_newer_announcements() -> None:
    board = Announcements()
    assert board.receive("a", Announce(5, (TODO,)))
    assert not board.receive("a", Announce(5, ()))
    assert not board.receive("a", Announce(4, ()))
    assert board.interested_in(TODO) == ["a"]
    assert board.receive("a", Announce(6, ()))  # un-announce
    assert board.interested_in(TODO) == []
    assert board.receive_bytes(b"garbage") is None and board.rejected == 1


def test_board_and_session_follow_the_one_newer_announce_rule() -> None:
    assert supersedes(Announce(5, ()), None)
    assert supersedes(Announce(6, ()), Announce(5, (TODO,)))
    assert not supersedes(Announce(5, ()), Announce(5, (TODO,)))
    session = Replication([TODO], now=0)
    assert session.receive_announce(Announce(5, (TODO,)))
    assert not session.receive_announce(Announce(5, ()))
    assert not session.receive_announce(Announce(4, ()))
    assert session.remote_announce == Announce(5, (TODO,))
    assert session.receive_announce(Announce(6, ()))


async def test_announce_travels_over_the_pub_sub_transport() -> None:
    network = MemoryNetwork()
    alice, bob = network.transport("alice"), network.transport("bob")
    board = Announcements()
    seen: list[str] = []
    listener = asyncio.ensure_future(
        listen_announcements(bob, board, on_new=lambda peer, _: seen.append(peer))
    )
    await idle()  # bob's subscription is made (in-process)
    await publish_announcement(alice, "alice", Announce(10, (TODO,)))
    await publish_announcement(alice, "alice", Announce(9, ()))  # late, older: ignored
    await alice.publish("chorus/p2panda/v1/announce", b"\x00junk")
    assert await eventually(lambda: seen and board.rejected)
    assert seen == ["alice"]
    assert board.get("alice") == Announce(10, (TODO,))
    assert board.rejected == 1
    listener.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await listener


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_announcement_decoder(data: bytes) -> None:
    with contextlib.suppress(MalformedMessage):
        decode_announcement(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=10))
def test_fuzz_frame_decoder(chunks: list[bytes]) -> None:
    decoder = FrameDecoder(max_frame=64)
    with contextlib.suppress(SyncError):
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                assert len(frame) <= 64


STORE = make_store([])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=60), max_size=6))
def test_fuzz_session_receive_never_raises(frames: list[bytes]) -> None:
    before = STORE.entry_count()
    replication = LocalReplication(STORE, [TODO], now=0)
    for frame in frames:
        replication.receive(frame, 0)  # bad bytes become events, never exceptions
    while replication.next_event() is not None:
        pass
    replication.close()
    assert STORE.entry_count() == before
