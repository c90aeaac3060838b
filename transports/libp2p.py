"""libp2p GossipSub transport on py-libp2p 0.8.1, bridged into asyncio.

Theory of operation
-------------------
py-libp2p is trio-native. Trio runs here in *guest mode*
(``trio.lowlevel.start_guest_run``) on top of the running asyncio loop: trio's
tasks execute on the asyncio thread, interleaved with asyncio callbacks, and
only trio's I/O wait happens in a helper thread. Trio allows one run per
thread, so every :class:`Libp2pTransport` on a loop shares one
:class:`_TrioGuest`; it starts with the first transport and ends with the last.
asyncio code submits work to trio with ``TrioToken.run_sync_soon`` and gets
results back through an asyncio future; cancelling the asyncio side cancels
the trio job.

Each transport is one libp2p host (TCP, listening on ``/ip4/127.0.0.1/tcp/0``
unless told otherwise: py-libp2p's own examples bind every interface) with a
Pubsub service driven by a GossipSub router.

py-libp2p traps and what this adapter does about them
-----------------------------------------------------
* **Spam limit.** GossipSub drops (and penalises) a peer's messages beyond
  ``max_messages_per_topic_per_second`` (10 by default) per topic, *including
  our own publishes*, which are checked before being forwarded. The router is
  built with ``spam_limit`` (default 1000/s), and :meth:`Libp2pTransport.publish`
  paces itself to ``publish_rate`` (default 90 % of ``spam_limit``), so peers
  running this adapter never drop each other. Against peers with py-libp2p's
  defaults, pass ``publish_rate=9``.
* **No backpressure on publish, and small outbound queues.** ``Pubsub.publish``
  returns once the message is pushed onto each peer's outbound RPC queue,
  and those queues hold 32 RPCs and *drop* beyond that (``drop_rpc``): a burst
  of publishes, or a relay forwarding a burst, loses messages. This adapter
  enlarges every peer queue to ``outbound_queue_size`` (default 1024) and,
  before each publish, waits until no peer queue is more than half full, so a
  fast publisher is slowed to what the network writes. At most
  ``max_pending_publishes`` publishes are in progress; further ones wait.
* **Subscription queue of 32.** ``Pubsub.notify_subscriptions`` drops messages
  (with a log line) once a subscription's trio channel holds 32. This adapter
  replaces that channel with one of ``max_pending`` right after subscribing, and
  a trio task moves each message into the asyncio subscription queues
  (bounded too, :class:`~transports.base.QueueSubscription`), so nothing is
  dropped at any rate the consumer keeps up with. When a consumer falls behind,
  the task waits for room (backpressure), the trio channel fills, and GossipSub
  drops what arrives beyond it, as it does by design: memory stays bounded and
  SDS repairs the loss.
* **Slow mesh maintenance.** The default GossipSub heartbeat is 120 s; this
  adapter uses 1 s so that meshes form and repair within seconds.
* **Plaintext offered.** ``new_host`` offers Noise, TLS, secio and plaintext
  security; this adapter offers Noise only.
* **Message size.** Pubsub rejects inbound RPC frames over 1 MiB
  (``max_inbound_rpc_size``); :attr:`max_payload_size` leaves room for the
  signature, key, topic and framing around the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import DefaultMaxMessageSize
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from transports.base import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    Envelope,
    QueueSubscription,
    Subscription,
    Transport,
    TransportClosed,
    TransportError,
    check_topic,
    message_hash,
)

__all__ = ["GOSSIPSUB_PROTOCOLS", "SYNC_PROTOCOL", "Libp2pStats", "Libp2pStream", "Libp2pTransport"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: GossipSub protocol ids offered, newest first.
GOSSIPSUB_PROTOCOLS = (TProtocol("/meshsub/1.1.0"), TProtocol("/meshsub/1.0.0"))

# Signature (64) + public key (~40) + from (~40) + seqno + topic + framing.
_RPC_OVERHEAD_ALLOWANCE = 4096


class _TrioGuest:
    """One trio guest run on an asyncio loop, shared by every libp2p transport there."""

    _by_loop: dict[asyncio.AbstractEventLoop, _TrioGuest] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._ready: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()

    @classmethod
    async def acquire(cls) -> _TrioGuest:
        """The running loop's guest run, started on first use."""
        loop = asyncio.get_running_loop()
        guest = cls._by_loop.get(loop)
        if guest is None or guest._done.done():
            guest = cls(loop)
            cls._by_loop[loop] = guest

            def threadsafe(fn: Callable[[], None]) -> None:
                loop.call_soon_threadsafe(fn)

            def same_thread(fn: Callable[[], None]) -> None:
                loop.call_soon(fn)

            trio.lowlevel.start_guest_run(
                guest._main,
                run_sync_soon_threadsafe=threadsafe,
                run_sync_soon_not_threadsafe=same_thread,
                done_callback=guest._on_done,
                # asyncio owns the signal wakeup fd.
                host_uses_signal_set_wakeup_fd=True,
            )
        guest.users += 1
        await asyncio.shield(guest._ready)
        return guest

    async def release(self) -> None:
        """Drop one user; the last one ends the trio run and waits for it."""
        self.users -= 1
        if self.users > 0:
            return
        if self._by_loop.get(self.loop) is self:
            del self._by_loop[self.loop]
        if self._stop is not None and self._token is not None and not self._done.done():
            stop = self._stop
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(stop.set)
        await asyncio.shield(self._done)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.loop.call_soon(_resolve, self._ready, None)
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _on_done(self, result: Any) -> None:
        # ``result`` is an outcome.Value or outcome.Error.
        error = getattr(result, "error", None)
        if error is not None:
            log.error("trio guest run ended with an error", exc_info=error)
        if not self._ready.done():
            self._ready.set_exception(TransportError("the trio guest run failed to start"))
        _resolve(self._done, None)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` as a trio task; cancelling the caller cancels it."""
        fut: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()

        async def job() -> None:
            with scope:
                try:
                    result = await fn(*args)
                except trio.Cancelled:
                    # Our own cancel (the asyncio caller gave up) or the guest
                    # run shutting down under a caller that is still waiting.
                    stopped = TransportClosed("the libp2p host stopped")
                    self.loop.call_soon(_fail, fut, stopped)
                    raise
                except BaseException as err:  # handed to the asyncio side
                    self.loop.call_soon(_fail, fut, err)
                    return
                self.loop.call_soon(_resolve, fut, result)

        self._spawn(job)
        try:
            return await fut
        except asyncio.CancelledError:
            self._call_soon(scope.cancel)
            raise

    async def start(self, fn: Callable[..., Awaitable[None]], *args: Any) -> Any:
        """Start a long-running trio task with ``nursery.start``; returns its started value."""
        fut: asyncio.Future[Any] = self.loop.create_future()

        async def guarded(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            # A failure after start-up must not take down the shared guest run
            # (and with it every other transport on this loop): log it instead.
            started = False

            class Status:
                def started(self, value: Any = None) -> None:
                    nonlocal started
                    started = True
                    task_status.started(value)

            try:
                await fn(*args, task_status=Status())
            except Exception:
                if not started:
                    raise
                log.exception("libp2p background task %s failed", getattr(fn, "__name__", fn))

        async def job() -> None:
            assert self._nursery is not None
            try:
                value = await self._nursery.start(guarded)
            except BaseException as err:
                self.loop.call_soon(_fail, fut, err)
                if isinstance(err, trio.Cancelled):
                    raise
                return
            self.loop.call_soon(_resolve, fut, value)

        self._spawn(job)
        return await fut

    def _spawn(self, job: Callable[[], Awaitable[None]]) -> None:
        def start() -> None:
            if self._nursery is not None:
                self._nursery.start_soon(job)

        self._call_soon(start)

    def _call_soon(self, fn: Callable[[], object]) -> None:
        if self._token is None or self._done.done():
            raise TransportClosed("the trio guest run has ended")
        self._token.run_sync_soon(fn)


def _resolve(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[Any], err: BaseException) -> None:
    if not fut.done():
        fut.set_exception(err)


class _RoomyQueues(dict[Any, Any]):
    """``Pubsub.peer_queues`` replacement that enlarges each peer's outbound queue.

    Pubsub creates a 32-slot ``RpcQueue`` per peer and stores it here; the
    capacity is raised as it is stored (py-libp2p has no option for it).
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def __setitem__(self, peer: Any, queue: Any) -> None:
        inner = getattr(queue, "_queue", None)
        if inner is not None and hasattr(inner, "max_size"):
            inner.max_size = self.size
        else:
            log.warning("py-libp2p RpcQueue layout changed; outbound queues stay at 32")
        super().__setitem__(peer, queue)


@dataclass(slots=True)
class Libp2pStats:
    """Counters of what the transport did."""

    published: int = 0
    received: int = 0
    #: Times the pump waited for a full subscription to drain (backpressure).
    read_pauses: int = 0


#: The protocol id sync streams are opened with (``transports.stream`` users pick their own).
SYNC_PROTOCOL = "/chorus/sync/1.0.0"


class Libp2pStream:
    """A libp2p stream as a :class:`transports.stream.Stream` (reads and writes run in trio)."""

    def __init__(self, guest: _TrioGuest, stream: Any) -> None:
        self._guest = guest
        self._stream = stream

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` once the peer closed its side."""
        from libp2p.network.stream.exceptions import StreamEOF, StreamError

        from transports.stream import StreamClosed

        try:
            data: bytes = await self._guest.run(self._stream.read, max_bytes)
        except StreamEOF:
            return b""
        except (StreamError, TransportClosed) as exc:
            raise StreamClosed(str(exc) or type(exc).__name__) from exc
        return data

    async def write(self, data: bytes) -> None:
        """Send ``data``."""
        from libp2p.network.stream.exceptions import StreamError

        from transports.stream import StreamClosed

        try:
            await self._guest.run(self._stream.write, bytes(data))
        except (StreamError, TransportClosed) as exc:
            raise StreamClosed(str(exc) or type(exc).__name__) from exc

    async def close(self) -> None:
        """Close the stream."""
        with contextlib.suppress(Exception):
            await self._guest.run(self._stream.close)


class Libp2pTransport(Transport):
    """A :class:`~transports.base.Transport` over libp2p GossipSub.

    ``async with Libp2pTransport(bootstrap=[...]) as t:`` starts a host
    listening on ``listen`` (default ``/ip4/127.0.0.1/tcp/0``; use
    :attr:`addrs` to learn the port) and dials every ``bootstrap`` multiaddr
    (``/ip4/.../tcp/.../p2p/<peer id>``), redialling any that is disconnected
    every ``redial_interval`` seconds (0 turns that off). ``key_pair`` (a
    py-libp2p ed25519 ``KeyPair``) fixes the peer id across restarts. See the
    module notes for ``spam_limit``, ``publish_rate``, ``max_pending_publishes``,
    ``outbound_queue_size`` and ``max_pending`` / ``max_pending_bytes`` (the bound
    of each subscription).
    """

    def __init__(
        self,
        *,
        listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
        bootstrap: Sequence[str] = (),
        key_pair: Any = None,
        spam_limit: float = 1000.0,
        publish_rate: float | None = None,
        max_pending_publishes: int = 64,
        outbound_queue_size: int = 1024,
        redial_interval: float = 5.0,
        heartbeat_interval: int = 1,
        degree: int = 6,
        degree_low: int = 4,
        degree_high: int = 12,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        self._listen = [multiaddr.Multiaddr(a) for a in listen]
        self._bootstrap = list(bootstrap)
        self._key_pair = key_pair or create_new_key_pair()
        self._spam_limit = spam_limit
        rate = publish_rate if publish_rate is not None else spam_limit * 0.9
        if rate <= 0:
            raise ValueError("publish_rate must be > 0")
        self._publish_interval = 1.0 / rate
        self._next_publish_at = 0.0
        self._pending = asyncio.Semaphore(max_pending_publishes)
        self._heartbeat_interval = heartbeat_interval
        self._outbound_queue_size = outbound_queue_size
        self._redial_interval = redial_interval
        self._degree = (degree, degree_low, degree_high)
        self.max_payload_size = DefaultMaxMessageSize - _RPC_OVERHEAD_ALLOWANCE
        self.stats = Libp2pStats()
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes

        self._guest: _TrioGuest | None = None
        self._pubsub: Pubsub | None = None
        self._host: Any = None
        self._stop: trio.Event | None = None
        self._stopped = asyncio.Event()
        self._closed = False
        self._subs: dict[str, list[QueueSubscription]] = {}
        #: topics whose libp2p subscription is being set up or torn down
        self._topic_locks: dict[str, asyncio.Lock] = {}
        self.addrs: list[str] = []
        self.peer_id: str = ""

    # ------------------------------------------------------------------ public

    async def start(self) -> None:
        """Start the host and dial the bootstrap peers (failures are logged, not raised)."""
        if self._closed:
            raise TransportClosed("libp2p transport is closed")
        if self._guest is not None:
            return
        self._guest = await _TrioGuest.acquire()
        try:
            await self._guest.start(self._host_main)
        except BaseException:
            await self._guest.release()
            self._guest = None
            raise
        for addr in self._bootstrap:
            try:
                await self.connect(addr)
            except TransportError as err:
                log.warning("libp2p bootstrap peer %s unreachable: %s", addr, err)

    async def __aenter__(self) -> Libp2pTransport:
        await self.start()
        return self

    async def connect(self, addr: str) -> None:
        """Dial the peer at ``addr`` (a multiaddr ending in ``/p2p/<peer id>``)."""
        guest = self._require_started()
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as err:
            raise ValueError(f"not a dialable /p2p/ multiaddr: {addr!r} ({err})") from err
        try:
            await guest.run(self._host.connect, info)
        except (asyncio.CancelledError, TransportError):
            raise
        except Exception as err:
            raise TransportError(f"cannot connect to {addr}: {err}") from err

    def peers(self, topic: str | None = None) -> list[str]:
        """Peer ids connected over pubsub, or those known to subscribe to ``topic``."""
        if self._pubsub is None:
            return []
        if topic is None:
            return [p.to_base58() for p in self._pubsub.peers]
        return [p.to_base58() for p in self._pubsub.peer_topics.get(topic, ())]

    async def wait_for_peers(self, topic: str, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` peers are known to subscribe to ``topic``."""
        async with asyncio.timeout(timeout):
            while len(self.peers(topic)) < count:
                await asyncio.sleep(0.05)

    async def publish(self, topic: str, payload: bytes) -> bytes:
        """Publish on ``topic`` (paced, with backpressure); returns the retrieval hint.

        Returns once GossipSub has queued the message for its peers, after waiting
        while any peer's outbound queue is more than half full.
        """
        guest = self._require_started()
        check_topic(topic, publish=True)
        self._check_size(payload)
        payload = bytes(payload)
        async with self._pending:
            # Pacing: a schedule of send slots keeps the long-run rate at
            # publish_rate without sleeping when the sender is slower anyway.
            now = time.monotonic()
            slot = max(now, self._next_publish_at)
            self._next_publish_at = slot + self._publish_interval
            if slot > now:
                await asyncio.sleep(slot - now)
            await guest.run(self._publish_in_trio, topic, payload)
        self.stats.published += 1
        return message_hash(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        """Receive ``topic`` from now on (exact topic; GossipSub has no wildcards).

        Raises :class:`~transports.base.InvalidTopic` / ``InvalidChannelId`` for a
        topic no transport could carry, before anything reaches GossipSub.
        """
        guest = self._require_started()
        check_topic(topic, publish=False)
        lock = self._topic_locks.setdefault(topic, asyncio.Lock())
        sub = QueueSubscription(
            topic,
            self._drop_subscription,
            max_pending=self._max_pending,
            max_pending_bytes=self._max_pending_bytes,
        )
        async with lock:
            if topic not in self._subs:
                await guest.start(self._topic_main, topic)
                self._subs[topic] = []
            self._subs[topic].append(sub)
        return sub

    async def close(self) -> None:
        """Stop the host; iteration of open subscriptions ends. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for subs in self._subs.values():
            for sub in subs:
                sub.end()
        self._subs.clear()
        guest, self._guest = self._guest, None
        if guest is None:
            return
        if self._stop is not None:
            with contextlib.suppress(TransportClosed):
                stop = self._stop
                await guest.run(self._set_event, stop)
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(10):
                    await self._stopped.wait()
        await guest.release()

    async def open_stream(self, addr: str, protocol: str = SYNC_PROTOCOL) -> Libp2pStream:
        """A stream to the peer at ``addr`` (``/ip4/.../tcp/.../p2p/<id>``) for ``protocol``."""
        guest = self._require_started()
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        try:
            await guest.run(self._host.connect, info)
            stream = await guest.run(self._host.new_stream, info.peer_id, [TProtocol(protocol)])
        except (asyncio.CancelledError, TransportError):
            raise
        except Exception as err:
            raise TransportError(f"cannot open a {protocol} stream to {addr}: {err}") from err
        return Libp2pStream(guest, stream)

    def handle_streams(
        self,
        handler: Callable[[Libp2pStream], Awaitable[None]],
        protocol: str = SYNC_PROTOCOL,
    ) -> None:
        """Run ``handler`` (on the asyncio loop) for every stream peers open for ``protocol``.

        The stream is closed when ``handler`` returns.
        """
        guest = self._require_started()
        loop = guest.loop

        async def in_trio(net_stream: Any) -> None:
            finished = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def done(_: object) -> None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(finished.set)

            task = asyncio.ensure_future(handler(Libp2pStream(guest, net_stream)), loop=loop)
            task.add_done_callback(done)
            try:
                await finished.wait()
            finally:
                if not task.done():
                    task.cancel()
                with contextlib.suppress(Exception):
                    await net_stream.close()

        self._host.set_stream_handler(TProtocol(protocol), in_trio)

    # --------------------------------------------------------------- internals

    def _require_started(self) -> _TrioGuest:
        if self._closed:
            raise TransportClosed("libp2p transport is closed")
        if self._guest is None or self._pubsub is None:
            raise TransportError(
                "the libp2p host is not running: call start() (or use 'async with') first"
            )
        return self._guest

    @staticmethod
    async def _set_event(event: trio.Event) -> None:
        event.set()

    async def _host_main(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Trio task owning the host, the pubsub service and the router."""
        # Noise only: py-libp2p's default set also offers TLS, secio and
        # *plaintext*, and multistream negotiation is unauthenticated, so an
        # on-path attacker could pick plaintext.
        security = {
            NOISE_PROTOCOL_ID: NoiseTransport(
                self._key_pair, noise_privkey=create_x25519_key_pair().private_key
            )
        }
        host = new_host(key_pair=self._key_pair, listen_addrs=self._listen, sec_opt=security)
        degree, degree_low, degree_high = self._degree
        router = GossipSub(
            protocols=list(GOSSIPSUB_PROTOCOLS),
            degree=degree,
            degree_low=degree_low,
            degree_high=degree_high,
            heartbeat_initial_delay=0.1,
            heartbeat_interval=self._heartbeat_interval,
            max_messages_per_topic_per_second=self._spam_limit,
        )
        pubsub = Pubsub(host, router)
        pubsub.peer_queues = _RoomyQueues(self._outbound_queue_size)
        self._stop = trio.Event()
        try:
            async with (
                host.run(listen_addrs=self._listen),
                background_trio_service(pubsub),
                background_trio_service(router),
            ):
                await pubsub.wait_until_ready()
                self._host = host
                self._pubsub = pubsub
                self.peer_id = host.get_id().to_base58()
                self.addrs = [str(a) for a in host.get_addrs()]
                task_status.started()
                async with trio.open_nursery() as nursery:
                    if self._bootstrap and self._redial_interval > 0:
                        nursery.start_soon(self._redial, host)
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self._pubsub = None
            # Trio tasks run on the asyncio thread, so setting an asyncio event is safe.
            self._stopped.set()

    async def _redial(self, host: Any) -> None:
        """Keep the bootstrap peers connected: a restarted peer is found again."""
        infos = []
        for addr in self._bootstrap:
            with contextlib.suppress(Exception):
                infos.append(info_from_p2p_addr(multiaddr.Multiaddr(addr)))
        while True:
            await trio.sleep(self._redial_interval)
            connected = set(host.get_connected_peers())
            for info in infos:
                if info.peer_id in connected:
                    continue
                with trio.move_on_after(self._redial_interval):
                    try:
                        await host.connect(info)
                        log.info("libp2p: reconnected to bootstrap peer %s", info.peer_id)
                    except Exception as err:
                        log.debug(
                            "libp2p: bootstrap peer %s still unreachable: %s", info.peer_id, err
                        )

    async def _publish_in_trio(self, topic: str, payload: bytes) -> None:
        pubsub = self._pubsub
        if pubsub is None:
            raise TransportClosed("libp2p transport is closed")
        high_water = self._outbound_queue_size // 2
        while any(len(q) > high_water for q in pubsub.peer_queues.values()):
            await trio.sleep(0.002)
        await pubsub.publish(topic, payload)

    async def _topic_main(self, topic: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Trio task that subscribes to ``topic`` and hands every message to asyncio."""
        pubsub = self._pubsub
        assert pubsub is not None
        await pubsub.subscribe(topic)
        # Swap py-libp2p's 32-slot channel for a larger bounded one (see module notes).
        send, receive = trio.open_memory_channel[Any](self._max_pending)
        pubsub.subscribed_topics_send[topic] = send
        task_status.started()
        async with receive:
            async for msg in receive:
                payload = bytes(msg.data)
                envelope = Envelope(topic, payload, message_hash(topic, payload))
                self.stats.received += 1
                subs = self._subs.get(topic, ())
                for sub in subs:
                    sub.deliver(envelope)
                # Backpressure: a full subscription holds the pump (trio and asyncio
                # share this thread, so its state is read directly).
                if any(sub.full for sub in subs):
                    self.stats.read_pauses += 1
                while any(sub.full and not sub.closed for sub in self._subs.get(topic, ())):
                    await trio.sleep(0.005)
                # Let other trio tasks (and asyncio) run between bursts.
                if receive.statistics().current_buffer_used == 0:
                    await trio.lowlevel.checkpoint()

    def _drop_subscription(self, sub: QueueSubscription) -> None:
        subs = self._subs.get(sub.topic)
        if subs is None:
            return
        with contextlib.suppress(ValueError):
            subs.remove(sub)
        if subs or self._closed or self._guest is None or self._pubsub is None:
            return
        del self._subs[sub.topic]
        pubsub = self._pubsub
        guest = self._guest
        lock = self._topic_locks.setdefault(sub.topic, asyncio.Lock())

        async def unsubscribe() -> None:
            async with lock:
                if sub.topic not in self._subs:
                    with contextlib.suppress(Exception):
                        await guest.run(pubsub.unsubscribe, sub.topic)

        asyncio.get_running_loop().create_task(unsubscribe())
