"""Channel-history analytics on Spark over the store node's Parquet archive export.

Use from Python::

    from store_node.analytics import build_session, run_report
    spark = build_session()                      # local[*], 127.0.0.1, UI off
    result = run_report(spark, "export/", "report/")
    print(result.summary)

or from the shell: ``store-node analytics report --input export/ --out report/``. The jobs
(``store_node.analytics.jobs``) are plain DataFrame -> DataFrame functions for notebooks.
Importing this package does not start Spark or import PySpark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AnalyticsError, JavaNotFoundError, NotAnExport

if TYPE_CHECKING:
    from .report import ReportResult as ReportResult

__all__ = [
    "AnalyticsError",
    "JavaNotFoundError",
    "NotAnExport",
    "ReportResult",
    "build_session",
    "main",
    "run_report",
]


def __getattr__(name: str) -> Any:
    # Lazy: the CLI must be able to say "install Java" without importing PySpark first.
    if name in ("run_report", "ReportResult"):
        from . import report

        return getattr(report, name)
    if name == "build_session":
        from .session import build_session

        return build_session
    if name == "main":
        from .cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
