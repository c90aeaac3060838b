"""The local log: every delivered message id of a channel, ordered by
``(lamport_timestamp, message_id)`` (specs/sds.md, "Deliver Message" and
"Resolve Conflicts": equal timestamps order by ascending message id).

Membership is O(1) (a dict), insertion is a binary search plus a memmove, and
the most recent entries are at the end.

Which "preceding few message IDs" go into a causal history (specs/sds.md,
"Send Message") is left to the implementation. Taking only the last ``n``
entries in log order loses messages under concurrency: a message that is never
among anyone's last ``n`` when they send is never referenced, so a participant
that missed it never learns it is missing. Chorus therefore prefers *heads*:
logged messages no content message has referenced yet (oldest first), and fills
the rest with the most recent entries. Heads are sampled at random so concurrent
senders reference different ones, and sync messages (rare, sent only when the
channel is idle) carry more of them. Every message then ends up referenced,
and gaps are always detectable.

Only the most recent ``window`` entries (``ChannelConfig.log_window``) stay in
memory, plus the heads among older ones; the rest leave for a
:class:`~sdk.sds.archive.LogArchive` (in the runtime, the database that has them
already). Entries leave from the front of the log order, so a message whose key
``(lamport_timestamp, message_id)`` is above every key that ever left is
delivered exactly when it is in memory: a new message's duplicate check never
asks the archive. An id without a timestamp (a causal-history reference) is
asked for only when it is not in memory.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sdk.sds.archive import LogArchive
from sdk.sds.message import HistoryEntry, history_field


@dataclass(slots=True)
class LogEntry:
    """What the log keeps per message."""

    lamport_timestamp: int
    sender_id: str
    #: Reference to this message as it goes into causal histories.
    history_entry: HistoryEntry


class LocalLog:
    """Ordered, deduplicated message ids of one channel."""

    __slots__ = (
        "_archive",
        "_entries",
        "_evicted_heads",
        "_fields",
        "_floor",
        "_heads",
        "_history",
        "_ids",
        "_lazy_from",
        "_max_heads",
        "_order",
        "_referenced",
        "_window",
        "_with_sender",
    )

    def __init__(
        self,
        *,
        with_sender: bool,
        window: int | None = None,
        archive: LogArchive | None = None,
        max_heads: int | None = None,
    ) -> None:
        self._order: list[tuple[int, str]] = []
        # Each entry's HistoryEntry at the same index as its key in ``_order``, so the
        # usual causal history (the most recent entries) is one slice.
        self._history: list[HistoryEntry] = []
        # And each entry's id, so the usual history's ids are one slice too.
        self._ids: list[str] = []
        # And each one encoded as a causal-history field, so the usual history is
        # written into a message with one join. Encoded when first sent: entries
        # from ``_lazy_from`` on may still be ``None`` (most received messages are
        # never in one of our histories, and ours get their retrieval hint just
        # after they are logged).
        self._fields: list[bytes | None] = []
        self._lazy_from = 0
        self._entries: dict[str, LogEntry] = {}
        # Logged ids no content message has referenced yet, in arrival order.
        self._heads: dict[str, None] = {}
        # Ids referenced before they were logged (delivered out of order after a gap).
        self._referenced: set[str] = set()
        # SDS-R needs the original sender in history entries; plain SDS omits it.
        self._with_sender = with_sender
        # Entries kept in memory (None: all) and where older ones are looked up.
        self._window = window
        self._archive = archive
        # The greatest key that ever left the window (None: none left).
        self._floor: tuple[int, str] | None = None
        # Heads that left the window: still in ``_entries`` until referenced.
        self._evicted_heads: set[str] = set()
        # At most this many heads (None: no bound); the oldest stop being heads.
        self._max_heads = max_heads

    def __contains__(self, message_id: object) -> bool:
        """Whether ``message_id`` is logged and in memory (the archive is not asked)."""
        return message_id in self._entries

    def has(self, message_id: str, lamport_timestamp: int) -> bool:
        """Whether a message with this id and timestamp was delivered, asking the
        archive only when its key is at or below one that left the window."""
        if message_id in self._entries:
            return True
        floor = self._floor
        if floor is None or (lamport_timestamp, message_id) > floor or self._archive is None:
            return False
        return bool(self._archive.delivered({message_id}))

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        message_id: str,
        lamport_timestamp: int,
        sender_id: str,
        retrieval_hint: bytes | None = None,
    ) -> None:
        """Insert a delivered message (no-op if present)."""
        if message_id in self._entries:
            return
        key = (lamport_timestamp, message_id)
        order = self._order
        history_entry = HistoryEntry(
            message_id, retrieval_hint, sender_id if self._with_sender else None
        )
        if not order or order[-1] < key:
            order.append(key)
            self._ids.append(message_id)
            self._history.append(history_entry)
            self._fields.append(None)  # _lazy_from <= its index already
        else:
            at = bisect.bisect_left(order, key)
            order.insert(at, key)
            self._ids.insert(at, message_id)
            self._history.insert(at, history_entry)
            self._fields.insert(at, None)
            if self._lazy_from > at:
                self._lazy_from = at
        self._entries[message_id] = LogEntry(lamport_timestamp, sender_id, history_entry)
        if message_id in self._referenced:
            self._referenced.discard(message_id)
        else:
            self._heads[message_id] = None
            if self._max_heads is not None and len(self._heads) > self._max_heads:
                self._drop_oldest_heads()
        window = self._window
        # Leave in slices of window/16: one memmove per slice, not per message.
        if window is not None and len(order) > window + (window >> 4):
            self._evict(len(order) - window)

    def _evict(self, count: int) -> None:
        """Move the ``count`` oldest entries out of memory (heads stay until referenced)."""
        order = self._order
        gone = order[:count]
        del order[:count], self._ids[:count], self._history[:count], self._fields[:count]
        self._lazy_from = max(0, self._lazy_from - count)
        if self._floor is None or gone[-1] > self._floor:
            self._floor = gone[-1]
        entries, heads = self._entries, self._heads
        ids = [mid for _, mid in gone]
        for mid in ids:
            if mid in heads:
                self._evicted_heads.add(mid)
            else:
                del entries[mid]
        if self._archive is not None:
            self._archive.evicted(ids)

    def _drop_oldest_heads(self) -> None:
        """Past ``max_heads``, the oldest heads are no longer heads (as if referenced):
        a peer flooding unreferenced messages cannot grow memory, or the cost of
        choosing heads, without bound. Those older than the window leave memory."""
        heads, evicted = self._heads, self._evicted_heads
        assert self._max_heads is not None
        while len(heads) > self._max_heads:
            mid = next(iter(heads))
            del heads[mid]
            if mid in evicted:
                evicted.discard(mid)
                del self._entries[mid]

    def forget_references(self, message_ids: Iterable[str]) -> None:
        """Stop remembering these ids as referenced before they were logged (they were
        lost, and are forgotten: ``ChannelConfig.max_lost``); logged later, one is a head."""
        self._referenced.difference_update(message_ids)

    def mark_referenced(self, message_ids: Iterable[str], *, all_logged: bool = False) -> None:
        """Ids in the causal history of a content message delivered or sent: no longer heads.

        ``all_logged``: the caller knows every one of them is in the log (none is
        remembered as referenced before it was logged), which saves a lookup each.
        """
        heads = self._heads
        if all_logged and not heads:
            return  # nothing to do: no set to build
        ids = message_ids if isinstance(message_ids, set) else set(message_ids)
        if not ids:
            return
        if heads:
            for mid in [h for h in heads if h in ids] if len(heads) < len(ids) else ids:
                heads.pop(mid, None)
            if self._evicted_heads:
                for mid in self._evicted_heads.intersection(ids):
                    self._evicted_heads.discard(mid)
                    del self._entries[mid]
        if all_logged:
            return
        unlogged = self.not_logged(ids)
        if unlogged:
            self._referenced |= unlogged

    def not_logged(self, message_ids: Iterable[str]) -> set[str]:
        """Those of ``message_ids`` that are not in the log."""
        ids = message_ids if isinstance(message_ids, set) else set(message_ids)
        unknown = ids.difference(self._entries)
        if unknown and self._floor is not None and self._archive is not None:
            unknown -= self._archive.delivered(unknown)
        return unknown

    def set_retrieval_hint(self, message_id: str, retrieval_hint: bytes) -> bool:
        """Attach a retrieval hint to a logged message; False if unknown."""
        entry = self._entries.get(message_id)
        if entry is None:
            return False
        old = entry.history_entry
        entry.history_entry = HistoryEntry(message_id, retrieval_hint, old.sender_id)
        key = (entry.lamport_timestamp, message_id)
        at = bisect.bisect_left(self._order, key)
        if at == len(self._order) or self._order[at] != key:
            return True  # a head that left the window: its entry alone holds the hint
        self._history[at] = entry.history_entry
        self._fields[at] = None
        if self._lazy_from > at:
            self._lazy_from = at
        return True

    def get(self, message_id: str) -> LogEntry | None:
        """The entry of a logged message."""
        return self._entries.get(message_id)

    def causal_history(
        self, n: int, rng: random.Random, *, heads: int | None = None
    ) -> tuple[HistoryEntry, ...]:
        """Entries to send as causal history, in log order.

        Up to ``heads`` (default ``n``) heads, chosen at random so that
        concurrent senders reference different ones, then the most recent
        entries until there are ``n`` (see the module docstring).
        """
        return self._select(n, rng, heads)[0]

    def causal_history_encoded(
        self, n: int, rng: random.Random, *, heads: int | None = None
    ) -> tuple[tuple[HistoryEntry, ...], list[str], bytes]:
        """:meth:`causal_history`, its message ids, and the same entries encoded as a
        message's ``causal_history`` fields (:func:`~sdk.sds.message.history_field`,
        joined)."""
        entries, tail = self._select(n, rng, heads)
        if tail:
            fields = self._fields
            if self._lazy_from < len(fields):
                self._encode_fields()
            return entries, self._ids[-tail:], b"".join(fields[-tail:])  # type: ignore[arg-type]
        return entries, [e.message_id for e in entries], b"".join(map(history_field, entries))

    def _encode_fields(self) -> None:
        """Encode every entry not encoded yet (each is encoded once, as before it
        was done at :meth:`add`)."""
        fields, history = self._fields, self._history
        for i in range(self._lazy_from, len(fields)):
            if fields[i] is None:
                fields[i] = history_field(history[i])
        self._lazy_from = len(fields)

    def _select(
        self, n: int, rng: random.Random, heads: int | None
    ) -> tuple[tuple[HistoryEntry, ...], int]:
        """The causal history, and its length when it is the log's last entries (else 0)."""
        limit = n if heads is None else heads
        order = self._order
        if limit <= 0 or not order:
            return (), 0
        entries = self._entries
        head_ids = self._heads
        if not head_ids:
            recent = tuple(self._history[-n:]) if n > 0 else ()
            return recent, len(recent)
        chosen = list(head_ids) if len(head_ids) <= limit else rng.sample(list(head_ids), limit)
        if n > 0:
            # The most recent n entries are the tail of the sorted order: when every
            # chosen head is in it (the usual case), they are the history.
            first = order[max(0, len(order) - n)]
            for mid in chosen:  # a loop, not all(): one or two heads, once per send
                if (entries[mid].lamport_timestamp, mid) < first:
                    break
            else:
                recent = tuple(self._history[-n:])
                return recent, len(recent)
        chosen_set = set(chosen)
        keys = [(entries[mid].lamport_timestamp, mid) for mid in chosen]
        fill = max(0, n - len(keys))
        if fill:
            extra = [k for k in order[-(fill + len(chosen)) :] if k[1] not in chosen_set]
            keys.extend(extra[-fill:])
        keys.sort()
        return tuple([entries[mid].history_entry for _, mid in keys]), 0

    def heads(self) -> list[str]:
        """Logged ids not yet referenced by any content message."""
        return list(self._heads)

    def referenced_unlogged(self) -> list[str]:
        """Ids referenced before they were logged (for persistence), sorted: a set's
        order depends on its history, so a restored log would list them differently."""
        return sorted(self._referenced)

    def restore_references(self, heads: Iterable[str], referenced: Iterable[str]) -> None:
        """Reinstate the heads and early references saved with :meth:`heads` and
        :meth:`referenced_unlogged` after re-adding the entries (snapshot restore)."""
        entries = self._entries
        self._heads = {mid: None for mid in heads if mid in entries}
        self._referenced = {mid for mid in referenced if mid not in entries}
        for mid in [m for m in self._evicted_heads if m not in self._heads]:
            self._evicted_heads.discard(mid)
            del entries[mid]
        if self._max_heads is not None and len(self._heads) > self._max_heads:
            self._drop_oldest_heads()

    def newest(self, n: int) -> list[tuple[int, str]]:
        """The last ``n`` ``(lamport_timestamp, message_id)`` keys in log order."""
        return self._order[-n:] if n > 0 else []

    def between(self, after: int, upto: int) -> list[tuple[int, str]]:
        """The ``(lamport_timestamp, message_id)`` keys with ``after < lamport <= upto``,
        in log order."""
        order = self._order
        lo = bisect.bisect_right(order, (after, "\U0010ffff"))
        hi = bisect.bisect_right(order, (upto, "\U0010ffff"))
        return order[lo:hi]

    def newest_from(
        self, sender_id: str, before: int | None, scan: int
    ) -> tuple[int | None, int | None]:
        """The Lamport time of ``sender_id``'s newest logged message older than
        ``before`` (``None``: any) among the ``scan`` entries before it, and the
        oldest Lamport time looked at when none was found there (``None`` when
        the log was read to its start)."""
        order = self._order
        entries = self._entries
        end = len(order) if before is None else bisect.bisect_left(order, (before, ""))
        stop = max(0, end - scan)
        for i in range(end - 1, stop - 1, -1):
            lamport, mid = order[i]
            if entries[mid].sender_id == sender_id:
                return lamport, None
        return None, (order[stop][0] if stop else None)

    def ids(self) -> list[str]:
        """Every message id in memory, in log order."""
        return [mid for _, mid in self]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """The keys in memory (the window and the heads older than it), in log order."""
        if not self._evicted_heads:
            return iter(self._order)
        entries = self._entries
        old = [(entries[mid].lamport_timestamp, mid) for mid in self._evicted_heads]
        return iter(sorted(self._order + old))

    def restore_floor(self, floor: tuple[int, str]) -> None:
        """After a restore from part of the log: keys up to ``floor`` are the archive's."""
        if self._floor is None or floor > self._floor:
            self._floor = floor

    @property
    def floor(self) -> tuple[int, str] | None:
        """The greatest key that left the window (``None`` while all are in memory)."""
        return self._floor
