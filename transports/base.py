"""The transport interface every adapter implements.

A transport is a broadcast medium: ``publish`` bytes to a topic, ``subscribe``
to a topic and iterate what arrives, ``close``. It promises nothing about
delivery: SDS on top provides the reliability. Publishing may return a
*retrieval hint* for what was published; every adapter uses
:func:`message_hash`, so a store node that archived a message and a client
that saw it compute the same hint.

Every adapter delivers a node's own publications to its own matching
subscriptions (as an MQTT 3.1.1 broker and GossipSub do) unless it offers and
was given a no-local option (``MqttTransport(no_local=True)``), and any adapter
may deliver a message twice or not at all: the layer above deduplicates by
message id and repairs losses.

Acknowledgement seam: an adapter that can hand the acknowledgement of a message
to its consumer (MQTT with ``manual_ack=True``: the broker keeps a QoS 1 message
until its PUBACK) sets :attr:`Envelope.ack`; the consumer calls
:meth:`Envelope.acknowledge` once the message is safe (a store node: once the
batch holding it is committed). Elsewhere ``acknowledge()`` is a no-op, so a
consumer calls it unconditionally.

Subscriptions are bounded (:class:`QueueSubscription`): past ``max_pending``
messages or ``max_pending_bytes`` bytes the adapter applies backpressure (MQTT
stops reading its socket, or with ``manual_ack`` lets the broker's in-flight
window hold the rest; memory makes ``publish`` wait; libp2p stops moving
messages out of GossipSub, which then drops as it always does).

Exception tree::

    TransportError
     ├── TransportClosed      publish/subscribe after close()
     ├── PayloadTooLarge      payload above the adapter's max_payload_size
     └── InvalidTopic         a topic the transport cannot carry (also a ValueError)
          └── InvalidChannelId  a channel id no transport can carry
"""

from __future__ import annotations

import abc
import asyncio
import collections
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

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


class InvalidTopic(TransportError, ValueError):
    """A topic the transport cannot carry; raised before anything reaches the network."""


class InvalidChannelId(InvalidTopic):
    """A channel id that cannot be carried: raised at the API and config boundary,
    and by every adapter for a Chorus topic (:data:`TOPIC_PREFIX`) built from one."""

    def __init__(self, channel_id: object, reason: str) -> None:
        TransportError.__init__(self, f"invalid channel id {channel_id!r}: {reason}")
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


#: Longest topic in UTF-8 bytes (MQTT's string limit; GossipSub has none, so one rule).
MAX_TOPIC_BYTES = 65_535


