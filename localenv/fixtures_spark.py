"""pytest plugin: real Spark for the Spark stage's tests.

Load it with `pytest_plugins = ["localenv.fixtures_spark"]` (next to fixtures_kafka,
fixtures_k8s and fixtures_operator). Fixtures:

- spark_jars (session): the Kafka connector jars folder (hack/fetch-spark-jars.sh, cached).
- spark_cds (session): the class data sharing archive the drivers map (localenv/sparkcds.py).
- spark_driver: a factory `spark_driver(config: dict, **env) -> SparkDriver` that runs
  `python -m spark_app.main --config FILE` as a local process group (master local[2,4]);
  every driver is killed at teardown. Only one Spark should run at a time on a small machine.

When a test using them fails, the tail of the drivers' logs is attached to its report.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from localenv import REPO_ROOT, daemon, sparkcds
from localenv.sparkdriver import RUNNING_LINE, DriverProcess

_DRIVERS_KEY = pytest.StashKey[list]()


def ensure_spark_jars() -> Path:
    return Path(daemon.script_output(REPO_ROOT / "hack" / "fetch-spark-jars.sh")[-1])


class SparkDriver(DriverProcess):
    """spark_app run as `python -m spark_app.main`, restartable from its checkpoint."""

    def __init__(self, config: dict, workdir: Path, jars: Path, env: dict[str, str], cds: Path | None = None):
        self.config = config
        self.config_path = workdir / "spark-config.json"
        self.config_path.write_text(json.dumps(config))
        full_env = {**os.environ, "EOPIPE_SPARK_JARS": str(jars), "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": "127.0.0.1", **(sparkcds.driver_env(cds) if cds else {}), **env}
        full_env.pop("PYSPARK_GATEWAY_PORT", None)
        super().__init__([sys.executable, "-m", "spark_app.main", "--config", str(self.config_path)],
                         full_env, workdir / "driver.log")
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        with open(self.log_path, "ab") as f:
            f.write(f"\n===== run {self.runs} =====\n".encode())
        super().start()

    def wait_running(self, timeout: float = 120) -> float:
        """Until the streaming query runs; returns the seconds it took. Fails if it exits."""
        t0 = time.monotonic()
        while not self.query_running():
            if not self.alive:
                raise RuntimeError(f"spark_app exited with {self.returncode} before running:\n"
                                   f"{self.tail(40, meaningful=True)}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"spark_app not running after {timeout}s:\n{self.tail(40, meaningful=True)}")
            time.sleep(0.2)
        return time.monotonic() - t0

    def restart(self) -> float:
        self.kill()
        self.start()
        return self.wait_running()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture(scope="session")
def spark_jars() -> Path:
    return ensure_spark_jars()


@pytest.fixture(scope="session")
def spark_cds(spark_jars) -> Path:
    return sparkcds.archive(spark_jars)


@pytest.fixture
def spark_driver(spark_jars, spark_cds, tmp_path, request):
    drivers: list[SparkDriver] = []
    request.node.stash[_DRIVERS_KEY] = drivers

    def make(config: dict, start: bool = True, **env: str) -> SparkDriver:
        workdir = tmp_path / f"driver{len(drivers)}"
        workdir.mkdir(parents=True, exist_ok=True)
        d = SparkDriver(config, workdir, spark_jars, env, spark_cds)
        drivers.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in drivers:
        d.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    if not rep.failed:
        return
    for d in item.stash.get(_DRIVERS_KEY, []):
        rep.sections.append((f"spark_app log (tail of {d.log_path})", d.tail(60, meaningful=True)))


__all__ = ["SparkDriver", "RUNNING_LINE", "ensure_spark_jars"]
