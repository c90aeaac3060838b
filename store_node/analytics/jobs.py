"""The analytics jobs: each a function from DataFrames to a DataFrame.

Theory of operation. Every job reads the export's columns (``schema.py``) and nothing else,
so each can be checked on a hand-built archive of a few rows. Two intermediate frames are
shared because several answers come from the same expensive step:

* :func:`sender_hour_volume` — messages and bytes per (channel, sender, UTC hour). Every
  volume table, the participant counts and the busiest hours roll up from it, so the archive
  is grouped once, not once per table.
* :func:`causal_references` — one row per causal-history entry with the dependency's Lamport
  time looked up in the archive. Loss (references to ids never archived) and causal-order
  violations (dependencies whose Lamport time is not below the message's) both come from it.

Definitions (the report's glossary repeats them):

* time buckets are by ``first_arrival``, the store's clock, in UTC;
* delivery delay = ``first_arrival - lamport_timestamp`` in ms (Lamport time is the sender's
  ms clock, SDS §Lamport); ephemeral messages have no Lamport time and no delay. A negative
  delay means the sender's clock ran ahead of the store's; it is kept, not clipped;
* percentiles are exact: Spark's ``percentile`` aggregate counts each distinct value and
  interpolates linearly between the two closest ranks (numpy's default ``linear`` method,
  DuckDB's ``quantile_cont``). ``approx_percentile`` is never used: its rank error is a share
  of the row count, which on heavy-tailed delays moves p99 by seconds;
* rebroadcasts = ``arrival_count - 1`` per message; their share of traffic is
  rebroadcasts / all copies received;
* a lost message is an id that appears in some archived message's causal history, in the same
  channel, but was never archived itself. The export keeps history ids only (not the
  ``HistoryEntry.sender_id``), so loss is attributed to the *referencing* sender;
* a causal-order violation is a (message, dependency) pair, both archived with a Lamport
  time, where the message's Lamport time is not greater than the dependency's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

Bucket = Literal["hour", "day"]

#: Percentiles reported for delays and sizes, and the column-name suffix of each.
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def read_archive(spark: Any, path: str) -> DataFrame:
    """The archive export under ``path`` as a DataFrame with the explicit export schema.

    The partition columns ``channel`` and ``date`` are strings, never inferred. Jobs key on
    the ``channel_id`` column, which holds the decoded id (see ``schema.py`` for why the
    folder name is not used).
    """
    from .schema import spark_schema

    return spark.read.schema(spark_schema()).parquet(path)


def _percentiles(column: str, prefix: str) -> list[Column]:
    """Exact percentile aggregates of ``column`` named ``<prefix>_p50`` etc."""
    exact = F.percentile(F.col(column), [q for _, q in PERCENTILES])
    return [exact.alias(f"_{prefix}_pcts")]


def _unpack_percentiles(df: DataFrame, prefix: str) -> DataFrame:
    """Spread the array from :func:`_percentiles` into one column per percentile."""
    cols = [
        F.col(f"_{prefix}_pcts")[i].alias(f"{prefix}_{name}")
        for i, (name, _) in enumerate(PERCENTILES)
    ]
    return df.select("*", *cols).drop(f"_{prefix}_pcts")


# --- volume ------------------------------------------------------------------------------


def sender_hour_volume(archive: DataFrame) -> DataFrame:
    """Messages, bytes and copies per (channel, sender, UTC hour of first arrival).

    Columns: ``channel_id, sender_id, hour, messages, bytes, copies``. The base of every
    volume table; counts are additive, so hour rolls up to day and sender to channel.
    """
    return archive.groupBy(
        "channel_id", "sender_id", F.date_trunc("hour", "first_arrival").alias("hour")
    ).agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum("message_size").cast("long").alias("bytes"),
        F.sum("arrival_count").cast("long").alias("copies"),
    )


def _bucket(bucket: Bucket) -> Column:
    if bucket == "hour":
        return F.col("hour").alias("bucket_start")
    if bucket == "day":
        return F.date_trunc("day", "hour").alias("bucket_start")
    raise ValueError(f"bucket must be 'hour' or 'day', not {bucket!r}")


def channel_volume(sender_hours: DataFrame, bucket: Bucket = "hour") -> DataFrame:
    """Messages, bytes and active participants per channel and time bucket.

    Input: :func:`sender_hour_volume`. Columns: ``channel_id, bucket_start, messages, bytes,
    active_participants`` (distinct senders with at least one message in the bucket).
    """
    return (
        sender_hours.groupBy("channel_id", _bucket(bucket))
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.countDistinct("sender_id").alias("active_participants"),
        )
        .orderBy("channel_id", "bucket_start")
    )


def sender_volume(sender_hours: DataFrame, bucket: Bucket = "day") -> DataFrame:
    """Messages and bytes per channel, sender and time bucket (input: sender-hour volume)."""
    return (
        sender_hours.groupBy("channel_id", "sender_id", _bucket(bucket))
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .orderBy("channel_id", "sender_id", "bucket_start")
    )


def participants(sender_hours: DataFrame) -> DataFrame:
    """Per channel: participants (distinct senders), messages, bytes, active hours, span.

    Columns: ``channel_id, participants, messages, bytes, active_hours, first_hour,
    last_hour``, largest channel first.
    """
    return (
        sender_hours.groupBy("channel_id")
        .agg(
            F.countDistinct("sender_id").alias("participants"),
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.countDistinct("hour").alias("active_hours"),
            F.min("hour").alias("first_hour"),
            F.max("hour").alias("last_hour"),
        )
        .orderBy(F.desc("messages"), "channel_id")
    )


def hour_of_day(sender_hours: DataFrame) -> DataFrame:
    """Messages and bytes by UTC hour of day (0-23) over the whole archive."""
    return (
        sender_hours.groupBy(F.hour("hour").alias("hour_of_day"))
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .orderBy("hour_of_day")
    )


def busiest_hours(sender_hours: DataFrame, top: int = 10) -> DataFrame:
    """The ``top`` hours with the most messages: ``hour, messages, bytes, channels, senders``.

    Ties go to the earlier hour, so the table is deterministic.
    """
    return (
        sender_hours.groupBy("hour")
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.countDistinct("channel_id").alias("channels"),
            F.countDistinct("channel_id", "sender_id").alias("senders"),
        )
        .orderBy(F.desc("messages"), "hour")
        .limit(top)
    )


# --- per-message measures ----------------------------------------------------------------


def delivery_delay(archive: DataFrame, by: Sequence[str] = ("channel_id",)) -> DataFrame:
    """Exact delivery-delay percentiles (ms) per group; ``by=()`` gives one overall row.

    Columns: ``*by, messages, delay_min_ms, delay_mean_ms, delay_p50_ms, delay_p95_ms,
    delay_p99_ms, delay_max_ms``. Messages without a Lamport time (ephemeral) are left out;
    ``messages`` counts the ones measured.
    """
    delay = (F.unix_millis("first_arrival") - F.col("lamport_timestamp")).alias("delay_ms")
    timed = archive.where(F.col("lamport_timestamp").isNotNull()).select(*by, delay)
    out = timed.groupBy(*by).agg(
        F.count(F.lit(1)).alias("messages"),
        F.min("delay_ms").alias("delay_min_ms"),
        F.avg("delay_ms").alias("delay_mean_ms"),
        *_percentiles("delay_ms", "delay"),
        F.max("delay_ms").alias("delay_max_ms"),
    )
    out = _unpack_percentiles(out, "delay")
    out = out.withColumnsRenamed({f"delay_{n}": f"delay_{n}_ms" for n, _ in PERCENTILES})
    order = ["messages", "delay_min_ms", "delay_mean_ms"]
    order += [f"delay_{n}_ms" for n, _ in PERCENTILES] + ["delay_max_ms"]
    return out.select(*by, *order).orderBy(*by) if by else out.select(*order)


def rebroadcasts(archive: DataFrame, by: Sequence[str] = ("channel_id",)) -> DataFrame:
    """Rebroadcast counts per group; ``by=()`` gives one overall row.

    Columns: ``*by, messages, copies, rebroadcasts, rebroadcast_messages,
    rebroadcast_fraction`` where ``copies = sum(arrival_count)``, ``rebroadcasts = copies -
    messages`` and the fraction is rebroadcasts / copies (the share of received traffic that
    was a repeat).
    """
    out = archive.groupBy(*by).agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum("arrival_count").cast("long").alias("copies"),
        F.count(F.when(F.col("arrival_count") > 1, True)).alias("rebroadcast_messages"),
    )
    out = out.select(
        *by,
        "messages",
        "copies",
        (F.col("copies") - F.col("messages")).alias("rebroadcasts"),
        "rebroadcast_messages",
        F.when(F.col("copies") > 0, (F.col("copies") - F.col("messages")) / F.col("copies"))
        .otherwise(F.lit(0.0))
        .alias("rebroadcast_fraction"),
    )
    return out.orderBy(*by) if by else out


def message_sizes(archive: DataFrame, by: Sequence[str] = ("channel_id",)) -> DataFrame:
    """Exact percentiles of ``message_size`` (bytes) per group; ``by=()`` for overall.

    Columns: ``*by, messages, size_mean, size_p50, size_p95, size_p99, size_max,
    content_mean``.
    """
    out = archive.groupBy(*by).agg(
        F.count(F.lit(1)).alias("messages"),
        F.avg("message_size").alias("size_mean"),
        *_percentiles("message_size", "size"),
        F.max("message_size").alias("size_max"),
        F.avg("content_size").alias("content_mean"),
    )
    out = _unpack_percentiles(out, "size")
    order = ["messages", "size_mean"] + [f"size_{n}" for n, _ in PERCENTILES]
    order += ["size_max", "content_mean"]
    return out.select(*by, *order).orderBy(*by) if by else out.select(*order)


def size_histogram(archive: DataFrame) -> DataFrame:
    """Message sizes in power-of-two buckets: ``size_from`` ≤ size < ``size_to``, by kind.

    Columns: ``size_from, size_to, kind, messages, bytes``; size 0 is the bucket [0, 1).
    """
    size = F.col("message_size")
    low = F.when(size < 1, F.lit(0)).otherwise(
        F.shiftleft(F.lit(1).cast("long"), F.floor(F.log2(size)).cast("int"))
    )
    return (
        archive.groupBy(low.alias("size_from"), "kind")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(size).cast("long").alias("bytes"))
        .select(
            "size_from",
            F.when(F.col("size_from") == 0, F.lit(1).cast("long"))
            .otherwise(F.col("size_from") * 2)
            .alias("size_to"),
            "kind",
            "messages",
            "bytes",
        )
        .orderBy("size_from", "kind")
    )


# --- causal history ----------------------------------------------------------------------


def causal_references(archive: DataFrame) -> DataFrame:
    """One row per causal-history entry, with the dependency looked up in the archive.

    Columns: ``channel_id, message_id, sender_id, lamport_timestamp, dependency_id,
    dependency_archived (bool), dependency_lamport (null when not archived or ephemeral)``.
    Dependencies are looked up in the same channel only: SDS causal history never crosses
    channels.
    """
    refs = archive.select(
        "channel_id",
        "message_id",
        "sender_id",
        "lamport_timestamp",
        F.explode("causal_history").alias("dependency_id"),
    )
    archived = archive.select(
        "channel_id",
        F.col("message_id").alias("dependency_id"),
        F.col("lamport_timestamp").alias("dependency_lamport"),
        F.lit(True).alias("dependency_archived"),
    )
    return refs.join(archived, ["channel_id", "dependency_id"], "left").select(
        "channel_id",
        "message_id",
        "sender_id",
        "lamport_timestamp",
        "dependency_id",
        F.coalesce("dependency_archived", F.lit(False)).alias("dependency_archived"),
        "dependency_lamport",
    )


def missing_messages(references: DataFrame) -> DataFrame:
    """Ids referenced in causal histories but never archived (input: causal references).

    Columns: ``channel_id, message_id, references, referencing_senders,
    first_referencing_sender`` (the sender of the earliest referencing message by Lamport time).
    """
    return (
        references.where(~F.col("dependency_archived"))
        .groupBy("channel_id", F.col("dependency_id").alias("message_id"))
        .agg(
            F.count(F.lit(1)).alias("references"),
            F.countDistinct("sender_id").alias("referencing_senders"),
            F.min_by("sender_id", F.struct("lamport_timestamp", "sender_id")).alias(
                "first_referencing_sender"
            ),
        )
        .orderBy("channel_id", "message_id")
    )


def loss_by_channel(archive: DataFrame, references: DataFrame) -> DataFrame:
    """Loss as the archive sees it, per channel.

    Columns: ``channel_id, archived_messages`` (content and sync; ephemeral messages are never
    referenced), ``references, missing_references, missing_messages`` (distinct ids never
    archived) and ``loss_fraction = missing / (archived + missing)``. Channels with no
    references still appear, with zeros.
    """
    archived = (
        archive.where(F.col("kind") != "ephemeral")
        .groupBy("channel_id")
        .agg(F.count(F.lit(1)).alias("archived_messages"))
    )
    missing = references.groupBy("channel_id").agg(
        F.count(F.lit(1)).alias("references"),
        F.count(F.when(~F.col("dependency_archived"), True)).alias("missing_references"),
        F.countDistinct(F.when(~F.col("dependency_archived"), F.col("dependency_id"))).alias(
            "missing_messages"
        ),
    )
    joined = archived.join(missing, "channel_id", "full")
    zero = F.lit(0).cast("long")
    cols = ["archived_messages", "references", "missing_references", "missing_messages"]
    joined = joined.select("channel_id", *[F.coalesce(c, zero).alias(c) for c in cols])
    total = F.col("archived_messages") + F.col("missing_messages")
    return joined.withColumn(
        "loss_fraction",
        F.when(total > 0, F.col("missing_messages") / total).otherwise(F.lit(0.0)),
    ).orderBy("channel_id")


def loss_by_sender(references: DataFrame) -> DataFrame:
    """Missing references per channel and *referencing* sender (input: causal references).

    Columns: ``channel_id, sender_id, references, missing_references, missing_messages``;
    only senders with at least one missing reference. The export does not record who sent a
    message that was never archived, so this says whose view of the channel had gaps.
    """
    missing = F.when(~F.col("dependency_archived"), F.col("dependency_id"))
    return (
        references.groupBy("channel_id", "sender_id")
        .agg(
            F.count(F.lit(1)).alias("references"),
            F.count(missing).alias("missing_references"),
            F.countDistinct(missing).alias("missing_messages"),
        )
        .where(F.col("missing_references") > 0)
        .orderBy("channel_id", "sender_id")
    )


def causal_order_violations(references: DataFrame) -> DataFrame:
    """(message, dependency) pairs where the message's Lamport time is not above its dependency's.

    Input: :func:`causal_references`. Pairs where either side has no Lamport time (ephemeral,
    or dependency never archived) cannot be judged and are left out. Columns: ``channel_id,
    message_id, sender_id, lamport_timestamp, dependency_id, dependency_lamport, lag_ms``
    (how far the message's time is at or below its dependency's, ≥ 0).
    """
    return (
        references.where(
            F.col("dependency_archived")
            & F.col("lamport_timestamp").isNotNull()
            & F.col("dependency_lamport").isNotNull()
            & (F.col("lamport_timestamp") <= F.col("dependency_lamport"))
        )
        .select(
            "channel_id",
            "message_id",
            "sender_id",
            "lamport_timestamp",
            "dependency_id",
            "dependency_lamport",
            (F.col("dependency_lamport") - F.col("lamport_timestamp")).alias("lag_ms"),
        )
        .orderBy("channel_id", "message_id", "dependency_id")
    )


def violations_by_channel(violations: DataFrame) -> DataFrame:
    """Per channel: violating pairs and distinct violating messages (input: violations)."""
    return (
        violations.groupBy("channel_id")
        .agg(
            F.count(F.lit(1)).alias("violating_pairs"),
            F.countDistinct("message_id").alias("violating_messages"),
            F.max("lag_ms").alias("max_lag_ms"),
        )
        .orderBy("channel_id")
    )
