"""One store-sync session between two store nodes over a reliable stream.

Theory of operation
-------------------
Both sides send :class:`~store_node.store_sync.wire.Hello`. The initiator opens
range-based set reconciliation (:class:`sdk.sync.rbsr.Reconciler`, the sync
layer's primitive: lifting-monoid fingerprints over XXH3) of the two archives'
sync keys; rounds go back and forth as :class:`~store_node.store_sync.wire.Ranges`
frames until neither side has a range left to ask about. As soon as a round
tells a side which keys its peer lacks, it *pushes* those messages
(:class:`~store_node.store_sync.wire.Messages`), right after sending its own
answer, so the peer has always learned that it lacks a key before the message
arrives. This is Waku Sync's split into reconciliation and transfer, where
transfer also sends each side what the other lacks (waku-org/nwaku
``waku/waku_store_sync/reconciliation.nim`` ``processRequest`` queues
``hashToSend`` for the transfer protocol; ``transfer.nim``), run here on one
stream so a session needs no second connection.

Each Hello carries the sender's *floor*, the oldest timestamp it still syncs
(its retention cutoff or sync window; Waku Sync reconciles a sliding "sync
range" the same way); both sides reconcile only keys at or above the later of
the two floors (:class:`~store_node.store_sync.index.FloorView`), so a message
one node has already deleted by age is neither offered to it nor fetched back.

A side that has finished reconciling and pushing sends
:class:`~store_node.store_sync.wire.Finished` (pushes are written by their own
task, so a side keeps reading the peer's pushes while writing its own); the
session ends when both have,
and once everything received has been *committed* to the archive (the side's
``committed()``), so a session that returns has lost nothing it was sent. The
responder sends its Finished only after the initiator's and after committing
everything the initiator pushed: a session that returns on the initiator also
means the peer holds what it was sent (done means stored). The initiator never
waits for the responder's Finished before its own, so neither waits for the other.

Received messages must be ones this side learned it lacks (their hash was a
key the peer sent): anything else is :class:`sdk.sync.errors.UnexpectedEntry`
and ends the session. Bad bytes are :class:`sdk.sync.errors.MalformedMessage`,
a bound crossed or a silent peer :class:`sdk.sync.errors.LimitExceeded`;
nothing is stored from a session beyond what was received before the error,
and what was stored is complete, validated messages (ingest decides).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sdk.sds.limits import DEFAULT_LIMITS
from sdk.sync import rbsr
from sdk.sync.errors import LimitExceeded, MalformedMessage, UnexpectedEntry
from sdk.sync.framing import FrameDecoder, encode_frame
from store_node.store_sync import wire
from store_node.store_sync.index import FloorView, key_hash
from transports.base import message_hash, topic_for_channel
from transports.stream import Stream
from transports.tasks import cancel_and_wait

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Bounds on what a peer can make a session hold or wait for."""

    #: One frame (checked on its length prefix).
    max_frame: int = 1024 * 1024
    #: Range messages in one reconciliation round (keys of 41 bytes each).
    max_round_messages: int = 1_000_000
    #: Seconds of silence from the peer before the session is aborted.
    idle_timeout_s: float = 60.0
    #: Largest SDS message accepted.
    max_message_size: int = DEFAULT_LIMITS.max_message_size


@dataclass(frozen=True, slots=True)
class ReconciliationParams:
    """Reconciliation shape (both sides should agree; results stay correct if not).

    b = 4, threshold 4: the fewest bytes per missing message in ``bench/store_sync.py``
    among b, threshold in {4/4, 4/8, 8/8, 16/16, 32/32} (n = 20k), at one or two more
    round trips than b = 16.
    """

    branching: int = 4
    threshold: int = 4


