"""Exceptions of the analytics package, rooted in :class:`AnalyticsError`, itself a
branch of the store node's tree (:mod:`store_node.errors`).

::

    StoreNodeError
     └── AnalyticsError
          ├── JavaNotFoundError   no usable Java runtime for Spark
          └── NotAnExport         the input folder is not an archive export (also a ValueError)
"""

from __future__ import annotations

from store_node.errors import StoreNodeError


class AnalyticsError(StoreNodeError):
    """Base class of every error the analytics package raises on purpose."""


class JavaNotFoundError(AnalyticsError):
    """Spark needs a Java 17+ runtime and none was found (or it is too old)."""


class NotAnExport(AnalyticsError, ValueError):
    """The input is not a readable archive export (missing folder, no Parquet files)."""
