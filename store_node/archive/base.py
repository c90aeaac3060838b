"""The archive interface and the values that cross it.

An archive keeps one row per distinct ``(channel_id, message_id)``: the raw SDS
bytes as first received, the fields analysts need, and how often and when the
message arrived (rebroadcasts and duplicates bump ``arrival_count`` and
``last_arrival``; ``first_arrival`` never changes, so it is a stable sort key
for pagination). Rows are ordered by :data:`Key` ``(first_arrival, seq)``, where
``seq`` is the archive's insertion counter, unique per row.

Every method is synchronous and blocking: the node runs writes on one writer
thread and reads on a small thread pool, so the database drivers stay simple
and the event loop never blocks. Implementations must allow one writer and
several concurrent readers from different threads.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

#: Position of a row in archive order: ``(first_arrival, seq)``.
Key = tuple[int, int]

#: Largest Lamport time the archive accepts (the export column is int64).
MAX_LAMPORT = 2**63 - 1

#: The ``kind`` of a sealed envelope's row (``docs/encryption.md``): the store cannot
#: read the SDS message inside, so the row is keyed by what is outside the seal. Its
#: ``message_id`` is the hex of its ``transport_hash``, its ``sender_id`` is empty,
#: its causal history is empty and its ``lamport_timestamp`` holds the envelope's
#: sender-set timestamp (ms), the one order key a sealed message shows.
SEALED = "sealed"


@dataclass(frozen=True, slots=True)
class ArchiveRow:
    """One message to write, with its arrival bookkeeping (already merged per batch)."""

    channel_id: str
    message_id: str
    sender_id: str
    #: ``content``, ``sync`` or ``ephemeral`` (:class:`sdk.sds.message.MessageKind` values),
    #: or :data:`SEALED`.
    kind: str
    #: The SDS Lamport time; for a :data:`SEALED` row, the envelope's timestamp (ms).
    lamport_timestamp: int | None
    causal_history: tuple[str, ...]
    content_size: int
    message_size: int
    #: Unix epoch milliseconds.
    first_arrival: int
    last_arrival: int
    arrival_count: int
    #: Retrieval hint of the first copy (``transports.base.message_hash``).
    transport_hash: bytes | None
    #: The raw SDS message bytes.
    data: bytes


def _row_maker() -> Callable[..., ArchiveRow]:
    """A positional constructor of :class:`ArchiveRow` that sets its slots directly.

    A frozen dataclass's ``__init__`` goes through ``object.__setattr__`` once per
    field; ingest builds a row per message (thirteen fields), and this costs about
    half as much. The result is the same frozen row ``ArchiveRow(...)`` builds.
    """
    setters = tuple(getattr(ArchiveRow, f.name).__set__ for f in fields(ArchiveRow))
    (s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12) = setters
    new = object.__new__

    def make(
        channel_id: str,
        message_id: str,
        sender_id: str,
        kind: str,
        lamport_timestamp: int | None,
        causal_history: tuple[str, ...],
        content_size: int,
        message_size: int,
        first_arrival: int,
        last_arrival: int,
        arrival_count: int,
        transport_hash: bytes | None,
        data: bytes,
    ) -> ArchiveRow:
        row: ArchiveRow = new(ArchiveRow)
        s0(row, channel_id)
        s1(row, message_id)
        s2(row, sender_id)
        s3(row, kind)
        s4(row, lamport_timestamp)
        s5(row, causal_history)
        s6(row, content_size)
        s7(row, message_size)
        s8(row, first_arrival)
        s9(row, last_arrival)
        s10(row, arrival_count)
        s11(row, transport_hash)
        s12(row, data)
        return row

    return make


#: ``ArchiveRow(...)`` with every field given positionally, in declaration order,
#: for hot paths (see :func:`_row_maker`).
make_row = _row_maker()


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a batch write did."""

    #: Rows that did not exist before.
    inserted: int
    #: Rows that existed and had their arrival count bumped (rebroadcasts, duplicates).
    updated: int


