"""Gap answering: how one participant answers the gaps its peers show.

A peer's sync message carries its bloom filter; a message the filter lacks is
one the peer missed. :class:`GapAnswers` holds what a participant remembers to
answer such gaps and decides what to rebroadcast: its own recent messages
(:meth:`GapAnswers.offer_missed`, from the archive once the SDS-R cache dropped
them), a backup answer when the first did not arrive
(:meth:`GapAnswers.answer_again`), other senders' messages through SDS-R, and
chain repair answers (:meth:`GapAnswers.answer_chains`, docs/sds.md "Chain
repair"). The order and timing of the answers follow SDS-R response timing
(specs/sds.md, "Determine T_resp"). Every answer is local policy: a duplicate
is harmless to any peer.

:class:`~sdk.sds.channel.MessageChannel` owns one and calls it as messages
arrive; it shares the channel's configuration, log, archive, repair state,
outbox and counters, and reads the channel's peers (heard from within
``peer_window_ms``). Like the channel it is sans-I/O: ``now`` comes in with
every call.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Container

from sdk.sds.archive import LogArchive
from sdk.sds.bloom import Positions, contains
from sdk.sds.config import ChannelConfig
from sdk.sds.local_log import LocalLog
from sdk.sds.message import Datagram, HistoryEntry, MessageKind
from sdk.sds.repair import RepairState, in_response_group, repair_hash, response_offset

#: Without SDS-R, our own recent messages checked against peers' sync filters
#: (see GapAnswers.prune_own_recent).
_OWN_RECENT = 1_000
#: Newest logged messages of others checked against a peer's sync filter.
_OFFER_OTHERS = 128
#: Our own messages that left the SDS-R cache remembered (id, filter positions,
#: Lamport time) so offer_missed can still offer them from the archive.
_OWN_BEYOND = 128
#: Chain requests remembered per (asker, id), and recent chain answers per id.
_CHAIN_MEMORY = 4_096


class GapAnswers:
    """What one participant of one channel rebroadcasts to close its peers' gaps.

    ``peers`` is the channel's map of peers heard from (id to when), read, not
    written, here; ``outbox`` and ``stats`` are the channel's.
    """

    def __init__(
        self,
        channel_id: str,
        participant_id: str,
        config: ChannelConfig,
        log: LocalLog,
        archive: LogArchive,
        repair: RepairState | None,
        peers: dict[str, int],
        outbox: list[Datagram],
        stats: Counter[str],
    ) -> None:
        self.channel_id = channel_id
        self.participant_id = participant_id
        self.config = config
        self.log = log
        self.archive = archive
        self.repair = repair
        self._peers = peers
        self._outbox = outbox
        self.stats = stats
        # Our recent content messages: id -> (bytes, filter positions, sent at,
        # last (re)broadcast), oldest first; and when each peer's filter was last
        # checked against them (see offer_missed).
        self._own_recent: OrderedDict[str, tuple[bytes, Positions, int, int]] = OrderedDict()
        self._peer_checked: dict[str, int] = {}
        # Our own messages the repair cache dropped: id -> (filter positions,
        # Lamport time, sent at, last (re)broadcast), oldest first; their bytes
        # are the archive's (offer_missed, ChannelConfig.offer_archive_reads).
        self._own_beyond: OrderedDict[str, tuple[Positions, int, int, int]] = OrderedDict()
        # Other senders' messages seen answered (a duplicate arrived): id ->
        # (filter positions, when, when we last answered it ourselves), oldest
        # first; and each participant's SDS-R hash (see answer_again).
        self._answered: OrderedDict[str, tuple[Positions, int, int]] = OrderedDict()
        self._peer_hash: dict[str, int] = {}
        # Chain repair (docs/sds.md): chain requests seen, id -> asker -> (how many,
        # when last counted), least recently asked first; and when we last
        # rebroadcast a message in a chain answer (see answer_chains).
        self._chain_asked: OrderedDict[str, dict[str, tuple[int, int]]] = OrderedDict()
        self._chain_sent: OrderedDict[str, int] = OrderedDict()
        self._peer_checked_log: dict[str, int] = {}
        self._positions: OrderedDict[str, Positions] = OrderedDict()

    def on_sent(self, message_id: str, data: bytes, positions: Positions, now: int) -> None:
        """We broadcast a content message: remember it to offer to peers that lack it."""
        self._own_recent[message_id] = (data, positions, now, now)
        self.prune_own_recent(now)

    def sent_at(self, message_id: str) -> int | None:
        """When we sent one of our recent messages, or ``None``."""
        own = self._own_recent.get(message_id)
        return own[2] if own is not None else None

    def on_sync(self, peer: str, bloom_filter: bytes, made_at: int, now: int) -> None:
        """A peer's sync message arrived (made at Lamport time ``made_at``): answer
        what its filter shows it lacks."""
        if self._own_recent or self._own_beyond:
            self.offer_missed(peer, bloom_filter, made_at, now)
        if self._answered:
            self.answer_again(peer, bloom_filter, now)

    def sweep(self, now: int) -> None:
        """Forget when each peer's sync was last checked (offer_missed,
        _offer_missed_of_others) once that no longer matters, so a peer id heard
        once is not kept for good."""
        cfg = self.config
        if self._peer_checked:
            recent = now - cfg.in_flight_ms
            self._peer_checked = {p: t for p, t in self._peer_checked.items() if t > recent}
        if self._peer_checked_log:
            recent = now - max(cfg.sync_interval_ms, cfg.sweep_interval_ms)
            self._peer_checked_log = {p: t for p, t in self._peer_checked_log.items() if t > recent}

    def offer_missed(self, peer: str, bloom_filter: bytes, made_at: int, now: int) -> None:
        """Rebroadcast our recent messages a peer's sync filter shows it lacks.

        A filter has no false negatives (bar a rollover, which costs one
        duplicate), so a peer back from a cut-off gets what we sent meanwhile
        within one round trip of its sync (:meth:`announce`), even though the
        rest of the group acknowledged it long ago. Only the original sender
        does this (and one backup when that answer was lost,
        :meth:`answer_again`); each message goes out again at most once per
        :meth:`_answer_spacing` and each peer's filter is checked at most once
        per ``in_flight_ms``: both below the pause between the syncs of a peer
        with a gap (:meth:`MessageChannel._next_sync_at`, ``reask_quiet_ms`` in a quiet
        channel), so a lost rebroadcast is answered at its next sync however
        the network delays them (at the full pause, half those syncs were
        skipped, issue 20).
        Messages sent less than ``in_flight_ms`` before the sync was
        made (its Lamport time) may simply not have reached the peer yet and
        are left alone. Local policy: duplicates are harmless to any peer.
        """
        cfg = self.config
        profile = cfg.bloom
        checked = self._peer_checked.get(peer)
        if checked is not None and now - checked < cfg.in_flight_ms:
            return
        if len(bloom_filter) != profile.size_bytes or profile.is_saturated(bloom_filter):
            return
        self._peer_checked[peer] = now
        self.prune_own_recent(now)
        own = self._own_recent
        spacing = self._answer_spacing()
        settled = made_at - cfg.in_flight_ms
        repair = self.repair
        # A rolling filter keeps only the newest ids (at least capacity // 2):
        # older messages missing from it prove nothing.
        floor = self._filter_floor()
        for mid, (data, positions, sent_at, last) in list(own.items()):
            if sent_at > settled:
                break  # oldest first: the rest are younger still
            if repair is not None and repair.is_responding(mid):
                continue  # the peer asked by SDS-R: that answer goes out instead
            logged = self.log.get(mid)
            if logged is None or logged.lamport_timestamp < floor:
                continue
            if (last == sent_at or now - last >= spacing) and not contains(bloom_filter, positions):
                own[mid] = (data, positions, sent_at, now)
                self._outbox.append(Datagram(self.channel_id, data, mid, MessageKind.CONTENT))
                self.stats["rebroadcast_missed"] += 1
        if self._own_beyond:
            self._offer_beyond(bloom_filter, settled, floor, spacing, now)
        if self.repair is not None:
            self._offer_missed_of_others(peer, bloom_filter, settled, now)

    def _offer_beyond(
        self, bloom_filter: bytes, settled: int, floor: int, spacing: int, now: int
    ) -> None:
        """:meth:`offer_missed` for our own messages the repair cache dropped:
        the bytes come from the archive, at most ``offer_archive_reads`` lookups
        per sync. Those the peer's filter can no longer prove missing (older than
        ``floor``) are forgotten."""
        beyond = self._own_beyond
        budget = self.config.offer_archive_reads
        repair = self.repair
        for mid, (positions, lamport, sent_at, last) in list(beyond.items()):
            if lamport < floor:
                del beyond[mid]
                continue
            if budget <= 0 or sent_at > settled:
                break
            if repair is not None and repair.is_responding(mid):
                continue
            if (last != sent_at and now - last < spacing) or contains(bloom_filter, positions):
                continue
            budget -= 1
            found = self.archive.message(mid)
            if found is None:
                continue
            beyond[mid] = (positions, lamport, sent_at, now)
            self._outbox.append(Datagram(self.channel_id, found[1], mid, MessageKind.CONTENT))
            self.stats["rebroadcast_missed"] += 1
            self.stats["offered_from_archive"] += 1

    def _answer_spacing(self) -> int:
        """How soon the same message may be rebroadcast again to answer a gap sync:
        half ``ack_sync_delay_ms``, at most ``in_flight_ms`` (below
        ``reask_quiet_ms``). Several peers lacking it at once share one copy."""
        cfg = self.config
        return min((cfg.ack_sync_delay_ms or cfg.sweep_interval_ms) // 2, cfg.in_flight_ms)

    def note_answered(self, message_id: str, now: int) -> None:
        """A duplicate of another sender's logged message arrived: somebody
        answered a gap with it (see :meth:`answer_again`)."""
        answered = self._answered
        old = answered.pop(message_id, None)
        positions = old[0] if old else self.config.bloom.positions(message_id)
        answered[message_id] = (positions, now, old[2] if old else 0)
        if len(answered) > _OFFER_OTHERS:
            answered.popitem(last=False)

    def answer_again(self, peer: str, bloom_filter: bytes, now: int) -> None:
        """A second answer when the first did not arrive.

        Under loss the original sender's rebroadcast (:meth:`offer_missed`) is
        lost as often as the gap holder's sync, so a round closes a gap with
        ``(1 - loss)^2``. When we saw a message answered (a duplicate arrived
        at least ``answer_settle_ms`` before) and a peer's sync filter still
        lacks it, that answer did not reach the peer: we rebroadcast it from
        the repair cache if we are the one participant SDS-R response timing
        ranks first after the sender (smallest ``T_resp`` offset among the
        peers we hear, the sender and the asker excluded, within the response
        group: specs/sds.md "Determine T_resp", "Determine response group").
        Local policy like the sender's offer (a duplicate is harmless to any
        peer); the SDS-R response buffer is left as it is.
        """
        cfg = self.config
        repair = self.repair
        assert repair is not None
        profile = cfg.bloom
        if len(bloom_filter) != profile.size_bytes or profile.is_saturated(bloom_filter):
            return
        horizon = now - 4 * (cfg.ack_sync_delay_ms or cfg.sweep_interval_ms)
        answered = self._answered
        while answered and next(iter(answered.values()))[1] < horizon:
            answered.popitem(last=False)
        spacing = self._answer_spacing()
        floor: int | None = None  # as in offer_missed: older ids missing prove nothing
        reads = cfg.offer_archive_reads  # lookups for bytes the cache dropped
        for mid, (positions, seen_at, last) in list(answered.items()):
            if now - seen_at < cfg.answer_settle_ms or now - last < spacing:
                continue
            if contains(bloom_filter, positions):
                continue
            entry = self.log.get(mid)
            if entry is None or entry.sender_id == peer:
                continue
            data = repair.cached(mid)
            if data is None and reads <= 0:
                continue
            if floor is None:
                floor = self._filter_floor()
            if entry.lamport_timestamp < floor:
                continue
            if self._response_rank(entry.sender_id, mid, (entry.sender_id, peer), 1) != 0:
                continue
            if mid in self._chain_sent and now - self._chain_sent[mid] < spacing:
                continue  # a chain answer carried it just now
            if data is None:  # the cache dropped it: the archive has the bytes
                reads -= 1
                found = self.archive.message(mid)
                if found is None:
                    continue
                data = found[1]
            answered[mid] = (positions, seen_at, now)
            self._outbox.append(Datagram(self.channel_id, data, mid, MessageKind.CONTENT))
            self.stats["rebroadcast_backup"] += 1

    def _response_rank(
        self, sender: str, message_id: str, exclude: Container[str] = (), below: int = 1 << 30
    ) -> int | None:
        """How many of the peers we hear (bar ``exclude``) SDS-R response timing ranks
        before us for ``sender``'s message: the smallest ``T_resp`` offset first, the
        sender itself (offset 0) before everyone, ties to the smaller id
        (specs/sds.md, "Determine T_resp"). ``None`` outside its response group.
        Counting stops at ``below`` (the caller only asks whether we rank below it)."""
        repair_cfg = self.config.repair
        assert repair_cfg is not None
        me = self.participant_id
        if not in_response_group(repair_cfg, me, sender, message_id):
            return None
        hashes = self._peer_hash
        if len(hashes) > 4 * len(self._peers) + 64:
            hashes.clear()
        h_sender = self._participant_hash(sender)
        h_message = repair_hash(message_id)
        mine = response_offset(repair_cfg, self._participant_hash(me), h_sender, h_message)
        rank = 0
        for p in self._peers:
            if p == me or p in exclude:
                continue
            theirs = response_offset(repair_cfg, self._participant_hash(p), h_sender, h_message)
            if (theirs < mine or (theirs == mine and p < me)) and in_response_group(
                repair_cfg, p, sender, message_id
            ):
                rank += 1
                if rank >= below:
                    break
        return rank

    def _participant_hash(self, participant: str) -> int:
        value = self._peer_hash.get(participant)
        if value is None:
            value = self._peer_hash[participant] = repair_hash(participant)
        return value

    def prune_own_recent(self, now: int) -> None:
        """Keep the own messages :meth:`offer_missed` may offer: with SDS-R, those
        the repair cache keeps (while some peer has not provably delivered them,
        sdk/sds/repair.py); without, the newest ``_OWN_RECENT`` of the last two
        loss timeouts (a peer may still take an id it gave up on)."""
        own = self._own_recent
        repair = self.repair
        if repair is not None:
            beyond = self._own_beyond
            keep = self.config.offer_archive_reads > 0
            while own and repair.cached(next(iter(own))) is None:
                mid, (_, positions, sent_at, last) = own.popitem(last=False)
                logged = self.log.get(mid)
                if keep and logged is not None:
                    beyond[mid] = (positions, logged.lamport_timestamp, sent_at, last)
                    if len(beyond) > _OWN_BEYOND:
                        beyond.popitem(last=False)
            return
        cfg = self.config
        horizon = now - 2 * (cfg.lost_timeout_ms or cfg.peer_window_ms)
        while own and (len(own) > _OWN_RECENT or next(iter(own.values()))[2] < horizon):
            own.popitem(last=False)

    def _offer_missed_of_others(
        self, peer: str, bloom_filter: bytes, settled: int, now: int
    ) -> None:
        """Other senders' recent messages a peer's filter lacks are repaired as if
        the peer had asked (SDS-R response timing: the closest participant
        answers first, the rest stand down when they see it). Needed for
        senders that do not offer their own (``@waku/sds``), or that left.
        Checked at most once per peer per ``sync_interval_ms``, over the newest
        ``_OFFER_OTHERS`` messages of the log.
        """
        repair = self.repair
        assert repair is not None
        cfg = self.config
        checked = self._peer_checked_log.get(peer)
        every = max(cfg.sync_interval_ms, cfg.sweep_interval_ms)
        if checked is not None and now - checked < every:
            return
        self._peer_checked_log[peer] = now
        cache = self._positions
        profile = cfg.bloom
        for lamport, mid in self.log.newest(min(_OFFER_OTHERS, profile.capacity // 2)):
            if lamport > settled:
                break  # log order: the rest are newer still
            entry = self.log.get(mid)
            if entry is None or entry.sender_id in (peer, self.participant_id):
                continue
            positions = cache.get(mid)
            if positions is None:
                positions = cache[mid] = profile.positions(mid)
                if len(cache) > 4 * _OFFER_OTHERS:
                    cache.popitem(last=False)
            if not contains(bloom_filter, positions) and mid not in self._chain_sent:
                # (A chain answer carried it within the spacing: no SDS-R copy later.)
                repair.on_repair_request(entry.history_entry, now)
                self.stats["repair_offered"] += 1

    def answer_chains(
        self,
        asker: str,
        requests: list[tuple[HistoryEntry, int]],
        bloom_filter: bytes | None,
        now: int,
    ) -> None:
        """Answer a peer's chain requests (docs/sds.md, "Chain repair").

        For each requested id we have logged, we answer if SDS-R response timing
        ranks us first among the peers we hear that may hold it (the asker and
        whoever asked for the same id are left out; the sender ranks first), or,
        when the same peer asks again ``chain_answer_spacing_ms`` or more later,
        second, and so on: each repeat means the earlier answers did not all
        arrive. The answer rebroadcasts, oldest first, every message we logged
        after the request's ``since`` up to the id itself that the asker's
        filter does not show and the repair cache holds, except the asker's
        own, at most ``chain_answer_max`` of them. Below the floor of what its
        filter surely still holds (:meth:`_filter_floor`), a miss in the filter
        proves nothing, but the asker said it lacks that stretch of the chain.
        A message rebroadcast by a chain answer within the spacing is not sent
        again (a second asker shares the copy: it is a broadcast), and our
        scheduled SDS-R response to it is dropped.
        """
        cfg = self.config
        repair = self.repair
        assert repair is not None
        cap = cfg.chain_answer_max
        if not cap:
            return
        spacing = cfg.chain_answer_spacing_ms
        asked = self._chain_asked
        ranges: list[tuple[int, int]] = []
        for entry, since in requests:
            mid = entry.message_id
            askers = asked.pop(mid, None) or {}
            asked[mid] = askers  # most recently asked last
            count, last = askers.get(asker, (0, 0))
            if count == 0 or now - last >= spacing:
                count, last = count + 1, now
            askers[asker] = (count, last)
            logged = self.log.get(mid)
            if logged is None:
                continue
            # Whoever asked for it lacks it: it cannot answer.
            rank = self._response_rank(logged.sender_id, mid, askers, count)
            if rank is None or rank >= count:
                continue
            ranges.append((min(since, logged.lamport_timestamp - 1), logged.lamport_timestamp))
        while len(asked) > _CHAIN_MEMORY:
            asked.popitem(last=False)
        if not ranges:
            return
        profile = cfg.bloom
        if bloom_filter is not None and (
            len(bloom_filter) != profile.size_bytes or profile.is_saturated(bloom_filter)
        ):
            bloom_filter = None  # says nothing we can read: the range alone decides
        sent_at = self._chain_sent
        while sent_at and (
            len(sent_at) > _CHAIN_MEMORY or now - next(iter(sent_at.values())) > spacing
        ):
            sent_at.popitem(last=False)
        own = self._own_recent
        me = self.participant_id
        peers = self._peers
        # Where the asker's filter is conclusive (a miss there is a real miss), a
        # message of another sender we hear is left to that sender, which offers
        # it on this same sync (offer_missed): two copies would only add bytes.
        floor = self._filter_floor() if bloom_filter is not None else None
        ranges.sort()
        sent = 0
        upto = -1  # merged ranges: what an earlier range covered is not read again
        for after, end in ranges:
            if end <= upto:
                continue
            for lamport, mid in self.log.between(max(after, upto), end):
                held = self.log.get(mid)
                if held is None or held.sender_id == asker:
                    continue
                if (
                    floor is not None
                    and lamport >= floor
                    and held.sender_id != me
                    and held.sender_id in peers
                ):
                    continue
                last_sent = sent_at.get(mid)
                if last_sent is not None and now - last_sent < spacing:
                    continue
                mine = own.get(mid)
                if mine is not None and mine[3] != mine[2] and now - mine[3] < spacing:
                    continue  # just offered (offer_missed)
                if bloom_filter is not None and contains(bloom_filter, profile.positions(mid)):
                    continue
                data = repair.cached(mid)
                if data is None:
                    continue
                sent_at.pop(mid, None)
                sent_at[mid] = now
                if mine is not None:
                    own[mid] = (mine[0], mine[1], mine[2], now)
                repair.answered(mid)
                self._outbox.append(Datagram(self.channel_id, data, mid, MessageKind.CONTENT))
                sent += 1
                if sent >= cap:
                    break
            if sent >= cap:
                break
            upto = end
        self.stats["rebroadcast_chain"] += sent

    def _filter_floor(self) -> int:
        """Lamport time of the oldest logged message a peer's filter surely still holds."""
        keep = max(1, self.config.bloom.capacity // 2)
        window = self.log.newest(keep)
        return window[0][0] if len(window) == keep else -1
