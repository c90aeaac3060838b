"""SDS Repair (specs/sds.md, "SDS Repair (SDS-R)").

Two buffers per channel: *outgoing repair requests* (missing entries we will
ask peers to rebroadcast once ``T_req`` passes) and *incoming repair requests*
(entries others asked for that we hold and will rebroadcast at ``T_resp``
unless someone else does first), plus the cache of full messages we could be
asked to rebroadcast.

The spec leaves ``hash`` open. For the response groups to agree across
implementations Chorus uses what ``@waku/sds`` does: the first 8 bytes of
SHA-256 over the UTF-8 of the concatenated strings, as a big-endian integer,
with participant ids mapped through the same hash before the XOR distance.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict

from sdk.sds.config import RepairConfig
from sdk.sds.message import HistoryEntry


def repair_hash(*parts: str) -> int:
    """``hash(a, b, ...)`` of the spec: SHA-256 of the concatenation, first 8 bytes big-endian."""
    return int.from_bytes(hashlib.sha256("".join(parts).encode()).digest()[:8], "big")


def request_time(config: RepairConfig, participant_id: str, message_id: str, now: int) -> int:
    """``T_req = now + hash(participant_id, message_id) % (T_max - T_min) + T_min``."""
    span = config.t_max_ms - config.t_min_ms
    return now + repair_hash(participant_id, message_id) % span + config.t_min_ms


def response_time(
    config: RepairConfig, participant_id: str, sender_id: str, message_id: str, now: int
) -> int:
    """``T_resp = now + (distance * hash(message_id)) % T_max``; distance 0 for the sender."""
    distance = repair_hash(participant_id) ^ repair_hash(sender_id)
    return now + (distance * repair_hash(message_id)) % config.t_max_ms


def in_response_group(
    config: RepairConfig, participant_id: str, sender_id: str, message_id: str
) -> bool:
    """Whether ``participant_id`` answers repair requests for ``sender_id``'s message."""
    groups = config.num_response_groups
    if groups == 1:
        return True
    return (
        repair_hash(participant_id, message_id) % groups
        == repair_hash(sender_id, message_id) % groups
    )


