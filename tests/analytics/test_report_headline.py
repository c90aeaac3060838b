"""The report's headline counts content messages apart from SDS's sync and ephemeral ones
(issue 30.6: the demo's summary said "73 messages" for a chat of 60)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from store_node.analytics.report import messages_by_kind, render_summary


def _histogram(rows: list[tuple[str, int]]) -> pa.Table:
    """A size_histogram table: a few buckets per kind."""
    return pa.Table.from_pylist(
        [
            {"size_from": 64 << i, "size_to": 128 << i, "kind": kind, "messages": n, "bytes": 0}
            for i, (kind, n) in enumerate(rows)
        ]
    )


def _totals(by_kind: dict[str, int]) -> dict[str, Any]:
    return {
        "messages": sum(by_kind.values()),
        "messages_by_kind": by_kind,
        "channels": 1,
        "senders": 5,
        "first_hour": None,
        "last_hour": None,
        "busiest_channel": None,
        "delivery_delay": {},
        "message_sizes": {},
        "rebroadcasts": {},
        "loss": {"missing_messages": 0, "loss_fraction": 0.0, "missing_references": 0},
        "causal_order_violations": {"violating_pairs": 0, "violating_messages": 0},
        "busiest_hour": None,
    }


def test_messages_are_counted_by_kind() -> None:
    table = _histogram(
        [("content", 40), ("sync", 7), ("content", 20), ("sync", 4), ("ephemeral", 2)]
    )
    assert messages_by_kind(table) == {"content": 60, "sync": 11, "ephemeral": 2}
    assert messages_by_kind(_histogram([("content", 3)])) == {
        "content": 3,
        "sync": 0,
        "ephemeral": 0,
    }


def test_the_headline_separates_content_from_sync_and_ephemeral() -> None:
    headline = render_summary("export/", _totals({"content": 60, "sync": 11, "ephemeral": 2}))
    line = headline.splitlines()[1]
    assert line.startswith(
        "  60 content messages (plus 13 sync/ephemeral: 11 sync, 2 ephemeral) in 1 channels"
    ), line
    assert "73" not in line
