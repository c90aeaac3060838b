"""The outgoing buffer: our messages not yet acknowledged (specs/sds.md,
"Participant state", "Review ACK Status", "Periodic Outgoing Buffer Sweep").

States: *unacknowledged* (no sign of receipt), *possibly acknowledged* (the id
is in some peers' bloom filters), *acknowledged* (in a peer's causal history,
or in enough peers' filters); acknowledged messages leave the buffer.

"Enough" is derived from the filters themselves (specs/sds.md, "Review ACK
Status": "taking into account the bloom filter size and hash number"). A hit
in a filter whose bits are a fraction ``f`` set is false with probability
``f ** k``; hits from distinct peers multiply, and the message counts as
acknowledged once that product is at most ``ack_false_positive_target``. A
full ``waku`` filter (0.1 %) then needs two peers, as the reference's default
threshold; a sparse filter, as in a small or quiet group, settles it alone.

A group cannot give more evidence than it has peers: once every peer seen
recently (``peers``, counted by the channel) has the id in its filter, the
message is acknowledged too. A two-person channel has one peer, so one hit
settles it; a three-person channel needs both others. Without this rule a
full ``compact`` filter (1 %) needed three peers and small groups resent and
expired messages every peer had delivered. The product
treats peers as independent; peers that hold the same ids share false
positives, which makes it optimistic for full filters. A wrongly acknowledged
message is still referenced as a head by whoever has it, so participants that
lack it detect the gap and fetch it.

Unacknowledged messages are resent every ``resend_interval_ms``,
possibly acknowledged ones on the longer ``possibly_acked_resend_interval_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Self

from sdk.sds.bloom import BloomProfile, Positions, contains


class OutgoingState(Enum):
    """Acknowledgement state of a buffered outgoing message."""

    UNACKNOWLEDGED = "unacknowledged"
    POSSIBLY_ACKNOWLEDGED = "possibly_acknowledged"


@dataclass(slots=True)
class OutgoingEntry:
    """One buffered outgoing message."""

    message_id: str
    data: bytes
    #: Where the id's bits are in a peer's filter (``send`` hashes them anyway;
    #: ``None``: computed on first use).
    positions: Positions | None
    next_resend_at: int
    attempts: int = 0
    state: OutgoingState = OutgoingState.UNACKNOWLEDGED
    #: Distinct peers whose filters contained the id.
    filter_hits: set[str] = field(default_factory=set)
    #: Probability that every hit so far was a false positive.
    false_ack: float = 1.0


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """The saved fields of one outgoing-buffer entry (one of our unacknowledged
    messages): a snapshot's record, and what the journal's ``OutgoingSaved`` carries."""

    message_id: str
    data: bytes
    next_resend_at: int
    attempts: int = 0
    state: OutgoingState = OutgoingState.UNACKNOWLEDGED
    filter_hits: tuple[str, ...] = ()

    @classmethod
    def of(cls, entry: OutgoingEntry) -> Self:
        """``entry`` as it is now."""
        hits = tuple(sorted(entry.filter_hits)) if entry.filter_hits else ()
        return cls(
            entry.message_id, entry.data, entry.next_resend_at, entry.attempts, entry.state, hits
        )


class OutgoingBuffer:
    """Buffered outgoing messages by id, in send order."""

    __slots__ = ("_entries", "profile", "target")

    def __init__(self, target: float, profile: BloomProfile) -> None:
        self._entries: dict[str, OutgoingEntry] = {}
        #: Tolerated probability of a false acknowledgement by filters.
        self.target = target
        self.profile = profile

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._entries

    def __iter__(self) -> Iterator[OutgoingEntry]:
        return iter(self._entries.values())

    def add(self, entry: OutgoingEntry) -> None:
        """Buffer a message just broadcast."""
        self._entries[entry.message_id] = entry

    def get(self, message_id: str) -> OutgoingEntry | None:
        """A buffered entry by id."""
        return self._entries.get(message_id)

    def remove(self, message_id: str) -> OutgoingEntry | None:
        """Drop an entry (acknowledged or expired)."""
        return self._entries.pop(message_id, None)

    def acknowledge_history(
        self, history_ids: Iterable[str], id_set: set[str] | None = None
    ) -> list[str]:
        """Mark every buffered id in a causal history acknowledged; return those removed.

        ``id_set``, when the caller has it, is ``set(history_ids)`` (not built again).
        """
        entries = self._entries
        if not entries:
            return []
        ids = history_ids if isinstance(history_ids, (set, list, tuple)) else list(history_ids)
        if len(entries) < len(ids):
            idset = id_set if id_set is not None else set(ids)
            acked = [mid for mid in entries if mid in idset]
        else:
            acked = [mid for mid in ids if mid in entries]
        for mid in acked:
            del entries[mid]
        return acked

    def review_filter(
        self, bloom_filter: bytes, peer: str, peers: int = 0
    ) -> tuple[list[str], list[tuple[str, int]]]:
        """Check every buffered id against a peer's filter.

        ``peers`` is how many distinct peers the channel has seen recently
        (0: unknown). Returns ``(acknowledged, possibly)``: ids now acknowledged
        (removed) and ``(id, hits)`` for ids that gained a hit but whose
        evidence is still short of the target (see the module docstring).
        """
        acked: list[str] = []
        possibly: list[tuple[str, int]] = []
        target = self.target
        false_positive: float | None = None  # of this filter, computed at the first hit
        for entry in self._entries.values():
            if peer in entry.filter_hits:
                continue
            positions = entry.positions
            if positions is None:
                positions = entry.positions = self.profile.positions(entry.message_id)
            if not contains(bloom_filter, positions):
                continue
            if false_positive is None:
                false_positive = self.profile.false_positive_rate(bloom_filter)
            entry.filter_hits.add(peer)
            entry.false_ack *= false_positive
            if entry.false_ack <= target or 0 < peers <= len(entry.filter_hits):
                acked.append(entry.message_id)
            else:
                entry.state = OutgoingState.POSSIBLY_ACKNOWLEDGED
                possibly.append((entry.message_id, len(entry.filter_hits)))
        for mid in acked:
            del self._entries[mid]
        return acked, possibly

    def due(self, now: int) -> list[OutgoingEntry]:
        """Entries whose resend time has come, oldest first."""
        return [e for e in self._entries.values() if e.next_resend_at <= now]
