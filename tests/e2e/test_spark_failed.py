"""A schema that Spark cannot parse ends the pipeline in phase Failed with Spark's own message,
through the SparkApplication's status, within a bounded time: the operator, the control plane,
the node agent (the dedup pod) and the Spark-operator stand-in running the real driver
(spark-submit, Spark's parser). SQL Spark cannot analyse (Failed with its words, not retried,
then fixed) runs on the node tier through the real Spark Operator
(tests/e2e/test_node_tier.py::test_bad_sql_fails_with_sparks_message_and_is_not_retried)."""

from __future__ import annotations

import pytest

from localenv.fixtures_operator import wait_for
from tests.helpers.pipelines import condition, example_manifest, get_pipeline, kubectl_apply, unique_topic

pytestmark = [pytest.mark.k8s, pytest.mark.kafka, pytest.mark.spark]

DEADLINE = 180  # seconds from apply to Failed: one driver start, on a busy two-core machine


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


def test_a_schema_spark_cannot_parse_fails_with_sparks_message(
        operator, spark_runner, kube_api, kafka_bootstrap, k8s_namespace):
    ns = k8s_namespace
    _apply(operator, kafka_bootstrap, ns, schema="id STRING, amount BIGINTT, user STRUCT<name: STRING")
    obj = wait_for(lambda: _failed(kube_api, ns), DEADLINE, what="phase Failed, Ready=False/SparkFailed")
    msg = condition(obj, "Ready")["message"]
    assert "schema:" in msg and "BIGINTT" in msg and "SQLSTATE" in msg, msg  # Spark's parser's words
    assert condition(obj, "ProcessingReady")["message"] == msg
