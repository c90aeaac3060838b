"""The durable changes a :class:`~sdk.sds.MessageChannel` makes, as an append-only journal.

Theory of operation
-------------------
Everything a participant must keep across a restart (``sdk.sds.snapshot``'s
list) changes only inside the core. With ``MessageChannel(..., journal=True)``
the core appends one small typed record per durable change, at the place the
change is made, and :meth:`~sdk.sds.MessageChannel.drain_changes` hands them
over in order. A runtime writes exactly those (one transaction per batch) and
never mirrors or re-derives core state: the rules stay in the core.

Two facts are added when the journal is drained rather than at every step,
because they change on paths that carry nothing else durable: the Lamport
clock (:class:`ClockAdvanced`) and the log's heads and early references
(:class:`HeadsChanged`), each only when different from the last drain.

The tests check the journal is complete by replaying drained changes into a
fresh channel (``tests/runtime/journal_replay.py``): ``export_snapshot`` of the
two is equal.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdk.sds.message import HistoryEntry
from sdk.sds.outgoing import OutgoingRecord
from sdk.sds.records import fast_init


@dataclass(frozen=True, slots=True)
class Change:
    """Base class of every durable change."""


@dataclass(frozen=True, slots=True)
class Logged(Change):
    """A message entered the local log: one we sent (``own``) or one delivered.

    ``references`` are the ids of its causal history (they stop being heads);
    ``data`` its encoding, kept for history, replay and the SDS-R cache;
    ``logged_at`` when (the SDS-R cache keeps entries by age; ``None``: long ago).
    """

    message_id: str
    lamport_timestamp: int
    sender_id: str
    retrieval_hint: bytes | None
    data: bytes
    references: tuple[str, ...]
    own: bool
    logged_at: int | None = None


@dataclass(frozen=True, slots=True)
class HintSet(Change):
    """A logged message's retrieval hint was set."""

    message_id: str
    retrieval_hint: bytes


@dataclass(frozen=True, slots=True)
class ClockAdvanced(Change):
    """The Lamport clock's value at the drain."""

    lamport_timestamp: int


@dataclass(frozen=True, slots=True)
class HeadsChanged(Change):
    """The local log's heads and ids referenced before they were logged, at the drain."""

    heads: tuple[str, ...]
    referenced: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OutgoingSaved(OutgoingRecord, Change):
    """An outgoing-buffer entry was added or changed (resend schedule, attempts,
    acknowledgement state): its fields as :meth:`OutgoingRecord.of` saves them."""


@dataclass(frozen=True, slots=True)
class OutgoingRemoved(Change):
    """An entry left the outgoing buffer: ``outcome`` is ``"acknowledged"``,
    ``"expired:<attempts>"`` or ``"failed:<error>"``."""

    message_id: str
    outcome: str


@dataclass(frozen=True, slots=True)
class IncomingAdded(Change):
    """A received message now waits in the incoming buffer for dependencies."""

    message_id: str
    data: bytes
    retrieval_hint: bytes | None
    received_at: int


@dataclass(frozen=True, slots=True)
class IncomingRemoved(Change):
    """A message left the incoming buffer (delivered or replaced)."""

    message_id: str


@dataclass(frozen=True, slots=True)
class MissingSaved(Change):
    """A dependency is missing since ``first_seen`` (added, or its entry got a hint)."""

    entry: HistoryEntry
    first_seen: int


@dataclass(frozen=True, slots=True)
class MissingRemoved(Change):
    """A dependency is no longer missing (it arrived or was declared lost)."""

    message_id: str


@dataclass(frozen=True, slots=True)
class LostAdded(Change):
    """A dependency was declared irretrievably lost."""

    message_id: str


@dataclass(frozen=True, slots=True)
class LostRemoved(Change):
    """A message declared lost arrived after all."""

    message_id: str


@dataclass(frozen=True, slots=True)
class FilterInserted(Change):
    """A received id went into the bloom filter (its rollover window is durable)."""

    message_id: str


# A few are built per message: see sdk/sds/records.py.
fast_init(*[c for c in list(globals().values()) if isinstance(c, type) and issubclass(c, Change)])
