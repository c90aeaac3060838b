"""Export the archive to Parquet, exactly as ``docs/archive-export.md`` fixes it.

Layout: ``<out>/channel=<encoded channel>/date=<YYYY-MM-DD>/part-<n>.parquet``,
one row per archived message, the schema in :data:`EXPORT_SCHEMA`. Rows stream
from :meth:`Archive.iter_export` (ordered by channel then arrival, so each
partition is written in one pass with one open file) and are written in row
groups; a partition's file rolls over to the next ``part-<n>`` once it holds
about ``max_file_bytes`` of (uncompressed) rows, so files stay large enough for
Spark and memory stays bounded. The export is written next to ``<out>`` and
renamed into place at the end, so a reader never sees half an export.

Sealed rows (:data:`store_node.archive.base.SEALED`, ``docs/encryption.md``) export
as they are archived: no sender, kind, Lamport time or causal history, only what is
outside the seal. Given the channels' keys (``readers``, from a keys file:
:func:`sdk.encryption.keyfile.load_key_rings`), each sealed row of a channel with keys
is opened (its bytes read back by hash) and exported as the clear message it holds
would be, so the analytics report is the full one; one that does not open (no epoch
for it, forged) stays sealed and is counted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sdk.encryption.hook import Encryption
from sdk.sds.message import decode_message
from store_node.analytics.schema import ARROW_SCHEMA, encode_channel
from store_node.archive.base import SEALED, Archive, Criteria, ExportRow
from store_node.errors import ConfigError

#: The export schema (docs/archive-export.md); columns not marked nullable there are
#: required. Its one home is the analytics schema module, which reads what this writes.
EXPORT_SCHEMA = ARROW_SCHEMA

#: Target size of one Parquet file ("one file per partition up to ~128 MiB").
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024
#: Rows buffered before a row group is written.
ROW_GROUP_ROWS = 100_000
_DAY_MS = 86_400_000


def channel_folder(channel_id: str) -> str:
    """The partition folder: ``channel=`` + :func:`store_node.analytics.schema.encode_channel`.

    Percent-encoding (RFC 3986 unreserved kept); an id whose encoding would not fit a
    folder name is shortened with a hash, so every valid channel id exports.
    """
    return "channel=" + encode_channel(channel_id)


def utc_date(ms: int) -> str:
    """``YYYY-MM-DD`` of an epoch-millisecond instant, in UTC."""
    return datetime.fromtimestamp((ms // _DAY_MS) * 86_400, UTC).date().isoformat()


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote."""

    rows: int
    files: list[Path]
    #: Sealed rows exported sealed (no keys for their channel, or they did not open).
    sealed: int = 0
    #: Sealed rows opened with the keys given and exported as clear messages.
    opened: int = 0


class _PartitionWriter:
    """Writes one partition's rows into part files of bounded size."""

    def __init__(self, folder: Path, max_file_bytes: int) -> None:
        self.folder = folder
        self.max_file_bytes = max_file_bytes
        self.part = 0
        self.writer: Any = None
        self.file_bytes = 0
        self.files: list[Path] = []
        self.columns: dict[str, list[Any]] = {name: [] for name in EXPORT_SCHEMA.names}

    def add(self, row: ExportRow) -> None:
        c = self.columns
        c["message_id"].append(row.message_id)
        c["channel_id"].append(row.channel_id)
        c["sender_id"].append(row.sender_id)
        c["kind"].append(row.kind)
        c["lamport_timestamp"].append(row.lamport_timestamp)
        c["causal_history"].append(row.causal_history)
        c["content_size"].append(row.content_size)
        c["message_size"].append(row.message_size)
        c["first_arrival"].append(row.first_arrival)
        c["last_arrival"].append(row.last_arrival)
        c["arrival_count"].append(row.arrival_count)
        c["transport_hash"].append(row.transport_hash)
        if len(c["message_id"]) >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.columns["message_id"]:
            return
        table = pa.Table.from_pydict(self.columns, schema=EXPORT_SCHEMA)
        self.columns = {name: [] for name in EXPORT_SCHEMA.names}
        if self.writer is not None and self.file_bytes >= self.max_file_bytes:
            self._close_file()
        if self.writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"part-{self.part}.parquet"
            self.writer = pq.ParquetWriter(path, EXPORT_SCHEMA, compression="zstd")
            self.files.append(path)
            self.part += 1
            self.file_bytes = 0
        self.writer.write_table(table)
        self.file_bytes += table.nbytes

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> list[Path]:
        self.flush()
        self._close_file()
        return self.files


