"""The node tier's stand-in for the Kubeflow Spark Operator, which cannot be fetched here. A
real install runs that operator (its Helm chart); this does its job for SparkApplications on the
tier the way it does: each application becomes `spark-submit --master k8s://...
--deploy-mode cluster` with the spec's image, service account, resources, labels, env, volumes,
pod security and sparkConf, so Spark itself creates the driver pod, and the driver the executor
pods, from the Spark image. `status.applicationState` follows the driver pod, as the operator's:
SUBMITTED once spark-submit created it, RUNNING while it runs, COMPLETED when it succeeded,
FAILING / PENDING_RERUN / FAILED by restartPolicy when it failed or was deleted, with
errorMessage "driver container failed with ExitCode: <n>, Reason: <reason>" and no more: the
driver's own message is in its pod's termination message, where the eopipe operator reads it.
The retry loop and state writes are localenv/sparkrunner.py's; this module adds the submission
(`cluster_submit`, pure) and the driver as a pod (`DriverPod`).

    python -m localenv.node.sparkpods --kubeconfig K --workdir W --master URL --ca F --token F
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from localenv import sparkrunner
from localenv.sparkdriver import log_tail
from localenv.sparkrunner import AppRun, SparkRunner

DRIVER_CONTAINER, EXECUTOR_CONTAINER = "spark-kubernetes-driver", "spark-kubernetes-executor"
APP_LABEL = "sparkoperator.k8s.io/app-name"
SUBMIT_TIMEOUT = 180


def _volume_conf(role: str, mount: dict, volume: dict) -> dict[str, str]:
    """One volumeMount as Spark's spark.kubernetes.<role>.volumes.* settings."""
    name = mount["name"]
    if "persistentVolumeClaim" in volume:
        kind, options = "persistentVolumeClaim", {"claimName": volume["persistentVolumeClaim"]["claimName"]}
    elif "hostPath" in volume:
        kind, options = "hostPath", {"path": volume["hostPath"]["path"]}
    elif "emptyDir" in volume:
        kind, options = "emptyDir", {k: str(v) for k, v in volume["emptyDir"].items()}
    else:
        raise ValueError(f"volume {name!r}: spark-submit mounts persistentVolumeClaim, hostPath and emptyDir "
                         f"volumes, not {sorted(k for k in volume if k != 'name')}")
    pre = f"spark.kubernetes.{role}.volumes.{kind}.{name}"
    out = {f"{pre}.mount.path": mount["mountPath"],
           f"{pre}.mount.readOnly": str(bool(mount.get("readOnly", False))).lower()}
    if mount.get("subPath"):
        out[f"{pre}.mount.subPath"] = mount["subPath"]
    out.update({f"{pre}.options.{k}": v for k, v in options.items()})
    return out


def pod_template(role_spec: dict, container: str) -> dict:
    """What Spark's settings cannot say (security contexts, placement, envFrom) as the pod
    template Spark starts the role's pods from."""
    c = {"name": container}
    for key, field in (("securityContext", "securityContext"), ("envFrom", "envFrom")):
        if role_spec.get(key):
            c[field] = role_spec[key]
    spec = {"containers": [c]}
    for key, field in (("podSecurityContext", "securityContext"), ("nodeSelector", "nodeSelector"),
                       ("tolerations", "tolerations"), ("affinity", "affinity")):
        if role_spec.get(key):
            spec[field] = role_spec[key]
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec}


