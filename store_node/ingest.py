"""Ingest: transport envelopes in, size/time-bounded batches into the archive.

Flow: one reader task per subscription appends ``(envelope, arrival time)`` to a
bounded queue; one writer task takes up to ``batch_size`` envelopes, or what
arrived within ``batch_interval`` of the first, and has it decoded and merged on a
decoder thread, then committed in one transaction on a single writer thread.
While a batch commits, the next one fills and decodes. The queue is a plain list
the writer takes whole slices of, woken once per batch rather than per message:
an ``asyncio.Queue`` costs a few microseconds per message on the event loop, a
tenth of what ingest spends on a message in all.

Backpressure: when the queue is full (``queue_size`` messages or
``queue_bytes`` bytes), readers stop pulling from their
subscriptions, so a slow archive slows consumption instead of growing memory;
what happens upstream then is the transport's policy.

Acknowledgement: an envelope is acknowledged to its transport
(:meth:`transports.base.Envelope.acknowledge`; a PUBACK for MQTT with
``manual_ack``) only after the batch holding it is committed, or once it is
rejected or quarantined for good. A message the node received but had not
committed when it died is therefore still the broker's, and a persistent
session delivers it again (``docs/store-node.md``, "Durability").

Bad input: bytes that are not a valid SDS message (per
:func:`sdk.sds.message.decode_message` and its bounds), whose ``channel_id``
does not match the topic, whose Lamport time does not fit the archive's
int64, or whose ids hold a NUL (no PostgreSQL text or JSON value can), are
counted in ``chorus_store_ingest_rejected_total{reason}``, logged (at most one
line per reason per :data:`REJECT_LOG_INTERVAL`) and skipped.

Sealed envelopes (``docs/encryption.md``): a payload starting with the envelope
version byte (0x01, which no SDS message can start with: protobuf has no field 0)
is archived without a key, keyed by what is outside the seal
(:func:`sealed_row`): its transport hash, the channel of its topic and the
sender-set timestamp of its header, which may lie at most
:data:`SEALED_FUTURE_TOLERANCE_MS` ahead of the node's clock
(``reason="timestamp_out_of_range"`` beyond). One without a well-formed header is
``reason="decode"``, as before.

Referenced but missing: every decoded batch also goes to
:class:`store_node.missing.MissingReferences` (:attr:`Ingest.missing`) on the
decoder thread, which keeps the set of ids archived messages reference but the
archive lacks; from :meth:`Ingest.start` on it also judges the newest archived
rows again, beside ingest, so a restarted node knows its gaps without waiting for
new traffic.

Poison rows: a batch the archive refuses because of what is in it (the backend
says so: :meth:`store_node.archive.base.Archive.is_row_error`, as opposed to an
outage, which is retried) is split in halves until the rows it refuses are
alone; each of those is quarantined (``rejected_total{reason="quarantined"}``
and a log line naming it, rate-limited like the rejects) and everything else is
committed. Neither kind of
bad input ever stops ingest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sdk.encryption.envelope import OVERHEAD as SEALED_OVERHEAD
from sdk.encryption.envelope import VERSION as SEALED_VERSION
from sdk.encryption.envelope import read_header
from sdk.encryption.errors import RemoteEncryptionError
from sdk.sds.errors import RejectReason, RemoteProtocolError
from sdk.sds.limits import DEFAULT_LIMITS, Limits
from sdk.sds.message import MessageKind, decode_archive_fields
from store_node.archive.base import (
    MAX_LAMPORT,
    SEALED,
    Archive,
    ArchiveRow,
    WriteResult,
    make_row,
)
from store_node.metrics import NodeMetrics
from store_node.missing import MissingReferences
from transports.base import TOPIC_PREFIX, Envelope, Subscription, TransportError, message_hash

log = logging.getLogger("store_node.ingest")

#: Rejection reasons the store adds to :class:`sdk.sds.errors.RejectReason`.
CHANNEL_MISMATCH = "channel_mismatch"
LAMPORT_OUT_OF_RANGE = "lamport_out_of_range"
#: An id holds NUL, which no PostgreSQL text or JSON value can store.
UNSTORABLE = "unstorable"
#: A row the archive refused on its own (isolated by bisecting its batch).
QUARANTINED = "quarantined"
#: A sealed envelope whose timestamp is too far ahead of the node's clock.
TIMESTAMP_OUT_OF_RANGE = "timestamp_out_of_range"

#: How far ahead of the node's clock a sealed envelope's timestamp may be (ms): the
#: bound on the sync key a peer can claim (Waku Store rejects beyond 20 s; sender
#: clocks here are phones', so minutes).
SEALED_FUTURE_TOLERANCE_MS = 5 * 60 * 1000

#: Shortest time between two log lines about rejects of one reason (seconds).
REJECT_LOG_INTERVAL = 10.0

#: Under a backlog a batch may grow to this many times ``batch_size``.
BACKLOG_FACTOR = 8

#: Retries of a failing batch during shutdown before its messages are counted lost.
_SHUTDOWN_RETRIES = 3


def channel_for_topic(topic: str) -> str | None:
    """The SDS channel a Chorus topic carries, or ``None`` for a foreign topic."""
    return topic[len(TOPIC_PREFIX) :] if topic.startswith(TOPIC_PREFIX) else None


_CONTENT = MessageKind.CONTENT.value
_SYNC = MessageKind.SYNC.value
_EPHEMERAL = MessageKind.EPHEMERAL.value


def row_from_envelope(
    envelope: Envelope, arrival_ms: int, limits: Limits = DEFAULT_LIMITS
) -> ArchiveRow | str:
    """The archive row for one received copy, or the reason it is rejected."""
    payload = envelope.payload
    if payload[:1] == _SEALED_LEAD:
        return sealed_row(envelope, arrival_ms, limits)
    try:
        # decode_message's verdict, without building the Message (what a row needs).
        sender_id, message_id, channel_id, lamport, history, content = decode_archive_fields(
            payload, limits
        )
    except RemoteProtocolError as exc:
        return exc.reason.value
    topic = envelope.topic
    if topic.startswith(TOPIC_PREFIX) and channel_id != topic[len(TOPIC_PREFIX) :]:
        # A message claiming another channel than its topic would poison that
        # channel's archive; SDS participants ignore it too.
        return CHANNEL_MISMATCH
    if lamport is not None and lamport > MAX_LAMPORT:
        return LAMPORT_OUT_OF_RANGE
    if "\x00" in "".join((message_id, sender_id, channel_id, *history)):
        return UNSTORABLE
    # The kind was checked in decoding (Message.kind, without building a Message).
    kind = _EPHEMERAL if lamport is None else _CONTENT if content else _SYNC
    return make_row(
        channel_id,
        message_id,
        sender_id,
        kind,
        lamport,
        history,
        len(content) if content else 0,
        len(payload),
        arrival_ms,
        arrival_ms,
        1,
        envelope.retrieval_hint or None,
        payload,
    )


_SEALED_LEAD = bytes([SEALED_VERSION])


def sealed_row(
    envelope: Envelope, arrival_ms: int, limits: Limits = DEFAULT_LIMITS
) -> ArchiveRow | str:
    """The archive row of a sealed envelope (``docs/encryption.md``), or why it is rejected.

    Only the header is read (size bounds and version; the seal is not and cannot
    be checked): the channel is the topic's, the id the hex of the transport hash,
    the sender unknown (empty), and the envelope's timestamp takes the Lamport
    time's place (:data:`store_node.archive.base.SEALED`).
    """
    payload = envelope.payload
    try:
        header = read_header(payload, limits.max_message_size + SEALED_OVERHEAD)
    except RemoteEncryptionError:
        return RejectReason.DECODE.value
    channel_id = channel_for_topic(envelope.topic)
    if not channel_id:
        # No SDS channel id to check the topic against: the topic is all there is.
        return RejectReason.DECODE.value
    if header.timestamp > min(arrival_ms + SEALED_FUTURE_TOLERANCE_MS, MAX_LAMPORT):
        return TIMESTAMP_OUT_OF_RANGE
    if "\x00" in channel_id:
        return UNSTORABLE
    digest = envelope.retrieval_hint or message_hash(envelope.topic, payload)
    return make_row(
        channel_id,
        digest.hex(),
        "",
        SEALED,
        header.timestamp,
        (),
        0,
        len(payload),
        arrival_ms,
        arrival_ms,
        1,
        digest,
        payload,
    )


def merge_rows(rows: Sequence[ArchiveRow]) -> list[ArchiveRow]:
    """Collapse copies of one ``(channel_id, message_id)`` in a batch into one row.

    The first copy's bytes and hash win (as they do against the archive), the
    counts add up and the arrival times span all copies. One row per key is what
    :meth:`Archive.write_batch` requires (PostgreSQL cannot touch a row twice in
    one ``INSERT ... ON CONFLICT``).
    """
    merged: dict[tuple[str, str], ArchiveRow] = {}
    for row in rows:
        key = (row.channel_id, row.message_id)
        seen = merged.get(key)
        if seen is None:
            merged[key] = row
            continue
        merged[key] = ArchiveRow(
            channel_id=seen.channel_id,
            message_id=seen.message_id,
            sender_id=seen.sender_id,
            kind=seen.kind,
            lamport_timestamp=seen.lamport_timestamp,
            causal_history=seen.causal_history,
            content_size=seen.content_size,
            message_size=seen.message_size,
            first_arrival=min(seen.first_arrival, row.first_arrival),
            last_arrival=max(seen.last_arrival, row.last_arrival),
            arrival_count=seen.arrival_count + row.arrival_count,
            transport_hash=seen.transport_hash,
            data=seen.data,
        )
    return list(merged.values())


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What :meth:`Ingest.write_rows` did."""

    #: Rows that did not exist before.
    inserted: int
    #: Rows that existed and had their arrival count bumped.
    updated: int
    #: Rows the archive refused, set aside with a log line.
    quarantined: int
    #: Received copies those quarantined rows stood for.
    quarantined_copies: int