class RepairState:
    """Both SDS-R buffers and the message cache of one channel."""

    __slots__ = (
        "_cache",
        "_cache_bytes",
        "_incoming",
        "_outgoing",
        "_outgoing_heap",
        "config",
        "participant_id",
    )

    def __init__(self, config: RepairConfig, participant_id: str) -> None:
        self.config = config
        self.participant_id = participant_id
        # message id -> (T_req, entry); the heap orders eligibility, stale items skipped.
        self._outgoing: dict[str, tuple[int, HistoryEntry]] = {}
        self._outgoing_heap: list[tuple[int, str]] = []
        # message id -> T_resp
        self._incoming: dict[str, int] = {}
        # message id -> (sender id, bytes, cached at): the augmented local log,
        # oldest first; see :meth:`cache` for what it keeps.
        self._cache: OrderedDict[str, tuple[str, bytes, int]] = OrderedDict()
        self._cache_bytes = 0

    # -- cache -------------------------------------------------------------------------
    def cache(self, message_id: str, sender_id: str, data: bytes, now: int | None = None) -> None:
        """Keep a delivered (or sent) message we may have to rebroadcast.

        Beyond ``cache_size`` messages the oldest are dropped, but only once
        they are ``cache_retention_ms`` old: a burst (a peer cut off while many
        messages went by) must not evict the very messages that peer will ask
        for. ``cache_max_bytes`` bounds the memory regardless. Without ``now``
        (a restore) the entry counts as cached long ago.
        """
        if not in_response_group(self.config, self.participant_id, sender_id, message_id):
            return
        cache = self._cache
        old = cache.pop(message_id, None)
        if old is not None:
            self._cache_bytes -= len(old[1])
        at = now if now is not None else -(1 << 62)
        cache[message_id] = (sender_id, data, at)
        self._cache_bytes += len(data)
        cfg = self.config
        horizon = (now if now is not None else at) - cfg.cache_retention_ms
        while cache and (
            self._cache_bytes > cfg.cache_max_bytes
            or (len(cache) > cfg.cache_size and next(iter(cache.values()))[2] <= horizon)
        ):
            _, (_, dropped, _) = cache.popitem(last=False)
            self._cache_bytes -= len(dropped)

    def cached(self, message_id: str) -> bytes | None:
        """The cached bytes of a message, if held."""
        item = self._cache.get(message_id)
        return item[1] if item else None

    def cached_items(self) -> list[tuple[str, str, bytes]]:
        """``(message id, sender id, bytes)`` of the cache, least recently added first."""
        return [(mid, sender, data) for mid, (sender, data, _) in self._cache.items()]

    # -- receive -----------------------------------------------------------------------
    def on_message_seen(self, message_id: str) -> None:
        """A message arrived (from anyone): stop requesting it and stop planning to resend it."""
        self._outgoing.pop(message_id, None)
        self._incoming.pop(message_id, None)

    def on_missing(self, entry: HistoryEntry, now: int) -> None:
        """A dependency is missing: schedule our request for it."""
        mid = entry.message_id
        if mid in self._outgoing:
            return
        t_req = request_time(self.config, self.participant_id, mid, now)
        self._outgoing[mid] = (t_req, entry)
        heapq.heappush(self._outgoing_heap, (t_req, mid))

    def on_repair_request(self, entry: HistoryEntry, now: int) -> None:
        """A peer asked for ``entry``: someone asked already, so we don't; answer if we can."""
        mid = entry.message_id
        self._outgoing.pop(mid, None)
        item = self._cache.get(mid)
        if item is None or mid in self._incoming:
            return
        sender = entry.sender_id or item[0]
        self._incoming[mid] = response_time(self.config, self.participant_id, sender, mid, now)

    def forget(self, message_id: str) -> None:
        """The dependency was declared lost: stop asking for it."""
        self._outgoing.pop(message_id, None)

    # -- send --------------------------------------------------------------------------
    def take_requests(self, now: int) -> tuple[HistoryEntry, ...]:
        """Eligible requests (``T_req <= now``) to piggyback, lowest ``T_req`` first.

        Each taken request is rescheduled ``T_min`` later, so a dependency that
        stays missing is asked for again rather than forgotten: under 25 % loss
        a request and its answer both arrive about half the time, and asking
        only every ``T_max`` left too few rounds within the loss timeout
        (docs/sds.md). Repeating at all is Chorus's choice; the spec computes
        ``T_req`` once.
        """
        limit = self.config.max_requests_per_message
        heap = self._outgoing_heap
        taken: list[HistoryEntry] = []
        while heap and len(taken) < limit and heap[0][0] <= now:
            t_req, mid = heapq.heappop(heap)
            item = self._outgoing.get(mid)
            if item is None or item[0] != t_req:
                continue  # answered, cancelled or rescheduled
            taken.append(item[1])
            again = now + max(1, self.config.t_min_ms)
            self._outgoing[mid] = (again, item[1])
            heapq.heappush(heap, (again, mid))
        return tuple(taken)

    def has_eligible_requests(self, now: int) -> bool:
        """Whether a request is due (SDS-R sync messages go out even when suppressed)."""
        heap = self._outgoing_heap
        while heap:
            t_req, mid = heap[0]
            item = self._outgoing.get(mid)
            if item is not None and item[0] == t_req:
                return t_req <= now
            heapq.heappop(heap)
        return False

    def next_request_time(self) -> int | None:
        """Earliest pending ``T_req``."""
        self.has_eligible_requests(-1)  # drop stale heap heads
        return self._outgoing_heap[0][0] if self._outgoing_heap else None

    def due_responses(self, now: int) -> list[bytes]:
        """Messages to rebroadcast now (``T_resp <= now``), removed from the buffer."""
        if not self._incoming:
            return []
        due = [mid for mid, t in self._incoming.items() if t <= now]
        out = []
        for mid in due:
            del self._incoming[mid]
            data = self.cached(mid)
            if data is not None:
                out.append(data)
        return out

    def is_responding(self, message_id: str) -> bool:
        """Whether a rebroadcast of ``message_id`` is scheduled (``T_resp``)."""
        return message_id in self._incoming

    @property
    def pending(self) -> bool:
        """Whether either buffer holds anything."""
        return bool(self._outgoing or self._incoming)

    def outgoing_requests(self) -> dict[str, int]:
        """``message id -> T_req`` of pending requests (inspection)."""
        return {mid: t for mid, (t, _) in self._outgoing.items()}

    def incoming_requests(self) -> dict[str, int]:
        """``message id -> T_resp`` of pending responses (inspection)."""
        return dict(self._incoming)