def cluster_submit(app: dict, *, spark_submit: str, master: str, auth: dict[str, str],
                   templates: dict[str, Path]) -> list[str]:
    """The spark-submit command line of a SparkApplication (v1beta2), as the Spark Operator
    builds it. `auth`: the submission client's caCertFile and oauthTokenFile (its service account's);
    `templates`: where the driver's and executor's pod templates are written (by the caller)."""
    md, spec = app["metadata"], app.get("spec") or {}
    if spec.get("type", "Python") != "Python" or not spec.get("mainApplicationFile"):
        raise ValueError("only Python applications with spec.mainApplicationFile are submitted")
    if not spec.get("image"):
        raise ValueError("spec.image is required")
    name, ns = md["name"], md["namespace"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    conf = {
        "spark.app.name": name,
        "spark.kubernetes.namespace": ns,
        "spark.kubernetes.container.image": spec["image"],
        "spark.kubernetes.container.image.pullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
        "spark.kubernetes.driver.pod.name": f"{name}-driver",
        "spark.kubernetes.submission.waitAppCompletion": "false",
        **{f"spark.kubernetes.authenticate.submission.{k}": v for k, v in auth.items()},
    }
    for role, key in (("driver", "driver"), ("executor", "executor")):
        r = spec.get(key) or {}
        if r.get("cores"):
            conf[f"spark.{role}.cores"] = str(r["cores"])
        if r.get("coreRequest"):
            conf[f"spark.kubernetes.{role}.request.cores"] = str(r["coreRequest"])
        if r.get("memoryOverhead"):
            conf[f"spark.{role}.memoryOverhead"] = r["memoryOverhead"]
        if r.get("memory"):
            conf[f"spark.{role}.memory"] = r["memory"]
        for k, v in {**(r.get("labels") or {}), APP_LABEL: name}.items():
            conf[f"spark.kubernetes.{role}.label.{k}"] = v
        for m in r.get("volumeMounts") or []:
            if m["name"] not in volumes:
                raise ValueError(f"{role}.volumeMounts: {m['name']!r} is not in spec.volumes")
            conf.update(_volume_conf(role, m, volumes[m["name"]]))
        env_key = "spark.kubernetes.driverEnv" if role == "driver" else "spark.executorEnv"
        for e in r.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if "value" in e:
                conf[f"{env_key}.{e['name']}"] = str(e["value"])
            elif ref:
                conf[f"spark.kubernetes.{role}.secretKeyRef.{e['name']}"] = f"{ref['name']}:{ref['key']}"
            else:
                raise ValueError(f"{role}.env {e['name']!r}: only values and secretKeyRef are submitted")
        conf[f"spark.kubernetes.{role}.podTemplateFile"] = str(templates[role])
        conf[f"spark.kubernetes.{role}.podTemplateContainerName"] = (
            DRIVER_CONTAINER if role == "driver" else EXECUTOR_CONTAINER)
    if (spec.get("executor") or {}).get("instances"):
        conf["spark.executor.instances"] = str(spec["executor"]["instances"])
    if (spec.get("driver") or {}).get("serviceAccount"):
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] = spec["driver"]["serviceAccount"]
    conf.update({f"spark.hadoop.{k}": str(v) for k, v in (spec.get("hadoopConf") or {}).items()})
    conf.update({k: str(v) for k, v in (spec.get("sparkConf") or {}).items()})
    argv = [spark_submit, "--master", master, "--deploy-mode", "cluster"]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    return argv + [spec["mainApplicationFile"], *[str(a) for a in spec.get("arguments") or []]]


def driver_outcome(pod: dict | None) -> tuple[bool, int | None, str]:
    """(alive, exit code, reason) of a driver pod: alive while Pending or Running; a pod that
    is gone failed (the operator resubmits it under restartPolicy)."""
    if pod is None:
        return False, 1, "DriverPodDeleted"
    phase = (pod.get("status") or {}).get("phase")
    if phase in (None, "Pending", "Running"):
        return True, None, ""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == DRIVER_CONTAINER and term:
            return False, int(term.get("exitCode", 1)), term.get("reason") or "Error"
    return False, 0 if phase == "Succeeded" else 1, "Error"


