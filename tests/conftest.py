"""Shared fixtures: where the shared specs and vectors live, and service checks."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
VECTORS = SHARED / "vectors"

#: In CI every service must be present: a test that would skip fails instead.
REQUIRE_SERVICES = os.environ.get("CHORUS_REQUIRE_SERVICES") == "1"


def service_available(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_service(name: str, port: int) -> None:
    """Skip (or, under CHORUS_REQUIRE_SERVICES=1, fail) when ``name`` is not listening."""
    if service_available(port):
        return
    message = f"{name} is not running on 127.0.0.1:{port}"
    if REQUIRE_SERVICES:
        pytest.fail(message + " (CHORUS_REQUIRE_SERVICES=1)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """The shared byte-exact test vectors."""
    if not VECTORS.is_dir():
        pytest.fail(f"shared vectors not found at {VECTORS}: clone the repo beside 'shared'")
    return VECTORS


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for the whole session: local[1], 2 shuffle partitions, UI off.

    Shared by the analytics and end-to-end tests; skips when PySpark or Java is missing.
    """
    pytest.importorskip("pyspark")
    from store_node.analytics.errors import JavaNotFoundError
    from store_node.analytics.session import build_session, find_java

    try:
        find_java()
    except JavaNotFoundError as exc:
        pytest.skip(str(exc))
    session = build_session(
        "local[1]",
        app_name="chorus-analytics-tests",
        extra_conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            # Tiny inputs: skip AQE's extra planning round-trips.
            "spark.sql.adaptive.enabled": "false",
        },
    )
    yield session
    session.stop()