class SyncSide(Protocol):
    """What a session needs of one side's archive."""

    def source(self) -> rbsr.RangeIndex:
        """The side's sync keys (used only inside :meth:`call`)."""
        ...

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` where the source may be used (the index's thread)."""
        ...

    async def load(self, keys: list[bytes]) -> list[tuple[str, bytes]]:
        """``(channel_id, raw SDS bytes)`` for the keys still archived."""
        ...

    async def accept(self, channel_id: str, data: bytes, digest: bytes) -> None:
        """Hand one received message to ingest (waits while ingest is full)."""
        ...

    async def committed(self) -> None:
        """Return once every accepted message is committed (or rejected for good)."""
        ...


@dataclass(slots=True)
class SessionStats:
    """What one session did, for logs, metrics and the benchmark."""

    #: Reconciliation rounds this side sent (the initiator's count is the round trips).
    rounds_sent: int = 0
    rounds_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Messages pushed to the peer / received from it.
    messages_sent: int = 0
    messages_received: int = 0
    #: Raw SDS bytes inside those (the rest of the bytes is protocol overhead).
    message_bytes_sent: int = 0
    message_bytes_received: int = 0
    #: Keys the peer said it lacked that we no longer had when asked (retention).
    unavailable: int = 0
    #: Keys we lacked that the peer never sent.
    not_received: int = 0
    #: The floor both sides used (milliseconds; 0: the whole archive).
    floor_ms: int = 0
    peer: str = field(default="")

    @property
    def overhead_bytes(self) -> int:
        """Bytes both ways that were not SDS message bytes."""
        return (
            self.bytes_sent
            + self.bytes_received
            - self.message_bytes_sent
            - self.message_bytes_received
        )


class _Conn:
    """Frames over a stream, with byte counts and an idle timeout."""

    def __init__(self, stream: Stream, limits: SessionLimits, stats: SessionStats) -> None:
        self._stream = stream
        self._limits = limits
        self._stats = stats
        self._decoder = FrameDecoder(limits.max_frame)
        self._frames: list[bytes] = []

    async def send(self, message: wire.WireMessage) -> None:
        data = encode_frame(wire.encode(message))
        self._stats.bytes_sent += len(data)
        await self._stream.write(data)

    async def recv(self) -> wire.WireMessage:
        while not self._frames:
            try:
                async with asyncio.timeout(self._limits.idle_timeout_s):
                    chunk = await self._stream.read(65536)
            except TimeoutError:
                raise LimitExceeded(f"peer silent for {self._limits.idle_timeout_s} s") from None
            if not chunk:
                raise MalformedMessage("the peer closed the stream mid-session")
            self._stats.bytes_received += len(chunk)
            self._frames.extend(self._decoder.feed(chunk))
        return wire.decode(self._frames.pop(0), max_message_size=self._limits.max_message_size)


async def run_session(
    stream: Stream,
    side: SyncSide,
    *,
    initiator: bool,
    floor_ms: int = 0,
    limits: SessionLimits | None = None,
    params: ReconciliationParams | None = None,
) -> SessionStats:
    """Reconcile ``side`` with the peer at the other end of ``stream``; see the module doc.

    Only messages whose timestamp is at least ``floor_ms`` and the peer's floor
    (each side's retention cutoff or sync window) are reconciled.

    Raises a :class:`sdk.sync.errors.RemoteProtocolError` subclass for a peer's
    bad input or a stall, :class:`transports.stream.StreamClosed` if the stream
    breaks. Does not close the stream.
    """
    limits = limits or SessionLimits()
    params = params or ReconciliationParams()
    stats = SessionStats()
    conn = _Conn(stream, limits, stats)
    await conn.send(wire.Hello(wire.VERSION, floor_ms))
    hello = await conn.recv()
    if not isinstance(hello, wire.Hello):
        raise MalformedMessage(f"expected Hello, got {type(hello).__name__}")
    if hello.version != wire.VERSION:
        raise MalformedMessage(f"peer speaks store-sync version {hello.version}")
    # Both sides leave out what either has given up on (the later floor).
    floor = max(floor_ms, hello.floor_ms)
    stats.floor_ms = floor
    index = side.source()
    source: rbsr.RangeSource = FloorView(index, floor.to_bytes(8, "big")) if floor else index
    reconciler = rbsr.Reconciler(
        source,
        branching=params.branching,
        threshold=params.threshold,
        limits=rbsr.ReconcilerLimits(max_round_messages=limits.max_round_messages),
    )
    # Hashes we learned we lack and expect the peer to push. At most about two
    # rounds' worth are outstanding (the peer pushes right after each answer).
    expected: set[bytes] = set()
    max_expected = 2 * limits.max_round_messages
    # Room for a frame's type byte and length prefix.
    frame_room = limits.max_frame - 8

    async def send_round(messages: list[rbsr.RangeMessage]) -> None:
        for part in wire.split_ranges(messages, frame_room):
            await conn.send(part)
        stats.rounds_sent += 1

    # Pushes go out from their own task, so this loop keeps reading the peer's
    # pushes while ours are written: two sides pushing more than the stream
    # buffers would otherwise both block in write, neither reading. Rounds
    # alternate, so the two loops never write rounds at the same time.
    pushes: asyncio.Queue[list[bytes] | None] = asyncio.Queue()

    async def pusher() -> None:
        while (local := await pushes.get()) is not None:
            for start in range(0, len(local), 500):
                keys = local[start : start + 500]
                found = await side.load(keys)
                stats.unavailable += len(keys) - len(found)
                batch: list[tuple[str, bytes]] = []
                size = 1
                for channel_id, data in found:
                    n = len(channel_id.encode()) + len(data) + 10
                    if batch and size + n > frame_room:
                        await conn.send(wire.Messages(tuple(batch)))
                        batch, size = [], 1
                    batch.append((channel_id, data))
                    size += n
                    stats.messages_sent += 1
                    stats.message_bytes_sent += len(data)
                if batch:
                    await conn.send(wire.Messages(tuple(batch)))
        # Everything learned is pushed: the peer may now finish.
        await conn.send(wire.Finished())

    def take_differences() -> None:
        # After our answer is sent: the peer learns what it lacks before it arrives.
        local, remote = reconciler.take_differences()
        expected.update(key_hash(k) for k in remote)
        if len(expected) > max_expected:
            raise LimitExceeded(f"more than {max_expected} messages outstanding from the peer")
        if local:
            pushes.put_nowait(local)

    async def next_message(pushing: asyncio.Task[None]) -> wire.WireMessage:
        receive = asyncio.ensure_future(conn.recv())
        await asyncio.wait({receive, pushing}, return_when=asyncio.FIRST_COMPLETED)
        if not receive.done() and pushing.exception() is not None:
            await cancel_and_wait([receive])
            raise pushing.exception()  # type: ignore[misc]
        return await receive

    pushing = asyncio.create_task(pusher(), name="store-sync-push")
    try:
        if initiator:
            await send_round(await side.call(reconciler.initiate))
        done_queued = peer_done = False
        pending: list[rbsr.RangeMessage] = []
        while not peer_done:
            if reconciler.finished and not done_queued and initiator:
                pushes.put_nowait(None)
                done_queued = True
            message = await next_message(pushing)
            if isinstance(message, wire.Ranges):
                if reconciler.finished:
                    raise MalformedMessage("a reconciliation round after the end")
                if len(pending) + len(message.items) > limits.max_round_messages:
                    raise LimitExceeded(f"round longer than {limits.max_round_messages} messages")
                pending.extend(message.items)
                if not isinstance(pending[-1], rbsr.Terminal):
                    continue
                if any(isinstance(m, rbsr.Terminal) for m in pending[:-1]):
                    raise MalformedMessage("a Terminal inside a round")
                messages, pending = pending[:-1], []
                stats.rounds_received += 1
                try:
                    reply = await side.call(lambda m=messages: reconciler.receive_round(m))  # type: ignore[misc]
                except rbsr.ReconcileError as exc:
                    raise MalformedMessage(f"reconciliation: {exc}") from exc
                if reply:
                    await send_round(reply)
                take_differences()
            elif isinstance(message, wire.Messages):
                for channel_id, data in message.items:
                    digest = message_hash(topic_for_channel(channel_id), data)
                    if digest not in expected:
                        raise UnexpectedEntry("a message whose key was not offered")
                    expected.discard(digest)
                    stats.messages_received += 1
                    stats.message_bytes_received += len(data)
                    await side.accept(channel_id, data, digest)
            elif isinstance(message, wire.Finished):
                if not reconciler.finished:
                    raise MalformedMessage("Finished before reconciliation finished")
                peer_done = True
            else:
                raise MalformedMessage("a second Hello")
        if not done_queued:
            if not initiator:
                # Our Finished tells the initiator that what it pushed is committed here.
                await side.committed()
            pushes.put_nowait(None)
        await pushing
    finally:
        await cancel_and_wait([pushing])
    stats.not_received = len(expected)
    await side.committed()
    return stats


__all__ = [
    "ReconciliationParams",
    "SessionLimits",
    "SessionStats",
    "SyncSide",
    "run_session",
]
