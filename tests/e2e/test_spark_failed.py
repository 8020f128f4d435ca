"""A spec.processing that Spark cannot analyse ends the pipeline in phase Failed with Spark's own
message, through the SparkApplication's status, within a bounded time, and not in a retry loop:
the operator, the control plane, the node agent (the dedup pod) and the Spark-operator stand-in
running the real driver (spark-submit, Spark's analyser)."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from eopipe.control.builders.spark import RESTART_POLICY
from localenv.fixtures_operator import kubectl, wait_for
from tests.helpers.pipelines import (
    condition,
    example_manifest,
    get_pipeline,
    kubectl_apply,
    ready_pipeline,
    unique_topic,
    wait_passes,
)

pytestmark = [pytest.mark.k8s, pytest.mark.kafka, pytest.mark.spark]

SPARK = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
DEADLINE = 180  # seconds from apply to Failed: one driver start, on a busy two-core machine


def _app(custom, ns: str) -> dict:
    return custom.get_namespaced_custom_object(*SPARK[:2], ns, SPARK[2], "payments-spark")


def _failed(kube_api, ns: str) -> dict | None:
    obj = get_pipeline(kube_api, ns, "payments")
    ready = condition(obj, "Ready")
    ok = ((obj.get("status") or {}).get("phase") == "Failed" and ready.get("status") == "False"
          and ready.get("reason") == "SparkFailed")
    return obj if ok else None


def _apply(operator, kafka_bootstrap, ns: str, **processing) -> None:
    topic = unique_topic("badspark", ns)
    doc = example_manifest("payments.yaml", kafka_bootstrap, **{
        "source.topic": topic, "source.partitions": 2, "dedup.replicas": 1,
        "sink.kafka.topic": f"{topic}-out", "sink.kafka.partitions": 2,
        **{f"processing.{k}": v for k, v in processing.items()}})
    kubectl_apply(operator.cp, ns, doc)


def test_sql_over_a_missing_column_fails_with_sparks_message_and_is_not_retried(
        operator, spark_runner, kube_api, kafka_bootstrap, k8s_namespace):
    ns, custom = k8s_namespace, client.CustomObjectsApi(kube_api)
    _apply(operator, kafka_bootstrap, ns, sql="SELECT id, no_such_column FROM events")
    obj = wait_for(lambda: _failed(kube_api, ns), DEADLINE, what="phase Failed, Ready=False/SparkFailed")
    # Spark's own words, as its analyser put them, on the pipeline...
    for c in (condition(obj, "Ready"), condition(obj, "ProcessingReady"), condition(obj, "Stalled")):
        assert "UNRESOLVED_COLUMN" in c["message"] and "`no_such_column` cannot be resolved" in c["message"], c
    assert condition(obj, "Stalled")["status"] == "True"
    assert any(e.reason == "SparkFailed" for e in client.CoreV1Api(kube_api).list_namespaced_event(ns).items)

    # The Spark Operator's retries are bounded: the application ends FAILED after
    # 1 + onFailureRetries runs, and stays so; the operator does not submit it again.
    runs = 1 + RESTART_POLICY["onFailureRetries"]
    app = wait_for(lambda: (a := _app(custom, ns))["status"]["applicationState"]["state"] == "FAILED" and a,
                   runs * 90, what=f"SparkApplication FAILED after {runs} runs")
    assert app["status"]["executionAttempts"] == runs
    # Spark's words came through the SparkApplication's status (the stand-in's errorMessage; on
    # a cluster, the driver pod's termination message).
    assert app["status"]["applicationState"]["errorMessage"].startswith("driver container failed with ExitCode: 2")
    assert "`no_such_column` cannot be resolved" in app["status"]["applicationState"]["errorMessage"]
    wait_passes(operator, 3)
    again = _app(custom, ns)
    assert again["metadata"]["uid"] == app["metadata"]["uid"], "the operator submitted the application again"
    assert (again["status"]["executionAttempts"], again["status"]["applicationState"]["state"]) == (runs, "FAILED")
    assert _failed(kube_api, ns), condition(get_pipeline(kube_api, ns, "payments"), "Ready")

    # A fixed spec is a new submission: the pipeline runs.
    kubectl(operator.cp, "patch", "eop", "payments", "-n", ns, "--type", "merge",
            "-p", json.dumps({"spec": {"processing": {"sql": "SELECT id, account FROM events"}}}))
    obj = wait_for(lambda: ready_pipeline(kube_api, ns, "payments"), 240, what="Ready once the SQL is fixed")
    assert condition(obj, "Stalled")["status"] == "False" and obj["status"]["phase"] == "Running"


def test_a_schema_spark_cannot_parse_fails_with_sparks_message(
        operator, spark_runner, kube_api, kafka_bootstrap, k8s_namespace):
    ns = k8s_namespace
    _apply(operator, kafka_bootstrap, ns, schema="id STRING, amount BIGINTT, user STRUCT<name: STRING")
    obj = wait_for(lambda: _failed(kube_api, ns), DEADLINE, what="phase Failed, Ready=False/SparkFailed")
    msg = condition(obj, "Ready")["message"]
    assert "schema:" in msg and "BIGINTT" in msg and "SQLSTATE" in msg, msg  # Spark's parser's words
    assert condition(obj, "ProcessingReady")["message"] == msg
