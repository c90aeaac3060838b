"""Fixtures for transport tests: the real Mosquitto, private Mosquitto processes.

Service checks come from the shared ``tests/conftest.py`` (skip, or fail under
``CHORUS_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import PrivateMosquitto, free_port, require_service  # noqa: F401 - re-exported

MOSQUITTO_HOST = "127.0.0.1"
#: The machine's broker; CHORUS_MOSQUITTO_PORT points the tests at another one.
MOSQUITTO_PORT = int(os.environ.get("CHORUS_MOSQUITTO_PORT", "1883"))


@pytest.fixture
def mosquitto() -> tuple[str, int]:
    """The machine's Mosquitto (127.0.0.1:1883 unless CHORUS_MOSQUITTO_PORT says otherwise)."""
    require_service("Mosquitto", MOSQUITTO_PORT)
    return MOSQUITTO_HOST, MOSQUITTO_PORT
