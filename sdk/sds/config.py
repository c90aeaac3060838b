"""Per-channel configuration of the SDS core.

Every period is in milliseconds, the unit of ``now`` and of Lamport time.
Defaults follow the reliable-channel API (``specs/reliable-channel-api.md``)
and the SDS-R recommendations (``specs/sds.md``, "SDS-R global state"); tests
and simulations shorten them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdk.sds.bloom import WAKU, BloomProfile
from sdk.sds.limits import DEFAULT_LIMITS, Limits


@dataclass(frozen=True, slots=True)
class RepairConfig:
    """SDS-R parameters; SHOULD be the same for every participant of a channel."""

    #: Minimum wait before requesting repair of a missing message (spec: >= 30 s).
    t_min_ms: int = 30_000
    #: Window over which missing messages can be repaired (spec: 120-600 s).
    t_max_ms: int = 120_000
    #: ``num_participants // 128 + 1``; 1 puts everyone in one response group.
    num_response_groups: int = 1
    #: Most repair requests carried by one message. The spec recommends 3, but a
    #: participant back from a cut-off can miss dozens: with 3 per sync message,
    #: asking takes longer than the loss timeout (docs/sds.md). Local policy:
    #: receivers accept up to ``Limits.max_repair_request`` (32).
    max_requests_per_message: int = 10
    #: Full messages cached to answer repair requests (the "augmented local log");
    #: beyond this many, a message stays while some peer has not provably
    #: delivered it (sdk/sds/repair.py), up to ``cache_retention_ms``.
    cache_size: int = 2_000
    #: Safety cap: how long a message stays beyond ``cache_size`` for a peer that
    #: has not shown it (and how long a silent peer still counts). A peer cut off
    #: for up to this long still gets everything it missed from its peers.
    cache_retention_ms: int = 60 * 60_000
    #: Hard bound on the cache's bytes, whatever its messages' age or delivery
    #: (memory: about 1.5x this with the bookkeeping). A request for a message no
    #: longer cached is answered from the channel's archive when it has the bytes
    #: (the runtime's database), so with one this may be set lower.
    cache_max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not 0 <= self.t_min_ms < self.t_max_ms:
            raise ValueError("need 0 <= t_min_ms < t_max_ms")
        if self.num_response_groups < 1 or self.max_requests_per_message < 0:
            raise ValueError("num_response_groups >= 1 and max_requests_per_message >= 0")


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """How one participant runs one channel."""

    #: Message ids from the local log included in each message's causal history.
    causal_history_size: int = 2
    #: Unreferenced messages ("heads") a sync message may reference, so that
    #: the tail of a conversation becomes detectable as missing once traffic stops.
    sync_heads: int = 32
    #: Heads remembered at most; beyond it the oldest are no longer heads (as if
    #: referenced), and those older than ``log_window`` leave memory. Bounds what a
    #: peer sending messages nobody references can make us keep.
    max_heads: int = 1_000
    #: Most recent local-log entries kept in memory (causal histories, dependency
    #: and duplicate checks); older ones are looked up in the channel's
    #: :class:`~sdk.sds.archive.LogArchive` (the runtime's database). About 0.3 KB
    #: each. ``None`` keeps every entry in memory.
    log_window: int | None = 10_000
    #: Archive lookups one peer's sync may cost when we offer it messages that
    #: left the SDS-R cache (our own, :meth:`GapAnswers.offer_missed`, and a
    #: backup answer, :meth:`GapAnswers.answer_again`, ``sdk.sds.answering``): the
    #: bytes are read from the channel's archive, at most this many per sync. Our
    #: own such messages are remembered (ids only) for the newest 128 of them.
    #: ``0``: offer from the cache only.
    offer_archive_reads: int = 16
    #: Bloom filter profile. Every participant of a channel must use the same one.
    bloom: BloomProfile = WAKU
    #: Resend period for unacknowledged outgoing messages.
    resend_interval_ms: int = 30_000
    #: Longer resend period for possibly acknowledged ones (spec: prioritize unacknowledged).
    possibly_acked_resend_interval_ms: int = 90_000
    #: Resends before giving up with ``MessageSendExpired``; ``None`` never gives up.
    max_resends: int | None = 10
    #: Granularity of the buffer sweeps (outgoing resend, incoming retrieval/loss, repair).
    sweep_interval_ms: int = 1_000
    #: Minimum interval between sync messages; a random backoff of up to the same
    #: again is added, and any broadcast in the channel restarts the wait. 0 disables.
    sync_interval_ms: int = 30_000
    #: How long after its first report a still-missing dependency is reported
    #: again for store retrieval; each later report waits twice as long.
    retrieval_interval_ms: int = 10_000
    #: A gap's :class:`~sdk.sds.RetrieveRange` starts this long before the last
    #: time we heard the channel (senders' messages reach the store a little
    #: before or after they reach us). 0 disables range retrieval.
    range_margin_ms: int = 5_000
    #: After receiving content, send a sync message (our filter: the sender's
    #: acknowledgement) within this delay, drawn in ``[d, 2d]`` per occasion,
    #: unless we broadcast first or enough peers acknowledged the same
    #: messages already. 0 disables (acknowledgement then waits for our next
    #: message or periodic sync).
    ack_sync_delay_ms: int = 1_000
    #: A dependency missing this long is irretrievably lost; its dependents are
    #: then delivered without it. 0 never gives up. Several SDS-R rounds
    #: (each up to ``2 * t_max_ms``) must fit in it (docs/sds.md).
    lost_timeout_ms: int = 600_000
    #: Messages held for unmet dependencies; beyond this new ones are rejected
    #: (the sender resends them) and buffered ones are kept.
    max_incoming_buffer: int = 10_000
    #: Encoded bytes held for unmet dependencies, in all and per sender;
    #: beyond either, new messages are rejected like a full buffer.
    max_incoming_bytes: int = 64 * 1024 * 1024
    max_incoming_bytes_per_sender: int = 16 * 1024 * 1024
    #: Missing message ids tracked at once.
    max_missing: int = 10_000
    #: Ids declared lost that are remembered (so a later reference to one is not
    #: reported missing again); beyond it the oldest are forgotten (and leave the
    #: runtime's database): referenced again, such an id is missing, then lost, anew.
    max_lost: int = 10_000
    #: How far ahead of ``now`` a peer's Lamport timestamp may move our clock.
    #: Messages further ahead are still delivered (peers such as ``@waku/sds``
    #: adopt any time, and rejecting them would partition the channel).
    max_lamport_drift_ms: int = 5 * 60_000
    #: Recompute every content message's id with the Chorus rule and reject mismatches.
    #: Leave off in channels shared with implementations using another rule (``@waku/sds``).
    verify_message_ids: bool = False
    #: Probability of a false acknowledgement tolerated when counting bloom-filter hits.
    ack_false_positive_target: float = 1e-6
    #: A peer counts towards the group's size (the most filter hits an
    #: acknowledgement can need) while it was heard from within this window.
    peer_window_ms: int = 10 * 60_000
    #: Chain repair, a Chorus extension of SDS-R (docs/sds.md, "Chain repair"):
    #: each sync a participant sends while dependencies are missing asks for the
    #: whole causal chain behind up to this many of them at once (the missing id,
    #: and everything its holder logged from that sender's last message we have
    #: up to it), instead of one causal-history level per repair round. At most
    #: ``RepairConfig.max_requests_per_message`` in all. 0 never asks.
    chain_requests_per_sync: int = 4
    #: Most messages one answer to a chain request rebroadcasts (oldest first; the
    #: rest is asked for again by the next sync). 0 never answers.
    chain_answer_max: int = 512
    #: A peer whose sync asks for the same chain again after this long did not
    #: get the answer: the next holder in SDS-R response order answers too. Also
    #: the least time between two rebroadcasts of one message by chain answers.
    chain_answer_spacing_ms: int = 250
    #: Liveness timing (docs/sds.md, "Liveness: how a gap closes"). A message sent
    #: this shortly before a peer's sync was made may still be on its way to that
    #: peer: its absence from the sync's filter proves nothing yet. Also the least
    #: time between two checks of one peer's filter, the cap on how often one
    #: message is rebroadcast to answer gaps, and how long after its discovery a
    #: gap found in a quiet channel is first asked for.
    in_flight_ms: int = 250
    #: In a quiet channel a gap holder asks again this long after its last sync
    #: (``ack_sync_delay_ms`` while content flows): a round trip and a little more.
    reask_quiet_ms: int = 300
    #: A message seen answered (a duplicate arrived) this long before a peer's
    #: sync was received should have reached that peer; if the filter still lacks
    #: it, the next holder in SDS-R response order answers again.
    answer_settle_ms: int = 125
    #: Syncs sent with a gap at each pause before the pause doubles (the first
    #: ones ``ack_sync_delay_ms`` apart, up to ``sync_interval_ms``).
    gap_syncs_per_step: int = 8
    #: SDS-R settings; ``None`` disables repair (no sender ids in history entries either).
    repair: RepairConfig | None = field(default_factory=RepairConfig)
    #: Bounds on incoming messages.
    limits: Limits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        if self.causal_history_size < 0:
            raise ValueError("causal_history_size must be >= 0")
        if self.causal_history_size > self.limits.max_causal_history:
            raise ValueError("causal_history_size exceeds limits.max_causal_history")
        for name in (
            "resend_interval_ms",
            "possibly_acked_resend_interval_ms",
            "sweep_interval_ms",
            "retrieval_interval_ms",
            "peer_window_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.sync_interval_ms < 0 or self.lost_timeout_ms < 0:
            raise ValueError("sync_interval_ms and lost_timeout_ms must be >= 0")
        if self.range_margin_ms < 0 or self.ack_sync_delay_ms < 0:
            raise ValueError("range_margin_ms and ack_sync_delay_ms must be >= 0")
        if self.max_incoming_bytes < 1 or self.max_incoming_bytes_per_sender < 1:
            raise ValueError("max_incoming_bytes and max_incoming_bytes_per_sender must be >= 1")
        if min(self.chain_requests_per_sync, self.chain_answer_max) < 0:
            raise ValueError("chain_requests_per_sync and chain_answer_max must be >= 0")
        if self.chain_answer_spacing_ms < 0:
            raise ValueError("chain_answer_spacing_ms must be >= 0")
        if self.log_window is not None and self.log_window < 1:
            raise ValueError("log_window must be >= 1 (or None: unbounded)")
        if min(self.in_flight_ms, self.reask_quiet_ms, self.answer_settle_ms) < 0:
            raise ValueError("in_flight_ms, reask_quiet_ms and answer_settle_ms must be >= 0")
        if self.gap_syncs_per_step < 1:
            raise ValueError("gap_syncs_per_step must be >= 1")
        if self.offer_archive_reads < 0:
            raise ValueError("offer_archive_reads must be >= 0")
        if self.max_heads < 1:
            raise ValueError("max_heads must be >= 1")
        if self.max_incoming_buffer < 1 or self.max_missing < 1 or self.max_lost < 1:
            raise ValueError("max_incoming_buffer, max_missing and max_lost must be >= 1")
