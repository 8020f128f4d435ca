"""The operator on the real control plane, real Kafka and the node agent (pods run the real worker)."""

import json
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from kubernetes import client

from tests.localenv.fixtures_operator import kubectl, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[1]


def _manifest(example: str, bootstrap: str, **spec_over) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["spec"]["kafka"]["bootstrapServers"] = bootstrap
    for path, value in spec_over.items():
        node = doc["spec"]
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return doc


def _apply(cp, ns: str, doc: dict, check: bool = True):
    return kubectl(cp, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def _get(kube_api, ns: str, name: str) -> dict:
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "eopipe.dev", "v1alpha1", ns, "exactlyoncepipelines", name)


def _condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def _ready(kube_api, ns, name):
    obj = _get(kube_api, ns, name)
    return obj if _condition(obj, "Ready").get("status") == "True" and \
        obj["status"].get("observedGeneration") == obj["metadata"]["generation"] else None


def _unique(name: str, ns: str) -> str:
    # Topics are cluster-wide: each test's source topic carries its namespace.
    return f"{name}-{ns}"


def test_minimal_pipeline_becomes_ready(operator, kube_api, kafka_bootstrap, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    doc = _manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": _unique("events", ns),
                                                         "dedup.replicas": 2})
    _apply(cp, ns, doc)
    obj = wait_for(lambda: _ready(kube_api, ns, "minimal"), 180, what="Ready=True")
    assert obj["status"]["phase"] == "Running"
    assert {c["type"] for c in obj["status"]["conditions"]} >= {
        "Ready", "Reconciling", "Stalled", "TopicsReady", "DedupReady", "ProcessingReady"}

    topic = doc["spec"]["source"]["topic"]
    md = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert len(md[topic].partitions) == 4 and len(md[f"{topic}.deduped"].partitions) == 4
    assert f"{topic}.dlq" in md

    apps = client.AppsV1Api(kube_api)
    # Ready was observed with 2 ready pods; a probe missed on a busy machine may flip one briefly.
    sts = wait_for(lambda: (s := apps.read_namespaced_stateful_set("minimal-dedup", ns)).status.ready_replicas == 2
                   and s, 60, what="2 ready dedup pods")
    assert sts.metadata.owner_references[0].kind == "ExactlyOncePipeline"
    assignment = obj["status"]["assignment"]
    assert sorted(p for pod in ("minimal-dedup-0", "minimal-dedup-1") for p in assignment[pod]) == [0, 1, 2, 3]

    table = kubectl(cp, "get", "eop", "-n", ns).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "READY", "PARTITIONS", "REPLICAS", "AGE"]
    assert row.split()[:5] == ["minimal", "Running", "True", "4", "2"]

    events = client.CoreV1Api(kube_api).list_namespaced_event(
        ns, field_selector="involvedObject.name=minimal").items
    assert any(e.reason == "Running" for e in events), [e.reason for e in events]


@pytest.mark.parametrize("over, message", [
    ({"source.partitions": 0}, "source.partitions"),
    ({"dedup.window": "500h"}, "dedup.window must not exceed source.retention"),
    ({"dedup.key": {"from": "header"}}, "dedup.key.name is required"),
    ({"source.partitioner": "fnv"}, "Unsupported value"),
])
def test_invalid_manifests_are_rejected_by_the_api_server(crds, k8s_namespace, over, message):
    doc = _manifest("minimal.yaml", "k:9092", **over)
    res = _apply(crds, k8s_namespace, doc, check=False)
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_partition_decrease_is_refused_by_the_api_server(crds, k8s_namespace):
    doc = _manifest("minimal.yaml", "k:9092")
    _apply(crds, k8s_namespace, doc)
    doc["spec"]["source"]["partitions"] = 2
    res = _apply(crds, k8s_namespace, doc, check=False)
    assert res.returncode != 0 and "may not decrease" in res.stderr, res.stderr


def test_changes_are_applied_and_drift_is_repaired(operator, kube_api, kafka_bootstrap, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    topic = _unique("events", ns)
    doc = _manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic})
    _apply(cp, ns, doc)
    first = wait_for(lambda: _ready(kube_api, ns, "minimal"), 180, what="Ready=True")
    gen = first["status"]["assignment"]["generation"]

    doc["spec"]["source"]["partitions"] = 6
    doc["spec"]["dedup"] = {"replicas": 2}
    _apply(cp, ns, doc)
    obj = wait_for(lambda: (o := _ready(kube_api, ns, "minimal")) and o["status"]["readyReplicas"] == 2 and o,
                   180, what="6 partitions on 2 ready pods")
    assert obj["status"]["assignment"]["generation"] > gen
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    md = admin.list_topics(timeout=10).topics
    assert len(md[topic].partitions) == 6 and len(md[f"{topic}.deduped"].partitions) == 6
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map("minimal-dedup-assignment", ns)
    owned = json.loads(cm.data["assignment.json"])["assignments"]
    assert sorted(p for parts in owned.values() for p in parts) == list(range(6))

    # A StatefulSet and a topic deleted by hand come back on the periodic resync.
    client.AppsV1Api(kube_api).delete_namespaced_stateful_set("minimal-dedup", ns)
    admin.delete_topics([f"{topic}.dlq"])[f"{topic}.dlq"].result(30)
    wait_for(lambda: f"{topic}.dlq" in admin.list_topics(timeout=10).topics, 60, what="DLQ topic recreated")
    wait_for(lambda: _ready(kube_api, ns, "minimal"), 180, what="Ready again after the StatefulSet was deleted")


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_deletion_policy(operator, kube_api, kafka_bootstrap, k8s_namespace, policy):
    ns, cp = k8s_namespace, operator.cp
    topic = _unique(f"del-{policy.lower()}", ns)
    doc = _manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic, "deletionPolicy": policy})
    _apply(cp, ns, doc)
    wait_for(lambda: _ready(kube_api, ns, "minimal"), 180, what="Ready=True")
    kubectl(cp, "delete", "eop", "minimal", "-n", ns, "--timeout=90s")
    apps = client.AppsV1Api(kube_api)
    wait_for(lambda: not apps.list_namespaced_stateful_set(ns).items, 60, what="StatefulSet garbage-collected")
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    if policy == "Retain":
        assert topic in topics and f"{topic}.deduped" in topics
    else:
        assert topic not in topics and f"{topic}.deduped" not in topics