class DriverPod:
    """A driver that spark-submit creates as a pod; the interface of sparkdriver.DriverProcess."""

    pid = None

    def __init__(self, core, ns: str, name: str, argv: list[str], env: dict[str, str], log_path: Path):
        self.core, self.ns, self.name, self.argv, self.env, self.log_path = core, ns, name, argv, env, log_path
        self.reason = ""

    def _pod(self) -> dict | None:
        from kubernetes.client.rest import ApiException
        try:
            return self.core.api_client.sanitize_for_serialization(self.core.read_namespaced_pod(self.name, self.ns))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def start(self) -> None:
        self.stop(grace=0)  # the last attempt's driver pod, as the operator removes it before a rerun
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            res = subprocess.run(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, timeout=SUBMIT_TIMEOUT, check=False)
        if res.returncode != 0:
            raise ValueError(f"spark-submit exited with {res.returncode}: {self.tail(5, meaningful=True)}")

    @property
    def alive(self) -> bool:
        return driver_outcome(self._pod())[0]

    @property
    def returncode(self) -> int | None:
        alive, rc, self.reason = driver_outcome(self._pod())
        return None if alive else rc

    def query_running(self) -> bool:
        return ((self._pod() or {}).get("status") or {}).get("phase") == "Running"

    def stop(self, grace: float = 10) -> int | None:
        from kubernetes.client.rest import ApiException
        try:
            self.core.delete_namespaced_pod(self.name, self.ns, grace_period_seconds=int(grace))
        except ApiException as e:
            if e.status != 404:
                raise
        deadline = time.monotonic() + grace + 60
        while self._pod() is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        return None

    def kill(self) -> int | None:
        return self.stop(grace=0)

    def tail(self, n: int = 40, meaningful: bool = False) -> str:
        return log_tail(self.log_path, n, meaningful)


class PodAppRun(AppRun):
    def _launch(self, attempt: int) -> DriverPod:
        r: PodRunner = self.runner
        templates = {}
        for role, container in (("driver", DRIVER_CONTAINER), ("executor", EXECUTOR_CONTAINER)):
            templates[role] = self.dir / f"{role}-template.{attempt}.json"
            templates[role].write_text(json.dumps(pod_template((self.app.get("spec") or {}).get(role) or {},
                                                               container)))
        argv = cluster_submit(self.app, spark_submit=r.spark_submit, master=r.master, auth=r.auth,
                              templates=templates)
        return DriverPod(r.core, self.ns, f"{self.name}-driver", argv, r.submit_env, self.dir / f"submit.{attempt}.log")

    def _error(self, rc: int) -> str:
        reason = getattr(self.driver, "reason", "") or "Error"
        return f"driver container failed with ExitCode: {rc}, Reason: {reason}"


class PodRunner(SparkRunner):
    app_class = PodAppRun

    def __init__(self, kubeconfig: Path, workdir: Path, *, master: str, auth: dict[str, str],
                 spark_submit: str, max_retry_interval: float = 10.0):
        super().__init__(kubeconfig, workdir, None, max_retry_interval=max_retry_interval)
        self.master, self.auth, self.spark_submit = master, auth, spark_submit
        import pyspark  # the submission client is the venv's pyspark: its SPARK_HOME and python

        # Only `auth` identifies the submission: no kubeconfig of the harness's. No PYSPARK_PYTHON:
        # spark-submit would hand this machine's python to the driver pod (spark.pyspark.python).
        self.submit_env = {**{k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PYSPARK_PYTHON")},
                           "SPARK_HOME": str(Path(pyspark.__file__).parent)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.node.sparkpods", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--master", required=True, help="k8s://https://<apiserver>")
    ap.add_argument("--ca", required=True, help="the apiserver's CA certificate")
    ap.add_argument("--token", required=True, help="a file with the token spark-submit authenticates with")
    ap.add_argument("--max-retry-interval", type=float, default=10.0)
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    runner = PodRunner(args.kubeconfig, args.workdir, master=args.master, max_retry_interval=args.max_retry_interval,
                       auth={"caCertFile": args.ca, "oauthTokenFile": args.token},
                       spark_submit=str(Path(sys.executable).parent / "spark-submit"))
    return sparkrunner.serve(runner, args.workdir)


if __name__ == "__main__":
    sys.exit(main())
