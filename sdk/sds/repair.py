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

The cache keeps a message while some peer has not provably delivered it
(issue 20): a peer cut off while more than ``cache_size`` messages went by
must still find each of them here when it asks. Each peer heard from has a
*delivery mark*, the oldest cached message its filters have not shown yet;
the mark only moves forward, at each sweep, one filter check per message and
peer. Beyond
``cache_size`` the oldest message is dropped once every peer's mark is past
it, or once it is ``cache_retention_ms`` old whoever lacks it; and always
beyond ``cache_max_bytes``. A peer first heard from after a message was
cached does not hold that message back (it joined, or we restarted, since),
and a peer silent for ``cache_retention_ms`` stops counting. A filter hit is
false with the filter's false-positive rate: the cost is that this peer gets
that one message from another peer or the store. ``@waku/sds`` answers from
its local history, dropped by count alone (10,000 messages,
``packages/sds/src/message_channel/mem_local_history.ts``, lines 5 and 49,
js-waku commit 44d8fbf); what we keep is local policy and changes nothing on
the wire.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from dataclasses import dataclass

from sdk.sds.archive import LogArchive
from sdk.sds.bloom import WAKU, BloomProfile, Positions, contains
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
    return now + response_offset(
        config, repair_hash(participant_id), repair_hash(sender_id), repair_hash(message_id)
    )


def response_offset(
    config: RepairConfig, participant_hash: int, sender_hash: int, message_hash: int
) -> int:
    """``T_resp - now`` from the three hashes (callers ranking many participants
    for one message hash each participant once)."""
    return ((participant_hash ^ sender_hash) * message_hash) % config.t_max_ms


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


#: Marks a repair request as a chain request (Chorus extension, docs/sds.md
#: "Chain repair"): the entry's ``retrieval_hint`` is this prefix and the
#: requester's ``since`` Lamport time, 8 bytes big-endian. ``@waku/sds`` reads only
#: ``message_id`` and ``sender_id`` of a repair request
#: (js-waku ``packages/sds/src/message_channel/repair/repair.ts``,
#: ``processIncomingRepairRequests``), so to it this is a
#: plain SDS-R request for the id.
CHAIN_MARK = b"\x00chorus-chain/1\x00"
_CHAIN_HINT_LENGTH = len(CHAIN_MARK) + 8


def chain_request(entry: HistoryEntry, since: int) -> HistoryEntry:
    """A repair request for ``entry`` that also asks for the causal chain behind it:
    whatever its holder logged after Lamport time ``since`` up to the entry."""
    return HistoryEntry(
        entry.message_id, CHAIN_MARK + max(0, since).to_bytes(8, "big"), entry.sender_id
    )


def chain_since(entry: HistoryEntry) -> int | None:
    """The ``since`` of a chain request, or ``None`` for a plain repair request."""
    hint = entry.retrieval_hint
    if hint is None or len(hint) != _CHAIN_HINT_LENGTH or not hint.startswith(CHAIN_MARK):
        return None
    return int.from_bytes(hint[len(CHAIN_MARK) :], "big")


@dataclass(slots=True)
class _Cached:
    sender_id: str
    data: bytes
    cached_at: int
    #: Position in cache order; delivery marks compare against it.
    seq: int
    #: Where the id's bits are in a filter; computed at the first check.
    positions: Positions | None = None


#: Ids the archive was asked for and lacked, remembered (newest) so that a request
#: repeated by its requester every ``T_min``, and by every other requester, reads
#: the archive once.
_ABSENT_KEPT = 1024
#: Archive reads for repair requests per ``T_min`` (each a database read in the
#: runtime, on the event loop): requests for ids a peer makes up, or that no one
#: logged, cannot make a node read its disk at the rate they arrive. A request
#: beyond the budget is answered when it is asked again (requesters repeat).
ARCHIVE_READS_PER_T_MIN = 64

#: ``cached_at`` of entries restored without a time: as old as can be.
_LONG_AGO = -(1 << 62)
#: The lowest delivery mark when no peer is known: past every entry.
_NO_PEERS = 1 << 62


