"""Shared fixtures: where the shared specs and vectors live, and service checks."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench._common import free_port  # one home: the benches need it too

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


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it under ``CHORUS_REQUIRE_SERVICES=1`` (CI runs everything)."""
    if REQUIRE_SERVICES:
        pytest.fail(reason + " (CHORUS_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def require_module(name: str) -> Any:
    """``pytest.importorskip`` that fails instead of skipping under ``CHORUS_REQUIRE_SERVICES=1``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        skip_or_fail(f"could not import {name!r}: {exc}")
        raise  # unreachable: skip_or_fail raises


def require_service(name: str, port: int) -> None:
    """Skip (or, under CHORUS_REQUIRE_SERVICES=1, fail) when ``name`` is not listening."""
    if service_available(port):
        return
    skip_or_fail(f"{name} is not running on 127.0.0.1:{port}")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skip report gives, without the file and line."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if isinstance(report, pytest.CollectReport):
        reason += " (a whole module)"
    return reason


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> Generator[None]:
    """End the report with how many tests were skipped and why, grouped by reason.

    A local run that is green with skips has not tested what those tests cover
    (mostly a service that is not running); this makes it plain just above the
    final counts. Outermost wrapper, so it prints after pytest's short summary.
    Reporting only: the exit status is pytest's.
    """
    yield
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter(_skip_reason(report) for report in skipped)
    terminalreporter.section(f"{len(skipped)} skipped: not tested in this run", yellow=True)
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:5d}  {reason}")
    terminalreporter.line(
        "Start what is missing (scripts/services) to run them; under"
        " CHORUS_REQUIRE_SERVICES=1, as in CI, each of these fails instead."
    )


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
    require_module("pyspark")
    from store_node.analytics.errors import JavaNotFoundError
    from store_node.analytics.session import build_session, find_java

    try:
        find_java()
    except JavaNotFoundError as exc:
        skip_or_fail(str(exc))
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


class PrivateMosquitto:
    """A Mosquitto process of the test's own on a free 127.0.0.1 port; killable, restartable
    (``start()`` again reuses the port and configuration)."""

    def __init__(self, workdir: Path, extra_config: str = "", anonymous: bool = True) -> None:
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.config = workdir / f"mosquitto-{self.port}.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"allow_anonymous {'true' if anonymous else 'false'}\n{extra_config}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or restart) the broker and wait until it accepts connections."""
        self.proc = subprocess.Popen(
            ["mosquitto", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not service_available(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"private mosquitto on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the broker: connections drop without a DISCONNECT."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture
def private_mosquitto(tmp_path: Path) -> Iterator[Callable[..., PrivateMosquitto]]:
    """Start private Mosquitto brokers (``start(extra_config, anonymous)``); killed at teardown."""
    if shutil.which("mosquitto") is None:
        skip_or_fail("the mosquitto binary is not installed (private brokers need it)")
    made: list[PrivateMosquitto] = []

    def start(extra_config: str = "", anonymous: bool = True) -> PrivateMosquitto:
        broker = PrivateMosquitto(tmp_path, extra_config, anonymous)
        made.append(broker)
        broker.start()
        return broker

    yield start
    for broker in made:
        broker.kill()
