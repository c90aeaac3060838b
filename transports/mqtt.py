"""MQTT transport on paho-mqtt 2.x, driven by the asyncio event loop.

Theory of operation
-------------------
paho's client is used *without* its network thread. Its socket is registered
with the running loop (``add_reader``; ``add_writer`` only while paho has bytes
queued, toggled by paho's ``on_socket_register_write`` /
``on_socket_unregister_write`` hooks) and a one-second task calls
``loop_misc`` for keep-alive pings. Every paho callback therefore runs on the
loop thread: futures and queues are touched without locks, and no message
crosses a thread boundary. (The alternative, paho's ``loop_start`` thread
bridged with ``call_soon_threadsafe``, costs a thread hop per message and
leaves reconnection to paho, whose backoff has no jitter.)

paho reads a packet with three or more tiny ``recv`` calls; its socket is
wrapped (:class:`~transports.mqtt_socket.BufferedSocket`) so they are served
from one 64 KiB read, which is what lets a subscriber keep up with a flood. The two packets a flood
is made of, PUBLISH at QoS 0/1 without MQTT 5 properties and the plain PUBACK,
are taken whole from that buffer and handled by the adapter
(:meth:`MqttTransport._fast_packet`): paho built a message object with a
lock, a ``Properties`` and a ``ReasonCode`` per packet, and its reads and
callbacks were three quarters of a flood's MQTT CPU. The adapter still goes
through paho for what carries session state: a PUBACK retires the publish in
paho's in-flight table (``_do_on_publish``) and a PUBACK we owe is queued by
paho (``_send_puback``); every other packet (CONNACK, SUBACK, PINGRESP, QoS 2,
properties, anything malformed) is put back and read by paho itself. Every
private name of paho used here is reached through :mod:`transports.paho_private`,
which checks them all when it is imported. paho also
writes one
``send`` per packet; every packet queued in one loop iteration (publishes and
the PUBACKs for a batch of reads) is written in one pass, collected by the
wrapper and handed to the kernel in one ``send`` (a system call per packet was
a tenth of a flood's CPU).

paho logs every packet at DEBUG level; those calls are skipped unless this
module's logger is enabled for DEBUG (they were 3 % of a flood's CPU), while
paho's warnings and errors always reach it.

The one blocking step, TCP connect plus TLS handshake plus sending CONNECT, runs
in the default executor while the loop leaves the client alone (publish and
subscribe wait for the connection); the socket is registered with the loop
only once that call returned.

A supervisor task owns the connection: after a loss it reconnects with
exponential backoff and full jitter (so a broker restart is not met by every
client at the same instant) and re-subscribes every topic. QoS 1 messages
handed to paho before the loss are kept by paho and re-sent after the
reconnect.

Choices
-------
* **QoS 1 by default** for publish and subscribe. SDS repairs loss, but a
  repair costs a sync round (seconds); QoS 1 makes each broker hop
  at-least-once for one PUBACK, and the duplicates it can create are dropped
  by SDS's message-id check for the price of a lookup. QoS 2 adds a second
  round trip per message to buy exactly-once, which SDS already provides.
  ``publish(..., qos=0)`` suits ephemeral messages (typing indicators).
* **Backpressure**: at most ``max_inflight`` QoS>0 publishes are un-acknowledged;
  the next ``publish`` waits for a PUBACK (fewer if an MQTT 5 broker announces a
  smaller Receive Maximum, Mosquitto's being 20: exceeding it is a protocol
  error, and paho does not enforce it). QoS 0 publishes wait until paho's
  send buffer is flushed to the socket. While disconnected, ``publish`` waits
  for the reconnection (wrap it in ``asyncio.timeout`` to fail instead).
* **Clean session by default**: a reconnect starts a fresh broker session and
  re-subscribes. SDS recovers what was missed while offline from peers and
  store nodes; a persistent session (``persistent_session=True``, needs a stable
  ``client_id``) additionally has the broker queue QoS 1 messages while the
  client is away, which shortens repair after short outages but is bounded by
  the broker's ``max_queued_messages`` anyway. What the broker delivers from
  such a session before ``subscribe()`` is called again (after a process
  restart) is kept, up to 10,000 messages, for the subscribe that claims it.
* **Mosquitto's ``max_queued_messages`` (default 1000)** silently drops QoS 1
  messages for a subscriber whose in-flight window is full, i.e. during bursts.
  That window is ``max_inflight_messages`` (default 20) for MQTT 3.1.1 clients
  and the client's Receive Maximum for MQTT 5 clients; this adapter announces
  65535 (``receive_maximum``) so the broker sends instead of queueing, and it
  reads and acknowledges at socket speed. ``bench/transport.py --only stalled``
  shows a 2 s stall costing an MQTT 3.1.1 subscriber all but 1020 messages of
  a 5000-message burst and an MQTT 5 one none. For 3.1.1 clients raise the
  broker limits (``max_queued_messages 10000``, ``max_inflight_messages 100``);
  SDS repairs whatever is still dropped.
* **Acknowledge after processing** (``manual_ack=True``): paho then sends no
  PUBACK on receipt; each QoS 1 envelope carries an ``ack`` and the PUBACK goes
  out when the consumer calls :meth:`~transports.base.Envelope.acknowledge`.
  PUBACKs leave in the order the PUBLISHes arrived (MQTT 3.1.1 §4.6, MQTT 5
  §4.6), so an acknowledgement waits for the earlier ones. An acknowledgement
  from before a reconnect is dropped: that connection's packet ids are gone,
  and a persistent session makes the broker send the message again. Together
  with ``persistent_session=True`` this is what lets a store node acknowledge
  only what it has committed (``docs/store-node.md``, "Durability"). QoS 2
  deliveries are not covered: paho answers PUBREC on receipt and keeps no
  session on disk, so subscribe at QoS 1 (the default).
* **No local** (``no_local=True``): the node does not get its own publications
  back. MQTT 5 asks the broker (the No Local subscription option); on MQTT
  3.1.1, which has none, the adapter drops arriving messages whose retrieval
  hint (topic and payload hash) matches one of its last 4,096 publications.
  Identical bytes from another client on the same topic are dropped too, which
  for SDS is harmless: they carry the same message id.
* **Bounded subscriptions**: each subscription queues at most ``max_pending``
  messages / ``max_pending_bytes`` bytes; when one is full the adapter stops
  reading the socket until the consumer has drained it to half, so the broker
  (not this process) holds the backlog, bounded by its own limits. A pause
  longer than ``keepalive`` also holds back the broker's PINGRESP, so paho
  drops the connection and the supervisor reconnects (with a clean session
  what arrived meanwhile is for SDS to repair). With ``manual_ack=True``
  reading never pauses: the broker sends at most ``receive_maximum`` (MQTT 5)
  or its ``max_inflight_messages`` (MQTT 3.1.1) unacknowledged messages, and
  that window is the bound.
* **Topics**: :func:`~transports.base.check_topic` runs before paho sees a topic,
  so a bad channel id raises :class:`~transports.base.InvalidChannelId` instead
  of reaching the broker (a NUL in a topic makes Mosquitto drop the connection,
  in a loop with reconnects).
* **Payload size**: MQTT caps a packet at 268,435,455 bytes (256 MiB); an MQTT 5
  broker may announce a lower Maximum Packet Size in CONNACK, which is then
  honoured. Mosquitto's ``message_size_limit`` / ``max_packet_size`` are not
  announced to MQTT 3.1.1 clients and oversize messages are dropped silently,
  so pass the broker's limit as ``max_payload_size``. Oversize payloads raise
  :class:`~transports.base.PayloadTooLarge` before anything is sent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import socket
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, LogLevel, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from transports import paho_private
from transports.base import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    Envelope,
    PayloadTooLarge,
    QueueSubscription,
    Subscription,
    Transport,
    TransportClosed,
    TransportError,
    check_topic,
    message_hash,
)
from transports.mqtt_socket import BufferedSocket, MalformedLength
from transports.tasks import cancel_and_wait

__all__ = ["MQTT_MAX_PACKET_SIZE", "MqttStats", "MqttTransport"]

log = logging.getLogger(__name__)

#: Largest MQTT control packet the protocol can express (remaining length 268,435,455).
MQTT_MAX_PACKET_SIZE = 268_435_455 + 5

# Room kept for the fixed header, topic and packet id when max_payload_size is
# derived from a packet limit; the exact check in publish uses the real topic.
_HEADER_ALLOWANCE = 1024


@dataclass(slots=True)
class MqttStats:
    """Counters of what the transport did; read them for monitoring and tests."""

    published: int = 0
    acknowledged: int = 0
    received: int = 0
    connects: int = 0
    connection_losses: int = 0
    #: PUBACKs carrying an MQTT 5 failure reason code (e.g. quota exceeded).
    publish_rejected: int = 0
    #: PUBACKs sent for received messages after the consumer acknowledged them
    #: (``manual_ack=True`` only).
    acks_sent: int = 0
    #: Received messages dropped as our own publications (``no_local`` on MQTT 3.1.1).
    own_dropped: int = 0
    #: Received messages whose topic is not valid UTF-8 (dropped).
    bad_topic: int = 0
    #: Times reading stopped because a subscription was full (backpressure).
    read_pauses: int = 0


class MqttTransport(Transport):
    """A :class:`~transports.base.Transport` over one MQTT broker connection.

    Use ``async with MqttTransport(...) as t:`` or ``await t.connect()`` first;
    :meth:`from_url` parses ``mqtt://[user:password@]host[:port]`` and
    ``mqtts://`` (TLS with the system's default trust store).

    ``protocol`` is ``5`` or ``"3.1.1"`` (amqtt speaks 3.1.1 only). ``tls`` is an
    :class:`ssl.SSLContext`. ``qos`` is the default for publish and subscribe.
    ``reconnect_min`` / ``reconnect_max`` bound the backoff in seconds.
    ``manual_ack``, ``no_local`` and ``max_pending`` / ``max_pending_bytes``: see
    the module notes.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        protocol: Literal[5, "3.1.1"] = 5,
        qos: Literal[0, 1, 2] = 1,
        keepalive: int = 30,
        persistent_session: bool = False,
        session_expiry: int = 3600,
        max_inflight: int = 100,
        receive_maximum: int = 65535,
        max_payload_size: int | None = None,
        connect_timeout: float = 10.0,
        reconnect_min: float = 0.1,
        reconnect_max: float = 30.0,
        manual_ack: bool = False,
        no_local: bool = False,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        if persistent_session and client_id is None:
            raise ValueError("persistent_session=True needs a stable client_id")
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.host = host
        self.port = port if port is not None else (8883 if tls is not None else 1883)
        self.client_id = client_id or f"chorus-{uuid.uuid4().hex[:16]}"
        self.qos = qos
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.stats = MqttStats()
        self._v5 = protocol == 5
        self._persistent = persistent_session
        self._session_expiry = session_expiry
        self._receive_maximum = receive_maximum
        self._max_inflight = max_inflight
        self._manual_ack = manual_ack
        self._no_local = no_local
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes
        self._user_payload_limit = max_payload_size
        self._broker_packet_limit = MQTT_MAX_PACKET_SIZE
        self.max_payload_size = self._payload_limit()

        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if self._v5 else not persistent_session,
            protocol=MQTTProtocolVersion.MQTTv5 if self._v5 else MQTTProtocolVersion.MQTTv311,
            # Reconnection is the supervisor's job; paho must not retry on its own.
            reconnect_on_failure=False,
            manual_ack=manual_ack,
        )
        client.connect_timeout = connect_timeout
        # A bug in a callback must be logged, not tear down paho's read loop.
        client.suppress_exceptions = True
        client.enable_logger(log)
        # paho's per-packet DEBUG lines cost a logging call each even when nobody
        # listens: an instance attribute shadowing the method filters them first.
        paho_private.set_log(client, _paho_log)
        self._paho_fast = paho_private.FastPath(client)
        # publish() keeps at most max_inflight QoS>0 messages un-acknowledged (_window),
        # so paho's own limit never binds; left on, paho rescans every message it
        # holds on each PUBACK looking for a queued one to send. 0: no paho limit.
        client.max_inflight_messages_set(0)
        if username is not None:
            client.username_pw_set(username, password)
        if tls is not None:
            client.tls_set_context(tls)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_socket_close = self._on_socket_close
        self._client = client

        self._loop: asyncio.AbstractEventLoop | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._misc_task: asyncio.Task[None] | None = None
        self._closed = False
        self._connected = False
        self._ever_connected = False
        self._connect_error: str | None = None
        self._lost = asyncio.Event()
        # Wakes every waiter when connection, subscription or ack state changes;
        # waiters re-check their own condition (a condition variable without a lock).
        self._changed = asyncio.Event()
        self._window = asyncio.Semaphore(max_inflight)
        self._send_quota = max_inflight
        self._unacked: set[int] = set()
        # Topics check_topic accepted for publishing (a pure check, run once per topic
        # instead of a character loop over the channel id per message).
        self._valid_topics: set[str] = set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._writer_registered = False
        self._flush_scheduled = False
        self._flushing = False

        self._subs: list[QueueSubscription] = []
        #: topic filter -> number of open subscriptions on it
        self._filters: dict[str, int] = {}
        #: filters the broker acknowledged on the current connection
        self._active: set[str] = set()
        #: filters with a SUBSCRIBE in flight on the current connection
        self._requested: set[str] = set()
        #: SUBSCRIBE mid -> its filters
        self._suback_mids: dict[int, list[str]] = {}
        #: filters the broker refused, with the reason
        self._refused: dict[str, str] = {}
        #: With a persistent session the broker delivers what it queued for us
        #: right after CONNACK, before the application had a chance to call
        #: subscribe() again (e.g. after a process restart). Those messages wait
        #: here, bounded, for the subscribe() that claims them.
        #: With manual_ack nothing is dropped here (that would lose it for good): the
        #: broker's Receive Maximum (65535) / max_inflight_messages bounds it instead.
        self._unclaimed: collections.deque[Envelope] = collections.deque(
            maxlen=None if manual_ack else _UNCLAIMED_LIMIT if persistent_session else 0
        )
        # Manual acknowledgement: packet ids of QoS 1 messages in arrival order, those
        # the consumer has acknowledged, and how many deliveries of each still owe an
        # acknowledgement. All of it belongs to one connection (_ack_generation).
        self._ack_generation = 0
        self._ack_order: collections.deque[int] = collections.deque()
        self._ack_done: set[int] = set()
        self._ack_owed: dict[int, int] = {}
        #: Retrieval hints of recent publications, for no-local on MQTT 3.1.1.
        self._own: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        #: Reading is paused because a subscription is full (backpressure).
        self._paused = False
        #: Subscriptions whose subscribe() returned, i.e. that can have a consumer.
        #: Only these pause reading: one still waiting for its SUBACK cannot drain.
        self._ready: set[QueueSubscription] = set()

    # ------------------------------------------------------------------ public

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> MqttTransport:
        """Build from ``mqtt://[user:password@]host[:port][?protocol=3.1.1]`` or ``mqtts://...``.

        ``mqtts`` uses ``ssl.create_default_context()`` unless ``tls=`` is given;
        other keyword arguments go to the constructor.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts"):
            raise ValueError(f"expected an mqtt:// or mqtts:// URL, got {url!r}")
        for key, value in parse_qsl(parts.query):
            if key != "protocol" or value not in ("5", "3.1.1"):
                raise ValueError(f"unknown URL parameter {key}={value!r} (only protocol=5|3.1.1)")
            kwargs.setdefault("protocol", 5 if value == "5" else "3.1.1")
        if parts.scheme == "mqtts":
            kwargs.setdefault("tls", ssl.create_default_context())
        if parts.username is not None:
            kwargs.setdefault("username", unquote(parts.username))
        if parts.password is not None:
            kwargs.setdefault("password", unquote(parts.password))
        return cls(parts.hostname or "127.0.0.1", parts.port, **kwargs)

    @property
    def connected(self) -> bool:
        """Whether the broker has accepted the current connection."""
        return self._connected

    async def connect(self) -> None:
        """Connect once; then a supervisor keeps the connection up until :meth:`close`.

        Raises :class:`TransportError` when the first connection fails (broker
        unreachable, credentials refused): a misconfiguration should be loud.
        Later losses are retried forever.
        """
        if self._closed:
            raise TransportClosed("MQTT transport is closed")
        if self._supervisor is not None:
            return
        self._loop = asyncio.get_running_loop()
        try:
            await self._connect_once()
        except TransportError:
            self._teardown_socket()
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="mqtt-supervisor")
        self._misc_task = asyncio.create_task(self._misc(), name="mqtt-keepalive")

    async def __aenter__(self) -> MqttTransport:
        await self.connect()
        return self

    async def publish(self, topic: str, payload: bytes, *, qos: int | None = None) -> bytes:
        """Publish ``payload`` on ``topic``; returns its retrieval hint.

        Returns once the message is handed to the connection within the
        in-flight window (see the module notes on backpressure); :meth:`flush`
        waits for the broker's acknowledgements.
        """
        self._check_open()
        if topic not in self._valid_topics:
            check_topic(topic, publish=True)  # raises for a bad topic, every time
            if len(self._valid_topics) >= _VALID_TOPICS_LIMIT:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        qos = self.qos if qos is None else qos
        payload = bytes(payload)
        self._check_packet_size(topic, payload, qos)
        hint = message_hash(topic, payload)  # once: it is also the own-echo key
        if self._no_local and not self._v5:
            self._remember_own(hint)
        if qos == 0:
            await self._wait_for(lambda: self._connected)
            self._client.publish(topic, payload, qos=0)
            self.stats.published += 1
            if self._client.want_write():
                self._drained.clear()
                await self._drained.wait()
            return hint
        await self._window.acquire()
        try:
            await self._wait_for(lambda: self._connected and len(self._unacked) < self._send_quota)
        except BaseException:
            self._window.release()
            raise
        info = self._client.publish(topic, payload, qos=qos)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            # NO_CONN still keeps the message queued in paho for the reconnect.
            self._window.release()
            raise TransportError(f"paho refused the publish: {paho.error_string(info.rc)}")
        self._unacked.add(info.mid)
        self.stats.published += 1
        return hint

    async def wait_ready(self) -> None:
        """Wait until connected and every subscription is acknowledged by the broker.

        After a reconnect, messages published before this returns may have
        missed this client's re-subscription (clean session): that is the
        window SDS repairs.
        """
        self._check_open()
        await self._wait_for(
            lambda: (
                self._connected
                and all(t in self._active or t in self._refused for t in self._filters)
            )
        )

    async def flush(self) -> None:
        """Wait until the broker acknowledged every QoS>0 publish made so far."""
        self._check_open()
        await self._wait_for(lambda: not self._unacked)

    async def subscribe(self, topic: str) -> Subscription:
        """Subscribe to ``topic`` (MQTT filters with ``+``/``#`` allowed).

        Returns after the broker's SUBACK, so messages published afterwards are
        delivered. Raises :class:`TransportError` if the broker refuses, and
        :class:`~transports.base.InvalidTopic` / ``InvalidChannelId`` before
        anything is sent for a topic the broker cannot take (a Chorus topic must
        name a valid channel id: no wildcards there).
        """
        self._check_open()
        check_topic(topic, publish=False)
        sub = QueueSubscription(
            topic,
            self._drop_subscription,
            max_pending=self._max_pending,
            max_pending_bytes=self._max_pending_bytes,
            on_room=self._on_room,
        )
        self._subs.append(sub)
        self._claim_unclaimed(sub)
        self._filters[topic] = self._filters.get(topic, 0) + 1
        self._refused.pop(topic, None)
        if self._connected and topic not in self._active and topic not in self._requested:
            self._send_subscribe([topic])
        try:
            await self._wait_for(lambda: topic in self._active or topic in self._refused)
        except BaseException:
            await sub.close()
            raise
        if topic in self._refused:
            reason = self._refused[topic]
            await sub.close()
            raise TransportError(f"broker refused the subscription to {topic!r}: {reason}")
        self._ready.add(sub)
        if sub.full:
            self._pause_reading()  # what the session held for it already fills it
        return sub

    async def close(self) -> None:
        """Disconnect after waiting briefly (2 s) for outstanding acks; idempotent."""
        if self._closed:
            return
        if self._connected and self._unacked:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._wait_for(lambda: not self._unacked or not self._connected)
        self._closed = True
        await cancel_and_wait([self._supervisor, self._misc_task])
        if self._connected:
            self._client.disconnect()
            # Write DISCONNECT now; paho closes the socket after sending it.
            self._write()
        self._teardown_socket()
        self._connected = False
        for sub in self._subs:
            sub.end()
        self._subs.clear()
        self._ready.clear()
        self._notify()

    # --------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed("MQTT transport is closed")
        if self._loop is None:
            raise TransportError("call connect() (or use 'async with') before using the transport")

    def _payload_limit(self) -> int:
        limit = self._broker_packet_limit - _HEADER_ALLOWANCE
        if self._user_payload_limit is not None:
            limit = min(limit, self._user_payload_limit)
        return limit

    def _check_packet_size(self, topic: str, payload: bytes, qos: int) -> None:
        limit = self.max_payload_size
        assert limit is not None
        if len(payload) > limit:
            raise PayloadTooLarge(len(payload), limit)
        # Exact PUBLISH packet size: topic string, packet id, v5 property length.
        remaining = 2 + len(topic.encode()) + (2 if qos else 0) + (1 if self._v5 else 0)
        remaining += len(payload)
        size = 1 + _varint_len(remaining) + remaining
        if remaining > 268_435_455 or size > self._broker_packet_limit:
            room = len(payload) - (size - min(self._broker_packet_limit, MQTT_MAX_PACKET_SIZE))
            raise PayloadTooLarge(len(payload), max(room, 0))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            if self._closed:
                raise TransportClosed("MQTT transport is closed")
            await self._changed.wait()

    async def _connect_once(self) -> None:
        """One connection attempt: blocking connect in the executor, then CONNACK."""
        loop = self._loop
        assert loop is not None
        client = self._client
        self._connect_error = None
        self._lost.clear()
        # While the executor owns the client, paho must write CONNECT itself
        # instead of asking this loop (which is on another thread) to do it.
        client.on_socket_register_write = None
        client.on_socket_unregister_write = None
        blocking = loop.run_in_executor(
            None, client.reconnect if self._ever_connected else self._first_connect
        )
        try:
            await asyncio.shield(blocking)
        except asyncio.CancelledError:
            # close() cancelled us while the executor thread is still connecting:
            # close whatever socket it ends up opening, on this loop.
            blocking.add_done_callback(self._discard_late_connection)
            raise
        except (OSError, ValueError) as err:
            raise TransportError(
                f"cannot reach MQTT broker {self.host}:{self.port}: {err}"
            ) from err
        raw = client.socket()
        if raw is None:
            raise TransportError(f"MQTT broker {self.host}:{self.port} closed the connection")
        # Every SDS participant both publishes and receives QoS 1: with Nagle's
        # algorithm on, small PUBACKs and publishes wait for each other's ACKs
        # (measured p50 22 ms instead of 0.3-0.6 ms).
        if isinstance(raw, socket.socket) and raw.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = BufferedSocket(raw)
        paho_private.set_socket(client, sock)
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        self._writer_registered = False
        loop.add_reader(sock, self._on_readable)
        if client.want_write():
            self._on_register_write(client, None, sock)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._wait_for(lambda: self._connected or self._lost.is_set())
        except TimeoutError:
            self._teardown_socket()
            hint = (
                " (a broker that only speaks MQTT 3.1.1, such as amqtt, ignores an MQTT 5"
                " CONNECT: use protocol='3.1.1')"
                if self._v5
                else ""
            )
            raise TransportError(
                f"MQTT broker {self.host}:{self.port} sent no CONNACK within "
                f"{self.connect_timeout} s{hint}"
            ) from None
        if not self._connected:
            self._teardown_socket()
            raise TransportError(
                f"MQTT broker {self.host}:{self.port} refused the connection: "
                f"{self._connect_error or 'connection lost'}"
            )

    def _discard_late_connection(self, attempt: asyncio.Future[Any]) -> None:
        if not attempt.cancelled():
            attempt.exception()  # retrieved: a failed late attempt is not an error
        self._teardown_socket()

    def _first_connect(self) -> None:
        client = self._client
        if self._v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.ReceiveMaximum = self._receive_maximum
            props.SessionExpiryInterval = self._session_expiry if self._persistent else 0
            client.connect(
                self.host,
                self.port,
                self.keepalive,
                clean_start=not self._persistent,
                properties=props,
            )
        else:
            client.connect(self.host, self.port, self.keepalive)

    async def _supervise(self) -> None:
        attempt = 0
        while not self._closed:
            await self._lost.wait()
            while not self._closed:
                # Full jitter: sleep uniformly in [0, min(max, min * 2^attempt)].
                ceiling = min(self.reconnect_max, self.reconnect_min * 2**attempt)
                await asyncio.sleep(random.uniform(0, ceiling))
                attempt += 1
                try:
                    await self._connect_once()
                except TransportError as err:
                    log.info("MQTT reconnect failed (attempt %d): %s", attempt, err)
                    continue
                attempt = 0
                break

    async def _misc(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self._connected:
                self._client.loop_misc()

    def _teardown_socket(self) -> None:
        # paho's own close path: it calls on_socket_close (which unregisters
        # the socket from the loop) before closing the file descriptor.
        if self._client.socket() is not None:
            self._client._sock_close()

    def _remove_io(self, sock: Any) -> None:
        loop = self._loop
        if loop is None or sock is None:
            return
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(sock)
        with contextlib.suppress(ValueError, OSError):
            loop.remove_writer(sock)
        self._writer_registered = False
        self._flush_scheduled = False
        self._drained.set()

    def _send_subscribe(self, topics: list[str]) -> None:
        requests: list[tuple[str, Any]]
        if self._v5:
            options = SubscribeOptions(qos=self.qos, noLocal=self._no_local)
            requests = [(t, options) for t in topics]
        else:
            requests = [(t, self.qos) for t in topics]
        rc, mid = self._client.subscribe(requests)
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
            self._requested.update(topics)
            self._suback_mids[mid] = topics

    def _claim_unclaimed(self, sub: QueueSubscription) -> None:
        if not self._unclaimed:
            return
        keep: list[Envelope] = []
        for envelope in self._unclaimed:
            if paho.topic_matches_sub(sub.topic, envelope.topic):
                sub.deliver(envelope)  # if it fills up, _on_subscribe pauses reading
            else:
                keep.append(envelope)
        self._unclaimed.clear()
        self._unclaimed.extend(keep)

    def _drop_subscription(self, sub: QueueSubscription) -> None:
        self._ready.discard(sub)
        self._on_room()  # it may have been the full one
        with contextlib.suppress(ValueError):
            self._subs.remove(sub)
        count = self._filters.get(sub.topic, 0) - 1
        if count > 0:
            self._filters[sub.topic] = count
            return
        self._filters.pop(sub.topic, None)
        self._active.discard(sub.topic)
        self._requested.discard(sub.topic)
        if self._connected and not self._closed:
            self._client.unsubscribe(sub.topic)

    # ------------------------------------------------------- paho callbacks
    # All of them run on the event loop thread (see the module docstring).

    def _on_readable(self) -> None:
        client = self._client
        if self._paused:
            return
        raw = client.socket()
        if not isinstance(raw, BufferedSocket):
            client.loop_read()
            return
        sock = raw
        # Whole packets from the buffer: PUBLISH (QoS 0/1, no MQTT 5 properties) and
        # plain PUBACKs are handled here, everything else by paho from the same bytes.
        # The cap keeps one busy connection from starving the rest of the loop.
        fast = 0
        for _ in range(_READ_BATCH):
            if self._paused or client.socket() is not sock:
                break
            if paho_private.reading_packet(client):
                client.loop_read()  # paho is part-way through a packet: it finishes it
                if paho_private.reading_packet(client) and not sock.pending():
                    break  # the rest of it has not arrived
                continue
            try:
                packet = sock.next_packet()
            except MalformedLength:
                client.loop_read()  # paho reads the same bytes and drops the connection
                break
            except OSError:
                packet = None
                sock.closed_by_peer = True
            if packet is None:
                if sock.closed_by_peer:
                    client.loop_read()  # paho reads the end of the stream and reports it
                break
            if self._fast_packet(*packet):
                fast += 1
            else:
                sock.rewind()
                client.loop_read()
        else:
            if self._loop is not None:
                self._loop.call_soon(self._on_readable)
        if fast:
            # paho's keep-alive measures silence from here, as its _packet_read does.
            paho_private.mark_received(client, paho.time_func())

    def _fast_packet(self, command: int, body: bytes) -> bool:
        """Handle the two packets of a flood without paho's per-byte reads and
        per-message objects; ``False`` leaves the packet to paho (any other type,
        QoS 2, MQTT 5 properties, or anything malformed)."""
        kind = command & 0xF0
        if kind == 0x40:  # PUBACK
            if len(body) != 2:
                return False  # MQTT 5 reason code and properties: paho decodes them
            self._paho_fast.retire_publish((body[0] << 8) | body[1])
            return True
        if kind != 0x30:
            return False
        qos = (command & 0x06) >> 1
        size = len(body)
        if qos > 1 or size < 2:
            return False
        end = 2 + ((body[0] << 8) | body[1])
        mid = 0
        if qos:
            if end + 2 > size:
                return False
            mid = (body[end] << 8) | body[end + 1]
            start = end + 2
        else:
            start = end
        if self._v5:
            if start >= size or body[start] != 0:
                return False  # properties (or a malformed length): paho's decoder
            start += 1
        if start > size or end == 2:
            return False  # an empty topic is malformed in 3.1.1 and an alias in 5
        try:
            topic = body[2:end].decode()
        except UnicodeDecodeError:
            return False
        try:
            self._deliver(topic, body[start:], qos, mid)
        except Exception:  # a bug here must not stop the reading, as in paho's callbacks
            log.exception("MQTT message handling failed")
        if qos and not self._manual_ack:
            self._paho_fast.send_puback(mid)
        return True

    def _pause_reading(self) -> None:
        if self._paused or self._loop is None or self._manual_ack:
            # With manual_ack the broker's in-flight window is the bound (see the module
            # notes), and reading must go on: a paused socket also stops PINGRESPs, and
            # keep-alive would drop the connection under a consumer slower than it.
            return
        if self._suback_mids or not any(sub.full for sub in self._ready):
            # A subscribe() is waiting for its SUBACK, which is behind the messages in
            # the socket: pausing now would deadlock it (its caller cannot start
            # consuming before it returns), and so would pausing for a subscription
            # whose subscribe() has not returned. Until then the broker's in-flight
            # window bounds what it holds; subscribe() pauses once it returns.
            return
        self._paused = True
        self.stats.read_pauses += 1
        sock = self._client.socket()
        if sock is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock)

    def _on_room(self) -> None:
        """A subscription drained to half: resume reading if none is still full."""
        if not self._paused or any(sub.full for sub in self._ready):
            return
        self._paused = False
        sock = self._client.socket()
        if sock is not None and self._loop is not None:
            self._loop.add_reader(sock, self._on_readable)
            # Bytes already in the buffered socket are not reported by the selector.
            self._loop.call_soon(self._on_readable)

    def _remember_own(self, hint: bytes) -> None:
        own = self._own
        own[hint] = None
        if len(own) > _OWN_LIMIT:
            own.popitem(last=False)

    def _ack_later(self, mid: int, owed: int) -> Callable[[], None]:
        """Register a QoS 1 delivery awaiting ``owed`` consumer acknowledgements."""
        self._ack_order.append(mid)
        self._ack_owed[mid] = owed
        return functools.partial(self._consumer_ack, self._ack_generation, mid)

    def _consumer_ack(self, generation: int, mid: int) -> None:
        if generation != self._ack_generation:
            return  # an earlier connection's packet id: the broker sends it again
        owed = self._ack_owed.get(mid)
        if owed is None:
            return
        if owed > 1:
            self._ack_owed[mid] = owed - 1
            return
        del self._ack_owed[mid]
        self._ack_done.add(mid)
        order = self._ack_order
        done = self._ack_done
        while order and order[0] in done:
            first = order.popleft()
            done.discard(first)
            self._client.ack(first, 1)
            self.stats.acks_sent += 1

    def _reset_acks(self) -> None:
        self._ack_generation += 1
        self._ack_order.clear()
        self._ack_done.clear()
        self._ack_owed.clear()

    def _write(self) -> None:
        """Have paho write what it queued, collected by the socket wrapper and sent in
        one system call; what the kernel does not take waits for writability."""
        client = self._client
        sock = client.socket()
        if not isinstance(sock, BufferedSocket):
            client.loop_write()
            return
        sock.collect = True
        try:
            client.loop_write()
        finally:
            sock.collect = False
        if sock.flush():
            if self._writer_registered and not client.want_write():
                self._on_unregister_write(client, None, sock)
            elif not client.want_write():
                self._drained.set()
        elif not self._writer_registered and self._loop is not None:
            self._drained.clear()
            self._loop.add_writer(sock, self._on_writable)
            self._writer_registered = True

    def _on_writable(self) -> None:
        self._write()

    def _flush_writes(self) -> None:
        self._flush_scheduled = False
        if self._client.socket() is None:
            return
        self._flushing = True
        try:
            self._write()
        finally:
            self._flushing = False

    def _on_register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._drained.clear()
        if self._loop is None or self._writer_registered:
            return
        if self._flushing:
            # The socket did not take everything (not collected: a socket paho
            # was given before the wrapper): wait until it is writable.
            self._loop.add_writer(sock, self._on_writable)
            self._writer_registered = True
        elif not self._flush_scheduled:
            # Coalesce every packet queued during this loop iteration (e.g. the
            # PUBACKs for a batch of reads) into one write pass, without the
            # two epoll_ctl calls of registering a writer each time.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_writes)

    def _on_unregister_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        if isinstance(sock, BufferedSocket) and sock.unsent():
            return  # paho's queue is empty, the wrapper's is not: _write finishes it
        if self._writer_registered and self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_writer(sock)
            self._writer_registered = False
        self._drained.set()

    def _on_socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._remove_io(sock)

    def _on_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: Any,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            self._connect_error = str(reason_code)
            return
        self._connected = True
        self._ever_connected = True
        self.stats.connects += 1
        self._reset_acks()
        if properties is not None:
            limit = getattr(properties, "MaximumPacketSize", None)
            if limit:
                self._broker_packet_limit = min(int(limit), MQTT_MAX_PACKET_SIZE)
                self.max_payload_size = self._payload_limit()
            receive_max = getattr(properties, "ReceiveMaximum", None)
            # The broker's Receive Maximum caps our un-acknowledged QoS>0
            # publishes (MQTT 5 §3.3.4); exceeding it is a protocol error.
            # paho does not enforce it, so publish() does.
            self._send_quota = min(self._max_inflight, int(receive_max or 65535))
        # Re-subscribe everything on every connect: harmless on a resumed
        # session, necessary on a clean one.
        self._active.clear()
        self._requested.clear()
        self._suback_mids.clear()
        if self._filters:
            self._send_subscribe(list(self._filters))
        self._notify()

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: Any,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        was_connected = self._connected
        self._connected = False
        # The next connection must be able to read its CONNACK; a still-full
        # subscription pauses it again after one message.
        self._paused = False
        self._active.clear()
        self._requested.clear()
        self._suback_mids.clear()
        if was_connected and not self._closed:
            self.stats.connection_losses += 1
            log.warning("MQTT connection to %s:%s lost: %s", self.host, self.port, reason_code)
        elif self._connect_error is None:
            self._connect_error = str(reason_code)
        self._lost.set()
        self._notify()

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        try:
            topic: str | None = message.topic
        except UnicodeDecodeError:
            topic = None
        self._deliver(topic, bytes(message.payload), message.qos, message.mid)

    def _deliver(self, topic: str | None, payload: bytes, qos: int, mid: int) -> None:
        """One received PUBLISH (from paho's callback or :meth:`_fast_packet`); ``topic``
        is ``None`` when it is not valid UTF-8."""
        manual = self._manual_ack and qos == 1
        if topic is None:
            # paho hands the topic over undecoded; a broker should never send this.
            self.stats.bad_topic += 1
            if manual:
                self._ack_later(mid, 1)()
            return
        self.stats.received += 1
        hint = message_hash(topic, payload)
        if self._own and hint in self._own:
            del self._own[hint]
            self.stats.own_dropped += 1
            if manual:
                self._ack_later(mid, 1)()
            return
        subs = [s for s in self._subs if s.topic == topic or paho.topic_matches_sub(s.topic, topic)]
        keep = not subs and self._persistent
        owed = len(subs) + (1 if keep else 0)
        if manual:
            ack = self._ack_later(mid, max(owed, 1))
            envelope = Envelope(topic, payload, hint, ack)
            if not owed:
                ack()  # nobody wants it: release it at once
        else:
            envelope = Envelope(topic, payload, hint)
        room = True
        for sub in subs:
            room = sub.deliver(envelope) and room
        if keep:
            self._unclaimed.append(envelope)
        if not room:
            self._pause_reading()

    def _on_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if mid not in self._unacked:
            return  # a QoS 0 publish reaching the socket
        self._unacked.discard(mid)
        self._window.release()
        self.stats.acknowledged += 1
        if reason_code.is_failure:
            self.stats.publish_rejected += 1
            log.warning("MQTT broker rejected a publish: %s", reason_code)
        self._notify()

    def _on_subscribe(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        topics = self._suback_mids.pop(mid, [])
        for topic, code in zip(topics, reason_codes, strict=False):
            self._requested.discard(topic)
            if code.is_failure:
                self._refused[topic] = str(code)
                log.warning("MQTT broker refused subscription %r: %s", topic, code)
            elif topic in self._filters:
                self._active.add(topic)
        if any(sub.full for sub in self._ready):
            self._pause_reading()  # deferred while the SUBACK was on its way
        self._notify()


_READ_BATCH = 1024
# Topics remembered as valid for publishing; cleared when full.
_VALID_TOPICS_LIMIT = 1024
# Recent publications remembered for no-local on MQTT 3.1.1.
_OWN_LIMIT = 4096
# Messages a persistent session may deliver before subscribe() is called again.
_UNCLAIMED_LIMIT = 10_000


def _paho_log(level: LogLevel, fmt: str, *args: Any) -> None:
    """paho's ``_easy_log`` for this adapter: its messages go to this module's logger,
    the per-packet DEBUG ones only when that logger is enabled for DEBUG."""
    if level == paho.MQTT_LOG_DEBUG:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(fmt, *args)
        return
    log.log(paho.LOGGING_LEVEL[level], fmt, *args)


def _varint_len(n: int) -> int:
    length = 1
    while n >= 128:
        n //= 128
        length += 1
    return length
