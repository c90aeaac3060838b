"""Issue 16.5: the report on a real Spark standalone cluster, so ``--master spark://`` is proven.

A master and one worker are started from the installed PySpark's own launcher
(``pyspark/bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``;
the wheel ships ``bin/`` but not the ``sbin/start-*.sh`` scripts), bound to 127.0.0.1 on
free ports, with the master's REST submission server off. The real CLI then runs the report
with ``--master spark://127.0.0.1:PORT`` in its own process; the test checks that the master
ran the application on its worker and that the report's figures equal those of a local run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store_node.analytics.report import run_report
from store_node.analytics.synthetic import SynthConfig, generate
from tests.conftest import REQUIRE_SERVICES, free_port, service_available

ROOT = Path(__file__).resolve().parents[2]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=30) as r:
        state: dict[str, Any] = json.loads(r.read())
    return state


def _workers_alive(ui_port: int) -> bool:
    try:
        return int(_master_state(ui_port).get("aliveworkers", 0)) >= 1
    except OSError:  # the UI is still starting (a busy machine takes a while)
        return False


class Cluster:
    """A standalone master and one worker on 127.0.0.1 (processes of this test only)."""

    def __init__(self, workdir: Path) -> None:
        self.port, self.ui_port, self.worker_ui = free_port(), free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        home = _spark_home()
        self.spark_class = str(home / "bin" / "spark-class")
        (workdir / "worker").mkdir(parents=True)
        self.env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(workdir),
            "SPARK_WORKER_DIR": str(workdir / "worker"),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,
        }
        self.logs = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                [self.spark_class, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        )

    def _wait(self, ready: Any, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for proc in self.procs:
                if proc.poll() is not None:
                    logs = "".join(p.read_text()[-1500:] for p in self.logs.glob("*.log"))
                    raise AssertionError(f"spark {what}: a process exited\n{logs}")
            assert time.monotonic() < deadline, f"spark {what} did not come up"
            time.sleep(0.5)

    def start(self) -> None:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        self._wait(lambda: service_available(self.ui_port), "master")
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            "--host",
            "127.0.0.1",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            str(self.worker_ui),
        )
        self._wait(lambda: _workers_alive(self.ui_port), "worker")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        message = "no Java runtime: a Spark cluster needs Java 17+"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    c = Cluster(tmp_path / "spark")
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_report_on_a_standalone_cluster_equals_the_local_one(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    export = tmp_path / "export"
    generate(str(export), SynthConfig(messages=2_000, channels=4, days=2, seed=7))
    out = tmp_path / "cluster-report"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "store_node.analytics",
            "report",
            "--input",
            str(export),
            "--out",
            str(out),
            "--master",
            cluster.url,
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.cores.max=1",
            "--conf",
            "spark.sql.shuffle.partitions=4",
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[report" in result.stderr and "done" in result.stderr, "progress lines on stderr"

    # The master ran the application, on its worker.
    state = _master_state(cluster.ui_port)
    apps = state.get("completedapps", []) + state.get("activeapps", [])
    assert any(app["name"] == "chorus-analytics" for app in apps), apps

    local = run_report(spark, export, tmp_path / "local-report", make_plots=False)
    remote = json.loads((out / "report.json").read_text())["totals"]
    expected = json.loads((local.out_dir / "report.json").read_text())["totals"]
    assert remote == expected
    assert remote["messages"] == 2_000
