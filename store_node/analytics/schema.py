"""The archive export's schema, as Arrow and as Spark see it.

``docs/archive-export.md`` is the normative description; this module is the one place the
analytics code spells it out. Both readers (Spark in the jobs, DuckDB in the benchmark) and the
synthetic writer take their column lists from here, so a change to the format is one edit.

The partition folders are ``channel=<percent-encoded id>/date=YYYY-MM-DD`` (ids whose
encoding would not fit a folder name are shortened with a hash: :func:`encode_channel`).
Spark decodes ``%XX`` escapes in partition values byte by byte into Latin-1 characters, so a
non-ASCII channel id comes back garbled from the folder name; the ``channel_id`` column is
authoritative and the jobs key on it. The ``channel`` partition column is read as a string only
so that pruning by channel works and ``0042`` stays ``0042``.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa

#: Columns stored inside every Parquet file, in the documented order.
ARROW_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("channel_id", pa.string(), nullable=False),
        pa.field("sender_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("lamport_timestamp", pa.int64(), nullable=True),
        pa.field("causal_history", pa.list_(pa.string()), nullable=False),
        pa.field("content_size", pa.int32(), nullable=False),
        pa.field("message_size", pa.int32(), nullable=False),
        pa.field("first_arrival", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("last_arrival", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("arrival_count", pa.int32(), nullable=False),
        pa.field("transport_hash", pa.binary(), nullable=True),
    ]
)

#: Hive partition columns, outermost first.
PARTITION_COLUMNS: tuple[str, ...] = ("channel", "date")

#: Values of the ``kind`` column.
KINDS: tuple[str, ...] = ("content", "sync", "ephemeral")


#: Longest folder name the export writes, in bytes (file systems allow 255; room to spare).
MAX_FOLDER_BYTES = 200
#: Bytes of the percent-encoded id kept before the hash in a shortened folder name.
_PREFIX_BYTES = 120
#: Separates the kept prefix from the hash. Percent-encoding always escapes ``+``, so a
#: shortened name can never equal the plain name of another channel.
_HASH_MARK = "+"


def encode_channel(channel_id: str) -> str:
    """The folder-safe form of a channel id: the value after ``channel=``.

    Percent-encoding that keeps RFC 3986 unreserved characters, as long as
    ``channel=<encoded>`` fits :data:`MAX_FOLDER_BYTES`. Longer ones (a 90-byte CJK id
    encodes to 270 bytes, over the 255 a folder name may have) keep the first
    ``_PREFIX_BYTES`` of the encoding, whole characters only, then ``+`` and the first 32
    hex digits of SHA-256 over the id's UTF-8: unique, stable, and still recognisable.
    The ``channel_id`` column inside the files always holds the full id.
    """
    encoded = quote(channel_id, safe="")
    if len("channel=") + len(encoded) <= MAX_FOLDER_BYTES:
        return encoded
    prefix, size = [], 0
    for ch in channel_id:  # whole characters: readers decode the prefix as UTF-8
        piece = quote(ch, safe="")
        if size + len(piece) > _PREFIX_BYTES:
            break
        prefix.append(piece)
        size += len(piece)
    digest = hashlib.sha256(channel_id.encode("utf-8")).hexdigest()[:32]
    return f"{''.join(prefix)}{_HASH_MARK}{digest}"


def decode_channel(segment: str) -> str | None:
    """Inverse of :func:`encode_channel`; ``None`` for a shortened (hashed) name.

    A shortened name cannot be decoded: read the ``channel_id`` column instead.
    """
    if _HASH_MARK in segment:
        return None
    return unquote(segment)


def spark_schema() -> Any:
    """The export's schema as a Spark ``StructType``, partition columns included.

    Built on demand so importing this module does not import PySpark. Every column is
    declared nullable: Spark ignores non-null flags when reading Parquet anyway, and the jobs
    must not crash on a file that carries a null where the format promises none.
    """
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("message_id", T.StringType()),
            T.StructField("channel_id", T.StringType()),
            T.StructField("sender_id", T.StringType()),
            T.StructField("kind", T.StringType()),
            T.StructField("lamport_timestamp", T.LongType()),
            T.StructField("causal_history", T.ArrayType(T.StringType())),
            T.StructField("content_size", T.IntegerType()),
            T.StructField("message_size", T.IntegerType()),
            T.StructField("first_arrival", T.TimestampType()),
            T.StructField("last_arrival", T.TimestampType()),
            T.StructField("arrival_count", T.IntegerType()),
            T.StructField("transport_hash", T.BinaryType()),
            # Partition columns: strings, never inferred (``0042`` must not become 42).
            T.StructField("channel", T.StringType()),
            T.StructField("date", T.StringType()),
        ]
    )
