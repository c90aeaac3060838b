"""The transport interface every adapter implements.

A transport is a broadcast medium: ``publish`` bytes to a topic, ``subscribe``
to a topic and iterate what arrives, ``close``. It promises nothing about
delivery: SDS on top provides the reliability. Publishing may return a
*retrieval hint* for what was published; every adapter uses
:func:`message_hash`, so a store node that archived a message and a client
that saw it compute the same hint.

Exception tree::

    TransportError
     ├── TransportClosed      publish/subscribe after close()
     └── PayloadTooLarge      payload above the adapter's max_payload_size
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

TOPIC_PREFIX = "chorus/sds/v1/"


class TransportError(Exception):
    """Base class of every error a transport raises."""


class TransportClosed(TransportError):
    """The transport (or subscription) was closed."""


class PayloadTooLarge(TransportError, ValueError):
    """The payload exceeds what the transport can carry."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes exceeds the transport limit of {limit} bytes")
        self.size = size
        self.limit = limit


def message_hash(topic: str, payload: bytes) -> bytes:
    """The retrieval hint of ``payload`` published on ``topic``: SHA-256 over both.

    Deterministic, so every party that saw the message (sender, receivers,
    store node) derives the same 32 bytes.
    """
    h = hashlib.sha256()
    h.update(topic.encode())
    h.update(b"\x00")
    h.update(payload)
    return h.digest()


def topic_for_channel(channel_id: str) -> str:
    """The pub/sub topic that carries an SDS channel (``chorus/sds/v1/<channel_id>``)."""
    return TOPIC_PREFIX + channel_id


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message as it arrived from the transport."""

    topic: str
    payload: bytes
    #: :func:`message_hash` of topic and payload.
    retrieval_hint: bytes


class Subscription(abc.ABC):
    """An async iterator over the envelopes arriving on one topic."""

    topic: str

    def __aiter__(self) -> AsyncIterator[Envelope]:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> Envelope:
        """The next envelope; raises ``StopAsyncIteration`` once closed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop receiving; pending iteration ends."""


class Transport(abc.ABC):
    """Publish bytes to a topic, subscribe to a topic, close."""

    #: Largest payload the adapter accepts, or ``None`` when unbounded.
    max_payload_size: int | None = None

    @abc.abstractmethod
    async def publish(self, topic: str, payload: bytes) -> bytes:
        """Broadcast ``payload`` on ``topic``; return its retrieval hint.

        Raises :class:`PayloadTooLarge` or :class:`TransportClosed`.
        """

    @abc.abstractmethod
    async def subscribe(self, topic: str) -> Subscription:
        """Start receiving ``topic``; messages published after this returns are delivered."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release every resource; idempotent."""

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_size(self, payload: bytes) -> None:
        if self.max_payload_size is not None and len(payload) > self.max_payload_size:
            raise PayloadTooLarge(len(payload), self.max_payload_size)
