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

Mapping (the command is built in sparkdriver.py):
* mainApplicationFile `local:///opt/eopipe/<path>` -> `<repo>/<path>` (the image's layout);
  other `local://` paths are used as they are. spec.arguments are passed through.
* spec.sparkConf -> `--conf k=v`; spec.driver.memory -> spark.driver.memory; spark.jars ->
  the cached connector jars (the image has them in $SPARK_HOME/jars); the literal values of
  spec.driver.env and its pod template's env -> the driver's environment. Master `local[C,4]` with C = executor
  instances x cores (at least 2), 4 attempts per task; small shuffle partitions and the UI
  off unless sparkConf says otherwise.
* spec.volumes and the pod templates' volumes (driver.template, executor.template) mounted by
  the volumeMounts of driver, executor or their templates' Spark container (one process here):
  a persistentVolumeClaim is its PersistentVolume's directory (the node agent's provisioner
  makes hostPath PVs), a hostPath its path, an emptyDir a fresh directory per attempt; those
  mount paths in the arguments and env values point there (localenv/nodeagent's rewrite). A
  claim not yet bound keeps the driver from starting, as a Pending driver pod; other paths stay
  as they are (nothing else of the container's file system survives a real driver pod).
* Images, service accounts, executors as pods: ignored.

States written to status.applicationState.state (with errorMessage), as the real operator:
  SUBMITTED   spark-submit started (submissionAttempts +1, lastSubmissionAttemptTime)
  RUNNING     the driver's streaming query runs (spark_app prints a line when it does; the
              real operator says RUNNING when the driver pod runs, a little earlier)
  COMPLETED   the driver exited 0
  FAILING     the driver exited non-zero and will be retried (errorMessage as the real operator
              writes it, "driver container failed with ExitCode: <n>, Reason: Error", then
              ": " and the driver's termination log, which on a cluster is the driver pod's
              termination message and not in errorMessage); then PENDING_RERUN during
              restartPolicy.onFailureRetryInterval (capped by --max-retry-interval), then
              SUBMITTED again (executionAttempts counts the runs)
  FAILED      the driver exited non-zero and restartPolicy is Never or retries are used up
A changed spec (metadata.generation) kills the driver and submits again; a deleted object
gets its driver stopped (SIGTERM, then SIGKILL after a grace period).

Run as a subprocess (the fixture does), like the node agent:

    python -m localenv.sparkrunner --kubeconfig K --workdir W --jars DIR
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import time
from pathlib import Path

from localenv import daemon
from localenv.sparkdriver import DriverProcess, container_list, pod_volumes, submit_command

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"

log = logging.getLogger("eopipe.sparkrunner")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        try:
            driver = self._launch(self.attempts + 1)
        except Pending as e:
            if self.state != "PENDING":
                log.info("app %s/%s driver pending: %s", self.ns, self.name, e)
            self.state = "PENDING"  # local only: the real operator shows SUBMITTED, the driver pod Pending
            return
        except ValueError as e:
            self._write("SUBMISSION_FAILED", str(e))
            return
        self.attempts += 1
        self.submissions += 1
        self.rerun_at = None
        self.driver = driver
        try:
            self.driver.start()
        except ValueError as e:  # spark-submit refused it (cluster mode: before any pod ran)
            self.driver = None
            self._write("SUBMISSION_FAILED", str(e))
            return
        if self.driver.pid:
            (self.dir / "pid").write_text(str(self.driver.pid))
        log.info("app %s/%s submitted: %s", self.ns, self.name, " ".join(self.driver.argv))
        self._write("SUBMITTED")

    def _launch(self, attempt: int):
        """The driver of this attempt, not started: here a local spark-submit process.
        Raises Pending (not yet: a claim not bound) or ValueError (cannot be run)."""
        mounts = self.runner.mounts(self.app, self.dir / f"empty.{attempt}")
        argv, env = submit_command(self.app, self.runner.jars_dir, mounts=mounts)
        # The driver container's /dev/termination-log (spark_app writes why it ends there).
        log_file = self.dir / f"termination.{attempt}.log"
        env["EOPIPE_TERMINATION_LOG"] = str(log_file)
        log_file.unlink(missing_ok=True)
        return DriverProcess(argv, env, self.dir / f"driver.{attempt}.log")

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
        if self.state in ("NEW", "PENDING"):
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

    @property
    def termination_log(self) -> Path:
        return self.dir / f"termination.{self.attempts}.log"

    def _error(self, rc: int) -> str:
        # A process killed by a signal is a container that exited 128 + the signal.
        head = f"driver container failed with ExitCode: {128 - rc if rc < 0 else rc}, Reason: Error"
        try:
            detail = self.termination_log.read_text(errors="replace").strip()
        except OSError:
            detail = ""
        return head + (f": {detail}" if detail else "")

    def delete(self) -> None:
        if self.driver is not None:
            log.info("app %s/%s deleted: stopping the driver", self.ns, self.name)
            self.driver.stop()


class Pending(Exception):
    """The driver cannot start yet (a claim not bound): tried again next loop."""


def volume_dir(volume: dict, pv_path, empty_dir: Path) -> Path:
    """The local directory of one volume of the application. `pv_path(claim)` -> the bound
    PersistentVolume's hostPath or None. Raises Pending or ValueError."""
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        path = pv_path(claim)
        if path is None:
            raise Pending(f"persistentvolumeclaim {claim!r} not bound")
        return Path(path)
    if "hostPath" in volume:
        return Path(volume["hostPath"]["path"])
    if "emptyDir" in volume:
        return empty_dir / volume["name"]
    raise ValueError(f"volume {volume.get('name')!r}: the local runner supports persistentVolumeClaim, hostPath "
                     f"and emptyDir, not {sorted(k for k in volume if k != 'name')}")


def app_mounts(app: dict, pv_path, empty_dir: Path) -> dict[str, str]:
    """mountPath -> local directory for the driver's and the executors' volumeMounts."""
    spec = app.get("spec") or {}
    volumes = pod_volumes(spec)
    out: dict[str, str] = {}
    for pod in ("driver", "executor"):
        for m in container_list(spec, pod, "volumeMounts"):
            if m["name"] not in volumes:
                raise ValueError(f"{pod}.volumeMounts: {m['name']!r} is not in spec.volumes or its pod template")
            local = volume_dir(volumes[m["name"]], pv_path, empty_dir) / (m.get("subPath") or "")
            local.mkdir(parents=True, exist_ok=True)
            out[m["mountPath"]] = str(local)
    return out


class SparkRunner:
    app_class = AppRun

    def __init__(self, kubeconfig: Path, workdir: Path, jars_dir: Path | None,
                 namespace: str | None = None, max_retry_interval: float = 10.0):
        from kubernetes import client, config

        self.workdir = Path(workdir)
        self.jars_dir = jars_dir
        self.namespace = namespace
        self.max_retry_interval = max_retry_interval
        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.api, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.apps: dict[str, AppRun] = {}

    def mounts(self, app: dict, empty_dir: Path) -> dict[str, str]:
        ns = app["metadata"]["namespace"]

        def pv_path(claim: str) -> str | None:
            from kubernetes.client.rest import ApiException
            try:
                pvc = self.core.read_namespaced_persistent_volume_claim(claim, ns)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
            if not pvc.spec.volume_name or (pvc.status.phase or "") != "Bound":
                return None
            pv = self.core.read_persistent_volume(pvc.spec.volume_name)
            return pv.spec.host_path.path if pv.spec.host_path else None
        return app_mounts(app, pv_path, empty_dir)

    def list_apps(self) -> list[dict]:
        if self.namespace:
            res = self.api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        else:
            res = self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return res.get("items", [])

    def loop_once(self) -> None:
        items = {a["metadata"]["uid"]: a for a in self.list_apps()}
        # Deleted applications' drivers are stopped (and waited for) before anything is
        # submitted: an application deleted and created again under its name between two polls
        # (a pipeline paused and resumed) must not get its new driver beside the old one on the
        # same checkpoint, as a driver pod outlives its deleted SparkApplication until it is gone.
        for uid in list(self.apps):
            if uid not in items or items[uid]["metadata"].get("deletionTimestamp"):
                self.apps.pop(uid).delete()
        for uid, app in items.items():
            if app["metadata"].get("deletionTimestamp"):
                continue
            run = self.apps.get(uid)
            if run is None:
                run = self.apps[uid] = self.app_class(self, app)
                run.dir.mkdir(parents=True, exist_ok=True)
            run.step(app)

    def shutdown(self) -> None:
        for run in self.apps.values():
            if run.driver is not None:
                run.driver.kill()


class RunnerProcess(daemon.HelperDaemon):
    """The runner as a subprocess, for fixtures."""

    module, name, pid_files, stop_timeout = "localenv.sparkrunner", "sparkrunner", "apps/*/pid", 30.0

    def __init__(self, kubeconfig: Path, workdir: Path, jars_dir: Path | None,
                 max_retry_interval: float = 2.0):
        super().__init__(workdir)
        self.kubeconfig, self.jars_dir = Path(kubeconfig), jars_dir
        self.max_retry_interval = max_retry_interval

    def args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig), "--max-retry-interval", str(self.max_retry_interval),
                *(["--jars", str(self.jars_dir)] if self.jars_dir else [])]

    def driver_logs(self) -> list[Path]:
        return sorted((self.workdir / "apps").glob("*/driver.*.log"), key=lambda p: p.stat().st_mtime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.sparkrunner", description=__doc__.splitlines()[0])
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
    runner = SparkRunner(args.kubeconfig, args.workdir, args.jars, args.namespace, args.max_retry_interval)
    return serve(runner, args.workdir, args.poll, args.parent_pid)


def serve(runner: SparkRunner, workdir: Path, poll: float = 0.5, parent_pid: int = 0) -> int:
    """The runner's loop until SIGTERM/SIGINT (or the parent's death); drivers are killed at the end."""
    logging.basicConfig(filename=workdir / "sparkrunner.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    (workdir / "ready").write_text(str(os.getpid()))
    log.info("spark runner up (pid %d)", os.getpid())
    try:
        while not stop["now"]:
            if parent_pid and os.getppid() != parent_pid:
                log.warning("parent %d gone: exiting", parent_pid)
                break
            try:
                runner.loop_once()
            except Exception:  # noqa: BLE001 - API hiccups: log and go on
                log.exception("loop failed")
            time.sleep(poll)
    finally:
        runner.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
