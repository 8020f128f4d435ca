"""A test-only stand-in for the Kubeflow Spark Operator: runs SparkApplications as local processes.

There is no kubelet and no Spark Operator on the test machine. This runner watches
`sparkoperator.k8s.io/v1beta2` SparkApplication objects on the local control plane and runs
each one's driver with `spark-submit --master local[...]` (the driver and its executors in one
JVM), writing back `status.applicationState` the way the operator's reconciler reads it.

Why spark-submit rather than `python -m spark_app.main`: the SparkApplication says
"spark-submit this main file with these --conf settings and arguments" and the real operator
does exactly that; running the file through spark-submit exercises the same entry (main.py as
a file, not a module; spec.sparkConf as --conf; the connector jars through spark.jars) as the
image does. The tests of spark_app itself use `python -m spark_app.main`, so both launch paths
are covered.

Mapping:
* mainApplicationFile `local:///opt/eopipe/<path>` -> `<repo>/<path>` (the image's layout);
  other `local://` paths are used as they are. spec.arguments are passed through.
* spec.sparkConf -> `--conf k=v`; spec.driver.memory -> spark.driver.memory; spark.jars ->
  the cached connector jars (the image has them in $SPARK_HOME/jars); spec.driver.env
  literal values -> the driver's environment. Master `local[C,4]` with C = executor
  instances x cores (at least 2), 4 attempts per task; small shuffle partitions and the UI
  off unless sparkConf says otherwise.
* Images, volumes, service accounts, executors as pods: ignored.

States written to status.applicationState.state (with errorMessage), as the real operator:
  SUBMITTED   spark-submit started (submissionAttempts +1, lastSubmissionAttemptTime)
  RUNNING     the driver's streaming query runs (spark_app prints a line when it does; the
              real operator says RUNNING when the driver pod runs, a little earlier)
  COMPLETED   the driver exited 0
  FAILING     the driver exited non-zero and will be retried (errorMessage: the exit status
              and the last meaningful log line); then PENDING_RERUN during
              restartPolicy.onFailureRetryInterval (capped by --max-retry-interval), then
              SUBMITTED again (executionAttempts counts the runs)
  FAILED      the driver exited non-zero and restartPolicy is Never or retries are used up
A changed spec (metadata.generation) kills the driver and submits again; a deleted object
gets its driver stopped (SIGTERM, then SIGKILL after a grace period).

Run as a subprocess (the fixture does), like the node agent:

    python -m tests.localenv.sparkrunner --kubeconfig K --workdir W --jars DIR
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.localenv import daemon

REPO_ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
IMAGE_PREFIX = "local:///opt/eopipe/"
RUNNING_LINE = "eopipe-spark: streaming query running"  # spark_app/main.py prints it
GRACE_SECONDS = 10.0

log = logging.getLogger("eopipe.sparkrunner")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> int | None:
        """SIGKILL to the whole group (driver JVM and Python workers): a crash."""
        self.signal_group(signal.SIGKILL)
        return self.wait(30)

    def stop(self, grace: float = GRACE_SECONDS) -> int | None:
        if not self.alive:
            self.signal_group(signal.SIGKILL)  # leftovers of the group, if any
            return self.returncode
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(signal.SIGKILL)
        return self.wait(30)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n: int = 40, meaningful: bool = False) -> str:
        if not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()
        if meaningful:  # drop JVM stack frames
            lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("at ")]
        return "\n".join(lines[-n:])


def map_main_file(uri: str) -> str:
    if uri.startswith(IMAGE_PREFIX):
        return str(REPO_ROOT / uri[len(IMAGE_PREFIX):])
    if uri.startswith("local://"):
        return uri[len("local://"):]
    return uri


def submit_command(app: dict, jars_dir: Path | None, python: str = sys.executable) -> tuple[list[str], dict]:
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
    conf.update({k: str(v) for k, v in (spec.get("sparkConf") or {}).items()})
    argv = [str(Path(python).parent / "spark-submit"), "--master", f"local[{cores},4]"]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    argv += [map_main_file(main), *[str(a) for a in spec.get("arguments") or []]]
    env = dict(os.environ)
    env.update({"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
                "SPARK_LOCAL_IP": "127.0.0.1"})
    env.pop("PYSPARK_GATEWAY_PORT", None)
    for e in (spec.get("driver") or {}).get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return argv, env


class AppRun:
    """One SparkApplication (by uid): its driver process, attempts and state."""

    def __init__(self, runner: "SparkRunner", app: dict):
        self.runner = runner
        md = app["metadata"]
        self.ns, self.name, self.uid = md["namespace"], md["name"], md["uid"]
        self.app = app
        self.generation = md.get("generation")
        self.dir = runner.workdir / "apps" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.driver: DriverProcess | None = None
        self.state = "NEW"
        self.attempts = 0
        self.submissions = 0
        self.rerun_at: float | None = None
        status = app.get("status") or {}
        self.attempts = int(status.get("executionAttempts") or 0)
        self.submissions = int(status.get("submissionAttempts") or 0)

    # --- status ---------------------------------------------------------------------------
    def _write(self, state: str, message: str = "") -> None:
        self.state = state
        body = {"status": {
            "applicationState": {"state": state, "errorMessage": message},
            "executionAttempts": self.attempts, "submissionAttempts": self.submissions,
            "driverInfo": {"podName": f"{self.name}-driver"},
            "sparkApplicationId": f"local-{self.uid[:8]}-{self.attempts}",
        }}
        if state == "SUBMITTED":
            body["status"]["lastSubmissionAttemptTime"] = _now()
        if state in ("COMPLETED", "FAILED"):
            body["status"]["terminationTime"] = _now()
        try:
            self.runner.api.patch_namespaced_custom_object_status(GROUP, VERSION, self.ns, PLURAL,
                                                                  self.name, body)
        except Exception as e:  # noqa: BLE001 - the object may be gone; the loop goes on
            log.warning("status %s/%s -> %s failed: %s", self.ns, self.name, state, e)
            return
        log.info("app %s/%s state=%s attempts=%d %s", self.ns, self.name, state, self.attempts,
                 message[:200])

    # --- lifecycle ------------------------------------------------------------------------
    def submit(self) -> None:
        self.attempts += 1
        self.submissions += 1
        self.rerun_at = None
        try:
            argv, env = submit_command(self.app, self.runner.jars_dir)
        except ValueError as e:
            self._write("SUBMISSION_FAILED", str(e))
            return
        self.driver = DriverProcess(argv, env, self.dir / f"driver.{self.attempts}.log")
        self.driver.start()
        (self.dir / "pid").write_text(str(self.driver.pid))
        log.info("app %s/%s submitted pid=%s: %s", self.ns, self.name, self.driver.pid, " ".join(argv))
        self._write("SUBMITTED")

    def step(self, app: dict) -> None:
        """Called every loop with the current object."""
        self.app = app
        gen = app["metadata"].get("generation")
        if gen != self.generation and self.driver is not None:
            log.info("app %s/%s spec changed (generation %s -> %s): resubmitting",
                     self.ns, self.name, self.generation, gen)
            self.driver.stop()
            self.driver = None
            self.attempts = 0
            self.state = "NEW"
        self.generation = gen
        if self.state in ("NEW",):
            self.submit()
            return
        if self.state == "PENDING_RERUN":
            if time.monotonic() >= (self.rerun_at or 0):
                self.submit()
            return
        if self.driver is None or self.state in ("COMPLETED", "FAILED", "SUBMISSION_FAILED"):
            return
        if self.driver.alive:
            if self.state == "SUBMITTED" and self.driver.query_running():
                self._write("RUNNING")
            return
        rc = self.driver.returncode
        if rc == 0:
            self._write("COMPLETED")
            return
        why = self._error(rc)
        policy = (app.get("spec") or {}).get("restartPolicy") or {}
        ptype = policy.get("type", "Never")
        retries = int(policy.get("onFailureRetries", 0 if ptype == "OnFailure" else 1 << 30))
        if ptype in ("OnFailure", "Always") and self.attempts <= retries:
            self._write("FAILING", why)
            interval = float(policy.get("onFailureRetryInterval", 5))
            self.rerun_at = time.monotonic() + min(interval, self.runner.max_retry_interval)
            self._write("PENDING_RERUN", why)
        else:
            self._write("FAILED", why)

    def _error(self, rc: int) -> str:
        what = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
        lines = [ln for ln in self.driver.tail(200, meaningful=True).splitlines()
                 if "eopipe-spark" in ln or "invalid spark_app config" in ln or ln.startswith("  - ")]
        detail = "; ".join(ln.strip() for ln in lines[-4:])
        return f"driver {what}" + (f": {detail}" if detail else "")

    def delete(self) -> None:
        if self.driver is not None:
            log.info("app %s/%s deleted: stopping the driver", self.ns, self.name)
            self.driver.stop()


class SparkRunner:
    def __init__(self, kubeconfig: Path, workdir: Path, jars_dir: Path | None,
                 namespace: str | None = None, max_retry_interval: float = 10.0):
        from kubernetes import client, config

        self.workdir = Path(workdir)
        self.jars_dir = jars_dir
        self.namespace = namespace
        self.max_retry_interval = max_retry_interval
        self.api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
        self.apps: dict[str, AppRun] = {}

    def list_apps(self) -> list[dict]:
        if self.namespace:
            res = self.api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        else:
            res = self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return res.get("items", [])

    def loop_once(self) -> None:
        items = {a["metadata"]["uid"]: a for a in self.list_apps()}
        for uid, app in items.items():
            if app["metadata"].get("deletionTimestamp"):
                run = self.apps.pop(uid, None)
                if run:
                    run.delete()
                continue
            run = self.apps.get(uid)
            if run is None:
                run = self.apps[uid] = AppRun(self, app)
                run.dir.mkdir(parents=True, exist_ok=True)
            run.step(app)
        for uid in list(self.apps):
            if uid not in items:
                self.apps.pop(uid).delete()

    def shutdown(self) -> None:
        for run in self.apps.values():
            if run.driver is not None:
                run.driver.kill()


class RunnerProcess:
    """The runner as a subprocess, for fixtures."""

    def __init__(self, kubeconfig: Path, workdir: Path, jars_dir: Path | None,
                 max_retry_interval: float = 2.0):
        self.kubeconfig, self.workdir, self.jars_dir = Path(kubeconfig), Path(workdir), jars_dir
        self.max_retry_interval = max_retry_interval
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "sparkrunner.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.localenv.sparkrunner", "--kubeconfig", str(self.kubeconfig),
               "--workdir", str(self.workdir), "--parent-pid", str(os.getpid()),
               "--max-retry-interval", str(self.max_retry_interval)]
        if self.jars_dir:
            cmd += ["--jars", str(self.jars_dir)]
        self.proc = daemon.spawn(cmd, self.workdir, "sparkrunner", timeout, self.tail, self.stop)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None:
            return
        daemon.terminate(self.proc, timeout)
        for pidfile in (self.workdir / "apps").glob("*/pid"):
            try:
                os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        self.proc = None

    def driver_logs(self) -> list[Path]:
        return sorted((self.workdir / "apps").glob("*/driver.*.log"), key=lambda p: p.stat().st_mtime)

    def tail(self, n: int = 40) -> str:
        p = self.log_path if self.log_path.exists() else self.workdir / "sparkrunner.out"
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.localenv.sparkrunner", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--jars", type=Path, help="the Kafka connector jars folder (hack/fetch-spark-jars.sh)")
    ap.add_argument("--namespace", help="only this namespace (default: all)")
    ap.add_argument("--max-retry-interval", type=float, default=10.0,
                    help="cap of restartPolicy.onFailureRetryInterval, seconds")
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--parent-pid", type=int, default=0, help="exit (killing drivers) when it dies")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=args.workdir / "sparkrunner.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    runner = SparkRunner(args.kubeconfig, args.workdir, args.jars, args.namespace, args.max_retry_interval)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    (args.workdir / "ready").write_text(str(os.getpid()))
    log.info("spark runner up (pid %d)", os.getpid())
    try:
        while not stop["now"]:
            if args.parent_pid and os.getppid() != args.parent_pid:
                log.warning("parent %d gone: exiting", args.parent_pid)
                break
            try:
                runner.loop_once()
            except Exception:  # noqa: BLE001 - API hiccups: log and go on
                log.exception("loop failed")
            time.sleep(args.poll)
    finally:
        runner.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
