"""Fixtures of the runtime tests: private Mosquitto brokers the tests may kill."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def require_service(reason: str) -> None:
    """Skip with ``reason``, or fail when CHORUS_REQUIRE_SERVICES=1 (CI)."""
    if os.environ.get("CHORUS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (CHORUS_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A Mosquitto process of the test's own on a fixed 127.0.0.1 port; killable, restartable."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.config = workdir / f"mosquitto-{self.port}.conf"
        # Large queues: bursts must not be dropped by the broker's defaults (1000 / 20).
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            "max_queued_messages 100000\nmax_inflight_messages 1000\n"
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
        while not port_open("127.0.0.1", self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"private mosquitto on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the broker."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[Callable[[], Broker]]:
    """Start private Mosquitto brokers; all are killed at teardown."""
    if shutil.which("mosquitto") is None:
        require_service("the mosquitto binary is not installed (apt-get install mosquitto)")
    made: list[Broker] = []

    def start() -> Broker:
        broker = Broker(tmp_path)
        made.append(broker)
        broker.start()
        return broker

    yield start
    for broker in made:
        broker.kill()
