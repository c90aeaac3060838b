"""Starting Spark for the analytics jobs: local by default, loopback only, UI off.

The defaults suit one laptop-sized machine: driver memory sized for a 10M-message archive,
few shuffle partitions (adaptive execution coalesces further), UTC session time so hour and
day buckets mean the same thing on every machine. ``--master`` switches to a cluster with the
same jobs; ``extra_conf`` overrides anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from .errors import JavaNotFoundError

#: What to tell a user without Java; the CLI prints it verbatim.
JAVA_HINT = (
    "Spark needs a Java 17 (or newer) runtime and none was found. Install one, e.g. "
    "`sudo apt install openjdk-17-jre-headless` (Debian/Ubuntu) or `brew install openjdk@17` "
    "(macOS), or set JAVA_HOME to an existing Java 17+ installation."
)

#: Spark 4 runs on Java 17 and 21.
MIN_JAVA = 17


def find_java() -> str:
    """Path of the ``java`` executable PySpark will launch; raise if missing or too old.

    PySpark prefers ``$JAVA_HOME/bin/java`` and falls back to ``java`` on ``PATH``; this
    mirrors that, so the check fails exactly when Spark would, but with a message that says
    what to install instead of a gateway stack trace.
    """
    java_home = os.environ.get("JAVA_HOME")
    candidate = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        raise JavaNotFoundError(JAVA_HINT)
    try:
        out = subprocess.run(
            [candidate, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise JavaNotFoundError(f"{JAVA_HINT} ({candidate}: {exc})") from exc
    version = _java_major(out.stderr + out.stdout)
    if version is not None and version < MIN_JAVA:
        raise JavaNotFoundError(f"{JAVA_HINT} (found Java {version} at {candidate})")
    return candidate


def _java_major(banner: str) -> int | None:
    """Major version from ``java -version`` output (``"1.8.0_392"`` is 8, ``"17.0.9"`` is 17)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def local_conf(cores: int | None = None) -> dict[str, str]:
    """Settings for Spark local mode on a small machine (the benchmark's tuned set).

    Shuffle partitions: a few per core keeps each task's sort in memory while AQE merges the
    small ones; the default 200 costs more in task start-up than the data on a laptop.
    """
    n = cores or os.cpu_count() or 2
    return {
        "spark.sql.shuffle.partitions": str(max(2, 2 * n)),
        "spark.default.parallelism": str(max(2, 2 * n)),
        # Driver = executor in local mode; 10M messages of the synthetic archive need ~3 GiB.
        "spark.driver.memory": "4g",
        # A partition per ~64 MiB of Parquet: enough tasks for every core, few tiny ones.
        "spark.sql.files.maxPartitionBytes": str(64 * 1024 * 1024),
        # Opening one small file is cheap locally; the 4 MiB default splits too eagerly.
        "spark.sql.files.openCostInBytes": str(1024 * 1024),
    }


def base_conf() -> dict[str, str]:
    """Settings every analytics session gets, local or on a cluster."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        # Partition values are read as declared in the explicit schema, never inferred.
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    }


def loopback_conf() -> dict[str, str]:
    """Keep the driver on 127.0.0.1: no listening socket on other interfaces."""
    return {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


def _loopback_master(master: str) -> bool:
    """Whether a ``spark://host:port[,host:port]`` URL names only this machine."""
    if not master.startswith("spark://"):
        return False
    hosts = [h.rpartition(":")[0] or h for h in master[len("spark://") :].split(",")]
    return all(h in ("127.0.0.1", "localhost", "[::1]") for h in hosts)


def build_session(
    master: str | None = None,
    *,
    app_name: str = "chorus-analytics",
    extra_conf: Mapping[str, str] | None = None,
) -> Any:
    """Start (or reuse) a SparkSession for the analytics jobs.

    ``master`` is a Spark master URL; ``None`` means ``local[*]`` with :func:`local_conf`.
    Raises :class:`JavaNotFoundError` before touching Spark when Java is unusable.
    """
    find_java()
    # Spark resolves the host name for its own bookkeeping even when bound to loopback;
    # pinning SPARK_LOCAL_IP avoids that lookup and its warning on hosts without DNS.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    conf: dict[str, str] = {**base_conf()}
    if master is None or master.startswith("local"):
        conf.update(loopback_conf())
        conf.update(local_conf())
    elif _loopback_master(master):
        # A cluster on this machine (tests, a laptop): the driver stays on loopback too.
        conf.update(loopback_conf())
    conf.update(extra_conf or {})
    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