@dataclass(frozen=True, slots=True)
class Criteria:
    """Which rows a query matches (see ``proto/store/v1/store.proto``).

    A *lookup* lists ``message_ids`` and/or ``message_hashes`` and matches rows
    with either; ids need ``channel_id``. A *filter* query uses ``channel_id``
    (optional: all channels) and the ``[time_start, time_end)`` range on
    ``first_arrival``. The two kinds never mix; :mod:`store_node.query`
    validates requests before they get here.
    """

    channel_id: str | None = None
    time_start: int | None = None
    time_end: int | None = None
    message_ids: tuple[str, ...] = ()
    message_hashes: tuple[bytes, ...] = ()

    @property
    def is_lookup(self) -> bool:
        """True for a lookup by ids / hashes."""
        return bool(self.message_ids or self.message_hashes)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One row as a query returns it."""

    seq: int
    channel_id: str
    message_id: str
    sender_id: str
    lamport_timestamp: int | None
    first_arrival: int
    message_size: int
    transport_hash: bytes | None
    #: The raw bytes, or ``None`` when the query did not ask for data.
    data: bytes | None

    @property
    def key(self) -> Key:
        """The row's position in archive order."""
        return (self.first_arrival, self.seq)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a query, always in forward (oldest first) order."""

    messages: list[StoredMessage]
    #: Key to continue from (exclusive) in the same direction; ``None`` on the last page.
    next_key: Key | None


@dataclass(frozen=True, slots=True)
class ExportRow:
    """One row for the Parquet export (``docs/archive-export.md``); no raw bytes."""

    message_id: str
    channel_id: str
    sender_id: str
    kind: str
    lamport_timestamp: int | None
    causal_history: list[str]
    content_size: int
    message_size: int
    first_arrival: int
    last_arrival: int
    arrival_count: int
    transport_hash: bytes | None


@dataclass(frozen=True, slots=True)
class ArchiveStats:
    """A summary of the archive, for ``store-node stats``, Health and metrics."""

    schema_version: int
    message_count: int
    #: Sum of ``message_size`` over all rows (what size-based retention bounds).
    total_message_bytes: int
    #: Sum of ``arrival_count``: every copy received, rebroadcasts included.
    total_arrivals: int
    channels: dict[str, int] = field(default_factory=dict)
    oldest_arrival: int | None = None
    newest_arrival: int | None = None


class Archive(abc.ABC):
    """Durable storage of SDS messages; see the module docstring."""

    #: Short backend name for logs and metrics (``sqlite``, ``postgresql``).
    backend: str

    @abc.abstractmethod
    def migrate(self) -> int:
        """Bring the schema to the latest version; return that version. Idempotent."""

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The schema version currently applied (0 for an empty database)."""

    @abc.abstractmethod
    def write_batch(self, rows: Sequence[ArchiveRow]) -> WriteResult:
        """Insert or merge ``rows`` in one transaction (all or nothing).

        ``rows`` must have distinct ``(channel_id, message_id)`` keys (see
        :func:`store_node.ingest.merge_rows`). An existing row keeps its bytes,
        hash and ``first_arrival``; its ``arrival_count`` grows by the row's and
        ``last_arrival`` becomes the later of the two.
        """

    def is_row_error(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by :meth:`write_batch`, is about the rows themselves.

        ``True`` when writing the same rows again would fail the same way (a value
        the backend cannot store, a constraint), so ingest isolates the culprit by
        bisecting the batch; ``False`` for an outage (connection lost, locked, disk
        full), which ingest retries. Values the database driver refuses while binding
        (``ValueError``, ``TypeError``, ``OverflowError``) are row errors everywhere.
        """
        return isinstance(exc, ValueError | TypeError | OverflowError)

    @abc.abstractmethod
    def bulk_load(self, rows: Sequence[ArchiveRow]) -> None:
        """Plain bulk insert without merging, for loading a fresh archive (benchmarks).

        Fails on a duplicate key; use :meth:`write_batch` for live data.
        """

    @abc.abstractmethod
    def find(
        self,
        criteria: Criteria,
        *,
        after: Key | None,
        forward: bool,
        limit: int,
        max_bytes: int,
        include_data: bool,
    ) -> Page:
        """One page of matching rows, continuing after ``after`` (exclusive).

        Stops at ``limit`` rows, or earlier when the raw bytes would exceed
        ``max_bytes`` (at least one row is always returned if any match).
        """

    @abc.abstractmethod
    def iter_export(self, batch_size: int = 10_000) -> Iterator[list[ExportRow]]:
        """Every row ordered by ``(channel_id, first_arrival, seq)``, in batches.

        Streams from the database (a server-side cursor), so memory stays
        bounded whatever the archive size.
        """

    @abc.abstractmethod
    def stats(self) -> ArchiveStats:
        """Counts and sizes (one scan; not for hot paths)."""

    @abc.abstractmethod
    def count(self) -> int:
        """Number of rows."""

    @abc.abstractmethod
    def delete_older_than(self, cutoff: int) -> int:
        """Delete rows whose ``first_arrival`` is before ``cutoff`` (epoch ms); return how many."""

    @abc.abstractmethod
    def trim_to_bytes(self, max_bytes: int) -> int:
        """Delete the oldest rows until ``total_message_bytes <= max_bytes``; return how many."""

    @abc.abstractmethod
    def check_integrity(self) -> list[str]:
        """Problems found by the database's own checks and the archive invariants; empty if ok."""

    @abc.abstractmethod
    def get_meta(self, key: str) -> bytes | None:
        """A value from the archive's key-value metadata (e.g. the cursor secret)."""

    @abc.abstractmethod
    def set_meta_if_absent(self, key: str, value: bytes) -> bytes:
        """Store ``value`` under ``key`` unless one exists; return the value in effect."""

    @abc.abstractmethod
    def existing_ids(self, by_channel: Mapping[str, Collection[str]]) -> set[tuple[str, str]]:
        """Which ``(channel_id, message_id)`` of ``by_channel`` (ids per channel) are archived.

        Index lookups on a reader connection: sees what is committed, never waits on a
        batch commit (:class:`store_node.missing.MissingReferences` asks this).
        """

    @abc.abstractmethod
    def recent_references(self, limit: int) -> list[tuple[str, str, list[str]]]:
        """``(channel_id, message_id, causal_history)`` of the newest ``limit`` rows.

        Newest first, in archive insertion order (``seq``): what a restarted node reads
        to judge again which referenced ids it lacks.
        """

    def connect(self, role: str = "reader") -> Any:
        """A new connection to the archive's database with the archive's own settings
        (timeouts, pragmas), in autocommit mode: the archive's connections and store
        sync's index (:mod:`store_node.store_sync.index`) all open here. ``role`` names
        its use (``writer`` is the archive's one ingest writer); a failure raises
        :class:`~store_node.errors.ArchiveUnavailable`."""
        raise NotImplementedError(f"{type(self).__name__} does not support store sync")

    def sync_keys_after(self, seq: int, limit: int) -> list[tuple[int, int | None, bytes]]:
        """Up to ``limit`` rows after ``seq`` that have a transport hash, in ``seq`` order:
        ``(seq, lamport_timestamp, transport_hash)`` (store-to-store sync's index feed,
        :mod:`store_node.store_sync.index`)."""
        raise NotImplementedError(f"{type(self).__name__} does not support store sync")

    def count_sync_keys(self, up_to_seq: int) -> int:
        """How many rows with ``seq <= up_to_seq`` have a transport hash."""
        raise NotImplementedError(f"{type(self).__name__} does not support store sync")

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection. Idempotent. Reads and writes in progress end first;
        none starts afterwards (:class:`~store_node.errors.ArchiveClosed`)."""

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
