"""Transports: one small interface for broadcast pub/sub, and its adapters.

``transports.base`` defines :class:`Transport`; adapters live in their own
modules (``memory``, ``mqtt``, ``libp2p``) and are imported explicitly so the
heavy optional dependencies of one adapter never load for another.
Two-way byte streams for the sync protocols are ``stream`` (TCP, in-memory
pipes) and ``guarded`` (listeners with limits, deadlines, TLS and peer
authentication).
"""

from __future__ import annotations

from transports.base import (
    MAX_CHANNEL_ID_BYTES,
    Envelope,
    InvalidChannelId,
    InvalidTopic,
    PayloadTooLarge,
    Subscription,
    Transport,
    TransportClosed,
    TransportError,
    check_topic,
    message_hash,
    topic_for_channel,
    validate_channel_id,
)

__all__ = [
    "MAX_CHANNEL_ID_BYTES",
    "Envelope",
    "InvalidChannelId",
    "InvalidTopic",
    "PayloadTooLarge",
    "Subscription",
    "Transport",
    "TransportClosed",
    "TransportError",
    "check_topic",
    "message_hash",
    "topic_for_channel",
    "validate_channel_id",
]
