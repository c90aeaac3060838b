"""Progress lines while a report runs: the report's own phase and Spark's stage progress.

A report over a large export runs for minutes; without output an analyst cannot tell a slow
job from a stuck one. :class:`ReportProgress` prints one line per phase (``scan``,
``causal``, ``tables 3/17``, ``plots``) and, every ``interval`` seconds while a phase runs,
the active Spark stages with their finished and total tasks, read from
``SparkContext.statusTracker()`` (the same numbers Spark's console bar shows; the bar itself
is off because it redraws in place and garbles logs).

::

    [report    0.0s] scan: reading the export
    [report    2.0s] scan: stage 3 12/40 tasks
    [report    9.4s] causal
    ...
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

#: Receives one progress line (without newline).
ProgressSink = Callable[[str], None]


def stderr_sink(stream: TextIO | None = None) -> ProgressSink:
    """A sink writing lines to ``stream`` (stderr by default), flushed at once."""

    def write(line: str) -> None:
        out = stream or sys.stderr
        out.write(line + "\n")
        out.flush()

    return write


class ReportProgress:
    """Phase lines from the report, stage lines from a polling thread."""

    def __init__(self, spark: Any, sink: ProgressSink, *, interval: float = 2.0) -> None:
        self.sink = sink
        self.interval = interval
        self._tracker = spark.sparkContext.statusTracker()
        self._started = time.monotonic()
        self._phase = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="report-progress", daemon=True)

    def __enter__(self) -> ReportProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._emit("done" if exc[0] is None else "failed")

    def phase(self, name: str) -> None:
        """Start phase ``name`` (printed at once)."""
        self._phase = name
        self._emit(name)

    def _emit(self, text: str) -> None:
        self.sink(f"[report {time.monotonic() - self._started:6.1f}s] {text}")

    def stage_line(self) -> str | None:
        """``stage N done/total tasks`` for every active stage, or ``None`` when idle."""
        parts = []
        for stage_id in sorted(self._tracker.getActiveStageIds()):
            info = self._tracker.getStageInfo(stage_id)
            if info is None:
                continue
            parts.append(f"stage {stage_id} {info.numCompletedTasks}/{info.numTasks} tasks")
        return ", ".join(parts) or None

    def _poll(self) -> None:
        quiet = 0
        while not self._stop.wait(self.interval):
            try:
                line = self.stage_line()
            except Exception:  # the context is stopping: nothing more to report
                return
            quiet = 0 if line else quiet + 1
            if line:
                self._emit(f"{self._phase}: {line}")
            elif quiet % 5 == 0:
                # Planning, waiting for executors, writing files: say it is still alive.
                self._emit(f"{self._phase}: working (no Spark stage running)")
