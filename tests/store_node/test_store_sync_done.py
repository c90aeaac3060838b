"""Store sync: a session that returns on the initiator means the peer committed what it pushed."""

from __future__ import annotations

import asyncio

from store_node.store_sync.session import run_session
from tests.store_node.test_store_sync import MemorySide, _messages
from transports.stream import memory_pipe


class SlowCommitSide(MemorySide):
    """A side whose ingest commits what it accepted a while later, in batches (like the
    node's ``[ingest] batch_interval_ms``)."""

    def __init__(self, messages: list[tuple[str, bytes]], interval: float = 0.05) -> None:
        super().__init__(messages)
        self.interval = interval
        self.uncommitted = 0
        self.committed_count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        await super().accept(channel_id, data, digest)
        self.uncommitted += 1
        if self._idle.is_set():
            self._idle.clear()
            asyncio.get_running_loop().call_later(self.interval, self._commit)

    def _commit(self) -> None:
        self.committed_count += self.uncommitted
        self.uncommitted = 0
        self._idle.set()

    async def committed(self) -> None:
        await self._idle.wait()


async def test_the_initiator_returns_only_once_the_responder_committed_its_pushes() -> None:
    pushed = _messages(300, seed=5, prefix="a")
    initiator, responder = MemorySide(pushed), SlowCommitSide([])
    left, right, _ = memory_pipe()
    held_when_done: list[int] = []

    async def initiate() -> None:
        await run_session(left, initiator, initiator=True)
        held_when_done.append(responder.committed_count)

    async with asyncio.timeout(30):
        await asyncio.gather(initiate(), run_session(right, responder, initiator=False))
    assert held_when_done == [len(pushed)]
    assert responder.committed_count == len(pushed)


class CountingSide(MemorySide):
    """A side that counts how often the session waits for ingest's commit."""

    def __init__(self, messages: list[tuple[str, bytes]]) -> None:
        super().__init__(messages)
        self.commit_waits = 0

    async def committed(self) -> None:
        self.commit_waits += 1


async def test_each_side_waits_for_its_commit_once_per_session() -> None:
    initiator = CountingSide(_messages(50, seed=6, prefix="a"))
    responder = CountingSide(_messages(50, seed=7, prefix="b"))
    left, right, _ = memory_pipe()
    async with asyncio.timeout(30):
        await asyncio.gather(
            run_session(left, initiator, initiator=True),
            run_session(right, responder, initiator=False),
        )
    assert len(initiator.accepted) == len(responder.accepted) == 50
    assert (initiator.commit_waits, responder.commit_waits) == (1, 1)
