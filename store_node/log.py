"""Structured logs: one JSON object per line on stderr.

Fields: ``ts`` (UTC ISO 8601), ``level``, ``logger``, ``msg``, plus everything
passed as ``extra=`` (``logger.info("batch", extra={"rows": 500})``), so log
pipelines can filter on fields instead of parsing prose.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """See :class:`logging.Formatter`."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "info") -> None:
    """Send the ``store_node`` loggers to stderr as JSON lines at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("store_node")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class RateLimitedLog:
    """At most ``burst`` lines per ``interval`` seconds for one kind of event.

    For lines a remote party can trigger (a bad request per RPC): whoever reaches
    the port must not be able to flood the log. Lines over the budget are counted,
    not written; the next line written says how many were suppressed.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 10,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self._window_start = -float("inf")
        self._written = 0
        self.suppressed = 0

    def log(self, level: int, msg: str, **fields: Any) -> bool:
        """Write ``msg`` with ``fields`` unless over budget; return whether it was written."""
        now = self.clock()
        if now - self._window_start >= self.interval:
            self._window_start, self._written = now, 0
        if self._written >= self.burst:
            self.suppressed += 1
            return False
        self._written += 1
        if self.suppressed:
            fields["suppressed"] = self.suppressed
            self.suppressed = 0
        self.logger.log(level, msg, extra=fields)
        return True
