"""Exceptions of the analytics package, rooted in :class:`AnalyticsError`.

::

    AnalyticsError
    ├── JavaNotFoundError   no usable Java runtime for Spark
    └── ArchiveError        the input folder is not an archive export
"""

from __future__ import annotations


class AnalyticsError(Exception):
    """Base class of every error the analytics package raises on purpose."""


class JavaNotFoundError(AnalyticsError):
    """Spark needs a Java 17+ runtime and none was found (or it is too old)."""


class ArchiveError(AnalyticsError, ValueError):
    """The input is not a readable archive export (missing folder, no Parquet files)."""
