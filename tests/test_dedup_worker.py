"""The dedup worker against the real broker, run as real processes, under faults.

Every fault test ends with `verify` (which reads the topics, never the worker's metrics):
lost == 0 and duplicated == 0. Workers are subprocesses, so SIGKILL is a real SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes.config import new_client_from_config

from eopipe import partitioner
from eopipe.assignment import Assignment
from eopipe.builders import dedup as dedup_builders
from eopipe.builders.names import Names
from eopipe.keys import KeySpec
from eopipe.kube import Applier
from eopipe.spec import PipelineSpec
from eopipe.loadgen import run_load
from eopipe.verify import verify

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[1]
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable


# -- helpers -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pipeline:
    """Topics of one test pipeline and the worker processes that serve it."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int = 3, name: str | None = None):
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.name = name or f"t{uuid.uuid4().hex[:8]}"
        self.source, self.output, self.dlq = f"{self.name}-src", f"{self.name}-out", f"{self.name}-dlq"
        self.partitions = partitions
        self.namespace = "test"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futs = admin.create_topics([NewTopic(self.source, partitions, 1), NewTopic(self.output, 3, 1),
                                    NewTopic(self.dlq, 1, 1)])
        for f in futs.values():
            f.result(30)
        self.workers: list[WorkerProc] = []

    @property
    def group(self) -> str:
        return f"{self.namespace}.{self.name}.dedup"

    def worker(self, partitions, state: str = "a", env: dict | None = None, extra: list[str] = ()) -> "WorkerProc":
        w = WorkerProc(self, partitions, self.tmp / f"state-{state}", env or {}, list(extra),
                       log=self.tmp / f"worker-{state}-{len(self.workers)}.log")
        self.workers.append(w)
        return w

    def load(self, count: int, **kw) -> dict:
        return run_load(self.bootstrap, self.source, count, **kw)

    def committed_and_drained(self) -> bool:
        """True when, for every source partition, nothing committed lies past the group's
        committed offset (read independently of the worker, with read_committed)."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "enable.partition.eof": True})
        try:
            tps = [TopicPartition(self.source, p) for p in range(self.partitions)]
            committed = c.committed(tps, timeout=30)
            if any(tp.offset < 0 for tp in committed):
                return all(c.get_watermark_offsets(tp, timeout=30)[1] == 0 for tp in tps)
            c.assign(committed)
            pending = {tp.partition for tp in committed}
            deadline = time.monotonic() + 10
            while pending and time.monotonic() < deadline:
                for m in c.consume(100, 0.5):
                    if m.error() is None:
                        return False  # a committed record beyond the committed offset
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
            return not pending
        finally:
            c.close()

    def wait_drained(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for w in self.workers:
                w.assert_not_crashed()
            if self.committed_and_drained():
                return
            time.sleep(0.5)
        for w in self.workers:
            if w.running:
                w.proc.send_signal(signal.SIGUSR1)  # thread stacks into the log
        time.sleep(1)
        raise AssertionError(f"workers did not drain the source in {timeout}s; logs: "
                             + "; ".join(w.tail() for w in self.workers if w.proc))

    def verify(self, **kw):
        rep = verify(self.bootstrap, self.source, self.output, key_spec=KeySpec(), dlq_topic=self.dlq,
                     settle=5, timeout=300, **kw)
        print(rep.line())
        return rep

    def stop_all(self) -> None:
        for w in self.workers:
            if w.running:
                w.kill()


class WorkerProc:
    def __init__(self, pipe: Pipeline, partitions, state_dir: Path, env: dict, extra: list[str], log: Path):
        self.pipe, self.partitions, self.state_dir, self.env, self.extra = pipe, partitions, state_dir, env, extra
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0

    def cmd(self) -> list[str]:
        p = self.pipe
        own = (["--partitions", ",".join(map(str, self.partitions))]
               if not isinstance(self.partitions, Path) else ["--assignment-file", str(self.partitions)])
        return [PYTHON, "-m", "eopipe.dedup", "--bootstrap", p.bootstrap, "--source-topic", p.source,
                "--output-topic", p.output, "--dlq-topic", p.dlq, "--pipeline", p.name,
                "--namespace", p.namespace, *own, "--state-dir", str(self.state_dir),
                "--http-port", str(self.port), "--memory-mb", "32", "--window", "1h", *self.extra]

    def start(self, env: dict | None = None) -> "WorkerProc":
        self.port = free_port()
        self.starts += 1
        with open(self.log, "a") as f:
            f.write(f"--- start {self.starts}\n")
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(self.cmd(), stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env, **(env or {})}, cwd=REPO)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def status(self) -> dict:
        return json.loads(self.get("/status")[1])

    def wait_ready(self, timeout: float = 120) -> "WorkerProc":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_not_crashed()
            try:
                if self.get("/readyz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"worker not ready in {timeout}s: {self.tail()}")

    def assert_not_crashed(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and self.proc.returncode not in (0, -9, 137):
            raise AssertionError(f"worker exited {self.proc.returncode}: {self.tail()}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in self.get("/metrics")[1].decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def logs(self) -> list[dict]:
        docs = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    docs.append(json.loads(line))
                except ValueError:
                    pass
        return docs

    def tail(self, n: int = 40) -> str:
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if not ln.startswith("%")]
        return f"{self.log}:\n" + "\n".join(lines[-n:])


def metric_sum(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if re.match(rf"{name}(\{{|$)", k))


def background_load(pipe: Pipeline, count: int, **kw) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            result.update(pipe.load(count, **kw))
        except BaseException as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def finish_load(t: threading.Thread, result: dict, timeout: float = 300) -> dict:
    t.join(timeout)
    assert not t.is_alive(), "load did not finish"
    if "error" in result:
        raise result["error"]
    return result


@pytest.fixture
def pipe(kafka_bootstrap, tmp_path):
    p = Pipeline(kafka_bootstrap, tmp_path)
    yield p
    p.stop_all()


def assert_clean(rep, poison: int = 0) -> None:
    assert rep.lost == 0, rep.line() + f" {rep.examples}"
    assert rep.duplicated == 0, rep.line() + f" {rep.examples}"
    assert rep.unexpected == 0, rep.line()
    assert rep.malformed_in == poison
    assert rep.dead_lettered == poison, rep.line()
    assert rep.ok


# -- tests ---------------------------------------------------------------------------------------
def test_dedup_reroute_dlq_metrics_and_clean_shutdown(pipe):
    w = pipe.worker([0, 1, 2]).start().wait_ready()
    stats = pipe.load(6000, dup_ratio=0.3, wrong_partition_ratio=0.1, poison=25, seed=1)
    pipe.wait_drained()
    m = w.metrics()
    st = w.status()
    assert st["ready"] and all(v["state"] == "running" for v in st["partitions"].values())
    assert w.terminate() == 0, w.tail()
    rep = pipe.verify()
    assert_clean(rep, poison=25)
    assert rep.unique_in == stats["unique"] and rep.out == stats["unique"]
    assert rep.aborted_reads == 0
    # The worker's own counters agree with the topics (they are not what the test trusts).
    assert metric_sum(m, "eopipe_dedup_emitted_total") == stats["unique"]
    assert metric_sum(m, "eopipe_dedup_dead_lettered_total") == 25
    assert metric_sum(m, "eopipe_dedup_rerouted_total") >= stats["wrong_partition"] * 0.5
    assert metric_sum(m, "eopipe_dedup_duplicates_total") == (
        metric_sum(m, "eopipe_dedup_consumed_total") - stats["unique"] - 25
        - metric_sum(m, "eopipe_dedup_rerouted_total"))
    assert metric_sum(m, "eopipe_dedup_effective_window_seconds") == 3 * 3600
    assert metric_sum(m, "eopipe_dedup_commit_seconds_count") > 0
    # Dead letters carry the reason and where they came from.
    c = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([pipe.dlq])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 25 and time.monotonic() < deadline:
        got += [m for m in c.consume(100, 0.5) if m.error() is None]
    c.close()
    assert len(got) == 25
    h = dict(got[0].headers())
    assert h["eopipe.origin.topic"] == pipe.source.encode()
    assert int(h["eopipe.origin.offset"]) >= 0 and b"key" in h["eopipe.dlq.reason"]


def resend_all(pipe: Pipeline) -> int:
    """Re-sends every keyed source record once more, to its home partition: a worst-case
    redelivery. Any key the state forgot then shows up as a duplicate in verify."""
    from eopipe.verify import TopicReader

    prod = Producer({"bootstrap.servers": pipe.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    n = 0
    seen = set()
    for m in TopicReader(pipe.bootstrap).read(pipe.source, timeout=120):
        if not m.key() or m.key() in seen:
            continue
        seen.add(m.key())
        prod.produce(pipe.source, m.value(), m.key(), partitioner.murmur2_partition(m.key(), pipe.partitions),
                     timestamp=m.timestamp()[1])
        prod.poll(0)
        n += 1
    assert prod.flush(60) == 0
    return n


def recoveries(w: WorkerProc) -> list[dict]:
    return [d for d in w.logs() if d.get("msg") == "partition running"]


@pytest.mark.parametrize("key", ["key", "json:id"])
def test_poison_records_dead_lettered_with_key_spec(pipe, key):
    w = pipe.worker([0, 1, 2], extra=["--key", key]).start().wait_ready()
    stats = pipe.load(2000, poison=40, seed=2)
    pipe.wait_drained()
    assert w.terminate() == 0
    rep = verify(pipe.bootstrap, pipe.source, pipe.output, key_spec=KeySpec.parse(key),
                 dlq_topic=pipe.dlq, settle=5)
    assert_clean(rep, poison=40)
    assert rep.out == stats["unique"]


def test_crash_between_kafka_commit_and_rocksdb_write(pipe):
    """The test hook exits right after commit_transaction, before the RocksDB write: the
    restart must replay [applied, committed) into the state or it would re-emit."""
    w = pipe.worker([0, 1, 2])
    t, res = background_load(pipe, 30_000, dup_ratio=0.3, rate=6000, seed=3)
    replays = 0
    for nth in (3, 7, 2):
        w.start(env={"EOPIPE_FAULT": f"crash_after_commit:{nth}"})
        assert w.wait_exit(120) == 137, w.tail()
        assert any(d.get("msg", "").startswith("fault injected") for d in w.logs())
    w.start().wait_ready()
    # Every restart after a crash found the store behind Kafka and replayed the gap.
    rec = recoveries(w)
    replays = sum(1 for d in rec if d["recovery"] == "replay" and d["replayed"] > 0)
    assert replays >= 3, rec
    finish_load(t, res)
    resend_all(pipe)
    pipe.wait_drained()
    assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_rebuild_when_state_dir_deleted(pipe):
    w = pipe.worker([0, 1, 2]).start().wait_ready()
    stats = pipe.load(8000, seed=4)
    pipe.wait_drained()
    assert w.terminate() == 0
    import shutil

    shutil.rmtree(w.state_dir)
    w.start().wait_ready()
    rec = [d for d in recoveries(w) if d["recovery"] == "rebuild"]
    assert {d["partition"] for d in rec} == {0, 1, 2}
    assert sum(d["replayed"] for d in rec) >= 8000
    m = w.metrics()
    assert metric_sum(m, "eopipe_dedup_rebuilds_total") == 3
    assert metric_sum(m, "eopipe_dedup_state_keys") > 0
    resend_all(pipe)  # all old keys again: the rebuilt state must know every one
    stats2 = pipe.load(2000, seed=5)
    pipe.wait_drained()
    assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == rep.unique_in == stats["unique"] + stats2["unique"]


def test_two_workers_for_the_same_partitions_older_is_fenced(pipe):
    a = pipe.worker([0, 1, 2], state="a").start().wait_ready()
    t, res = background_load(pipe, 40_000, dup_ratio=0.3, rate=8000, seed=6)
    time.sleep(1.5)  # let A be mid-stream (not an assertion: the test checks A got fenced)
    b = pipe.worker([0, 1, 2], state="b").start().wait_ready()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = a.status()["partitions"]
        if all(v["state"] == "fenced" for v in parts.values()):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"A was not fenced: {a.status()}")
    assert a.get("/readyz")[0] == 503
    assert a.running  # a fenced partition stops; the process stays to report it
    finish_load(t, res)
    pipe.wait_drained()
    assert b.terminate() == 0
    assert a.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_broker_restart_during_load(pipe, kafka):
    w = pipe.worker([0, 1, 2]).start().wait_ready()
    t, res = background_load(pipe, 30_000, dup_ratio=0.25, rate=5000, seed=7)
    time.sleep(2)  # mid-load (the load thread keeps producing through the restart)
    kafka.restart(kill=True, down_seconds=3)
    finish_load(t, res)
    pipe.wait_drained(timeout=300)
    assert w.running, w.tail()
    assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


@pytest.mark.slow
def test_sigkill_mid_transaction_repeatedly_100k(pipe):
    """Kafka's transactions system test, shape-wise: >= 100,000 records with duplicates
    copied while workers are SIGKILLed again and again."""
    pipe2 = pipe
    ws = [pipe2.worker([0, 1], state="a"), pipe2.worker([2], state="b")]
    for w in ws:
        w.start()
    for w in ws:
        w.wait_ready()
    t, res = background_load(pipe2, 120_000, dup_ratio=0.25, rate=8_000, seed=8)
    rng = random.Random(8)
    kills = 0
    # At least 4 kills whatever the machine's speed; that they hit open transactions is
    # asserted below (aborted reads), not assumed from timing.
    while kills < 4 or (t.is_alive() and kills < 6):
        time.sleep(rng.uniform(0.5, 2.0))  # pacing between kills, not an assertion
        w = rng.choice(ws)
        w.kill()
        kills += 1
        w.start().wait_ready()
    finish_load(t, res)
    pipe2.wait_drained(timeout=300)
    for w in ws:
        assert w.terminate() == 0
    rep = pipe2.verify()
    assert_clean(rep)
    assert rep.unique_in == res["unique"] and rep.out == res["unique"]
    assert res["records"] >= 100_000
    # The kills really hit open transactions: their records were aborted, not delivered.
    assert rep.aborted_reads > 0, rep.line()


@pytest.mark.k8s
def test_assignment_configmap_watched_with_the_pods_own_rbac(pipe, control_plane, kube_api, k8s_namespace):
    """A new generation reaches the worker through its watch on the ConfigMap while the mounted
    file is still old (a real kubelet refreshes it only every minute or so), using the token of
    the ServiceAccount the operator gives dedup pods; partition 2 then moves under load."""
    from kubernetes import client

    names = Names(k8s_namespace, pipe.name, PipelineSpec.model_validate(
        yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())["spec"]))
    applier = Applier(kube_api)
    for manifest in dedup_builders.rbac(names):
        applier.apply(manifest)
    gen1 = Assignment(1, {0: "pod-a", 1: "pod-a", 2: "pod-a"})
    applier.apply(dedup_builders.assignment_configmap(names, gen1))
    token = client.CoreV1Api(kube_api).create_namespaced_service_account_token(
        names.dedup, k8s_namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))).status.token
    kubeconfig = pipe.tmp / "dedup-pod.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "c", "cluster": {"server": control_plane.server,
                                               "certificate-authority": str(control_plane.ca_cert)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "sa"}}]}))
    # The Role grants that one ConfigMap and nothing else.
    as_pod = client.CoreV1Api(new_client_from_config(config_file=str(kubeconfig)))
    as_pod.read_namespaced_config_map(names.assignment_configmap, k8s_namespace)
    for forbidden in (lambda: as_pod.list_namespaced_config_map(k8s_namespace),
                      lambda: as_pod.read_namespaced_config_map("kube-root-ca.crt", k8s_namespace)):
        with pytest.raises(client.ApiException) as e:
            forbidden()
        assert e.value.status == 403

    pipe.namespace = k8s_namespace
    path = pipe.tmp / "assignment.json"
    path.write_text(json.dumps(gen1.to_json()))
    watch = ["--assignment-configmap", names.assignment_configmap]
    env = {"KUBECONFIG": str(kubeconfig)}
    a = pipe.worker(path, state="a", env=env, extra=["--pod-name", "pod-a", *watch]).start().wait_ready()
    b = pipe.worker(path, state="b", env=env, extra=["--pod-name", "pod-b", *watch]).start().wait_ready()
    t, res = background_load(pipe, 20_000, dup_ratio=0.3, rate=8000, seed=19)
    time.sleep(1)  # mid-load
    applier.apply(dedup_builders.assignment_configmap(
        names, Assignment(2, {0: "pod-a", 1: "pod-a", 2: "pod-b"})))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sa, sb = a.status(), b.status()
        if (sa["generation"], sb["generation"]) == (2, 2) and sa["ready"] and sb["ready"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"the ConfigMap's generation 2 was not followed: {a.status()} {b.status()}")
    assert json.loads(path.read_text())["generation"] == 1  # the file never changed
    assert sa["owned"] == [0, 1] and sb["owned"] == [2]
    finish_load(t, res)
    pipe.wait_drained()
    assert a.terminate() == 0 and b.terminate() == 0
    assert not [d for d in a.logs() + b.logs() if "cannot watch" in d.get("msg", "")]
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_assignment_file_moves_a_partition_between_workers(pipe):
    """The operator's assignment (a mounted file) is re-read on change: partition 2 moves
    from pod-a to pod-b under load; pod-b has no state for it and rebuilds from the source."""
    path = pipe.tmp / "assignment.json"
    path.write_text(json.dumps({"generation": 1, "assignments": {"pod-a": [0, 1, 2]}}))
    a = pipe.worker(path, state="a", extra=["--pod-name", "pod-a"]).start().wait_ready()
    b = pipe.worker(path, state="b", extra=["--pod-name", "pod-b"]).start().wait_ready()
    assert b.status()["owned"] == [] and b.get("/readyz")[0] == 200
    t, res = background_load(pipe, 20_000, dup_ratio=0.3, rate=8000, seed=9)
    time.sleep(1)  # mid-load
    tmp = path.with_suffix(".new")  # replaced atomically, as a ConfigMap volume does
    tmp.write_text(json.dumps({"generation": 2, "assignments": {"pod-a": [0, 1], "pod-b": [2]}}))
    tmp.replace(path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sa, sb = a.status(), b.status()
        if (sa["generation"], sb["generation"]) == (2, 2) and sb["ready"] and sa["ready"] \
                and "2" not in sa["partitions"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"assignment not followed: {a.status()} {b.status()}")
    assert sb["owned"] == [2] and sa["owned"] == [0, 1]
    finish_load(t, res)
    pipe.wait_drained()
    assert a.terminate() == 0 and b.terminate() == 0
    assert any(d["partition"] == 2 and d["recovery"] == "rebuild" for d in recoveries(b))
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]
