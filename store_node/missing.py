"""Referenced but missing: ids archived messages point at that the archive lacks.

Definition: the analytics job's "lost message" (:mod:`store_node.analytics.jobs`,
``causal_problems``): an id in the causal history of an archived message, in the
same channel (SDS causal history is per channel), that was never archived itself.
The job finds them in a Parquet export after the fact; :class:`MissingReferences`
keeps the same set live, so a node can say how many it lacks
(``chorus_store_referenced_missing``, ``/readyz``) and ask its ``[store_sync]``
peers for them (:meth:`store_node.store_sync.service.StoreSyncService.request_sync`)
as soon as it notices, instead of at the next periodic session.

Theory of operation. Ingest hands every decoded batch to :meth:`observe` on its
decoder thread, before the batch commits (the decoder runs one batch ahead of the
commit, and the batch is committed or retried until it is). For each batch:

1. every row's key joins the *recent* set (the last :data:`RECENT_KEYS` archived
   keys, as 64-bit hashes) and leaves the missing set if it was there (counted in
   ``chorus_store_referenced_recovered_total``: a peer, a rebroadcast or a late
   copy filled it);
2. every causal-history id that is neither recent nor already missing is looked up
   in the archive (:meth:`store_node.archive.base.Archive.existing_ids`, index
   lookups on a reader connection); those not found become missing.

So the work per message is a few set lookups (a history holds a handful of ids, and
they name recent messages); the archive is asked only about ids older than the
recent window, or missing. The recent window must span more than the two batches
in flight (ingest's decoder runs one ahead of the commit; batches are at most
``BACKLOG_FACTOR x batch_size`` rows): a reference to a row not yet committed must
be answered from memory. Bounds: the recent set holds :data:`RECENT_KEYS` hashes
(about 8 MB), the missing set :data:`MAX_MISSING` ids; beyond that the oldest
missing ids are dropped from tracking (``given_up{reason="overflow"}``). An id that
stays missing for :data:`GIVE_UP_AFTER_S` is given up too
(``given_up{reason="expired"}``): no peer had it, or it is older than every peer's
retention (a quiet channel's first message after a long pause can point at
messages retention has deleted), and counting it forever would make the gauge an
alarm that never clears.

At start :meth:`seed` reads the newest :data:`RECENT_KEYS` rows back
(:meth:`~store_node.archive.base.Archive.recent_references`) and judges their
references the same way, on a thread of its own beside ingest, so a restarted
node knows again which ids its latest messages point at and lacks, and asks its
peers (the gap a store-node outage left shows up at its edges: the first messages
after the outage reference the last ones lost).

What the count is: a lower bound on what the archive lacks. It sees only ids some
archived message references; a causal history names the last few messages of its
sender's log, so of a long gap it sees the edges. Store-to-store sync reconciles
whole archives, so one session triggered by the edge fetches the whole gap from a
peer that has it. Two distinct keys share a 64-bit hash with probability 2^-64 per
pair; one such collision would hide one missing id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from store_node.archive.base import SEALED, Archive, ArchiveRow
from store_node.metrics import NodeMetrics

log = logging.getLogger("store_node.missing")

#: Archived keys remembered so that references to them are not looked up.
RECENT_KEYS = 100_000
#: Missing ids tracked at most (the oldest beyond it are given up).
MAX_MISSING = 100_000
#: Seconds an id may stay missing before it is given up.
GIVE_UP_AFTER_S = 3600.0
#: Seconds between two sweeps for expired ids (on the ingest path).
_SWEEP_INTERVAL_S = 10.0
#: Rows :meth:`MissingReferences.seed` judges per hold of the lock.
_SEED_CHUNK = 5_000


class MissingReferences:
    """The live set of referenced-but-missing ids of one archive; see the module docstring.

    Thread-safe: ingest's decoder thread calls :meth:`observe`, a probe reads
    :attr:`count` from any thread. ``on_noticed(n)`` is called (on the calling
    thread) after a batch in which ``n > 0`` ids became missing.
    """

    def __init__(
        self,
        archive: Archive,
        metrics: NodeMetrics | None = None,
        *,
        recent_keys: int = RECENT_KEYS,
        max_missing: int = MAX_MISSING,
        give_up_after: float = GIVE_UP_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if recent_keys < 1 or max_missing < 1 or give_up_after <= 0:
            raise ValueError("recent_keys and max_missing must be >= 1, give_up_after > 0")
        self.archive = archive
        self.metrics = metrics or NodeMetrics()
        self.recent_keys = recent_keys
        self.max_missing = max_missing
        self.give_up_after = give_up_after
        self.clock = clock
        self.on_noticed: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        self._recent: set[int] = set()
        self._recent_order: deque[int] = deque()
        #: (channel_id, message_id) -> when it was noticed missing (``clock``).
        self._missing: dict[tuple[str, str], float] = {}
        #: Of those, the ones noticed since the last :meth:`take_fresh`.
        self._fresh: set[tuple[str, str]] = set()
        self._last_sweep = clock()

    @property
    def count(self) -> int:
        """How many referenced ids the archive lacks (still sought)."""
        return len(self._missing)

    def missing(self) -> list[tuple[str, str]]:
        """The ``(channel_id, message_id)`` pairs currently missing, oldest first."""
        with self._lock:
            return list(self._missing)

    def observe(self, rows: Sequence[ArchiveRow]) -> int:
        """Account for a batch about to be committed; return how many ids became missing.

        Sealed rows (:data:`~store_node.archive.base.SEALED`) are skipped: their causal
        history is inside the seal, and their ids (transport hashes) are never referenced.
        """
        return self._judge(
            (r.channel_id, r.message_id, r.causal_history) for r in rows if r.kind != SEALED
        )

    def seed(self, limit: int | None = None) -> int:
        """Judge the newest ``limit`` archived rows again (at start); return ids missing.

        Blocking (about 2 s for 100,000 rows on SQLite), meant for a thread of its
        own: it takes the lock per :data:`_SEED_CHUNK` rows, so ingest's batches are
        judged in between instead of waiting for all of it. Interleaving is sound:
        every decision is made under the lock against the same sets, and a row
        judged out of order only sits at another place in the recent window.
        """
        rows = self.archive.recent_references(self.recent_keys if limit is None else limit)
        # Oldest first, as they were archived: the recent window keeps the newest.
        rows.reverse()
        noticed = 0
        for start in range(0, len(rows), _SEED_CHUNK):
            noticed += self._judge(rows[start : start + _SEED_CHUNK])
        return noticed

    def take_fresh(self) -> int:
        """How many ids noticed since the last call are still missing; starts anew.

        What decides whether a gap is worth a store-sync session: ids missing for a
        while (no peer had them) do not count again, and an id whose copy merely
        arrived late is no longer missing.
        """
        with self._lock:
            fresh = len(self._fresh)
            self._fresh.clear()
        return fresh

    def sweep(self) -> int:
        """Give up ids missing for longer than ``give_up_after``; return how many."""
        with self._lock:
            expired = self._expire(self.clock())
            self._publish()
        return expired

    def _judge(self, rows: Iterable[tuple[str, str, Sequence[str]]]) -> int:
        with self._lock:
            # The hot path (every ingested message): locals and inlined set work.
            recent, order, missing = self._recent, self._recent_order, self._missing
            add, append = recent.add, order.append
            recovered = 0
            references: list[tuple[str, Sequence[str]]] = []
            for channel, message_id, history in rows:
                key = (channel, message_id)
                h = hash(key)
                if h not in recent:
                    add(h)
                    append(h)
                if missing and missing.pop(key, None) is not None:
                    recovered += 1
                    self._fresh.discard(key)
                if history:
                    references.append((channel, history))
            unknown: dict[str, set[str]] = {}
            for channel, history in references:
                for ref in history:
                    if hash((channel, ref)) not in recent and (channel, ref) not in missing:
                        unknown.setdefault(channel, set()).add(ref)
            # Trimmed only now: a reference to a row of this very batch (not committed
            # yet, so not in the archive either) must find it here.
            excess = len(order) - self.recent_keys
            if excess > 0:
                discard, popleft = recent.discard, order.popleft
                for _ in range(excess):
                    discard(popleft())
            noticed = self._look_up(unknown) if unknown else 0
            now = self.clock()
            if now - self._last_sweep >= _SWEEP_INTERVAL_S:
                self._expire(now)
            if recovered:
                self.metrics.referenced_recovered.inc(recovered)
            self._publish()
        if noticed and self.on_noticed is not None:
            self.on_noticed(noticed)
        return noticed

    def _remember(self, h: int) -> None:
        if h in self._recent:
            return
        self._recent.add(h)
        self._recent_order.append(h)

    def _look_up(self, unknown: dict[str, set[str]]) -> int:
        found = self.archive.existing_ids(unknown)
        now = self.clock()
        noticed = 0
        for channel, refs in unknown.items():
            for ref in refs:
                key = (channel, ref)
                if key in found:
                    self._remember(hash(key))
                else:
                    self._missing[key] = now
                    self._fresh.add(key)
                    noticed += 1
        overflow = len(self._missing) - self.max_missing
        if overflow > 0:
            for key in list(self._iter_oldest(overflow)):
                del self._missing[key]
                self._fresh.discard(key)
            self.metrics.referenced_given_up.labels("overflow").inc(overflow)
        return noticed

    def _iter_oldest(self, n: int) -> Iterable[tuple[str, str]]:
        for i, key in enumerate(self._missing):
            if i == n:
                return
            yield key

    def _expire(self, now: float) -> int:
        self._last_sweep = now
        cutoff = now - self.give_up_after
        expired = [key for key, since in self._missing.items() if since <= cutoff]
        for key in expired:
            del self._missing[key]
            self._fresh.discard(key)
        if expired:
            self.metrics.referenced_given_up.labels("expired").inc(len(expired))
            log.warning(
                "referenced ids given up",
                extra={"count": len(expired), "after_s": self.give_up_after},
            )
        return len(expired)

    def _publish(self) -> None:
        self.metrics.referenced_missing.set(len(self._missing))


__all__ = ["GIVE_UP_AFTER_S", "MAX_MISSING", "RECENT_KEYS", "MissingReferences"]
