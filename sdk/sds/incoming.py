"""The incoming buffer: messages whose causal dependencies are not all in the
local log yet (specs/sds.md, "Receive Message", "Periodic Incoming Buffer Sweep").

Dependency lookup is O(1): besides the waiting messages, the buffer indexes
them by each missing dependency, so delivering one message finds exactly the
messages it unblocks without scanning the buffer. It also counts the bytes it
holds, in all and per sender, so the channel can bound both (a peer controls
how much it makes us hold).
"""

from __future__ import annotations

from dataclasses import dataclass

from sdk.sds.message import Message


@dataclass(slots=True)
class PendingMessage:
    """A received content message waiting for dependencies."""

    message: Message
    data: bytes
    retrieval_hint: bytes | None
    received_at: int
    #: Dependency ids not yet delivered (nor declared lost).
    unmet: set[str]


class IncomingBuffer:
    """Waiting messages by id, and by each unmet dependency."""

    __slots__ = ("_by_dependency", "_by_sender", "_waiting", "bytes_held")

    def __init__(self) -> None:
        self._waiting: dict[str, PendingMessage] = {}
        self._by_dependency: dict[str, set[str]] = {}
        self._by_sender: dict[str, int] = {}
        #: Encoded bytes of every waiting message.
        self.bytes_held = 0

    def bytes_from(self, sender_id: str) -> int:
        """Encoded bytes of the waiting messages of one sender."""
        return self._by_sender.get(sender_id, 0)

    def _count(self, pending: PendingMessage, sign: int) -> None:
        size = sign * len(pending.data)
        self.bytes_held += size
        sender = pending.message.sender_id
        left = self._by_sender.get(sender, 0) + size
        if left:
            self._by_sender[sender] = left
        else:
            self._by_sender.pop(sender, None)

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._waiting

    def add(self, pending: PendingMessage) -> None:
        """Hold a message until its ``unmet`` dependencies are resolved."""
        mid = pending.message.message_id
        old = self._waiting.get(mid)
        if old is not None:
            self._count(old, -1)
        self._waiting[mid] = pending
        self._count(pending, 1)
        for dep in pending.unmet:
            self._by_dependency.setdefault(dep, set()).add(mid)

    def resolve(self, dependency_id: str) -> list[PendingMessage]:
        """A dependency was delivered (or declared lost): return the messages it made ready.

        Ready messages are removed from the buffer.
        """
        waiting_ids = self._by_dependency.pop(dependency_id, None)
        if not waiting_ids:
            return []
        ready = []
        for mid in waiting_ids:
            pending = self._waiting[mid]
            pending.unmet.discard(dependency_id)
            if not pending.unmet:
                del self._waiting[mid]
                self._count(pending, -1)
                ready.append(pending)
        return ready

    def get(self, message_id: str) -> PendingMessage | None:
        """A waiting message by id."""
        return self._waiting.get(message_id)

    def discard(self, message_id: str) -> PendingMessage | None:
        """Remove a waiting message (and its index entries)."""
        pending = self._waiting.pop(message_id, None)
        if pending is not None:
            self._count(pending, -1)
            for dep in pending.unmet:
                waiting = self._by_dependency.get(dep)
                if waiting is not None:
                    waiting.discard(message_id)
                    if not waiting:
                        del self._by_dependency[dep]
        return pending

    def is_awaited(self, dependency_id: str) -> bool:
        """Whether some buffered message waits for ``dependency_id``."""
        return dependency_id in self._by_dependency

    def earliest_waiting(self, dependency_id: str) -> int | None:
        """The lowest Lamport time of the messages waiting for ``dependency_id``
        (the dependency is older than each of them), or ``None``."""
        waiting = self._by_dependency.get(dependency_id)
        if not waiting:
            return None
        return min(self._waiting[mid].message.lamport_timestamp or 0 for mid in waiting)

    def pending(self) -> list[PendingMessage]:
        """Every waiting message (for persistence and inspection)."""
        return list(self._waiting.values())
