#!/usr/bin/env python3
"""`make demo`: the payments pipeline end to end on a local cluster, with faults, then its verdict.

What runs (all real; see localenv/): by default the node tier (`make cluster`, root): a
Kubernetes control plane, containerd, a kubelet and kube-proxy, CoreDNS and a storage
provisioner in a network namespace of their own, pods from images built from the Dockerfile,
a Kafka broker on the node address, and the Kubeflow Spark Operator (v2.5.2, controller and
webhook, installed from its own Helm chart). The eopipe operator is installed
with the Helm chart; examples/payments.yaml is applied with kubectl as it is.

While `eopipe load` sends payments with 20% resends, 5% to a wrong partition and some
malformed records, the demo: SIGKILLs a dedup pod's container mid-transaction, SIGKILLs the
Spark driver, turns autoscaling on (the operator scales the dedup pods 2 -> 3 under the load)
and adds source partitions 8 -> 12. Then it prints
`kubectl get eop` and verifies, reading with read_committed: source -> deduped topic (the
dedup stage) and source -> the Spark sink (end to end). It exits 0 only if nothing was lost
or duplicated, 1 otherwise.

--process-node runs it on the node agent instead (pods as local processes, the Spark driver
in local mode; Kafka as local processes, so a broker SIGKILL + restart is among the faults).
--quick runs the dedup stage only (Kafka and two dedup workers as plain processes, a worker
SIGKILL and a broker restart): a one-minute look. --break-dedup turns the dedup step off
(every record counts as new) to show that the verdict catches it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from eopipe.control.builders.dedup import worker_args  # noqa: E402
from eopipe.control.builders.topics import desired_topics  # noqa: E402
from eopipe.control.topics import ensure_topics  # noqa: E402
from eopipe.core.assignment import Assignment, assign  # noqa: E402
from eopipe.core.names import Names  # noqa: E402
from eopipe.core.spec import RESOURCE, PipelineSpec  # noqa: E402
from eopipe.tools.loadgen import run_load  # noqa: E402
from eopipe.tools.verify import Report, verify, wait_for_group  # noqa: E402
from localenv.kafka import KafkaBroker, free_port  # noqa: E402

T0 = time.monotonic()
NS = "demo"
BROKEN = "no_dedup"  # the worker's test-only fault: every record counts as new


def say(step: str, msg: str = "") -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {step}{(': ' + msg) if msg else ''}", flush=True)


def verdict(reports: dict[str, Report]) -> int:
    """Prints one line per check; 0 only if every check ran and found nothing lost or duplicated."""
    for what, rep in reports.items():
        print(f"{rep.line()}  [{what}]", flush=True)
        for kind, keys in rep.examples.items():
            print(f"    {kind}, e.g.: {', '.join(keys)}", flush=True)
    ok = bool(reports) and all(r.ok for r in reports.values())
    print(f"verdict: {'EXACTLY-ONCE (lost=0, duplicated=0)' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


class Load:
    """`eopipe load` in a thread: payments with resends, wrong partitions and malformed records."""

    def __init__(self, bootstrap: str, topic: str, records: int, rate: float):
        self.stats: dict = {}
        self.error: BaseException | None = None
        say("load", f"{records} records at {rate:.0f}/s: 20% resends, 5% to a wrong partition, 25 malformed")

        def run() -> None:
            try:
                self.stats.update(run_load(bootstrap, topic, records, dup_ratio=0.2, wrong_partition_ratio=0.05,
                                           poison=25, rate=rate, seed=7,
                                           # Retries through the broker restart are expected: keep
                                           # librdkafka's connection errors out of the demo's output.
                                           producer_config={"message.timeout.ms": 300_000, "log_level": 2}))
            except BaseException as e:  # noqa: BLE001 - reported by finish()
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finish(self) -> dict:
        while self.thread.is_alive():
            self.thread.join(1)
        if self.error:
            raise self.error
        say("load", f"sent {self.stats['records']} ({self.stats['unique']} unique, "
                    f"{self.stats['duplicates']} resends, {self.stats['poison']} malformed)")
        return self.stats


def wait(fn, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (v := fn()):
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def drain_and_verify(bootstrap: str, names: Names, spark: bool) -> int:
    say("drain", "waiting until the dedup stage has consumed every committed source record")
    took = wait_for_group(bootstrap, names.consumer_group, names.source_topic, timeout=600)
    say("drain", f"dedup stage drained ({took:.1f}s)")
    say("verify", "reading source, outputs and dead-letter topic with read_committed")
    key = names.spec.dedup.key.key_spec()
    reports = {"dedup stage (source -> deduped)": verify(
        bootstrap, names.source_topic, names.deduped_topic, key_spec=key, dlq_topic=names.dlq_topic,
        settle=5, timeout=300)}
    if spark:
        reports["end to end (source -> Spark sink)"] = verify(
            bootstrap, names.source_topic, names.sink_topic, key_spec=key, dlq_topic=names.dlq_topic,
            settle=20, timeout=300, order=False)  # Spark's Kafka sink promises no order
    return verdict(reports)


# --------------------------------------------------------------------------- --quick: processes
class Worker:
    """One dedup worker process, as a dedup pod runs it."""

    def __init__(self, name: str, names: Names, bootstrap: str, workdir: Path, assignment: Path, env: dict):
        self.name, self.log, self.env = name, workdir / f"{name}.log", {**os.environ, **env}
        self.cmd = [str(Path(sys.executable).parent / "eopipe"),
                    *worker_args(names, bootstrap=bootstrap, assignment_file=str(assignment),
                                 watch_configmap=False, state_dir=str(workdir / "state" / name), http_port=free_port()),
                    "--pod-name", name]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def run_quick(args, stack: contextlib.ExitStack) -> int:
    kafka = start_kafka(args.workdir, stack)
    doc = {"kafka": {"bootstrapServers": kafka.bootstrap},
           "source": {"topic": "payments", "partitions": 4},
           "dedup": {"key": {"from": "jsonField", "name": "id"}, "window": "1h", "replicas": 2}}
    names = Names(NS, "payments", PipelineSpec.model_validate(doc))
    report = ensure_topics(AdminClient({"bootstrap.servers": kafka.bootstrap}), desired_topics(names))
    say("topics", f"created {', '.join(report.created)}")
    pods = [f"payments-dedup-{i}" for i in range(2)]
    assignment = Assignment(1, assign(4, pods))
    assignment_file = args.workdir / "assignment.json"
    assignment_file.write_text(json.dumps(assignment.to_json()))
    env = {"EOPIPE_FAULT": BROKEN} if args.break_dedup else {}
    workers = [Worker(p, names, kafka.bootstrap, args.workdir, assignment_file, env) for p in pods]
    for w in workers:
        w.start()
        stack.callback(w.kill, signal.SIGTERM)
    say("dedup", f"{len(workers)} workers, assignment {assignment.to_json()['assignments']}"
                 + (" (dedup step BROKEN on purpose)" if args.break_dedup else ""))

    load = Load(kafka.bootstrap, names.source_topic, args.records, args.rate)
    duration = args.records / args.rate
    time.sleep(duration * 0.3)
    say("fault", f"SIGKILL {workers[1].name} mid-transaction, then restart it")
    workers[1].kill()
    time.sleep(2)
    workers[1].start()
    time.sleep(duration * 0.3)
    broker_restart(kafka)
    load.finish()
    return drain_and_verify(kafka.bootstrap, names, spark=False)


def start_kafka(workdir: Path, stack: contextlib.ExitStack) -> KafkaBroker:
    say("kafka", "starting a single-node KRaft broker")
    kafka = KafkaBroker(workdir / "kafka")
    stack.callback(kafka.stop)
    took = kafka.start()
    say("kafka", f"ready at {kafka.bootstrap} in {took:.1f}s")
    return kafka


def broker_restart(kafka: KafkaBroker) -> None:
    say("fault", "broker SIGKILL + restart")
    took = kafka.restart(kill=True)
    say("fault", f"broker back in {took:.1f}s; open transactions abort, producers and consumers reconnect")


# --------------------------------------------------------------------------- full: the cluster
class Cluster:
    """The local cluster of the tests (localenv), driven the way a user drives a real one."""

    def __init__(self, workdir: Path, stack: contextlib.ExitStack):
        from kubernetes import client, config

        from localenv.controlplane import ControlPlane
        from localenv.nodeagent import NodeAgent
        from localenv.sparkrunner import RunnerProcess

        self.workdir = workdir
        say("kubernetes", "starting etcd, kube-apiserver, controller-manager, scheduler (built from source, cached)")
        self.cp = ControlPlane(workdir / "k8s")
        stack.callback(self.cp.stop)
        t = time.monotonic()
        self.cp.start()
        say("kubernetes", f"control plane ready in {time.monotonic() - t:.1f}s at {self.cp.server}")
        self.agent = NodeAgent(self.cp.kubeconfig, workdir / "node")
        stack.callback(self.agent.stop)
        self.agent.start()
        say("kubernetes", "node eopipe-node-0 joined (pods run as local processes)")
        jars = _output(["bash", str(REPO / "hack" / "fetch-spark-jars.sh")])[-1]
        self.spark = RunnerProcess(self.cp.kubeconfig, workdir / "spark", Path(jars))
        stack.callback(self.spark.stop)
        self.spark.start()
        self.kubectl("apply", "--server-side", "-f", str(REPO / "localenv" / "crds"))
        say("kubernetes", "Spark Operator stand-in runs SparkApplications (spark-submit, local master)")
        self.kubeconfig, self.kubectl_bin = self.cp.kubeconfig, self.cp.kubectl
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def undo(self, fn) -> None:
        """On a cluster the demo leaves up, what it made goes at the end (last made, first gone)."""

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 300) -> str:
        return _run([str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args], input=input,
                    timeout=timeout)

    def helm_install(self) -> None:
        helm = Path(_output(["bash", str(REPO / "hack" / "build-tools.sh"), "helm"])[0]) / "helm"  # its bin dir
        home = self.workdir / "helm"
        env = {**os.environ, **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
        say("operator", "helm install eopipe charts/eopipe (CRD, RBAC, operator Deployment)")
        # Its namespaces, made here, go after the release (a cluster's own eopipe-system stays).
        if not self.kubectl("get", "namespace", "eopipe-system", "--ignore-not-found", "-o", "name").strip():
            self.undo(lambda: self.kubectl("delete", "namespace", "eopipe-system", "--timeout=180s", timeout=200))
        self.kubectl("create", "namespace", NS)
        sets = [a for k, v in self.helm_values().items() for a in ("--set", f"{k}={v}")]
        helm_argv = [str(helm), "--kubeconfig", str(self.kubeconfig), "--namespace", "eopipe-system"]
        self.undo(lambda: self.kubectl("delete", "namespace", NS, "--timeout=180s", timeout=200))
        self.undo(lambda: _run([*helm_argv, "uninstall", "eopipe", "--wait"], env=env))
        _run([*helm_argv, "install", "eopipe", str(REPO / "charts" / "eopipe"), "--create-namespace",
              "--set", f"watchNamespaces={{{NS}}}", *sets, "--wait", "--timeout", "240s"], env=env, timeout=300)
        self.kubectl("-n", "eopipe-system", "rollout", "status", "deployment/eopipe", "--timeout=120s")
        say("operator", "running as a pod under its own ServiceAccount")

    def helm_values(self) -> dict[str, str]:
        # The node agent has no in-cluster mount: the pod builds a kubeconfig from its
        # ServiceAccount token; pods share the host's ports, so it listens on its pod IP.
        return {"serviceAccountKubeconfig.enabled": "true", "serviceAccountKubeconfig.server": self.cp.server,
                "bindAddress": "$(POD_IP)", "resyncSeconds": "5"}

    def pipeline(self) -> dict:
        group, version, plural = RESOURCE
        return self.custom.get_namespaced_custom_object(group, version, NS, plural, "payments")

    def patch(self, spec: dict) -> None:
        group, version, plural = RESOURCE
        self.custom.patch_namespaced_custom_object(group, version, NS, plural, "payments", {"spec": spec})

    @staticmethod
    def settled(obj: dict, after: int) -> bool:
        """Ready at its generation, no rebalance under way, and one newer than `after` recorded."""
        st = obj.get("status") or {}
        ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
        return (ready.get("status") == "True" and st.get("observedGeneration") == obj["metadata"]["generation"]
                and not st.get("rebalance") and (st.get("lastRebalance") or {}).get("id", -1) > after)

    def rebalance(self, what: str, spec: dict) -> None:
        last = (self.pipeline().get("status") or {}).get("lastRebalance", {}).get("id", -1)
        say("rebalance", what)
        t, phase = time.monotonic(), None
        self.patch(spec)

        def done():
            nonlocal phase
            obj = self.pipeline()
            now = ((obj.get("status") or {}).get("rebalance") or {}).get("phase")
            if now and now != phase:
                phase = now
                say("rebalance", f"  phase {now}")
            return obj if self.settled(obj, last) else None
        obj = wait(done, 600, what, interval=0.5)
        say("rebalance", f"done in {time.monotonic() - t:.1f}s: {_summary(obj['status']['lastRebalance'])}")

    def kill_dedup_pod(self, pod: str) -> None:
        before = self._restarts(pod)
        say("fault", f"SIGKILL the container of {pod} (a crash, mid-transaction); the node restarts it")
        t = time.monotonic()
        self.agent.kill_pod_process(NS, pod)
        wait(lambda: self._restarts(pod) > before and self._ready(pod), 180, f"{pod} Ready again")
        say("fault", f"{pod} Ready again in {time.monotonic() - t:.1f}s (recovered from its RocksDB state)")

    def kill_spark_driver(self) -> None:
        app = self.spark_app()
        attempts = app["status"].get("executionAttempts", 0)
        pidfile = next((self.workdir / "spark" / "apps").glob(f"{NS}_{app['metadata']['name']}_*/pid"))
        say("fault", f"SIGKILL the Spark driver of {app['metadata']['name']} while it streams")
        t = time.monotonic()
        os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        wait(lambda: (st := self.spark_app()["status"]).get("executionAttempts", 0) > attempts
             and st["applicationState"]["state"] == "RUNNING", 300, "the Spark driver RUNNING again")
        say("fault", f"driver resubmitted (restartPolicy OnFailure) and RUNNING in {time.monotonic() - t:.1f}s; "
                     "it resumes from its checkpoint")

    def last_event(self, reason: str, timeout: float = 60) -> str:
        """The message of the pipeline's newest event with this reason. Kopf posts events in the
        background, a little after the pass that made them: waited for."""
        deadline = time.monotonic() + timeout
        while not (events := self.core.list_namespaced_event(NS, field_selector=f"reason={reason}").items):
            if time.monotonic() > deadline:
                return f"none after {timeout:.0f}s"
            time.sleep(1)
        return max(events, key=lambda e: str(e.last_timestamp or e.event_time or "")).message

    def spark_caught_up(self, since_ms: int, timeout: float = 600) -> None:
        """The node agent's Spark runner makes no driver pod, so the operator has no progress to
        read: the end-to-end verify's settle time covers the Spark stage there."""

    def spark_app(self) -> dict:
        apps = self.custom.list_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", NS,
                                                         "sparkapplications")["items"]
        return apps[0]

    def _pod(self, pod: str):
        try:
            return self.core.read_namespaced_pod(pod, NS)
        except Exception:  # noqa: BLE001 - recreated or not there yet
            return None

    def _restarts(self, pod: str) -> int:
        p = self._pod(pod)
        return sum(c.restart_count for c in (p.status.container_statuses or [])) if p else -1

    def _ready(self, pod: str) -> bool:
        p = self._pod(pod)
        return bool(p and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))


