"""Print the fuzz run's seed at the end of the report, with how to replay it."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the seed this run's fuzz tests drew (``tests.fuzz.test_fuzz.SEED``)."""
    from tests.fuzz.test_fuzz import REPLAY, SEED

    terminalreporter.write_line(f"fuzz seed {SEED}; replay: {REPLAY}")
