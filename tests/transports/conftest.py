"""Fixtures for transport tests: the real Mosquitto, private Mosquitto processes.

Service checks come from the shared ``tests/conftest.py`` (skip, or fail under
``CHORUS_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SERVICES, require_service, service_available

MOSQUITTO_HOST = "127.0.0.1"
#: The machine's broker; CHORUS_MOSQUITTO_PORT points the tests at another one.
MOSQUITTO_PORT = int(os.environ.get("CHORUS_MOSQUITTO_PORT", "1883"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mosquitto() -> tuple[str, int]:
    """The machine's Mosquitto (127.0.0.1:1883 unless CHORUS_MOSQUITTO_PORT says otherwise)."""
    require_service("Mosquitto", MOSQUITTO_PORT)
    return MOSQUITTO_HOST, MOSQUITTO_PORT


class PrivateMosquitto:
    """A Mosquitto process of the test's own, on a free 127.0.0.1 port; killable."""

    def __init__(self, workdir: Path, extra_config: str = "", anonymous: bool = True) -> None:
        self.port = free_port()
        self.config = workdir / f"mosquitto-{self.port}.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"allow_anonymous {'true' if anonymous else 'false'}\n{extra_config}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the broker and wait until it accepts connections."""
        self.proc = subprocess.Popen(
            ["mosquitto", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
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
        message = "the mosquitto binary is not installed (private brokers need it)"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    made: list[PrivateMosquitto] = []

    def start(extra_config: str = "", anonymous: bool = True) -> PrivateMosquitto:
        broker = PrivateMosquitto(tmp_path, extra_config, anonymous)
        made.append(broker)
        broker.start()
        return broker

    yield start
    for broker in made:
        broker.kill()