def export_archive(
    archive: Archive,
    out: str | Path,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    overwrite: bool = False,
    progress: bool = True,
    batch_size: int = 10_000,
    on_rows: Callable[[int], None] | None = None,
    readers: Mapping[str, Encryption] | None = None,
) -> ExportSummary:
    """Write the whole archive under ``out``; see the module docstring (``readers``:
    a handle per channel that opens its sealed rows)."""
    from tqdm import tqdm

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; pass overwrite=True (--overwrite)")
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    files: list[Path] = []
    rows = sealed = opened = 0
    current: tuple[str, int] | None = None
    writer: _PartitionWriter | None = None
    bar = tqdm(total=archive.count(), unit="rows", disable=not progress, desc="export")
    try:
        for batch in archive.iter_export(batch_size):
            if readers:
                batch, count = open_sealed_rows(archive, batch, readers)
                opened += count
            for row in batch:
                if row.kind == SEALED:
                    sealed += 1
                partition = (row.channel_id, row.first_arrival // _DAY_MS)
                if partition != current:
                    if writer is not None:
                        files += writer.close()
                    current = partition
                    folder = (
                        staging
                        / channel_folder(row.channel_id)
                        / f"date={utc_date(row.first_arrival)}"
                    )
                    writer = _PartitionWriter(folder, max_file_bytes)
                assert writer is not None
                writer.add(row)
            rows += len(batch)
            bar.update(len(batch))
            if on_rows is not None:
                on_rows(rows)
        if writer is not None:
            files += writer.close()
    except BaseException:
        if writer is not None:
            writer._close_file()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        bar.close()
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return ExportSummary(
        rows=rows, files=[out / f.relative_to(staging) for f in files], sealed=sealed, opened=opened
    )


#: Hashes per lookup when reading sealed rows' bytes back.
_HASHES_PER_LOOKUP = 200


def open_sealed_rows(
    archive: Archive, batch: list[ExportRow], readers: Mapping[str, Encryption]
) -> tuple[list[ExportRow], int]:
    """``batch`` with every sealed row of a channel in ``readers`` that opens replaced by
    the row of the clear message inside (envelope size, arrivals and hash kept), and
    how many were."""
    wanted = [
        r.transport_hash
        for r in batch
        if r.kind == SEALED and r.transport_hash is not None and r.channel_id in readers
    ]
    data: dict[bytes, bytes] = {}
    for start in range(0, len(wanted), _HASHES_PER_LOOKUP):
        chunk = tuple(wanted[start : start + _HASHES_PER_LOOKUP])
        page = archive.find(
            Criteria(message_hashes=chunk),
            after=None,
            forward=True,
            limit=len(chunk) * 2,
            max_bytes=1 << 62,
            include_data=True,
        )
        for m in page.messages:
            if m.transport_hash is not None and m.data is not None:
                data[m.transport_hash] = m.data
    if not data:
        return batch, 0
    out: list[ExportRow] = []
    opened = 0
    for row in batch:
        envelope = data.get(row.transport_hash or b"") if row.kind == SEALED else None
        clear = _opened(row, envelope, readers[row.channel_id]) if envelope else None
        opened += clear is not None
        out.append(clear or row)
    return out, opened


def _opened(row: ExportRow, envelope: bytes, reader: Encryption) -> ExportRow | None:
    try:
        message = decode_message(reader.decrypt(envelope))
        kind = message.kind.value
    except Exception:  # any failure (RemoteEncryptionError, RemoteProtocolError): stays sealed
        return None
    if message.channel_id != row.channel_id:
        return None
    return ExportRow(
        message_id=message.message_id,
        channel_id=row.channel_id,
        sender_id=message.sender_id,
        kind=kind,
        lamport_timestamp=message.lamport_timestamp,
        causal_history=[e.message_id for e in message.causal_history],
        content_size=len(message.content or b""),
        message_size=row.message_size,
        first_arrival=row.first_arrival,
        last_arrival=row.last_arrival,
        arrival_count=row.arrival_count,
        transport_hash=row.transport_hash,
    )
