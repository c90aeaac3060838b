"""Poison input and acknowledgement after commit, on the real backends.

Issue 19.1: one message with a NUL in an id froze PostgreSQL ingest (the batch
failed and was retried forever). Now such ids are rejected at decode, and any
row a backend still refuses is isolated by bisecting its batch and quarantined
while the rest is committed. Issue 17.1: envelopes are acknowledged to the
transport only once their batch is committed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from sdk.sds.message import HistoryEntry, Message, encode_message
from sdk.testing.waiting import eventually, idle
from store_node.archive.base import Archive, ArchiveRow, WriteResult
from store_node.archive.sqlite import SqliteArchive
from store_node.ingest import QUARANTINED, UNSTORABLE, Ingest, row_from_envelope
from tests.store_node.store_node_helpers import BASE_MS, archive_row, envelope, sds_message
from transports.base import Envelope, message_hash


def _raw(channel: str, **fields: object) -> bytes:
    base: dict[str, object] = {
        "sender_id": "mallory",
        "message_id": "m-evil",
        "channel_id": channel,
        "lamport_timestamp": BASE_MS,
        "content": b"x",
    }
    base.update(fields)
    return encode_message(Message(**base))  # type: ignore[arg-type]


NUL_MESSAGES = {
    "message_id": _raw("c", message_id="evil\x00"),
    "sender_id": _raw("c", sender_id="evil\x00"),
    "history": _raw("c", causal_history=(HistoryEntry("ok"), HistoryEntry("evil\x00"))),
}


@pytest.mark.parametrize("field", sorted(NUL_MESSAGES))
def test_nul_in_an_id_is_rejected_at_decode(field: str) -> None:
    assert row_from_envelope(envelope("c", NUL_MESSAGES[field]), BASE_MS) == UNSTORABLE


def test_nul_in_the_channel_is_rejected_even_on_a_foreign_topic() -> None:
    payload = _raw("evil\x00")
    assert row_from_envelope(Envelope("other", payload, b"h"), BASE_MS) == UNSTORABLE
    # On its channel's topic it never matches: no valid topic carries a NUL.
    assert row_from_envelope(envelope("evil", payload), BASE_MS) == "channel_mismatch"


async def test_nul_messages_never_stop_ingest(
    archive: Archive, caplog: pytest.LogCaptureFixture
) -> None:
    ingest = Ingest(archive, batch_size=20, batch_interval=0.001)
    await ingest.start()
    with caplog.at_level(logging.WARNING, logger="store_node.ingest"):
        for i in range(100):
            await ingest.submit(envelope("c", sds_message("c", i)))
            if i % 10 == 0:
                for payload in NUL_MESSAGES.values():
                    await ingest.submit(envelope("c", payload))
        await ingest.stop()
    assert archive.count() == 100 and archive.check_integrity() == []
    m = ingest.metrics
    assert m.value("chorus_store_ingest_rejected_total", reason=UNSTORABLE) == 30
    assert m.value("chorus_store_ingest_write_errors_total") == 0
    # Logged, but not once per message: one line per reason per interval.
    lines = [r for r in caplog.records if r.getMessage() == "message rejected"]
    assert 1 <= len(lines) < 30


def _poison_for(archive: Archive) -> list[ArchiveRow]:
    """Rows each backend refuses: a Lamport time past int64 everywhere, plus a value
    only this backend cannot store (NUL for PostgreSQL, a lone surrogate for SQLite)."""
    good = archive_row("c", 10_000)
    rows = [dataclasses.replace(good, message_id="too-late", lamport_timestamp=2**63)]
    if archive.backend == "postgresql":
        rows.append(dataclasses.replace(good, message_id="evil\x00"))
        rows.append(dataclasses.replace(good, message_id="h", causal_history=("a\x00",)))
    else:
        rows.append(dataclasses.replace(good, message_id="evil\ud800"))
    return rows


async def test_a_refused_row_is_bisected_out_and_quarantined(
    archive: Archive, caplog: pytest.LogCaptureFixture
) -> None:
    ingest = Ingest(archive)
    await ingest.start()
    good = [archive_row("c", i) for i in range(200)]
    poison = _poison_for(archive)
    rows = good[:37] + poison[:1] + good[37:150] + poison[1:] + good[150:]
    with caplog.at_level(logging.ERROR, logger="store_node.ingest"):
        result = await ingest.write_rows(rows)
    assert (result.inserted, result.quarantined) == (200, len(poison))
    assert archive.count() == 200 and archive.check_integrity() == []
    assert ingest.metrics.value("chorus_store_ingest_rejected_total", reason=QUARANTINED) == len(
        poison
    )
    assert ingest.metrics.value("chorus_store_ingest_write_errors_total") == 0
    # One line names the first; the rest are counted (rate limit), not lost.
    quarantined = [r for r in caplog.records if r.getMessage().startswith("row quarantined")]
    assert len(quarantined) == 1
    assert quarantined[0].message_id in {p.message_id for p in poison}  # type: ignore[attr-defined]
    # Ingest goes on: later batches are committed as usual.
    await ingest.submit(envelope("c", sds_message("c", 500)))
    await ingest.stop()
    assert archive.count() == 201


# ---------------------------------------------------------------- acknowledgement


class _GatedArchive(SqliteArchive):
    """Holds every write until ``gate`` opens; fails them all while ``failing``."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.failing = False
        self.commits = 0

    def write_batch(self, rows: Sequence[ArchiveRow]) -> WriteResult:
        self.entered.set()
        self.gate.wait(10)
        if self.failing:
            raise RuntimeError("disk on fire")
        result = super().write_batch(rows)
        self.commits += 1
        return result


def _acked_envelope(channel: str, payload: bytes, log: list[bytes]) -> Envelope:
    topic = f"chorus/sds/v1/{channel}"
    return Envelope(topic, payload, message_hash(topic, payload), lambda: log.append(payload))


async def test_envelopes_are_acknowledged_only_after_their_batch_commits(tmp_path: Path) -> None:
    archive = _GatedArchive(tmp_path / "a.db")
    archive.migrate()
    acked: list[bytes] = []
    ingest = Ingest(archive, batch_size=10, batch_interval=0.0)
    await ingest.start()
    payloads = [sds_message("c", i) for i in range(30)] + [b"\xffnot sds"]
    for p in payloads:
        await ingest.submit(_acked_envelope("c", p, acked))
    # The batch (all 31: none was taken before the last was queued) is decoded, the
    # reject known, and its commit waits at the gate: an early ack would be done.
    assert await eventually(archive.entered.is_set)
    await idle()
    assert ingest.pending == 0
    assert acked == [] and archive.commits == 0  # received, held, not committed
    archive.gate.set()
    await ingest.stop()
    # Everything handled, the reject included, in arrival order.
    assert acked == payloads and archive.count() == 30


async def test_a_batch_given_up_at_shutdown_stays_unacknowledged(tmp_path: Path) -> None:
    archive = _GatedArchive(tmp_path / "a.db")
    archive.migrate()
    archive.gate.set()
    archive.failing = True
    acked: list[bytes] = []
    ingest = Ingest(archive, batch_interval=0.0)
    await ingest.start()
    for i in range(5):
        await ingest.submit(_acked_envelope("c", sds_message("c", i), acked))
    # Stop while the batch is failing and being retried.
    assert await eventually(
        lambda: ingest.metrics.value("chorus_store_ingest_write_errors_total") >= 1
    )
    await ingest.stop(timeout=10)
    assert acked == []
    assert ingest.metrics.value("chorus_store_ingest_lost_total") == 5
