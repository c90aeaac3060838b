"""Fixtures of the runtime tests: private Mosquitto brokers the tests may kill."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import PrivateMosquitto

#: Bursts must not be dropped by the broker's defaults (1000 queued / 20 in flight).
LARGE_QUEUES = "max_queued_messages 100000\nmax_inflight_messages 1000"

Broker = PrivateMosquitto


@pytest.fixture
def private_broker(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> Callable[[], PrivateMosquitto]:
    """Start private Mosquitto brokers with large queues; all are killed at teardown."""
    return lambda: private_mosquitto(LARGE_QUEUES)