class RepairState:
    """Both SDS-R buffers and the message cache of one channel."""

    __slots__ = (
        "_absent",
        "_by_seq",
        "_cache",
        "_cache_bytes",
        "_filters",
        "_heard",
        "_incoming",
        "_marks",
        "_min_mark",
        "_next_seq",
        "_outgoing",
        "_outgoing_heap",
        "_reads_left",
        "_reads_reset_at",
        "archive",
        "archive_reads",
        "config",
        "participant_id",
        "profile",
    )

    def __init__(
        self,
        config: RepairConfig,
        participant_id: str,
        profile: BloomProfile = WAKU,
        archive: LogArchive | None = None,
    ) -> None:
        self.config = config
        #: Where a request for a message no longer cached is answered from.
        self.archive = archive
        self.participant_id = participant_id
        #: The channel's bloom profile (to read peers' filters).
        self.profile = profile
        # message id -> (T_req, entry); the heap orders eligibility, stale items skipped.
        self._outgoing: dict[str, tuple[int, HistoryEntry]] = {}
        self._outgoing_heap: list[tuple[int, str]] = []
        # message id -> T_resp
        self._incoming: dict[str, int] = {}
        # The augmented local log, oldest first (see the module docstring); an
        # OrderedDict, as the oldest is looked at on every change and a plain
        # dict walks past the slots of everything dropped from its front.
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._by_seq: dict[int, str] = {}
        self._next_seq = 0
        self._cache_bytes = 0
        # Per peer: its delivery mark (a seq) and when we last heard it; the
        # lowest mark, or None when a mark moved or a peer came or went.
        self._marks: dict[str, int] = {}
        self._heard: dict[str, int] = {}
        # Each peer's newest filter since the last sweep.
        self._filters: dict[str, bytes] = {}
        self._min_mark: int | None = None
        # Ids the archive lacked (see _ABSENT_KEPT), and the archive read budget.
        self._absent: OrderedDict[str, None] = OrderedDict()
        self._reads_left = ARCHIVE_READS_PER_T_MIN
        self._reads_reset_at: int | None = None
        #: Archive reads made for repair requests (for tests and metrics).
        self.archive_reads = 0

    # -- cache -------------------------------------------------------------------------
    def cache(self, message_id: str, sender_id: str, data: bytes, now: int | None = None) -> None:
        """Keep a delivered (or sent) message we may have to rebroadcast.

        What stays is the module docstring's rule. Without ``now`` (a restore)
        the entry counts as cached long ago. A message cached again keeps its
        place.
        """
        self._absent.pop(message_id, None)
        if not in_response_group(self.config, self.participant_id, sender_id, message_id):
            return
        cache = self._cache
        old = cache.get(message_id)
        if old is not None:
            self._cache_bytes += len(data) - len(old.data)
            old.data = data
        else:
            seq = self._next_seq
            self._next_seq = seq + 1
            at = now if now is not None else _LONG_AGO
            cache[message_id] = _Cached(sender_id, data, at, seq)
            self._by_seq[seq] = message_id
            self._cache_bytes += len(data)
        self._evict(now)

    def _evict(self, now: int | None) -> None:
        cfg = self.config
        cache = self._cache
        if len(cache) <= cfg.cache_size and self._cache_bytes <= cfg.cache_max_bytes:
            return  # within both bounds: nothing may go
        old_before = _LONG_AGO if now is None else now - cfg.cache_retention_ms
        while cache:
            mid = next(iter(cache))
            oldest = cache[mid]
            if self._cache_bytes <= cfg.cache_max_bytes:
                if len(cache) <= cfg.cache_size:
                    return
                if oldest.cached_at > old_before and not self._delivered_everywhere(oldest.seq):
                    return
            del cache[mid]
            del self._by_seq[oldest.seq]
            self._cache_bytes -= len(oldest.data)

    def _delivered_everywhere(self, seq: int) -> bool:
        """Whether every peer's delivery mark is past ``seq``."""
        low = self._min_mark
        if low is None:
            low = self._min_mark = min(self._marks.values(), default=_NO_PEERS)
        return low > seq

    def on_peer_filter(self, peer: str, bloom_filter: bytes, now: int) -> None:
        """A peer's filter (of the channel's profile) arrived; :meth:`sweep` reads it."""
        self._heard[peer] = now
        if peer not in self._marks:
            # First heard now: what is cached already does not wait for it.
            self._marks[peer] = self._next_seq
            self._min_mark = None
        self._filters[peer] = bloom_filter
        # Faster than a filter forgets (capacity / 2 ids: 128 for ``compact``, so
        # above ~130 messages a second between two sweeps) the mark must move now,
        # or its message leaves every filter before a sweep looks and the cache
        # is then held by its age and byte caps alone.
        if self._next_seq - self._marks[peer] >= self.profile.capacity // 4:
            self._filters.pop(peer)
            if self._advance_mark(peer, bloom_filter):
                self._min_mark = None

    def _advance_mark(self, peer: str, bloom_filter: bytes) -> bool:
        """Move ``peer``'s mark past the cached messages ``bloom_filter`` shows (True: moved)."""
        cache = self._cache
        end = self._next_seq
        first = next(iter(cache.values())).seq if cache else end
        mark = max(self._marks[peer], first)
        profile = self.profile
        if mark >= end or profile.is_saturated(bloom_filter):
            return False  # nothing to check, or a filter whose hits prove nothing
        start = mark
        by_seq = self._by_seq
        while mark < end:
            mid = by_seq[mark]
            item = cache[mid]
            if item.sender_id != peer:
                positions = item.positions
                if positions is None:
                    positions = item.positions = profile.positions(mid)
                if not contains(bloom_filter, positions):
                    break
            mark += 1
        if mark == start:
            return False
        self._marks[peer] = mark
        return True

    def sweep(self, now: int) -> None:
        """Move each peer's delivery mark past the cached messages its newest filter
        shows, in cache order; forget peers silent for ``cache_retention_ms``; evict.

        Once per sweep interval rather than per message: each cached message is
        checked once per peer as the mark passes it, plus one check per peer
        whose mark waits. A rolling filter holds at least its newest
        ``capacity / 2`` ids; a faster channel moves marks as filters arrive
        (:meth:`on_peer_filter`).
        """
        horizon = now - self.config.cache_retention_ms
        silent = [peer for peer, at in self._heard.items() if at < horizon]
        for peer in silent:
            del self._heard[peer]
            self._marks.pop(peer, None)
            self._filters.pop(peer, None)
        changed = bool(silent)
        for peer, bloom_filter in self._filters.items():
            changed |= self._advance_mark(peer, bloom_filter)
        self._filters.clear()
        if changed:
            self._min_mark = None
            self._evict(now)

    def delivery_marks(self) -> dict[str, int]:
        """``peer -> how many cached messages, oldest first, it has provably delivered``
        (inspection)."""
        first = next(iter(self._cache.values())).seq if self._cache else self._next_seq
        return {peer: max(0, mark - first) for peer, mark in self._marks.items()}

    def cached(self, message_id: str) -> bytes | None:
        """The cached bytes of a message, if held."""
        item = self._cache.get(message_id)
        return item.data if item else None

    def cached_items(self) -> list[tuple[str, str, bytes]]:
        """``(message id, sender id, bytes)`` of the cache, least recently added first."""
        return [(mid, item.sender_id, item.data) for mid, item in self._cache.items()]

    # -- receive -----------------------------------------------------------------------
    def on_message_seen(self, message_id: str) -> None:
        """A message arrived (from anyone): stop requesting it and stop planning to resend it."""
        self._outgoing.pop(message_id, None)
        self._incoming.pop(message_id, None)
        self._absent.pop(message_id, None)

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
        if item is None and mid not in self._incoming and self._may_read(entry, now):
            # Older than the cache: the archive may have the bytes.
            assert self.archive is not None
            self.archive_reads += 1
            self._reads_left -= 1
            found = self.archive.message(mid)
            if found is not None:
                self.cache(mid, found[0], found[1], now)
                item = self._cache.get(mid)
            else:
                self._absent[mid] = None
                if len(self._absent) > _ABSENT_KEPT:
                    self._absent.popitem(last=False)
        if item is None or mid in self._incoming:
            return
        sender = entry.sender_id or item.sender_id
        self._incoming[mid] = response_time(self.config, self.participant_id, sender, mid, now)

    def _may_read(self, entry: HistoryEntry, now: int) -> bool:
        """Whether a request for an uncached ``entry`` is worth an archive read: not
        one the archive lacked already, not a message whose sender puts it in
        another response group (it would not be cached, nor answered, by us), and
        within the read budget."""
        if self.archive is None or entry.message_id in self._absent:
            return False
        if entry.sender_id and not in_response_group(
            self.config, self.participant_id, entry.sender_id, entry.message_id
        ):
            return False
        if self._reads_reset_at is None or now >= self._reads_reset_at:
            self._reads_left = ARCHIVE_READS_PER_T_MIN
            self._reads_reset_at = now + max(1, self.config.t_min_ms)
        return self._reads_left > 0

    def answered(self, message_id: str) -> None:
        """We rebroadcast ``message_id`` ourselves: drop our scheduled response to it."""
        self._incoming.pop(message_id, None)

    def forget(self, message_id: str) -> None:
        """The dependency was declared lost: stop asking for it."""
        self._outgoing.pop(message_id, None)

    # -- send --------------------------------------------------------------------------
    def take_requests(self, now: int, limit: int | None = None) -> tuple[HistoryEntry, ...]:
        """Eligible requests (``T_req <= now``) to piggyback, lowest ``T_req`` first
        (at most ``limit``, by default ``max_requests_per_message``).

        Each taken request is rescheduled ``T_min`` later, so a dependency that
        stays missing is asked for again rather than forgotten: under 25 % loss
        a request and its answer both arrive about half the time, and asking
        only every ``T_max`` left too few rounds within the loss timeout
        (docs/sds.md). Repeating at all is Chorus's choice; the spec computes
        ``T_req`` once.
        """
        if limit is None:
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