class NodeCluster(Cluster):
    """The node tier (`make cluster`): kubelet, containerd and the project's own images in a
    network namespace, which this process joins, as kubectl and helm then do."""

    def __init__(self, workdir: Path, stack: contextlib.ExitStack, on_cluster: bool = False):
        from kubernetes import client, config

        from localenv.node import NODE_IP
        from localenv.node import __main__ as node
        from localenv.node.addons import KAFKA_PORT
        from localenv.node.host import join_netns, leave_netns

        self.workdir, self.kill_container, self.stack, self.reused = workdir, node.kill_container, stack, on_cluster
        if on_cluster:
            say("kubernetes", "the node tier that `make cluster` started; the demo removes only what it makes")
        else:
            say("kubernetes", "make cluster: control plane, containerd, kubelet, kube-proxy, CoreDNS, "
                              "local-path-provisioner, Kafka on the node address, the Kubeflow Spark Operator; "
                              "images built or from the cache")
            stack.callback(subprocess.run, [sys.executable, "-m", "localenv.node", "down"], cwd=REPO,
                           stdout=subprocess.DEVNULL)
            if subprocess.run([sys.executable, "-m", "localenv.node", "up"], cwd=REPO).returncode != 0:
                raise RuntimeError("the node tier did not start (its output is above; without root: --process-node)")
        stack.callback(leave_netns, join_netns())  # back out before `down` sweeps the namespace
        self.images = json.loads(node.IMAGES.read_text())
        self.kubeconfig, self.kubectl_bin = node.KUBECONFIG, node._k8s_bin() / "kubectl"
        self.bootstrap = f"{NODE_IP}:{KAFKA_PORT}"
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def undo(self, fn) -> None:
        if self.reused:
            self.stack.callback(_quietly, fn)

    def helm_values(self) -> dict[str, str]:
        (repo, tag), (srepo, stag) = self.images["app"].rsplit(":", 1), self.images["spark"].rsplit(":", 1)
        return {"image.repository": repo, "image.tag": tag, "sparkImage.repository": srepo, "sparkImage.tag": stag,
                "resyncSeconds": "10"}  # status (the Spark stage's progress too) within seconds

    def spark_caught_up(self, since_ms: int, timeout: float = 600) -> None:
        """Until status.processing (the operator reads it from the driver) shows a batch that
        ended after `since_ms`, with no lag when `since_ms` is set: the Spark stage has read all
        of the deduped topic."""
        t = time.monotonic()

        def done():
            proc = (self.pipeline().get("status") or {}).get("processing") or {}
            ended = proc.get("lastBatchTime")
            ended_ms = datetime.fromisoformat(ended.replace("Z", "+00:00")).timestamp() * 1000 if ended else -1
            return proc if ended_ms >= since_ms and (not since_ms or proc.get("lagRecords") == 0) else None
        proc = wait(done, timeout, "the Spark stage's progress in status.processing", interval=2)
        say("spark", f"status.processing after {time.monotonic() - t:.1f}s: batch {proc['lastBatchId']}, lag "
                     f"{proc.get('lagRecords')}, {proc.get('processedRowsPerSecond')} rows/s in its last batch")

    def kill_dedup_pod(self, pod: str) -> None:
        before = self._restarts(pod)
        say("fault", f"SIGKILL the container of {pod} through containerd (a crash, mid-transaction); the kubelet restarts it")
        t = time.monotonic()
        self.kill_container(NS, pod)
        wait(lambda: self._restarts(pod) > before and self._ready(pod), 180, f"{pod} Ready again")
        say("fault", f"{pod} Ready again in {time.monotonic() - t:.1f}s (recovered from its RocksDB state)")

    def kill_spark_driver(self) -> None:
        def running():
            app = self.spark_app()
            st = app.get("status") or {}
            up = st.get("applicationState", {}).get("state") == "RUNNING" and st.get("driverInfo", {}).get("podName")
            return app if up else None
        app = wait(running, 300, "the Spark driver RUNNING")
        attempts = app["status"].get("executionAttempts", 0)
        say("fault", f"SIGKILL the Spark driver container of {app['metadata']['name']} while it streams")
        t = time.monotonic()
        self.kill_container(NS, app["status"]["driverInfo"]["podName"])
        wait(lambda: (st := self.spark_app()["status"]).get("executionAttempts", 0) > attempts
             and st["applicationState"]["state"] == "RUNNING", 300, "the Spark driver RUNNING again")
        say("fault", f"driver resubmitted (restartPolicy OnFailure) and RUNNING in {time.monotonic() - t:.1f}s; "
                     "it resumes from its checkpoint on its claim")


