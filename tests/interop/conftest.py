"""Fixtures for the interop tests: the reference harness, installed on first use.

The tests skip only when node or npm is missing, and fail instead when
``CHORUS_REQUIRE_SERVICES=1`` (CI), so interop can never silently stop running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .jsharness import HarnessError, JsHarness, ensure_harness, node_missing_reason
from .mixnet import MixedNetwork

REQUIRE_SERVICES = os.environ.get("CHORUS_REQUIRE_SERVICES") == "1"


@pytest.fixture(scope="session")
def harness_installed() -> None:
    """Skip (or fail under CHORUS_REQUIRE_SERVICES=1) without node; install @waku/sds once."""
    reason = node_missing_reason()
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(reason + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    try:
        ensure_harness()
    except HarnessError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def harness(harness_installed: None) -> Iterator[JsHarness]:
    """A fresh reference process per test (participants never leak between tests)."""
    h = JsHarness()
    yield h
    h.close()


@pytest.fixture
def net(harness: JsHarness) -> MixedNetwork:
    """An empty mixed network on the manual clock."""
    return MixedNetwork(harness)
