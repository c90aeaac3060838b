"""Helpers for the store-node tests: SDS messages, envelopes, rows, a feedable transport.

Imported as ``tests.store_node.store_node_helpers`` (``tests`` is a package).
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from sdk.sds.message import HistoryEntry, Message, encode_message
from sdk.sds.message_id import compute_message_id
from sdk.testing.waiting import eventually
from store_node.archive.base import ArchiveRow
from store_node.ingest import row_from_envelope
from tests.conftest import REQUIRE_SERVICES
from transports.base import Envelope, Subscription, Transport, message_hash, topic_for_channel

PG_DSN = os.environ.get("CHORUS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BASE_MS = 1_760_000_000_000


def postgres_dsn() -> str:
    """The test database's DSN, or skip (fail under CHORUS_REQUIRE_SERVICES=1)."""
    import psycopg

    try:
        psycopg.connect(PG_DSN, connect_timeout=3).close()
    except psycopg.Error as exc:
        reason = f"PostgreSQL not reachable at {PG_DSN}: {exc}"
        if REQUIRE_SERVICES:
            pytest.fail(reason)
        pytest.skip(reason)
    return PG_DSN


def new_schema() -> str:
    """A schema name no other run uses."""
    return f"chorus_test_{uuid.uuid4().hex[:12]}"


def sds_message(
    channel: str,
    n: int,
    *,
    sender: str = "alice",
    history: tuple[str, ...] = (),
    content: bytes | None = None,
    lamport: int | None = None,
    ephemeral: bool = False,
) -> bytes:
    """Encoded SDS message number ``n`` of ``sender`` on ``channel`` (Chorus id rule)."""
    body = content if content is not None else f"message {n} from {sender}".encode()
    ts = None if ephemeral else (lamport if lamport is not None else BASE_MS + n)
    mid = compute_message_id(channel, sender, ts if ts is not None else n, body)
    return encode_message(
        Message(
            sender_id=sender,
            message_id=mid,
            channel_id=channel,
            lamport_timestamp=ts,
            causal_history=tuple(HistoryEntry(h) for h in history),
            content=body,
        )
    )


def envelope(channel: str, payload: bytes) -> Envelope:
    """The envelope a transport would deliver for ``payload`` on ``channel``'s topic."""
    topic = topic_for_channel(channel)
    return Envelope(topic, payload, message_hash(topic, payload))


def archive_row(channel: str, n: int, arrival: int | None = None, **kw: object) -> ArchiveRow:
    """An archive row for message ``n``, as ingest would build it."""
    payload = sds_message(channel, n, **kw)  # type: ignore[arg-type]
    row = row_from_envelope(
        envelope(channel, payload), arrival if arrival is not None else BASE_MS + n
    )
    assert isinstance(row, ArchiveRow), row
    return row


class FeedSubscription(Subscription):
    """A subscription the test feeds by hand."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.queue: asyncio.Queue[Envelope | None] = asyncio.Queue()
        self.closed = False

    async def __anext__(self) -> Envelope:
        if self.closed:
            raise StopAsyncIteration
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)

    def end(self) -> None:
        """The transport is closing: iteration ends after what is already queued."""
        self.queue.put_nowait(None)


class FeedTransport(Transport):
    """An in-test Transport: ``publish`` (or :meth:`feed`) delivers to local subscribers."""

    def __init__(self) -> None:
        self.subscriptions: list[FeedSubscription] = []

    async def publish(self, topic: str, payload: bytes) -> bytes:
        hint = message_hash(topic, payload)
        for sub in self.subscriptions:
            if sub.topic == topic and not sub.closed:
                sub.queue.put_nowait(Envelope(topic, payload, hint))
        return hint

    async def subscribe(self, topic: str) -> FeedSubscription:
        sub = FeedSubscription(topic)
        self.subscriptions.append(sub)
        return sub

    async def close(self) -> None:
        # Like the real adapters: subscriptions end after the envelopes they hold.
        for sub in self.subscriptions:
            sub.end()


def node_config(tmp_path: object, **grpc: object) -> object:
    """A NodeConfig for an in-process node: SQLite in ``tmp_path``, ephemeral ports."""
    from pathlib import Path

    from store_node.config import parse_config

    base = Path(str(tmp_path))
    return parse_config(
        {
            "archive": {"path": "archive.db"},
            "ingest": {"channels": ["c", "d"], "batch_interval_ms": 5},
            "grpc": {"listen": "127.0.0.1:0", **grpc},
            "metrics": {"listen": ""},
        },
        base,
    )


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    """Poll ``predicate()`` until true or fail after ``timeout`` seconds."""
    if not await eventually(predicate, timeout, step=0.01):  # type: ignore[arg-type]
        raise AssertionError("condition not reached in time")