def test_unreachable_kafka_never_wedges_deletion(operator, kube_api, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    doc = _manifest("minimal.yaml", "127.0.0.1:1", **{"deletionPolicy": "Delete"})
    _apply(cp, ns, doc)
    obj = wait_for(lambda: (o := _get(kube_api, ns, "minimal")).get("status") and o, 60, what="status")
    assert _condition(obj, "TopicsReady")["reason"] == "KafkaUnavailable"
    assert _condition(obj, "Ready")["status"] == "False"
    kubectl(cp, "delete", "eop", "minimal", "-n", ns, "--timeout=150s")
    events = client.CoreV1Api(kube_api).list_namespaced_event(
        ns, field_selector="involvedObject.name=minimal").items
    assert any(e.reason == "TopicsRetained" for e in events)


def test_operator_restart_continues(operator, kube_api, kafka_bootstrap, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    doc = _manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": _unique("restart", ns)})
    _apply(cp, ns, doc)
    # Kill the operator as soon as it has started working on the pipeline.
    wait_for(lambda: (_get(kube_api, ns, "minimal").get("status") or {}).get("topics"), 60, what="first status")
    operator.stop(kill=True)
    doc["spec"]["dedup"] = {"replicas": 2}
    _apply(cp, ns, doc)
    operator.start()
    obj = wait_for(lambda: (o := _ready(kube_api, ns, "minimal")) and o["status"]["readyReplicas"] == 2 and o,
                   180, what="Ready with 2 replicas after the restart")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]


def test_spark_application_state_maps_to_processing_ready(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """The operator's side of the Spark stage: it creates the SparkApplication and reads its state.
    (The state is written here by hand; tests/test_spark_app.py runs the real application.)"""
    ns, cp = k8s_namespace, operator.cp
    topic = _unique("payments", ns)
    doc = _manifest("payments.yaml", kafka_bootstrap, **{
        "source.topic": topic, "source.partitions": 2, "dedup.replicas": 1,
        "sink.kafka.topic": f"{topic}-enriched"})
    _apply(cp, ns, doc)
    custom = client.CustomObjectsApi(kube_api)
    app = wait_for(lambda: _spark_app(custom, ns), 60, what="SparkApplication")
    role = client.RbacAuthorizationV1Api(kube_api).read_namespaced_role("payments-spark", ns)
    assert role.metadata.owner_references[0].name == "payments"
    assert app["spec"]["driver"]["serviceAccount"] == "payments-spark"
    assert app["metadata"]["ownerReferences"][0]["name"] == "payments"
    assert app["spec"]["type"] == "Python" and app["spec"]["restartPolicy"]["type"] == "OnFailure"
    wait_for(lambda: _condition(_get(kube_api, ns, "payments"), "ProcessingReady").get("reason") == "SparkStarting",
             60, what="ProcessingReady=False/SparkStarting")
    assert _condition(_get(kube_api, ns, "payments"), "Ready")["status"] == "False"
    md = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert f"{topic}-enriched" in md and f"eopipe.{ns}.payments.spark-commits" in md

    def set_state(state, message=""):
        custom.patch_namespaced_custom_object_status(
            "sparkoperator.k8s.io", "v1beta2", ns, "sparkapplications", "payments-spark",
            {"status": {"applicationState": {"state": state, "errorMessage": message}}})

    set_state("RUNNING")
    obj = wait_for(lambda: _ready(kube_api, ns, "payments"), 120, what="Ready once Spark runs")
    assert obj["status"]["sparkApplicationState"] == "RUNNING"
    set_state("FAILED", "driver OOMKilled")
    obj = wait_for(lambda: (o := _get(kube_api, ns, "payments")) and
                   _condition(o, "ProcessingReady").get("reason") == "SparkFailed" and o, 60, what="SparkFailed")
    assert _condition(obj, "Ready")["status"] == "False" and "OOMKilled" in _condition(obj, "ProcessingReady")["message"]


def _spark_app(custom, ns):
    try:
        return custom.get_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", ns,
                                                   "sparkapplications", "payments-spark")
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_operator_health_and_metrics(operator, kube_api, kafka_bootstrap, k8s_namespace):
    import urllib.request

    ns = k8s_namespace
    _apply(operator.cp, ns, _manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": _unique("m", ns)}))
    wait_for(lambda: _ready(kube_api, ns, "minimal"), 180, what="Ready=True")
    health = urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=10)
    assert health.status == 200
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).read().decode()
    ok = [line for line in metrics.splitlines() if line.startswith('eopipe_operator_reconciles_total{result="ok"}')]
    assert ok and float(ok[0].split()[-1]) >= 1
    assert f'eopipe_operator_pipeline_ready{{name="minimal",namespace="{ns}"}} 1.0' in metrics
