"""One store-sync session between two store nodes over a reliable stream.

The protocol is the machine in :mod:`store_node.store_sync.machine` (its
docstring is the theory of operation); this module runs it on the sync layer's
one driver (:func:`sdk.sync.run.run_machine`) and carries out its requests
against one side's archive (:class:`SyncSide`): the reconciler's steps on the
index's thread, loads, ingest and its commits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sdk.sync import rbsr
from sdk.sync.run import now_ms, run_machine
from store_node.store_sync.index import FloorView, key_hash
from store_node.store_sync.machine import (
    Accept,
    Commit,
    Load,
    Round,
    RoundResult,
    SessionLimits,
    SessionStats,
    Start,
    StoreSyncMachine,
)
from transports.stream import Stream

T = TypeVar("T")


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


async def run_session(
    stream: Stream,
    side: SyncSide,
    *,
    initiator: bool,
    floor_ms: int = 0,
    limits: SessionLimits | None = None,
    params: ReconciliationParams | None = None,
) -> SessionStats:
    """Reconcile ``side`` with the peer at the other end of ``stream`` above ``floor_ms``
    and the peer's floor; see :mod:`store_node.store_sync.machine`.

    Raises a :class:`sdk.sync.errors.RemoteProtocolError` subclass for a peer's
    bad input or a stall, :class:`transports.stream.StreamClosed` if the stream
    breaks. Does not close the stream.
    """
    machine = StoreSyncMachine(initiator=initiator, now=now_ms(), floor_ms=floor_ms, limits=limits)
    params = params or ReconciliationParams()
    # Reads the side's index, so it is used only inside ``side.call``.
    reconciler: rbsr.Reconciler | None = None

    def step(request: Start | Round) -> RoundResult:
        """A reconciler step and the differences it found (inside ``side.call``)."""
        nonlocal reconciler
        if isinstance(request, Start):
            index = side.source()
            floor = request.floor_ms
            reconciler = rbsr.Reconciler(
                FloorView(index, floor.to_bytes(8, "big")) if floor else index,
                branching=params.branching,
                threshold=params.threshold,
            )
            reply = reconciler.initiate() if request.initiate else []
        else:
            assert reconciler is not None
            try:
                reply = reconciler.receive_round(request.messages)
            except rbsr.ReconcileError as exc:
                return RoundResult([], [], [], False, error=str(exc))
        local, remote = reconciler.take_differences()
        return RoundResult(reply, local, [key_hash(k) for k in remote], reconciler.finished)

    async def perform(request: Any) -> Any:
        """Carry out one of the machine's requests against ``side``; its result."""
        if isinstance(request, Start | Round):
            return await side.call(lambda: step(request))
        if isinstance(request, Load):
            return await side.load(list(request.keys))
        if isinstance(request, Accept):
            for channel_id, data, digest in request.items:
                await side.accept(channel_id, data, digest)
        elif isinstance(request, Commit):
            await side.committed()
        else:
            raise TypeError(f"not a store-sync request: {request!r}")
        return None

    await run_machine(machine, stream, perform)
    return machine.stats


__all__ = ["ReconciliationParams", "SessionLimits", "SessionStats", "SyncSide", "run_session"]