def now_ms() -> int:
    """Wall-clock Unix epoch milliseconds (the archive's time base)."""
    return time.time_ns() // 1_000_000


class _RowsRefused(Exception):
    """The archive refused a write because of the rows in it (bisect, don't retry)."""


class _GaveUp(Exception):
    """A write kept failing during shutdown; its messages stay unacknowledged."""


class _RejectLog:
    """One log line per reason per interval, with the count since the last line."""

    def __init__(self, interval: float = REJECT_LOG_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def note(
        self, reason: str, fields: dict[str, object], message: str = "message rejected"
    ) -> None:
        """Count one; log it with ``fields`` unless a line for ``reason`` went out lately."""
        self._since[reason] = self._since.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._last.get(reason, -self.interval) < self.interval:
            return
        self._last[reason] = now
        count = self._since.pop(reason)
        level = logging.ERROR if reason == QUARANTINED else logging.WARNING
        log.log(level, message, extra={"reason": reason, "count": count, **fields})


class Ingest:
    """Batches envelopes from any number of subscriptions into one archive."""

    def __init__(
        self,
        archive: Archive,
        *,
        batch_size: int = 1000,
        batch_interval: float = 0.05,
        queue_size: int = 20_000,
        queue_bytes: int = 64 * 1024 * 1024,
        archive_ephemeral: bool = True,
        metrics: NodeMetrics | None = None,
        limits: Limits = DEFAULT_LIMITS,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        if batch_size < 1 or queue_size < 1 or queue_bytes < 1 or batch_interval < 0:
            raise ValueError(
                "batch_size, queue_size and queue_bytes must be >= 1, batch_interval >= 0"
            )
        self.archive = archive
        self.batch_size = batch_size
        self.batch_interval = batch_interval
        self.archive_ephemeral = archive_ephemeral
        self.metrics = metrics or NodeMetrics()
        self.limits = limits
        self.clock = clock
        self.queue_size = queue_size
        self._queue: list[tuple[Envelope, int]] = []
        # Set when the queue becomes non-empty, a batch is full, or stop() is called:
        # what the writer waits for, so it is not woken once per message.
        self._arrived = asyncio.Event()
        self._stop_requested = False
        # A batch is full at batch_size, or when the queue is (readers wait on the writer).
        self._fill = min(batch_size, queue_size)
        self.metrics.track_queue(self._queue.__len__)
        # The queue is bounded in messages and in bytes: 20,000 messages of the SDS
        # maximum (256 KiB) would otherwise be 5 GiB of memory.
        self.queue_bytes = queue_bytes
        self._queued_bytes = 0
        self._room = asyncio.Event()
        # One writer thread: batches commit in order and SQLite sees a single writer.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive-writer")
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-decoder")
        self._writer: asyncio.Task[None] | None = None
        self._readers: list[tuple[Subscription, asyncio.Task[None]]] = []
        self._stopping = False
        self._draining = False
        # Both rate-limited: a hostile peer must not be able to flood the log. The
        # decoder thread writes one, the event loop the other.
        self._reject_log = _RejectLog()
        self._quarantine_log = _RejectLog()
        #: Ids archived messages reference that the archive lacks (store_node.missing).
        self.missing = MissingReferences(archive, self.metrics)
        self._seeding: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Start the writer task, and the judging of the newest archived rows'
        references (:meth:`MissingReferences.seed`) on a thread beside it.

        Neither the start nor ingest waits for the judging (about 2 s at 100,000
        rows); a failure there is logged, and ingest goes on without it.
        """
        if self._writer is None:
            self._seeding = asyncio.get_running_loop().run_in_executor(None, self._seed_missing)
            self._writer = asyncio.create_task(self._write_loop(), name="ingest-writer")

    def _seed_missing(self) -> None:
        try:
            started = time.perf_counter()
            noticed = self.missing.seed()
            log.info(
                "referenced ids judged at start",
                extra={"missing": noticed, "seconds": round(time.perf_counter() - started, 3)},
            )
        except Exception as exc:
            log.error("judging referenced ids at start failed", extra={"error": repr(exc)[:500]})

    def attach(self, subscription: Subscription) -> None:
        """Archive everything that arrives on ``subscription`` until :meth:`stop`."""
        task = asyncio.create_task(self._read(subscription), name=f"ingest:{subscription.topic}")
        self._readers.append((subscription, task))

    async def submit(self, envelope: Envelope) -> None:
        """Queue one envelope; waits while the queue is full (backpressure)."""
        if self._stopping:
            raise RuntimeError("ingest is stopping")
        size = len(envelope.payload)
        queue = self._queue
        # One message always fits an empty queue, however large: no deadlock.
        while len(queue) >= self.queue_size or (
            self._queued_bytes and self._queued_bytes + size > self.queue_bytes
        ):
            self._room.clear()
            await self._room.wait()
        self._queued_bytes += size
        # Counted per batch on the decoder thread (received_total), not here: this
        # runs once per message on the event loop, and the counter takes a lock.
        queue.append((envelope, self.clock()))
        if len(queue) == 1 or len(queue) == self._fill:
            self._arrived.set()

    async def _read(self, subscription: Subscription) -> None:
        try:
            async for envelope in subscription:
                await self.submit(envelope)
            if not (self._stopping or self._draining):
                log.warning(
                    "subscription closed by the transport", extra={"topic": subscription.topic}
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # One broken subscription must not take the node down; it is loud instead
            # (the adapters reconnect on their own; this is a bug or a closed transport).
            if not self._stopping:
                log.error(
                    "subscription ended",
                    extra={"topic": subscription.topic, "error": repr(exc)},
                    exc_info=not isinstance(exc, TransportError),
                )

    def expect_subscriptions_to_end(self) -> None:
        """The transport is about to close: its subscriptions ending is not a fault."""
        self._draining = True

    async def stop(self, timeout: float = 30.0, *, drain: bool = False) -> None:
        """Stop reading, write everything already received, release the threads.

        ``drain=True`` is for when the transport has just been closed: its
        subscriptions end after the envelopes they already hold, and those are
        archived too (closing a subscription instead would discard them). Readers
        still running after ``timeout / 3`` are closed anyway.
        """
        readers = [task for _, task in self._readers]
        pending: set[asyncio.Task[None]] = set(readers)
        self._draining = self._draining or drain
        if drain and readers:
            _, pending = await asyncio.wait(readers, timeout=timeout / 3)
        self._stopping = True
        for subscription, task in self._readers:
            if task in pending:
                with contextlib.suppress(Exception):
                    await subscription.close()
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=min(timeout / 3, 5.0))
            for task in stuck:
                task.cancel()
        if self._writer is not None:
            self._stop_requested = True
            self._arrived.set()
            try:
                async with asyncio.timeout(timeout):
                    await self._writer
            except TimeoutError:
                log.error("ingest flush timed out", extra={"pending": len(self._queue)})
        if self._seeding is not None:
            # It reads the archive, which the caller closes next.
            await asyncio.wait([self._seeding], timeout=timeout)
        self._executor.shutdown(wait=True)
        self._decoder.shutdown(wait=True)

    @property
    def pending(self) -> int:
        """Envelopes received but not yet handed to the archive."""
        return len(self._queue)

    async def _collect(self) -> tuple[list[tuple[Envelope, int]], bool]:
        """The next batch, and whether stop() was called and this is the last one."""
        queue = self._queue
        arrived = self._arrived
        while not queue:
            if self._stop_requested:
                return [], True
            arrived.clear()
            await arrived.wait()
        deadline = asyncio.get_running_loop().time() + self.batch_interval
        while len(queue) < self._fill and not (self._stopping or self._stop_requested):
            arrived.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await arrived.wait()
            except TimeoutError:
                break
        # Behind (a full batch and more already waiting): take what is queued, up to
        # BACKLOG_FACTOR batches, into this one commit. Fewer, larger transactions
        # catch up faster (~7% more messages/s on SQLite when backlogged) and those
        # messages have waited anyway. Bytes stay bounded by queue_bytes.
        take = BACKLOG_FACTOR * self.batch_size
        batch = queue[:take]
        del queue[:take]
        self._queued_bytes -= sum(len(envelope.payload) for envelope, _ in batch)
        self._room.set()
        return batch, self._stop_requested and not queue

    async def _write_loop(self) -> None:
        # A two-stage pipeline: batch N+1 is decoded (Python, holds the GIL) on one
        # thread while batch N commits (the database drivers release the GIL) on the
        # writer thread. Commits stay strictly in order: one write in flight at a time.
        loop = asyncio.get_running_loop()
        in_flight: asyncio.Task[None] | None = None
        while True:
            batch, stop = await self._collect()
            if batch:
                started = time.perf_counter()
                rows, copies = await loop.run_in_executor(self._decoder, self._prepare, batch)
                if in_flight is not None:
                    await in_flight
                envelopes = [envelope for envelope, _ in batch]
                in_flight = asyncio.create_task(
                    self._write_with_retry(rows, copies, envelopes, started)
                )
            if stop:
                if in_flight is not None:
                    await in_flight
                return

    async def _write_with_retry(
        self, rows: list[ArchiveRow], copies: int, envelopes: list[Envelope], started: float
    ) -> None:
        try:
            result = await self.write_rows(rows)
        except _GaveUp:
            # Not acknowledged: a persistent session delivers these again.
            self.metrics.lost.inc(copies)
            log.error("giving up on batch at shutdown", extra={"rows": len(rows)})
            return
        self.metrics.archived.inc(result.inserted)
        self.metrics.duplicates.inc(copies - result.inserted - result.quarantined_copies)
        self.metrics.batch_rows.observe(len(envelopes))
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        # Committed (or rejected / quarantined for good): now, and only now, the
        # transport may forget them. Acknowledgements run on the event loop.
        for envelope in envelopes:
            envelope.acknowledge()

    async def write_rows(self, rows: list[ArchiveRow]) -> IngestResult:
        """Commit ``rows`` (merged, see :func:`merge_rows`), isolating poison rows.

        Retries while the archive is unavailable. When the archive refuses the
        rows themselves, the batch is split in halves, recursively, until each
        refused row is alone; those are quarantined (counted and logged) and the
        rest committed. Raises ``_GaveUp`` (internal) only during shutdown.
        """
        inserted = updated = quarantined = quarantined_copies = 0
        parts = [rows]
        while parts:
            part = parts.pop()
            try:
                result = await self._write_part(part)
            except _RowsRefused as exc:
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]  # first half first
                    continue
                row = part[0]
                quarantined += 1
                quarantined_copies += row.arrival_count
                self.metrics.rejected.labels(QUARANTINED).inc()
                self._quarantine_log.note(
                    QUARANTINED,
                    {
                        "channel_id": row.channel_id[:300],
                        "message_id": row.message_id[:300],
                        "sender_id": row.sender_id[:300],
                        "transport_hash": (row.transport_hash or b"").hex(),
                        "error": repr(exc.__cause__)[:500],
                    },
                    "row quarantined: the archive refuses it",
                )
                continue
            inserted += result.inserted
            updated += result.updated
        return IngestResult(inserted, updated, quarantined, quarantined_copies)

    async def _write_part(self, rows: list[ArchiveRow]) -> WriteResult:
        loop = asyncio.get_running_loop()
        delay = 0.1
        attempts = 0
        while True:
            attempts += 1
            try:
                return await loop.run_in_executor(self._executor, self.archive.write_batch, rows)
            except Exception as exc:
                if self.archive.is_row_error(exc):
                    raise _RowsRefused() from exc
                self.metrics.write_errors.inc()
                log.error(
                    "batch write failed; retrying",
                    extra={"rows": len(rows), "attempt": attempts, "error": repr(exc)[:500]},
                )
                if self._stopping and attempts >= _SHUTDOWN_RETRIES:
                    raise _GaveUp() from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _prepare(self, batch: list[tuple[Envelope, int]]) -> tuple[list[ArchiveRow], int]:
        """Writer thread: decode and bound-check, count rejects, merge copies.

        Returns the rows to write and how many received copies they stand for.
        """
        self.metrics.received.inc(len(batch))
        rows: list[ArchiveRow] = []
        for envelope, arrival in batch:
            row = row_from_envelope(envelope, arrival, self.limits)
            if isinstance(row, str):
                self.metrics.rejected.labels(row).inc()
                self._reject_log.note(row, {"topic": envelope.topic[:300]})
            elif not self.archive_ephemeral and row.kind == MessageKind.EPHEMERAL.value:
                self.metrics.skipped.labels("ephemeral").inc()
            else:
                rows.append(row)
        merged = merge_rows(rows)
        try:
            self.missing.observe(merged)
        except Exception as exc:
            # Bookkeeping only: an archive lookup failing here must not stop ingest.
            log.error("tracking referenced ids failed", extra={"error": repr(exc)[:500]})
        return merged, len(rows)