def _summary(lr: dict) -> str:
    """status.lastRebalance in one line."""
    if lr.get("type") == "partitions":
        rebuilt = f", {len(lr['rebuilt'])} partitions rebuilt" if lr.get("rebuilt") else ""
        return (f"partitions {lr['fromPartitions']} -> {lr['toPartitions']}: {lr.get('keysMoved', 0)} keys "
                f"({lr.get('bytesMoved', 0) / 1e6:.2f} MB) re-sharded{rebuilt}, "
                f"dedup stage paused {lr.get('pauseMs', 0) / 1000:.1f}s")
    return (f"replicas {lr.get('fromReplicas')} -> {lr.get('toReplicas')}: {lr.get('partitionsMoved', 0)} "
            f"partitions moved ({lr.get('snapshot', 0)} by snapshot, {lr.get('rebuild', 0)} rebuilt, "
            f"{lr.get('bytesMoved', 0) / 1e6:.2f} MB), longest handoff pause {lr.get('maxPauseMs', 0)} ms")


def _quietly(fn) -> None:
    """A teardown step: its failure is said, the rest of the teardown still runs."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        say("teardown", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _run(cmd: list[str], input: str | None = None, env: dict | None = None, timeout: float = 300) -> str:
    res = subprocess.run(cmd, input=input, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} {' '.join(cmd[1:4])} ... failed ({res.returncode}):\n"
                           f"{res.stderr.strip()}")
    return res.stdout


def _output(cmd: list[str]) -> list[str]:
    """The stdout lines of a hack/ script (its progress goes to stderr)."""
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, timeout=3600).stdout.split()


def run_full(args, stack: contextlib.ExitStack) -> int:
    if args.process_node:
        kafka = start_kafka(args.workdir, stack)
        cluster, bootstrap = Cluster(args.workdir, stack), kafka.bootstrap
    else:  # the node tier has its broker on the node address, behind kafka.kafka.svc
        kafka, cluster = None, NodeCluster(args.workdir, stack, args.on_cluster)
        bootstrap = cluster.bootstrap
    cluster.helm_install()

    doc = yaml.safe_load((REPO / "examples" / "payments.yaml").read_text())
    if kafka is not None:  # pods are processes on this host: they reach the broker here
        doc["spec"]["kafka"]["bootstrapServers"] = kafka.bootstrap
    say("pipeline", f"kubectl apply -f examples/payments.yaml -n {NS} "
                    f"(bootstrapServers={doc['spec']['kafka']['bootstrapServers']})")
    # Last made, first gone: with its topics (deletionPolicy Delete) while its operator still runs.
    cluster.undo(lambda: cluster.kubectl("delete", "-n", NS, "eop", "payments", "--timeout=180s", timeout=200))
    cluster.undo(lambda: cluster.patch({"deletionPolicy": "Delete"}))
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(doc))
    t = time.monotonic()
    cluster.kubectl("wait", "-n", NS, "eop/payments", "--for=condition=Ready", "--timeout=400s", timeout=420)
    say("pipeline", f"Ready in {time.monotonic() - t:.1f}s: topics, 2 dedup pods, Spark driver RUNNING")
    if args.break_dedup:
        say("pipeline", "dedup step BROKEN on purpose: kubectl set env statefulset/payments-dedup EOPIPE_FAULT=no_dedup")
        cluster.kubectl("-n", NS, "set", "env", "statefulset/payments-dedup", f"EOPIPE_FAULT={BROKEN}")
        cluster.kubectl("-n", NS, "rollout", "status", "statefulset/payments-dedup", "--timeout=300s")
    print(cluster.kubectl("get", "eop", "-n", NS), end="", flush=True)

    names = Names(NS, "payments", PipelineSpec.model_validate(doc["spec"]))
    load = Load(bootstrap, names.source_topic, args.records, args.rate)
    time.sleep(args.records / args.rate * 0.1)
    cluster.kill_dedup_pod("payments-dedup-1")
    if kafka is not None:
        broker_restart(kafka)
    else:
        say("fault", "no broker restart here: the node tier's broker is one process (the process tiers prove broker faults)")
    # The operator's autoscaler, under the load still running: one pod per 40% of it asks for 3.
    per_pod = max(1, int(args.rate * 0.4))
    cluster.rebalance(f"autoscaling on: 2 to 3 dedup pods, one per {per_pod} records/s; at {args.rate:.0f}/s the "
                      "operator scales 2 -> 3 (state moves by snapshot)",
                      {"dedup": {"autoscale": {"minReplicas": 2, "maxReplicas": 3, "scaleUpStabilization": "0s",
                                               "targetRecordsPerSecondPerReplica": per_pod}}})
    say("rebalance", f"the operator's Autoscaled event: {cluster.last_event('Autoscaled')}")
    cluster.spark_caught_up(0)  # a first batch committed: the kill below is mid-stream
    cluster.kill_spark_driver()
    cluster.rebalance("add source partitions 8 -> 12 (pause, re-shard state, resume)", {"source": {"partitions": 12}})
    if load.thread.is_alive():
        say("load", "faults done; the load goes on to its end")
    load.finish()
    cluster.spark_caught_up(int(time.time() * 1000))
    code = drain_and_verify(bootstrap, names, spark=True)
    print(cluster.kubectl("get", "eop", "-n", NS), end="")
    print(cluster.kubectl("get", "pods", "-n", NS), end="")
    print(cluster.kubectl("get", "events", "-n", NS, "--field-selector", "involvedObject.kind=ExactlyOncePipeline",
                          "--sort-by", ".lastTimestamp"), end="", flush=True)
    return code


def _on_cluster_misuse(args) -> str | None:
    from localenv.node import RUN_DIR

    if args.quick or args.process_node:
        return "the full demo on the node tier only (not with --quick or --process-node)"
    if not (RUN_DIR / "ready").exists():
        return "no node tier is up (start one with `make cluster`)"
    return None


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(prog="hack/demo.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, help="records to send (default 40000; 20000 with --quick)")
    ap.add_argument("--rate", type=float, default=None, help="records per second (default 300; 2000 with --quick)")
    ap.add_argument("--quick", action="store_true", help="the dedup stage only, as plain processes (about a minute)")
    ap.add_argument("--break-dedup", action="store_true", help="turn the dedup step off: the verdict must fail")
    ap.add_argument("--process-node", action="store_true",
                    help="the full demo on the node agent (pods as processes) instead of the node tier")
    ap.add_argument("--on-cluster", action="store_true",
                    help="on the node tier `make cluster` started: leave it up, remove only what the demo made")
    ap.add_argument("--workdir", type=Path, default=REPO / ".work" / "demo", help="logs and data (default .work/demo)")
    args = ap.parse_args()
    if args.on_cluster and (misuse := _on_cluster_misuse(args)):
        print(f"hack/demo.py: --on-cluster: {misuse}", file=sys.stderr)
        return 2
    args.records = args.records or (20_000 if args.quick else 40_000)
    args.rate = args.rate or (2_000 if args.quick else 300)

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    # Ctrl-C tears down whatever this process inherited: a shell starts background jobs with
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    code = 1
    with contextlib.ExitStack() as stack:
        try:
            code = (run_quick if args.quick else run_full)(args, stack)
        except KeyboardInterrupt:
            say("interrupted", "tearing down")
            code = 130

        except Exception as e:  # noqa: BLE001 - one clear line, then the teardown
            say("error", f"{type(e).__name__}: {e}")
            code = 2
        finally:
            say("teardown", f"stopping everything; logs and data kept in {args.workdir}")
    say("done", f"total {time.monotonic() - T0:.0f}s, exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