def check_topic(topic: object, *, publish: bool) -> str:
    """Return ``topic`` if an adapter may hand it to its network; raise otherwise.

    A Chorus topic (:data:`TOPIC_PREFIX` + channel id) must carry a valid channel id
    (:func:`validate_channel_id`, raising :class:`InvalidChannelId`), for publish and
    subscribe alike, so ``join("a/+")`` fails at once instead of subscribing to a
    wildcard. Any other topic must be a non-empty ``str`` of valid UTF-8 of at most
    :data:`MAX_TOPIC_BYTES` bytes without NUL (which makes an MQTT broker drop the
    connection), and a published one must not contain the wildcards ``+`` / ``#``;
    otherwise :class:`InvalidTopic`.
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidTopic(f"invalid topic {topic!r}: must be a non-empty string")
    if topic.startswith(TOPIC_PREFIX):
        validate_channel_id(topic[len(TOPIC_PREFIX) :])
        return topic
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidTopic(f"invalid topic {topic!r}: not valid UTF-8") from None
    if size > MAX_TOPIC_BYTES:
        raise InvalidTopic(f"invalid topic {topic!r}: {size} bytes, over {MAX_TOPIC_BYTES}")
    if "\x00" in topic:
        raise InvalidTopic(f"invalid topic {topic!r}: contains NUL")
    if publish and ("+" in topic or "#" in topic):
        raise InvalidTopic(f"invalid topic {topic!r}: wildcards cannot be published to")
    return topic


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
    #: Set by an adapter that leaves acknowledgement to the consumer (see the module
    #: docstring); call :meth:`acknowledge` rather than this.
    ack: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def acknowledge(self) -> None:
        """Tell the transport this message is safely handled (e.g. committed to disk).

        Call it once per envelope received, from the event loop thread. Until then a
        transport with manual acknowledgement keeps the message unacknowledged, so a
        broker with a persistent session delivers it again after a crash. A no-op for
        transports that acknowledge on receipt.
        """
        if self.ack is not None:
            self.ack()


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


#: Default bound of a :class:`QueueSubscription`, in messages.
DEFAULT_MAX_PENDING = 10_000
#: Default bound of a :class:`QueueSubscription`, in payload bytes.
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024


class QueueSubscription(Subscription):
    """A :class:`Subscription` fed by its transport through a bounded queue.

    Every adapter shares it: the transport calls :meth:`deliver` from the event
    loop for each arriving envelope and :meth:`end` when the transport closes;
    ``on_close`` lets the transport forget the subscription (e.g. unsubscribe
    from the broker).

    The bound is ``max_pending`` envelopes or ``max_pending_bytes`` payload bytes.
    :meth:`deliver` never blocks and never drops (a transport's read loop must not
    stall mid-packet); it returns ``False`` once the queue is :attr:`full`, and the
    transport then stops producing until the consumer has drained it to half:
    :meth:`wait_for_room` for a task, or the ``on_room`` callback. The queue
    therefore overshoots its bound by at most what the transport had in hand when
    it paused (one packet for MQTT).
    """

    def __init__(
        self,
        topic: str,
        on_close: Callable[[QueueSubscription], None] | None = None,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        on_room: Callable[[], None] | None = None,
    ) -> None:
        if max_pending < 1 or max_pending_bytes < 1:
            raise ValueError("max_pending and max_pending_bytes must be >= 1")
        self.topic = topic
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._items: collections.deque[Envelope] = collections.deque()
        self._bytes = 0
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._on_close = on_close
        self._on_room = on_room
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or the transport's close) ended this subscription."""
        return self._closed

    @property
    def full(self) -> bool:
        """Whether the queue holds ``max_pending`` envelopes or ``max_pending_bytes``."""
        return len(self._items) >= self.max_pending or self._bytes >= self.max_pending_bytes

    def pending(self) -> int:
        """Envelopes received but not yet iterated."""
        return len(self._items)

    def pending_bytes(self) -> int:
        """Payload bytes received but not yet iterated."""
        return self._bytes

    def deliver(self, envelope: Envelope) -> bool:
        """Queue ``envelope`` (ignored once closed); ``False`` when the queue is now full."""
        if self._closed:
            return True
        self._items.append(envelope)
        self._bytes += len(envelope.payload)
        self._readable.set()
        if self.full:
            self._room.clear()
            return False
        return True

    async def wait_for_room(self) -> None:
        """Wait until a full queue has drained to half its bound (or the end)."""
        await self._room.wait()

    def end(self) -> None:
        """End iteration after what is already queued; the transport is going away."""
        if not self._closed:
            self._closed = True
            self._readable.set()
            self._room.set()

    async def __anext__(self) -> Envelope:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._readable.clear()
            await self._readable.wait()
        item = self._items.popleft()
        self._bytes -= len(item.payload)
        if (
            not self._room.is_set()
            and len(self._items) <= self.max_pending // 2
            and self._bytes <= self.max_pending_bytes // 2
        ):
            self._room.set()
            if self._on_room is not None:
                self._on_room()
        return item

    async def close(self) -> None:
        """Stop receiving; envelopes already queued are discarded and acknowledged
        (the consumer gave them up, so a transport with manual acknowledgement must
        not keep waiting for them)."""
        if self._closed:
            return
        discarded = list(self._items)
        self._items.clear()
        self._bytes = 0
        self.end()
        for envelope in discarded:
            envelope.acknowledge()
        if self._on_close is not None:
            self._on_close(self)
