"""The asyncio driver: one participant, one transport, many reliable channels.

Theory of operation
-------------------
A :class:`Node` is the aioquic-style adapter around the sans-I/O SDS core. It
owns, for all its channels together:

* **one timer** — a single ``loop.call_at`` armed for the earliest
  ``get_timer()`` of every channel and re-armed after every turn that touched
  a channel; when it fires, due channels run ``handle_timer(now)``;
* **one flush per event-loop turn** — inputs (sends, envelopes, store answers,
  the timer) call the cores synchronously and mark channels dirty; a
  ``call_soon`` callback then drains them, writes everything the turn changed
  in one SQLite transaction, and only after the commit hands datagrams to the
  publisher and events to the application;
* **one publisher task** — publishes datagrams in order, records the
  retrieval hint the transport returns (later causal histories carry it), and
  turns transport errors into :class:`~sdk.runtime.events.PublishFailed`
  events. Its queue is bounded for the application: ``send`` waits while
  ``max_pending_publishes`` datagrams are queued (backpressure); resends and
  sync messages from the core are never refused.

Time is the wall clock in epoch milliseconds (the SDS Lamport clock is pegged
to it); tests may pass ``clock``.

The seam with :class:`~sdk.runtime.reliable_channel.ReliableChannel` is two
short lists of methods, and neither side touches the other's state: a channel
knows the node only as a
:class:`~sdk.runtime.reliable_channel.ChannelHost` (its
``mark_dirty``, ``send_capacity``, ``check_running``, ``leave``,
``catch_up_start`` and ``republish``, and ``now``, ``options``,
``transport``, ``store``, ``persistence``), so it never imports this module;
the node calls the
channel's node-facing section (``_restored``, ``_start``, ``_collect``,
``_release``, ``_on_published``, ``_on_publish_failed``, ``_start_catch_up``,
``_reconnected``, ``_next_deadline``, ``_retry_due``, ``_node_failed``,
``_shutdown``). The one timer also fires the channels' catch-up retries
(:mod:`sdk.runtime.catch_up`). The message-size rule is the core's
(:class:`~sdk.sds.MessageTooLarge`, given the transport's limit).

Missing dependencies are fetched from the ``store`` (by message id and
retrieval hint) as soon as the core reports them; SDS-R repair asks peers only
``RepairConfig.t_min_ms`` later, which must be at least the store timeout, so
the store gets its chance first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable

from sdk.encryption.hook import Encryption
from sdk.runtime.errors import ChannelClosed, RuntimeFailure
from sdk.runtime.options import RuntimeOptions as RuntimeOptions  # its home; re-exported
from sdk.runtime.persistence import ChannelBatch, Persistence
from sdk.runtime.reliable_channel import ReliableChannel
from sdk.sds.channel import Datagram, MessageChannel
from sdk.sds.config import ChannelConfig
from sdk.sds.errors import LocalProtocolError
from sdk.sds.message import MessageKind
from sdk.sds.snapshot import restore_snapshot
from sdk.store.client import StoreClient
from transports.base import (
    PayloadTooLarge,
    Transport,
    TransportError,
    topic_for_channel,
    validate_channel_id,
)
from transports.tasks import cancel_and_wait


def wall_clock_ms() -> int:
    """The current time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class Node:
    """One participant on one transport, running any number of :class:`ReliableChannel`.

    ``participant_id`` is the sender id on the wire; it SHOULD stay the same
    across restarts. With ``db`` and no ``participant_id``, the id saved in
    the database is used, or a new random one is created and saved. ``db`` is
    a path (the node opens and closes it) or an open :class:`Persistence`.
    ``config`` is the default :class:`~sdk.sds.ChannelConfig` of joined
    channels; every participant of a channel must use the same bloom profile.
    The node uses but does not close ``transport`` and ``store``.

    Use as ``async with Node(...) as node:`` or call :meth:`close`.
    """

    def __init__(
        self,
        transport: Transport,
        participant_id: str | None = None,
        *,
        store: StoreClient | None = None,
        db: str | os.PathLike[str] | Persistence | None = None,
        config: ChannelConfig | None = None,
        options: RuntimeOptions | None = None,
        clock: Callable[[], int] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.transport = transport
        self.store = store
        self.options = options or RuntimeOptions()
        self.default_config = config or ChannelConfig()
        self.now: Callable[[], int] = clock or wall_clock_ms
        self._rng = rng or random.Random()
        self._owns_db = db is not None and not isinstance(db, Persistence)
        if db is None or isinstance(db, Persistence):
            self.persistence = db
        else:
            self.persistence = Persistence(db)
        if participant_id is None:
            saved = self.persistence.participant_id() if self.persistence else None
            participant_id = saved or uuid.uuid4().hex
        if not participant_id:
            raise LocalProtocolError("participant_id must be a non-empty string")
        if self.persistence is not None:
            self.persistence.set_participant_id(participant_id)
        self.participant_id = participant_id
        self.channels: dict[str, ReliableChannel] = {}
        self._dirty: dict[ReliableChannel, None] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._flush_waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._publish_queue = _Outbox()
        self._space = asyncio.Event()
        self._space.set()
        self._publisher: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._check_repair_timing(self.default_config)

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def join(
        self,
        channel_id: str,
        config: ChannelConfig | None = None,
        *,
        encryption: Encryption | None = None,
    ) -> ReliableChannel:
        """Start participating in ``channel_id``; restores its saved state if there is any.

        ``encryption`` (the Reliable Channel API's handle: any object with
        ``encrypt(bytes) -> bytes`` and ``decrypt(bytes) -> bytes``, such as
        :class:`~sdk.encryption.ChannelEncryption`) seals every SDS message before it
        is published and opens every payload before the core sees it; one that does
        not open is a :class:`~sdk.encryption.DecryptionFailed` event. Without it the
        wire bytes are those of an unencrypted channel. See ``docs/encryption.md``.

        Returns the already joined channel when called twice. Raises
        :class:`~transports.base.InvalidChannelId` for an id no transport can carry.
        With saved state the participant announces itself (a sync message) and,
        with a ``store``, catches up on what the store received while it was away
        (the core's :class:`~sdk.sds.RetrieveRange`, fetched in the background).
        """
        validate_channel_id(channel_id)
        self.check_running()
        existing = self.channels.get(channel_id)
        if existing is not None:
            return existing
        config = config or self.default_config
        self._check_repair_timing(config)
        sealed_for = getattr(encryption, "channel_id", channel_id)
        if sealed_for != channel_id:
            raise LocalProtocolError(
                f"the encryption handle is for channel {sealed_for!r}, not {channel_id!r}"
            )
        now = self.now()
        core = MessageChannel(
            channel_id,
            self.participant_id,
            now,
            config,
            rng=random.Random(self._rng.getrandbits(64)),
            journal=True,
            archive=self.persistence.archive(channel_id) if self.persistence else None,
        )
        channel = ReliableChannel(self, core, topic_for_channel(channel_id), encryption)
        restored = False
        active_at: int | None = None
        if self.persistence is not None:
            stored = self.persistence.load_channel(
                channel_id,
                bloom_keep=core.bloom.carry_over,
                cache_size=config.repair.cache_size if config.repair else 0,
                log_window=config.log_window,
            )
            if stored is not None:
                restored = True
                restore_snapshot(core, stored.snapshot, now)
                active_at = stored.active_at
                channel._restored(stored.last_seq, stored.received, active_at, stored.owed)
        # Subscribe before anything is published so no reply to our first message is missed.
        subscription = await self.transport.subscribe(channel.topic)
        self.channels[channel_id] = channel
        channel._start(subscription)
        if restored and self.persistence is not None and stored is not None:
            # Published before the restart and perhaps never stored: check them too.
            backlog = self.options.store_confirm_backlog
            for record in self.persistence.history(
                channel_id, after_seq=max(0, stored.last_seq - backlog)
            ):
                if record.sender_id == self.participant_id and record.data is not None:
                    channel._await_store(record.message_id, record.data, due=now)
        if self._publisher is None:
            self._publisher = asyncio.create_task(self._publish_loop(), name="chorus-publisher")
            self._publisher.add_done_callback(self._task_done)
        if self._watcher is None and hasattr(self.transport, "connected"):
            self._watcher = asyncio.create_task(self._watch_connection(), name="chorus-watch")
        if restored:
            # The core sends its sync message and emits the RetrieveRange for the
            # window away, so it knows that window is asked for: the windows it
            # asks for gaps found meanwhile start where this one ends.
            core.announce(now, away_since=self.catch_up_start(active_at))
        self.mark_dirty(channel)
        await self._flushed()
        if not restored and self.options.first_join_history > 0:
            channel._start_catch_up(now - int(self.options.first_join_history * 1000))
        return channel

    def catch_up_start(self, active_at: int | None) -> int:
        """Where a catch-up from the store starts: ``active_at`` minus the overlap,
        never before ``catch_up_max_window`` ago (and that far back without it)."""
        options = self.options
        earliest = self.now() - int(options.catch_up_max_window * 1000)
        if active_at is None:
            return earliest
        return max(earliest, active_at - int(options.catch_up_overlap * 1000))

    async def _watch_connection(self) -> None:
        """Announce every channel and catch up from the store after a transport reconnect.

        Polls the transport's ``connected`` flag (``MqttTransport`` has one) and
        calls ``MessageChannel.announce(now, away_since=...)`` with when the
        connection was first seen down (at most ``catch_up_max_window`` back):
        the core sends its sync message and emits the one
        :class:`~sdk.sds.RetrieveRange` for the window away, which the channel
        fetches from the store like any other.
        """
        interval = self.options.connection_check_interval
        away_since: int | None = None
        # A cut shorter than one check is seen only through the count of connects
        # (``MqttTransport.stats.connects``): the flag is up again at the next check.
        connects = _connects(self.transport)
        seen_up = self.now()
        while not self._closed:
            await asyncio.sleep(interval)
            connected = bool(getattr(self.transport, "connected", True))
            if not connected:
                if away_since is None:
                    away_since = self.now() - int(interval * 1000)
                continue
            count = _connects(self.transport)
            if away_since is None and connects and count != connects:
                away_since = seen_up  # reconnected between two checks
            connects = count
            seen_up = self.now()
            if away_since is None:
                continue
            now = self.now()
            since = max(away_since, now - int(self.options.catch_up_max_window * 1000))
            away_since = None
            for channel in list(self.channels.values()):
                channel.counters["reconnects"] += 1
                channel.core.announce(now, away_since=since)
                channel._reconnected()  # windows still owed too, at the flush
                self.mark_dirty(channel)

    async def close(self) -> None:
        """Flush, publish what is queued (up to ``close_timeout``), stop every task,
        close every channel's subscription and the database the node opened."""
        if self._closed:
            return
        if self._flush_handle is not None and self._failure is None:
            self._flush()
        if self._publisher is not None and not self._publisher.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.options.close_timeout):
                    await self._publish_queue.drained.wait()
        self._closed = True
        await cancel_and_wait([self._watcher])
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for channel in list(self.channels.values()):
            await channel._shutdown()
        self.channels.clear()
        await cancel_and_wait([self._publisher])
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._flush_waiter is not None and not self._flush_waiter.done():
            self._flush_waiter.set_exception(ChannelClosed("node closed"))
            self._flush_waiter.exception()
        self._space.set()
        if self.persistence is not None and self._owns_db:
            self.persistence.close()

    async def leave(self, channel: ReliableChannel) -> None:
        """Channel-facing (:class:`~sdk.runtime.reliable_channel.ChannelHost`): ``channel`` closes;
        commit what it changed and stop driving it. Applications call
        :meth:`ReliableChannel.close`."""
        if self._flush_handle is not None and self._failure is None:
            self._flush()
        self.channels.pop(channel.channel_id, None)
        await channel._shutdown()
        self._arm_timer()

    def check_running(self) -> None:
        """Raise :class:`RuntimeFailure` if a background step failed, and
        :class:`ChannelClosed` once the node is closed."""
        if self._failure is not None:
            raise RuntimeFailure(f"the node stopped: {self._failure!r}") from self._failure
        if self._closed:
            raise ChannelClosed("the node is closed")

    def _check_repair_timing(self, config: ChannelConfig) -> None:
        repair = config.repair
        if (
            self.store is not None
            and repair is not None
            and repair.t_min_ms < self.options.store_timeout * 1000
        ):
            raise ValueError(
                f"RepairConfig.t_min_ms ({repair.t_min_ms}) is shorter than the store "
                f"timeout ({self.options.store_timeout} s): peers would be asked to "
                "repair before the store could answer; raise t_min_ms or lower "
                "RuntimeOptions.store_timeout"
            )

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """A background step failed: stop accepting work and tell every waiter."""
        self._failure = exc
        failure = RuntimeFailure(f"the node stopped: {exc!r}")
        failure.__cause__ = exc
        if self._flush_waiter is not None and not self._flush_waiter.done():
            self._flush_waiter.set_exception(failure)
        for channel in self.channels.values():
            channel._node_failed(failure, exc)
        self._space.set()

    # -- the turn: dirty channels, flush, timer ------------------------------------------
    def mark_dirty(self, channel: ReliableChannel) -> None:
        """Channel-facing (:class:`~sdk.runtime.reliable_channel.ChannelHost`): ``channel``'s core
        changed; commit and hand out its outputs at the end of this event-loop turn."""
        self._dirty[channel] = None
        if self._flush_handle is None and not self._closed and self._failure is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flushed(self) -> asyncio.Future[None]:
        """A future resolved when the pending flush has committed."""
        if self._flush_waiter is None:
            self._flush_waiter = asyncio.get_running_loop().create_future()
        return self._flush_waiter

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush_handle = None
        waiter, self._flush_waiter = self._flush_waiter, None
        dirty = list(self._dirty)
        self._dirty.clear()
        persist = self.persistence is not None
        changes: list[ChannelBatch] = []
        try:
            for channel in dirty:
                c = channel._collect(persist)
                if c is not None:
                    changes.append(c)
            if changes and self.persistence is not None:
                self.persistence.write(changes)
        except Exception as exc:  # a failed commit must not let anything out unsaved
            if waiter is not None:
                self._flush_waiter = waiter
            self._fail(exc)
            return
        queue = self._publish_queue
        for channel in dirty:
            for datagram in channel._release():
                if not queue.put((channel, datagram)):
                    channel.counters["resends_coalesced"] += 1
        self._update_space()
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._arm_timer(dirty)

    def _arm_timer(self, touched: list[ReliableChannel] | None = None) -> None:
        """Arm the one timer for the earliest deadline.

        With ``touched``, only those channels' deadlines can have moved: an armed
        timer is kept unless one of them is due sooner (a timer that fires for a
        deadline that moved later costs one no-op wake-up and re-arms). Without
        it, every channel is consulted.
        """
        if self._closed or self._failure is not None:
            return
        if touched is not None and self._timer is not None:
            armed = self._timer_at
            earliest = armed
            for channel in touched:
                t = channel._next_deadline()
                if t is not None and (earliest is None or t < earliest):
                    earliest = t
            if earliest == armed:
                return
        times = [t for c in self.channels.values() if (t := c._next_deadline()) is not None]
        at = min(times) if times else None
        if at == self._timer_at and (at is None or self._timer is not None):
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is None:
            return
        loop = asyncio.get_running_loop()
        # +1 ms: fire after the deadline, never just before it (float rounding).
        delay = max(0.0, (at - self.now() + 1) / 1000)
        self._timer = loop.call_at(loop.time() + delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        now = self.now()
        for channel in self.channels.values():
            t = channel.core.get_timer()
            if t is not None and t <= now:
                channel.core.handle_timer(now)
                self._dirty[channel] = None
            if channel._retry_at is not None:
                channel._retry_due(now)
        self._flush()

    # -- publishing --------------------------------------------------------------------
    async def send_capacity(self) -> None:
        """Wait while ``max_pending_publishes`` datagrams are queued (backpressure)."""
        while self._publish_queue.qsize() >= self.options.max_pending_publishes:
            self._space.clear()
            await self._space.wait()
            self.check_running()

    def _update_space(self) -> None:
        if self._publish_queue.qsize() < self.options.max_pending_publishes:
            self._space.set()

    def republish(self, channel: ReliableChannel, datagram: Datagram) -> None:
        """Queue an already committed datagram again (the store lacks it)."""
        if not self._publish_queue.put((channel, datagram)):
            channel.counters["resends_coalesced"] += 1
        self._update_space()

    async def _publish_loop(self) -> None:
        outbox = self._publish_queue
        items = outbox.items
        transport = self.transport
        published = 0
        while True:
            if not items:
                outbox.drained.set()
                outbox.ready.clear()
                await outbox.ready.wait()
                continue
            channel, datagram = outbox.pop()
            outbox.busy = True
            try:
                if not channel.closed:
                    try:
                        data = (
                            datagram.data if channel.encryption is None else channel._seal(datagram)
                        )
                        # None: a repair with no envelope to send (ReliableChannel._seal).
                        hint = b"" if data is None else await transport.publish(channel.topic, data)
                    except PayloadTooLarge as exc:
                        channel._on_publish_failed(datagram, exc, recoverable=False)
                    except TransportError as exc:
                        channel._on_publish_failed(datagram, exc, recoverable=True)
                    except Exception as exc:
                        # A transport bug or a refusal it did not type (e.g. the client
                        # library's ValueError) ends this datagram only: the slot is
                        # released below and every other channel keeps publishing.
                        channel._on_publish_failed(datagram, exc, recoverable=False)
                    else:
                        if data is not None:
                            channel._on_published(datagram, hint)
            finally:
                outbox.busy = False
                self._update_space()
            published += 1
            if published % 64 == 0:
                # A transport whose publish never suspends must not starve the loop.
                await asyncio.sleep(0)


class _Outbox:
    """The publisher's FIFO: a deque plus two flags (cheaper than ``asyncio.Queue``,
    whose per-item futures and bookkeeping show up at thousands of messages/s)."""

    __slots__ = ("busy", "drained", "items", "queued", "ready")

    def __init__(self) -> None:
        self.items: deque[tuple[ReliableChannel, Datagram]] = deque()
        #: (channel id, message id) of the content messages waiting here. A resend of
        #: one of them is dropped: the copy waiting goes out anyway. Without this, a
        #: backlog (after a broker outage, on a slow link) fills with resends of the
        #: same messages every resend interval, and ``send`` waits behind them.
        self.queued: set[tuple[str, str]] = set()
        #: Set when there is something to publish (the publisher waits on it).
        self.ready = asyncio.Event()
        #: Set when everything queued has been published.
        self.drained = asyncio.Event()
        self.drained.set()
        #: Whether a publish is in progress (it still counts against the limit).
        self.busy = False

    def qsize(self) -> int:
        """Datagrams queued or being published."""
        return len(self.items) + self.busy

    def put(self, item: tuple[ReliableChannel, Datagram]) -> bool:
        """Queue a datagram; False (and nothing queued) when the same content message
        of the same channel is already waiting."""
        channel, datagram = item
        if datagram.kind is MessageKind.CONTENT:
            key = (channel.channel_id, datagram.message_id)
            if key in self.queued:
                return False
            self.queued.add(key)
        self.items.append(item)
        self.drained.clear()
        if not self.ready.is_set():
            self.ready.set()
        return True

    def pop(self) -> tuple[ReliableChannel, Datagram]:
        """Take the oldest datagram (the caller publishes it)."""
        item = self.items.popleft()
        self.queued.discard((item[0].channel_id, item[1].message_id))
        return item


def _connects(transport: object) -> int | None:
    """How many times the transport has connected, if it counts them (MQTT does)."""
    stats = getattr(transport, "stats", None)
    count = getattr(stats, "connects", None)
    return count if isinstance(count, int) else None
