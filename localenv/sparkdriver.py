"""A Spark driver as a local process group, and the spark-submit command that a
SparkApplication stands for (see sparkrunner.py for the mapping). Used by the runner, by the
tests of spark_app (`python -m spark_app.main`) and by the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from localenv import REPO_ROOT, daemon
from localenv.nodeagent.podspec import MountRewriter

IMAGE_PREFIX = "local:///opt/eopipe/"
RUNNING_LINE = "eopipe-spark: streaming query running"  # spark_app/main.py prints it
GRACE_SECONDS = 10.0


class DriverProcess:
    """One Spark driver as a local process group (spark-submit or python, and its JVM)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path = REPO_ROOT):
        self.argv, self.env, self.log_path, self.cwd = argv, env, Path(log_path), cwd
        self.proc: subprocess.Popen | None = None
        self._scan_pos = 0
        self._running_seen = False

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")
        self._scan_pos = self.log_path.stat().st_size
        self._running_seen = False
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=str(self.cwd), stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        out.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def maps(self, path: str) -> bool:
        """Whether a process of this driver's group (its JVM) has the file `path` mapped."""
        if not self.alive:
            return False
        for maps in Path("/proc").glob("[0-9]*/maps"):
            try:
                if os.getpgid(int(maps.parent.name)) == self.proc.pid and path in maps.read_text():
                    return True
            except (OSError, ProcessLookupError):  # gone meanwhile, or not ours to read
                continue
        return False

    def query_running(self) -> bool:
        """Whether this run printed spark_app's RUNNING line (read incrementally)."""
        if not self._running_seen and self.log_path.exists():
            with open(self.log_path, "rb") as f:
                f.seek(self._scan_pos)
                chunk = f.read()
            # Keep a line's worth of overlap so a line split across reads is still found.
            if RUNNING_LINE.encode() in chunk:
                self._running_seen = True
            else:
                self._scan_pos = max(self._scan_pos, self._scan_pos + len(chunk) - len(RUNNING_LINE))
        return self._running_seen

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            daemon.signal_group(self.proc.pid, sig)

    def kill(self) -> int | None:
        """SIGKILL to the whole group (driver JVM and Python workers): a crash."""
        self.signal_group(signal.SIGKILL)
        return self.wait(30)

    def stop(self, grace: float = GRACE_SECONDS) -> int | None:
        """SIGTERM, then SIGKILL to the group after `grace` (and to its leftovers anyway)."""
        return None if self.proc is None else daemon.stop_group(self.proc, grace, reap=30)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n: int = 40, meaningful: bool = False) -> str:
        return log_tail(self.log_path, n, meaningful)


def log_tail(path: Path, n: int = 40, meaningful: bool = False) -> str:
    """The last n lines of a driver's log; meaningful: without JVM stack frames."""
    if not path.exists():
        return ""
    lines = path.read_text(errors="replace").splitlines()
    if meaningful:
        lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("at ")]
    return "\n".join(lines[-n:])


def map_main_file(uri: str) -> str:
    if uri.startswith(IMAGE_PREFIX):
        return str(REPO_ROOT / uri[len(IMAGE_PREFIX):])
    if uri.startswith("local://"):
        return uri[len("local://"):]
    return uri


def submit_command(app: dict, jars_dir: Path | None, python: str = sys.executable,
                   mounts: dict[str, str] | None = None) -> tuple[list[str], dict]:
    """`mounts` (mountPath -> local directory) stands in for the driver's volume mounts the way
    the node agent does for pods: those paths in the arguments and env values point there."""
    rewrite = MountRewriter(mounts or {})
    spec = app.get("spec") or {}
    md = app["metadata"]
    if spec.get("type", "Python") != "Python":
        raise ValueError(f"spec.type {spec.get('type')!r}: only Python applications are run")
    main = spec.get("mainApplicationFile")
    if not main:
        raise ValueError("spec.mainApplicationFile is required")
    ex = spec.get("executor") or {}
    cores = max(2, int(ex.get("instances") or 1) * int(ex.get("cores") or 1))
    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.app.name": f"{md.get('namespace', 'default')}-{md['name']}"}
    if (spec.get("driver") or {}).get("memory"):
        conf["spark.driver.memory"] = spec["driver"]["memory"]
    if jars_dir is not None:
        conf["spark.jars"] = ",".join(str(p) for p in sorted(Path(jars_dir).glob("*.jar")))
    conf.update({f"spark.hadoop.{k}": str(v) for k, v in (spec.get("hadoopConf") or {}).items()})  # as the operator
    conf.update({k: str(v) for k, v in (spec.get("sparkConf") or {}).items()})
    argv = [str(Path(python).parent / "spark-submit"), "--master", f"local[{cores},4]"]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    argv += [map_main_file(main), *[rewrite(str(a)) for a in spec.get("arguments") or []]]
    env = dict(os.environ)
    env.update({"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
                "SPARK_LOCAL_IP": "127.0.0.1"})
    env.pop("PYSPARK_GATEWAY_PORT", None)
    for e in container_list(spec, "driver", "env"):
        if "value" in e:
            env[e["name"]] = rewrite(str(e["value"]))
    return argv, env


def container_list(spec: dict, role: str, field: str) -> list[dict]:
    """A list of the driver's or the executors' Spark container (env, volumeMounts): the
    SparkApplication's own (the Spark Operator's pod webhook applies them), then its pod
    template's (Spark applies those), as the pod ends up with both."""
    part = spec.get(role) or {}
    containers = ((part.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    return list(part.get(field) or []) + list(containers[0].get(field) or [])


def pod_volumes(spec: dict) -> dict[str, dict]:
    """name -> volume: spec.volumes and those of the driver's and the executors' pod templates."""
    out = {v["name"]: v for v in spec.get("volumes") or []}
    for role in ("driver", "executor"):
        template = ((spec.get(role) or {}).get("template") or {}).get("spec") or {}
        out.update({v["name"]: v for v in template.get("volumes") or []})
    return out
