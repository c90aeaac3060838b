"""The local log beyond the in-memory window: the seam between the core and durable history.

The core keeps the most recent ``ChannelConfig.log_window`` entries of the local
log in memory (causal histories come from them, and almost every dependency
check is answered by them). Older entries are the runtime's, which has them on
disk anyway; the core asks it, through a :class:`LogArchive`, the two questions
only old history answers:

* was this id delivered? (a dependency, or a duplicate, older than the window);
* what were this message's bytes? (an SDS-R repair request for a message that
  left the repair cache, or a peer's sync lacking such a message: our own, or
  one we answer as backup, at most ``ChannelConfig.offer_archive_reads`` per sync).

The core calls the archive synchronously and only on a miss of its own memory,
at most once per received message for its unknown dependencies, once per
repair request for an id it may hold (not one of another response group or one
the archive lacked already, and at most ``ARCHIVE_READS_PER_T_MIN`` per ``T_min``:
``sdk.sds.repair``) and ``offer_archive_reads`` times per peer's sync; an archive
answers from an index (``sdk.runtime.persistence`` looks rows up by id) or from
memory. Without one, :class:`MemoryArchive` keeps
the ids that left the window (ids only: no message bytes).

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Protocol

__all__ = ["LogArchive", "MemoryArchive"]


class LogArchive(Protocol):
    """Where the core looks up local-log entries older than its window."""

    def delivered(self, message_ids: Set[str]) -> set[str]:
        """Those of ``message_ids`` that are in the local log."""

    def message(self, message_id: str) -> tuple[str, bytes] | None:
        """``(sender_id, encoded message)`` of a logged message, or ``None``."""

    def evicted(self, message_ids: Iterable[str]) -> None:
        """The window dropped these ids (they were logged, and journaled, before)."""


class MemoryArchive:
    """The default archive: the ids that left the window, in memory.

    Bounds the log's memory to one string per message; a bounded core needs an
    archive backed by storage (the runtime's).
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def delivered(self, message_ids: Set[str]) -> set[str]:
        """Those of ``message_ids`` that left the window."""
        return self._ids.intersection(message_ids)

    def message(self, message_id: str) -> tuple[str, bytes] | None:
        """Message bytes are not kept: always ``None``."""
        return None

    def evicted(self, message_ids: Iterable[str]) -> None:
        """Remember ``message_ids`` as delivered."""
        self._ids.update(message_ids)

    def __len__(self) -> int:
        return len(self._ids)
