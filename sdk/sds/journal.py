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

:func:`replay` applies drained changes to a fresh channel through the same
components (local log, filter, buffers, SDS-R cache) the live channel used, so
``export_snapshot`` of the two is equal: the property the tests check.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdk.sds.incoming import PendingMessage
from sdk.sds.message import HistoryEntry, decode_message
from sdk.sds.outgoing import OutgoingEntry, OutgoingState
from sdk.sds.records import fast_init

if TYPE_CHECKING:
    from sdk.sds.channel import MessageChannel


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
class OutgoingSaved(Change):
    """An outgoing-buffer entry was added or changed (resend schedule, attempts,
    acknowledgement state)."""

    message_id: str
    data: bytes
    next_resend_at: int
    attempts: int
    state: OutgoingState
    filter_hits: tuple[str, ...]


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


def outgoing_saved(entry: OutgoingEntry) -> OutgoingSaved:
    """The change recording ``entry`` as it is now."""
    return OutgoingSaved(
        entry.message_id,
        entry.data,
        entry.next_resend_at,
        entry.attempts,
        entry.state,
        tuple(sorted(entry.filter_hits)) if entry.filter_hits else (),
    )


def replay(channel: MessageChannel, changes: Iterable[Change]) -> None:
    """Apply drained ``changes`` to ``channel`` (fresh, same id and participant) through
    the components the live channel used, so both export the same snapshot.

    Nothing is sent and no event is queued.
    """
    cfg = channel.config
    log = channel.log
    for change in changes:
        if isinstance(change, Logged):
            log.add(
                change.message_id,
                change.lamport_timestamp,
                change.sender_id,
                change.retrieval_hint,
            )
            if change.references:
                log.mark_referenced(change.references)
            if channel.repair is not None:
                channel.repair.cache(
                    change.message_id, change.sender_id, change.data, change.logged_at
                )
        elif isinstance(change, HintSet):
            log.set_retrieval_hint(change.message_id, change.retrieval_hint)
        elif isinstance(change, ClockAdvanced):
            channel.clock.observe(change.lamport_timestamp)
        elif isinstance(change, HeadsChanged):
            log.restore_references(change.heads, change.referenced)
        elif isinstance(change, OutgoingSaved):
            # Replaces an existing entry in place: the buffer keeps send order.
            channel.outgoing.add(
                OutgoingEntry(
                    change.message_id,
                    change.data,
                    None,
                    change.next_resend_at,
                    change.attempts,
                    change.state,
                    set(change.filter_hits),
                    cfg.bloom.error_rate ** len(change.filter_hits),
                )
            )
        elif isinstance(change, OutgoingRemoved):
            channel.outgoing.remove(change.message_id)
        elif isinstance(change, IncomingAdded):
            message = decode_message(change.data, cfg.limits)
            unmet = log.not_logged(e.message_id for e in message.causal_history)
            channel.incoming.add(
                PendingMessage(
                    message, change.data, change.retrieval_hint, change.received_at, unmet
                )
            )
        elif isinstance(change, IncomingRemoved):
            channel.incoming.discard(change.message_id)
        elif isinstance(change, MissingSaved):
            channel.restore_dependency_state([(change.entry, change.first_seen)], (), 0)
        elif isinstance(change, MissingRemoved):
            channel._missing.pop(change.message_id, None)
        elif isinstance(change, LostAdded):
            channel.restore_dependency_state((), (change.message_id,), 0)
        elif isinstance(change, LostRemoved):
            channel._lost.discard(change.message_id)
        elif isinstance(change, FilterInserted):
            channel.bloom.insert(change.message_id)
        else:  # pragma: no cover - every change type is handled above
            raise TypeError(f"unknown change {change!r}")
