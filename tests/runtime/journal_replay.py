"""Replaying a channel's drained journal (``sdk.sds.journal``) into a fresh channel:
the oracle of tests/runtime/test_journal.py. It lives with the tests (no runtime
replays a journal: a restart restores the snapshot the journal was written to),
which keeps the core free of an import circle between channel and journal."""

from __future__ import annotations

from collections.abc import Iterable

from sdk.sds.channel import MessageChannel
from sdk.sds.incoming import PendingMessage
from sdk.sds.journal import (
    Change,
    ClockAdvanced,
    FilterInserted,
    HeadsChanged,
    HintSet,
    IncomingAdded,
    IncomingRemoved,
    Logged,
    LostAdded,
    LostRemoved,
    MissingRemoved,
    MissingSaved,
    OutgoingRemoved,
    OutgoingSaved,
)
from sdk.sds.message import decode_message
from sdk.sds.outgoing import OutgoingEntry


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
            channel._lost.pop(change.message_id, None)
        elif isinstance(change, FilterInserted):
            channel.bloom.insert(change.message_id)
        else:  # pragma: no cover - every change type is handled above
            raise TypeError(f"unknown change {change!r}")
