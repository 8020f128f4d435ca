"""spec.paused stops the Spark stage too, and resuming continues exactly once: the operator, the
control plane, the node agent (the dedup pod) and the Spark-operator stand-in running a real
driver (spark-submit) with its checkpoint on the claim the operator made."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from eopipe.control import sparkstage
from eopipe.core.names import Names
from eopipe.core.spec import RESOURCE, PipelineSpec
from eopipe.tools.loadgen import run_load
from eopipe.tools.verify import TopicReader, verify, wait_for_group
from localenv.fixtures_operator import wait_for
from tests.helpers.pipelines import (
    condition,
    example_manifest,
    get_pipeline,
    kubectl_apply,
    ready_pipeline,
    unique_topic,
)

pytestmark = [pytest.mark.k8s, pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

SPARK = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")


def _app(custom, ns: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object(*SPARK[:2], ns, SPARK[2], "payments-spark")
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _driver_group(runner, ns: str, app: dict) -> int:
    """The process group of the application's driver, from the runner's pid file."""
    md = app["metadata"]
    return int((runner.workdir / "apps" / f"{ns}_{md['name']}_{md['uid'][:8]}" / "pid").read_text())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _rows(bootstrap: str, topic: str) -> list[dict]:
    return [json.loads(m.value()) for m in TopicReader(bootstrap).read(topic, timeout=60)]


class Load:
    """Records into the source until stopped, in chunks of fresh keys (each with resends), so the
    pause lands while records still flow however slow the machine is."""

    def __init__(self, bootstrap: str, topic: str, seed: int):
        self.unique, self.error, self._stop = 0, None, threading.Event()

        def run() -> None:
            try:
                for chunk in itertools.count(seed):
                    if self._stop.is_set():
                        break
                    self.unique += run_load(bootstrap, topic, 50, dup_ratio=0.2, rate=100, seed=chunk)["unique"]
            except BaseException as e:  # noqa: BLE001 - raised by stop()
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self._stop.set()

    def stop(self) -> int:
        self._stop.set()
        self.thread.join(60)
        if self.error:
            raise self.error
        return self.unique


def _query_id(checkpoint: Path) -> str:
    """The streaming query's id, which Spark keeps in the checkpoint: a new checkpoint, a new id."""
    return json.loads((checkpoint / "metadata").read_text())["id"]


