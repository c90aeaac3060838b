"""The transport interface every adapter implements.

A transport is a broadcast medium: ``publish`` bytes to a topic, ``subscribe``
to a topic and iterate what arrives, ``close``. It promises nothing about
delivery: SDS on top provides the reliability. Publishing may return a
*retrieval hint* for what was published; every adapter uses
:func:`message_hash`, so a store node that archived a message and a client
that saw it compute the same hint.

Every adapter delivers a node's own publications to its own matching
subscriptions (as an MQTT 3.1.1 broker and GossipSub do), and any adapter may
deliver a message twice or not at all: the layer above deduplicates by
message id and repairs losses.

Exception tree::

    TransportError
     ├── TransportClosed      publish/subscribe after close()
     ├── PayloadTooLarge      payload above the adapter's max_payload_size
     └── InvalidChannelId     a channel id no transport can carry (also a ValueError)
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
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


class InvalidChannelId(TransportError, ValueError):
    """A channel id that cannot be carried: raised at the API and config boundary."""

    def __init__(self, channel_id: object, reason: str) -> None:
        super().__init__(f"invalid channel id {channel_id!r}: {reason}")
        self.channel_id = channel_id
        self.reason = reason


#: Longest channel id in UTF-8 bytes; the SDS decoder bounds ids the same way
#: (``sdk.sds.limits.Limits.max_id_length``).
MAX_CHANNEL_ID_BYTES = 256


def validate_channel_id(channel_id: object) -> str:
    """Return ``channel_id`` if every transport, the SDS wire format and every archive
    backend can carry it; raise :class:`InvalidChannelId` saying why otherwise.

    The one rule for the whole project, checked where a channel id enters (``join``,
    the store node's config): a non-empty ``str`` of valid UTF-8 (no lone surrogates)
    of at most :data:`MAX_CHANNEL_ID_BYTES` bytes, without control characters (NUL
    breaks PostgreSQL and MQTT, others break logs and file names) and without the MQTT
    wildcards ``+`` and ``#``, which cannot appear in a topic one publishes to.
    """
    if not isinstance(channel_id, str):
        raise InvalidChannelId(channel_id, f"must be a string, not {type(channel_id).__name__}")
    if not channel_id:
        raise InvalidChannelId(channel_id, "must not be empty")
    try:
        size = len(channel_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidChannelId(channel_id, "is not valid UTF-8 (lone surrogate)") from None
    if size > MAX_CHANNEL_ID_BYTES:
        raise InvalidChannelId(channel_id, f"is {size} bytes in UTF-8, over {MAX_CHANNEL_ID_BYTES}")
    for ch in channel_id:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code < 0xA0:
            raise InvalidChannelId(channel_id, f"contains control character U+{code:04X}")
        if ch in "+#":
            raise InvalidChannelId(channel_id, f"contains the MQTT wildcard {ch!r}")
    return channel_id


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


class QueueSubscription(Subscription):
    """A :class:`Subscription` fed by its transport through an unbounded queue.

    Every adapter shares it: the transport calls :meth:`deliver` from the
    event loop for each arriving envelope (never blocking, so a slow consumer
    cannot stall the transport's read loop and nothing is dropped here), and
    :meth:`end` when the transport closes. ``on_close`` lets the transport
    forget the subscription (e.g. unsubscribe from the broker).
    """

    def __init__(
        self, topic: str, on_close: Callable[[QueueSubscription], None] | None = None
    ) -> None:
        self.topic = topic
        self._queue: asyncio.Queue[Envelope | None] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or the transport's close) ended this subscription."""
        return self._closed

    def pending(self) -> int:
        """Envelopes received but not yet iterated."""
        return self._queue.qsize()

    def deliver(self, envelope: Envelope) -> None:
        """Queue ``envelope`` for the consumer; ignored once closed."""
        if not self._closed:
            self._queue.put_nowait(envelope)

    def end(self) -> None:
        """End iteration after what is already queued; the transport is going away."""
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    async def __anext__(self) -> Envelope:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            # Leave the sentinel for any other task iterating the same subscription.
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return item

    async def close(self) -> None:
        """Stop receiving; envelopes already queued are discarded."""
        if self._closed:
            return
        while not self._queue.empty():
            self._queue.get_nowait()
        self.end()
        if self._on_close is not None:
            self._on_close(self)
