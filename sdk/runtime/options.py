"""Knobs of the asyncio runtime (:class:`RuntimeOptions`).

Its own module so that both sides of the node/channel seam
(:mod:`sdk.runtime.node`, and :class:`~sdk.runtime.reliable_channel.ChannelHost`)
can name it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Knobs of the asyncio runtime (the protocol's are in :class:`~sdk.sds.ChannelConfig`).

    Every duration here is in seconds (floats); milliseconds exist only inside the core.
    """

    #: Datagrams queued for publishing before ``send`` waits (backpressure).
    max_pending_publishes: int = 1_024
    #: How long one store query (or one page of a catch-up) may take; SDS-R
    #: ``t_min_ms`` must not be shorter.
    store_timeout: float = 5.0
    #: Events held for an application that does not consume them. Beyond it,
    #: deliveries spill to the database (``events()`` reads them back from there, in
    #: order) or, without a database, the channel stops reading its subscription
    #: (backpressure); other events are dropped and counted (``events_dropped``).
    event_queue_limit: int = 10_000
    #: Envelopes processed before yielding so the turn's flush can run.
    receive_batch: int = 256
    #: How long ``close`` waits for queued datagrams to be published.
    close_timeout: float = 2.0
    #: Catch-up from the store starts this long before the participant was last
    #: active (store arrival clock vs ours, messages in flight when it went away).
    catch_up_overlap: float = 60.0
    #: Catch-up never reaches further back than this; older gaps are found through
    #: causal histories and fetched by id.
    catch_up_max_window: float = 30 * 86_400.0
    #: History fetched from the store when a channel is joined with no saved state
    #: (0: none; the first messages from peers reveal what to fetch).
    first_join_history: float = 0.0
    #: How often the transport's ``connected`` flag (if it has one) is checked, to
    #: announce the participant and catch up after a reconnect.
    connection_check_interval: float = 0.5
    #: With a ``store``: how often the node checks that the store holds the messages
    #: it published, publishing again those it lacks (0: never). A broker that
    #: crashes can forget the store node's session while peers already have (and
    #: acknowledged) the message, so SDS would never resend it (docs/runtime.md).
    store_confirm_interval: float = 5.0
    #: After a restart, own messages among this many last log entries are checked.
    store_confirm_backlog: int = 1_000
    #: Each further check of a message the store lacks waits twice as long as the
    #: last, up to this (a store slow to archive is not flooded).
    store_confirm_max_interval: float = 300.0
    #: Messages published again per ``store_confirm_interval`` at most, per channel
    #: (the rest wait for the next interval: ``store_republish_deferred``).
    store_republish_limit: int = 100
    #: A catch-up window the store did not answer for is retried after this long,
    #: doubling per failure up to ``catch_up_retry_max`` (each wait drawn in [d/2, d]);
    #: at once after a transport reconnect or when another store query succeeds.
    catch_up_retry_min: float = 1.0
    catch_up_retry_max: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "max_pending_publishes",
            "event_queue_limit",
            "receive_batch",
            "store_republish_limit",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.store_timeout <= 0 or self.connection_check_interval <= 0:
            raise ValueError("store_timeout and connection_check_interval must be > 0")
        if self.catch_up_retry_min <= 0 or self.catch_up_retry_max < self.catch_up_retry_min:
            raise ValueError("need 0 < catch_up_retry_min <= catch_up_retry_max")
        for name in (
            "close_timeout",
            "catch_up_overlap",
            "catch_up_max_window",
            "first_join_history",
            "store_confirm_interval",
            "store_confirm_backlog",
            "store_confirm_max_interval",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