def test_pause_stops_spark_and_resume_continues_exactly_once(
        operator, spark_runner, kube_api, kafka_bootstrap, k8s_namespace, request):
    ns = k8s_namespace
    custom, core, apps = client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    topic = unique_topic("pause", ns)
    doc = example_manifest("payments.yaml", kafka_bootstrap, **{
        "source.topic": topic, "source.partitions": 2, "dedup.replicas": 1,
        "sink.kafka.topic": f"{topic}-enriched", "sink.kafka.partitions": 2})
    names = Names(ns, "payments", PipelineSpec.model_validate(doc["spec"]))
    kubectl_apply(operator.cp, ns, doc)
    wait_for(lambda: ready_pipeline(kube_api, ns, "payments"), 240, what="Ready: the dedup pod and Spark RUNNING")
    first = _app(custom, ns)
    driver = _driver_group(spark_runner, ns, first)
    claim = core.read_namespaced_persistent_volume_claim(names.spark_checkpoint_claim, ns)
    ckpt = Path(core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path) / "checkpoints" / "payments"

    # Load flows and Spark writes; the pause lands mid-stream.
    load = Load(kafka_bootstrap, topic, seed=6100)
    request.addfinalizer(load.halt)  # a failure below must not leave it producing
    wait_for(lambda: _rows(kafka_bootstrap, names.sink_topic), 180, what="Spark output flowing")
    query = _query_id(ckpt)
    group, version, plural = RESOURCE
    custom.patch_namespaced_custom_object(group, version, ns, plural, "payments", {"spec": {"paused": True}})

    wait_for(lambda: _app(custom, ns) is None, 60, what="the SparkApplication deleted")
    wait_for(lambda: not _group_alive(driver), 60, what="the Spark driver's processes gone")
    assert load.thread.is_alive(), f"the load stopped before the pause took effect: {load.error!r}"
    wait_for(lambda: apps.read_namespaced_stateful_set("payments-dedup", ns).spec.replicas == 0
             and not core.list_namespaced_pod(ns, label_selector=",".join(
                 f"{k}={v}" for k, v in names.selector("dedup").items())).items,
             120, what="the dedup stage at zero pods")
    sent = load.stop()
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "payments"))["status"].get("phase") == "Paused"
                   and condition(o, "ProcessingReady").get("reason") == "Paused"
                   and condition(o, "ProcessingReady")["message"].startswith("stopped while paused") and o,
                   60, what="phase Paused, ProcessingReady Paused")
    assert names.spark_checkpoint_claim in condition(obj, "ProcessingReady")["message"]
    stats = run_load(kafka_bootstrap, topic, 600, dup_ratio=0.2, seed=62)  # produced while paused
    sent += stats["unique"]
    paused_out = len(_rows(kafka_bootstrap, names.sink_topic))
    time.sleep(6)  # a driver left running would write the paused load's records by now
    assert len(_rows(kafka_bootstrap, names.sink_topic)) == paused_out
    assert _app(custom, ns) is None
    # The checkpoint survives the pause: the same claim, the same query in it.
    assert core.read_namespaced_persistent_volume_claim(names.spark_checkpoint_claim, ns).metadata.uid \
        == claim.metadata.uid
    assert _query_id(ckpt) == query

    custom.patch_namespaced_custom_object(group, version, ns, plural, "payments", {"spec": {"paused": False}})
    obj = wait_for(lambda: ready_pipeline(kube_api, ns, "payments"), 240, what="Ready again after the resume")
    second = _app(custom, ns)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]  # created again
    assert obj["status"]["sparkApplicationState"] == "RUNNING"

    wait_for_group(kafka_bootstrap, names.consumer_group, topic, timeout=120)
    key = names.spec.dedup.key.key_spec()
    dedup = verify(kafka_bootstrap, topic, names.deduped_topic, key_spec=key, dlq_topic=names.dlq_topic,
                   settle=5, timeout=120)
    assert dedup.ok, dedup.line()
    assert dedup.unique_in == sent, dedup.line()  # every unique record of both loads
    # The new driver's first batch is the whole backlog: wait for it before judging.
    wait_for(lambda: len(_rows(kafka_bootstrap, names.sink_topic)) >= sent, 240, what="Spark caught up")
    # Spark's Kafka sink keeps no order: exactly once is lost, duplicated and unexpected at 0.
    end = verify(kafka_bootstrap, topic, names.sink_topic, key_spec=key, settle=5, timeout=180)
    assert (end.lost, end.duplicated, end.unexpected) == (0, 0, 0), end.line()
    assert end.out == end.unique_in == dedup.unique_in, end.line()
    assert _query_id(ckpt) == query  # resumed from the checkpoint, not a new run

    # The rows themselves: the SQL's projection of each unique source record, once.
    source = {}
    for m in TopicReader(kafka_bootstrap).read(topic, timeout=60):
        v = json.loads(m.value())
        source.setdefault(v["id"], (v["account"], v["amount_cents"], v["currency"], v["amount_cents"] >= 1_000_000))
    sink = {r["id"]: (r["account"], r["amount_cents"], r["currency"], r["large"])
            for r in _rows(kafka_bootstrap, names.sink_topic)}
    assert sink == source
    assert sum(a for _, a, _, _ in sink.values()) == sum(a for _, a, _, _ in source.values())

    # status.processing: the operator reads the running driver's GET /progress.
    _check_processing_status(kube_api, core, ns, names, kafka_bootstrap, topic)


def _check_processing_status(kube_api, core, ns: str, names: Names, bootstrap: str, topic: str) -> None:
    """The operator writes status.processing from the running driver's /progress: a batch id that
    grows with new records, and the lag back at 0. The runner's driver is a local process and
    the runner makes no pod: this test registers the driver pod the real operator would have
    (the driver labels, Running, the loopback address the driver serves /progress on, its
    default port), held back from the scheduler so no node agent runs it."""
    pod = core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="payments-spark-driver", labels=dict(
            kv.split("=") for kv in sparkstage.driver_selector(names.spark_app).split(","))),
        spec=client.V1PodSpec(scheduling_gates=[client.V1PodSchedulingGate(name="eopipe.dev/spark-runner")],
                              containers=[client.V1Container(name="spark-kubernetes-driver", image="spark")])))
    try:
        core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})

        def processing(done):
            st = get_pipeline(kube_api, ns, "payments")["status"].get("processing") or {}
            return done(st) and st

        first = wait_for(lambda: processing(lambda st: st.get("lastBatchId") is not None
                                            and st.get("lagRecords") == 0), 120,
                         what="status.processing caught up")
        run_load(bootstrap, topic, 200, dup_ratio=0.0, seed=63)
        later = wait_for(lambda: processing(lambda st: st.get("lastBatchId", -1) > first["lastBatchId"]
                                            and st.get("lagRecords") == 0), 180,
                         what="status.processing: a later batch, caught up again")
        assert "error" not in later and later["batchDurationMs"] >= 0 and later["lastBatchTime"].endswith("Z"), later
        obj = get_pipeline(kube_api, ns, "payments")
        assert condition(obj, "ProcessingReady")["status"] == "True", obj["status"]
    finally:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
