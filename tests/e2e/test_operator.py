"""The operator on the real control plane, real Kafka and the node agent (pods run the real worker)."""

import json
import subprocess
import sys

import pytest
import yaml
from confluent_kafka.admin import AdminClient, ConfigResource
from kubernetes import client

from eopipe.control.kube import Applier
from eopipe.control.settings import Settings
from eopipe.core.kafkaconf import OPT_IN
from eopipe.core.names import deduped_topic, dlq_topic
from localenv.fixtures_operator import kubectl, wait_for
from tests.helpers.manifests import differences
from tests.helpers.pipelines import (
    condition,
    example_manifest,
    get_pipeline,
    kubectl_apply,
    object_events,
    ready_pipeline,
    set_topic_config,
    topic_config,
    unique_topic,
    wait_passes,
)

pytestmark = [pytest.mark.k8s, pytest.mark.kafka]

def test_minimal_pipeline_becomes_ready(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """In a namespace whose PodSecurity admission enforces `restricted`: the pods the StatefulSet
    controller creates are admitted, and the live pod carries the production defaults and the
    spec's pod template and image pull secrets (docs/operations.md#pod-defaults)."""
    from tests.helpers.podsecurity import restrict_namespace

    ns, cp = k8s_namespace, operator.cp
    restrict_namespace(kube_api, ns)
    core = client.CoreV1Api(kube_api)
    # An image pull Secret reaches a pipeline only once opened to it (docs/security.md).
    core.create_namespaced_secret(ns, {"metadata": {"name": "registry", "annotations": {OPT_IN: "minimal"}},
                                       "type": "kubernetes.io/dockerconfigjson",
                                       "stringData": {".dockerconfigjson": '{"auths": {}}'}})
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{
        "source.topic": unique_topic("events", ns), "dedup.replicas": 2,
        "dedup.podTemplate": {"labels": {"team": "data"}, "env": [{"name": "TEAM", "value": "data"}]},
        "imagePullSecrets": [{"name": "registry"}]})
    kubectl_apply(cp, ns, doc)

    def ready():
        refused = [e.message for e in object_events(kube_api, ns, "minimal-dedup") if e.reason == "FailedCreate"]
        if refused:
            raise AssertionError(f"the StatefulSet's pod was refused: {refused[0]}")
        return ready_pipeline(kube_api, ns, "minimal")
    obj = wait_for(ready, 180, what="Ready=True in a namespace enforcing the restricted standard")
    assert obj["status"]["phase"] == "Running"
    assert {c["type"] for c in obj["status"]["conditions"]} >= {
        "Ready", "Reconciling", "Stalled", "TopicsReady", "DedupReady", "ProcessingReady"}
    # One broker and no replicationFactor: the topics get what fits, and TopicsReady says so.
    topics_ready = next(c for c in obj["status"]["conditions"] if c["type"] == "TopicsReady")
    assert topics_ready["status"] == "True" and topics_ready["reason"] == "LowReplication", topics_ready
    assert "the cluster has 1 broker" in topics_ready["message"], topics_ready

    topic = doc["spec"]["source"]["topic"]
    deduped, dlq = deduped_topic(ns, "minimal"), dlq_topic(ns, "minimal")
    md = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert len(md[topic].partitions) == 4 and len(md[deduped].partitions) == 4
    assert dlq in md and f"{topic}.deduped" not in md and f"{topic}.dlq" not in md
    assert obj["status"]["topics"] == {"source": topic, "deduped": deduped, "dead-letter": dlq}
    # None existed before: the operator created, and so owns, all three.
    assert sorted(obj["status"]["ownedTopics"]) == sorted([topic, deduped, dlq])

    apps = client.AppsV1Api(kube_api)
    # Ready was observed with 2 ready pods; a probe missed on a busy machine may flip one briefly.
    sts = wait_for(lambda: (s := apps.read_namespaced_stateful_set("minimal-dedup", ns)).status.ready_replicas == 2
                   and s, 60, what="2 ready dedup pods")
    assert sts.metadata.owner_references[0].kind == "ExactlyOncePipeline"
    assignment = obj["status"]["assignment"]
    assert sorted(p for pod in ("minimal-dedup-0", "minimal-dedup-1") for p in assignment[pod]) == [0, 1, 2, 3]

    table = kubectl(cp, "get", "eop", "-n", ns).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "READY", "PARTITIONS", "REPLICAS", "LAG", "AGE"]
    assert row.split()[:5] == ["minimal", "Running", "True", "4", "2"]
    # Nothing was produced: once both workers reported, the dedup stage has no lag.
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "minimal"))["status"].get("lag") and o, 60,
                   what="status.lag")
    assert obj["status"]["lag"] == {"dedup": 0}

    events = object_events(kube_api, ns)
    assert any(e.reason == "Running" for e in events), [e.reason for e in events]

    pod = core.read_namespaced_pod("minimal-dedup-0", ns)
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert (pod.spec.security_context.run_as_user, pod.spec.security_context.run_as_non_root) == (10001, True)
    c = pod.spec.containers[0]
    assert c.security_context.read_only_root_filesystem is True and c.security_context.capabilities.drop == ["ALL"]
    assert c.resources.requests == {"cpu": "250m", "memory": "512Mi"} and c.resources.limits == {"memory": "1Gi"}
    assert c.args[c.args.index("--memory-mb") + 1] == "409"
    assert pod.metadata.labels["team"] == "data"
    assert {"TEAM": "data"}.items() <= {e.name: e.value for e in c.env}.items()
    assert [s.name for s in pod.spec.image_pull_secrets] == ["registry"]


# A window longer than the retention, a header key without its name and an unknown partitioner
# are refused the same way in tests/integration/test_admission.py (BREAKS), with validate's text.
@pytest.mark.parametrize("over, message", [
    ({"source.partitions": 0}, "source.partitions"),
    ({"topics": {"deduped": "events"}}, "topics.deduped and topics.deadLetter must differ"),
])
def test_invalid_manifests_are_rejected_by_the_api_server(crds, k8s_namespace, over, message):
    doc = example_manifest("minimal.yaml", "k:9092", **over)
    res = kubectl_apply(crds, k8s_namespace, doc, check=False)
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_partition_decrease_is_refused_by_the_api_server(crds, k8s_namespace):
    doc = example_manifest("minimal.yaml", "k:9092")
    kubectl_apply(crds, k8s_namespace, doc)
    doc["spec"]["source"]["partitions"] = 2
    res = kubectl_apply(crds, k8s_namespace, doc, check=False)
    assert res.returncode != 0 and "may not decrease" in res.stderr, res.stderr
    # Refused at admission: the stored spec (what a running operator reconciles) is unchanged.
    stored = kubectl(crds, "get", "eop", "minimal", "-n", k8s_namespace, "-o", "jsonpath={.spec.source.partitions}")
    assert stored.stdout == "4", stored.stdout


def test_changes_are_applied_and_drift_is_repaired(operator, kube_api, kafka_bootstrap, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    topic = unique_topic("events", ns)
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic})
    kubectl_apply(cp, ns, doc)
    first = wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")
    gen = first["status"]["assignment"]["generation"]

    doc["spec"]["source"]["partitions"] = 6
    doc["spec"]["dedup"] = {"replicas": 2}
    kubectl_apply(cp, ns, doc)
    obj = wait_for(lambda: (o := ready_pipeline(kube_api, ns, "minimal")) and o["status"]["readyReplicas"] == 2 and o,
                   180, what="6 partitions on 2 ready pods")
    assert obj["status"]["assignment"]["generation"] > gen
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    md = admin.list_topics(timeout=10).topics
    assert len(md[topic].partitions) == 6 and len(md[deduped_topic(ns, "minimal")].partitions) == 6
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map("minimal-dedup-assignment", ns)
    owned = json.loads(cm.data["assignment.json"])["assignments"]
    assert sorted(p for parts in owned.values() for p in parts) == list(range(6))

    # A StatefulSet and an owned topic deleted by hand come back on the periodic resync; the
    # topic's config drift (on a topic the operator created) is reverted.
    client.AppsV1Api(kube_api).delete_namespaced_stateful_set("minimal-dedup", ns)
    dlq = dlq_topic(ns, "minimal")
    admin.delete_topics([dlq])[dlq].result(30)
    wait_for(lambda: dlq in admin.list_topics(timeout=10).topics, 60, what="DLQ topic recreated")
    set_topic_config(admin, topic, "retention.ms", "1000")
    wait_for(lambda: topic_config(admin, topic, "retention.ms") == str(168 * 3600 * 1000), 60,
             what="the owned source topic's retention.ms drift reverted")
    assert dlq in get_pipeline(kube_api, ns, "minimal")["status"]["ownedTopics"]
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready again after the StatefulSet was deleted")


def test_a_refused_apply_is_reported_in_status_and_events(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """A webhook the API server cannot call (its 500, as while the Spark Operator's webhook
    restarts) is tried again soon, with the API server's words in a Warning event (not Kopf's
    60 s wait for an unknown error). A change the API server refuses (a StatefulSet's volume
    claim size is immutable) ends in status and an event with the API server's reason, not in
    a silent retry loop; the pipeline keeps running as it was, and reverting the change makes
    it Ready again."""
    ns, cp = k8s_namespace, operator.cp
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": unique_topic("imm", ns)})
    hooks = client.AdmissionregistrationV1Api(kube_api)
    hooks.create_validating_webhook_configuration(_unreachable_webhook(ns))
    try:
        kubectl_apply(cp, ns, doc)
        retried = wait_for(lambda: [e.message for e in object_events(kube_api, ns) if e.reason == "Retrying"
                                    and e.type == "Warning" and "failed calling webhook" in e.message],
                           60, what="a Warning event Retrying with the webhook's failure")
        print(f"retried soon: {retried[0][:400]}")
    finally:
        hooks.delete_validating_webhook_configuration(f"{ns}-unreachable")
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")

    doc["spec"]["dedup"] = {"storage": {"size": "2Gi"}}
    kubectl_apply(cp, ns, doc)

    def degraded():
        obj = get_pipeline(kube_api, ns, "minimal")
        st = obj.get("status") or {}
        return (st.get("observedGeneration") == obj["metadata"]["generation"] and st.get("phase") == "Degraded"
                and obj)
    obj = wait_for(degraded, 120, what="phase Degraded")
    ready, dedup = condition(obj, "Ready"), condition(obj, "DedupReady")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed"), ready
    assert dedup["reason"] == "ApplyFailed" and "StatefulSet minimal-dedup" in dedup["message"], dedup
    assert "Forbidden" in dedup["message"] or "forbidden" in dedup["message"], dedup
    events = object_events(kube_api, ns)
    assert any(e.reason == "ApplyFailed" and e.type == "Warning" for e in events), [e.reason for e in events]
    sts = client.AppsV1Api(kube_api).read_namespaced_stateful_set("minimal-dedup", ns)
    assert sts.status.ready_replicas == 1  # untouched: still the running pipeline

    del doc["spec"]["dedup"]
    kubectl_apply(cp, ns, doc)
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 120, what="Ready again after the revert")


def _unreachable_webhook(ns: str) -> dict:
    """A webhook on StatefulSet creates in `ns` whose server does not answer (a closed port on
    loopback): the API server refuses each such create with a 500 while it exists."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": f"{ns}-unreachable"},
            "webhooks": [{"name": "unreachable.eopipe.dev", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 2,
                          "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                          "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                          "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["statefulsets"]}]}]}


def test_an_adopted_source_topic_is_never_altered_or_deleted(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """The producers' topic existed before the pipeline: its configs survive every resync (a
    mismatch is reported with the fix, never repaired), and deletionPolicy Delete deletes only the
    topics the operator created."""
    from confluent_kafka.admin import NewTopic

    ns, cp = k8s_namespace, operator.cp
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = unique_topic("adopted", ns)
    theirs = {"retention.ms": str(72 * 3600 * 1000), "min.insync.replicas": "2"}
    admin.create_topics([NewTopic(topic, 4, 1, config=theirs)])[topic].result(30)
    wait_for(lambda: topic_config(admin, topic, "min.insync.replicas") == "2", 30, what="the topic's configs")
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic, "deletionPolicy": "Delete"})
    kubectl_apply(cp, ns, doc)
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")

    def unchanged():
        assert {k: topic_config(admin, topic, k) for k in theirs} == theirs
        assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 4

    # Resyncs every 3 s, each of which would have "repaired" the configs: two more passes hold at
    # least one that began after the check above (a repair would come at the first).
    wait_passes(operator, 2)
    unchanged()
    obj = get_pipeline(kube_api, ns, "minimal")
    mine = sorted([deduped_topic(ns, "minimal"), dlq_topic(ns, "minimal")])
    assert sorted(obj["status"]["ownedTopics"]) == mine
    assert f"adopted, checked only: {topic}" in condition(obj, "TopicsReady")["message"]

    # A retention the dedup window cannot live with (1h < 24h): reported with the command, not fixed.
    set_topic_config(admin, topic, "retention.ms", str(3600 * 1000))
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "minimal")) and
                   condition(o, "TopicsReady").get("reason") == "AdoptedTopicMismatch" and o, 60,
                   what="TopicsReady=False/AdoptedTopicMismatch")
    message = condition(obj, "TopicsReady")["message"]
    assert (f"kafka-configs.sh --bootstrap-server {kafka_bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config retention.ms=") in message, message
    assert obj["status"]["phase"] == "Degraded" and condition(obj, "Ready")["reason"] == "AdoptedTopicMismatch"
    wait_passes(operator, 2)  # at least one whole pass since
    assert topic_config(admin, topic, "retention.ms") == str(3600 * 1000)
    set_topic_config(admin, topic, "retention.ms", theirs["retention.ms"])  # the owner's fix
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 60, what="Ready again after the owner's fix")
    unchanged()

    kubectl(cp, "delete", "eop", "minimal", "-n", ns, "--timeout=90s")
    wait_for(lambda: not any(t in admin.list_topics(timeout=10).topics for t in mine), 30,
             what="the owned topics deleted")
    assert topic in admin.list_topics(timeout=10).topics
    unchanged()
    events = client.CoreV1Api(kube_api).list_namespaced_event(ns, field_selector="involvedObject.name=minimal").items
    deleted = [e.message for e in events if e.reason == "TopicsDeleted"]
    assert deleted and all(t in deleted[0] for t in mine) and topic not in deleted[0].split(";")[0], deleted


def test_growing_an_adopted_source_waits_for_its_owner(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """spec.source.partitions grows on a topic the operator did not create: the dedup stage
    pauses, the condition gives the kafka-topics.sh command, the topic is not touched; once its
    owner grows it the re-shard completes."""
    from confluent_kafka.admin import NewPartitions, NewTopic

    ns, cp = k8s_namespace, operator.cp
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = unique_topic("adopted-grow", ns)
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic})
    kubectl_apply(cp, ns, doc)
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")

    doc["spec"]["source"]["partitions"] = 6
    kubectl_apply(cp, ns, doc)
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "minimal")) and
                   condition(o, "TopicsReady").get("reason") == "AdoptedTopicMismatch" and o, 120,
                   what="TopicsReady=False/AdoptedTopicMismatch")
    assert f"--alter --topic {topic} --partitions 6" in condition(obj, "TopicsReady")["message"]
    assert obj["status"]["rebalance"]["phase"] == "CreatingPartitions"
    wait_passes(operator, 2)  # at least one whole pass since
    assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 4

    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(30)  # its owner does it
    obj = wait_for(lambda: (o := ready_pipeline(kube_api, ns, "minimal")) and not o["status"].get("rebalance")
                   and o["status"]["partitions"] == 6 and o, 180, what="Ready with 6 partitions")
    assert obj["status"]["lastRebalance"]["toPartitions"] == 6
    assert len(admin.list_topics(timeout=10).topics[deduped_topic(ns, "minimal")].partitions) == 6


def test_two_pipelines_on_one_source_topic(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """Pipelines in two namespaces read one source topic: each writes its own topics. One that
    would write another's topic is the newer one: Stalled/Conflict, nothing created or started,
    and the older keeps running."""
    ns1, cp = k8s_namespace, operator.cp
    ns2 = f"{ns1[:50]}-b"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns2, labels={"eopipe.dev/test": "true"})))
    try:
        operator.stop()
        operator.namespaces.append(ns2)  # one operator watching both namespaces
        operator.start()
        topic = unique_topic("shared", ns1)
        kubectl_apply(cp, ns1, example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic}))
        wait_for(lambda: ready_pipeline(kube_api, ns1, "minimal"), 180, what="the first pipeline Ready")
        # Same source, same pipeline name, other namespace: its own deduped and DLQ topics.
        kubectl_apply(cp, ns2, example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic}))
        second = wait_for(lambda: ready_pipeline(kube_api, ns2, "minimal"), 180, what="the second pipeline Ready")
        assert second["status"]["ownedTopics"] == sorted([deduped_topic(ns2, "minimal"), dlq_topic(ns2, "minimal")])

        clash = example_manifest("minimal.yaml", kafka_bootstrap, **{
            "source.topic": topic, "topics": {"deduped": deduped_topic(ns1, "minimal")}})
        clash["metadata"]["name"] = "clash"
        kubectl_apply(cp, ns2, clash)
        obj = wait_for(lambda: (o := get_pipeline(kube_api, ns2, "clash")) and
                       condition(o, "Stalled").get("status") == "True" and o, 60, what="Stalled=True")
        stalled = condition(obj, "Stalled")
        assert stalled["reason"] == "Conflict" and obj["status"]["phase"] == "Failed", stalled
        assert f"{ns1}/minimal" in stalled["message"] and deduped_topic(ns1, "minimal") in stalled["message"]
        wait_passes(operator, 6)
        assert not client.AppsV1Api(kube_api).list_namespaced_stateful_set(
            ns2, label_selector="eopipe.dev/pipeline=clash").items
        assert dlq_topic(ns2, "clash") not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(
            timeout=10).topics
        assert "ownedTopics" not in get_pipeline(kube_api, ns2, "clash")["status"]
        first = ready_pipeline(kube_api, ns1, "minimal")
        assert first and first["status"]["phase"] == "Running"
        assert condition(first, "Stalled")["status"] == "False"
    finally:
        # While the operator runs, so that their finalizers do not hold the namespace.
        kubectl(cp, "delete", "eop", "--all", "-n", ns2, "--timeout=60s", check=False)
        core.delete_namespace(ns2, propagation_policy="Background")


def test_unreachable_kafka_never_wedges_deletion(operator, kube_api, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    # Each attempt waits out the operator's Kafka timeout (15 s by default, 3 s here: the port
    # refuses at once, so the pass gives up on the timeout whatever its length): two attempts
    # show the retry and the give-up as well as the fixture's three, sooner.
    operator.stop()
    operator.env["EOPIPE_DELETE_ATTEMPTS"] = "2"
    operator.env["EOPIPE_KAFKA_TIMEOUT_SECONDS"] = "3"
    operator.start()
    doc = example_manifest("minimal.yaml", "127.0.0.1:1", **{"deletionPolicy": "Delete"})
    kubectl_apply(cp, ns, doc)
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "minimal")).get("status") and o, 60, what="status")
    assert condition(obj, "TopicsReady")["reason"] == "KafkaUnavailable"
    assert condition(obj, "Ready")["status"] == "False"
    # As if an earlier pass had created a topic (Kafka reachable then): there is something to delete.
    owned = dlq_topic(ns, "minimal")
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        "eopipe.dev", "v1beta1", ns, "exactlyoncepipelines", "minimal", {"status": {"ownedTopics": [owned]}})
    kubectl(cp, "delete", "eop", "minimal", "-n", ns, "--timeout=150s")
    events = client.CoreV1Api(kube_api).list_namespaced_event(
        ns, field_selector="involvedObject.name=minimal").items
    retained = [e.message for e in events if e.reason == "TopicsRetained"]
    assert any("gave up deleting topics after 2 attempts" in m and owned in m for m in retained), retained


def test_operator_restart_continues(operator, kube_api, kafka_bootstrap, k8s_namespace):
    ns, cp = k8s_namespace, operator.cp
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": unique_topic("restart", ns)})
    kubectl_apply(cp, ns, doc)
    # Kill the operator as soon as it has started working on the pipeline.
    wait_for(lambda: (get_pipeline(kube_api, ns, "minimal").get("status") or {}).get("topics"), 60, what="first status")
    operator.stop(kill=True)
    doc["spec"]["dedup"] = {"replicas": 2}
    kubectl_apply(cp, ns, doc)
    operator.start()
    obj = wait_for(lambda: (o := ready_pipeline(kube_api, ns, "minimal")) and o["status"]["readyReplicas"] == 2 and o,
                   180, what="Ready with 2 replicas after the restart")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]


def test_spark_application_state_maps_to_processing_ready(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """The operator's side of the Spark stage: it creates the SparkApplication and reads its state.
    (The state is written here by hand; tests/integration/test_spark_app.py runs the real application.)
    The resync is ten minutes here: a state change arrives through the operator's watch of its
    SparkApplications (control/sparkwatch.py) or not at all within the waits below."""
    ns, cp = k8s_namespace, operator.cp
    operator.stop()
    operator.env["EOPIPE_RESYNC_SECONDS"] = "600"
    operator.start()
    topic = unique_topic("payments", ns)
    doc = example_manifest("payments.yaml", kafka_bootstrap, **{
        "source.topic": topic, "source.partitions": 2, "dedup.replicas": 1,
        "sink.kafka.topic": f"{topic}-enriched"})
    kubectl_apply(cp, ns, doc)
    custom = client.CustomObjectsApi(kube_api)
    app = wait_for(lambda: _spark_app(custom, ns), 60, what="SparkApplication")
    # The driver's rights: the chart's ClusterRole, bound here, never a Role the operator holds.
    binding = client.RbacAuthorizationV1Api(kube_api).read_namespaced_role_binding("payments-spark-driver", ns)
    assert binding.metadata.owner_references[0].name == "payments" and binding.role_ref.kind == "ClusterRole"
    assert app["spec"]["driver"]["serviceAccount"] == "payments-spark"
    assert app["metadata"]["ownerReferences"][0]["name"] == "payments"
    assert app["spec"]["type"] == "Python" and app["spec"]["restartPolicy"]["type"] == "OnFailure"
    wait_for(lambda: condition(get_pipeline(kube_api, ns, "payments"), "ProcessingReady").get("reason") == "SparkStarting",
             60, what="ProcessingReady=False/SparkStarting")
    assert condition(get_pipeline(kube_api, ns, "payments"), "Ready")["status"] == "False"
    md = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert f"{topic}-enriched" in md and f"eopipe.{ns}.payments.spark-commits" in md

    def set_state(state, message=""):
        custom.patch_namespaced_custom_object_status(
            "sparkoperator.k8s.io", "v1beta2", ns, "sparkapplications", "payments-spark",
            {"status": {"applicationState": {"state": state, "errorMessage": message}}})

    # Executor pods as the Spark Operator makes them (the SparkApplication a non-controller owner):
    # one whose driver pod is gone (no controller left), one with its driver pod as controller,
    # and one that only carries the labels. The pass the state change below makes deletes the
    # first alone.
    core = client.CoreV1Api(kube_api)
    app_ref = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
               "name": "payments-spark", "uid": app["metadata"]["uid"]}
    driver = core.create_namespaced_pod(ns, _pod("stand-in-driver", {"spark-role": "driver"}, []))
    _executor = lambda name, refs: core.create_namespaced_pod(ns, _pod(name, {  # noqa: E731
        "spark-role": "executor", "sparkoperator.k8s.io/app-name": "payments-spark"}, refs))
    _executor("left-exec-1", [app_ref])
    _executor("live-exec-1", [app_ref, {"apiVersion": "v1", "kind": "Pod", "name": driver.metadata.name,
                                        "uid": driver.metadata.uid, "controller": True}])
    _executor("labelled-exec-1", [])

    set_state("RUNNING")
    obj = wait_for(lambda: ready_pipeline(kube_api, ns, "payments"), 120, what="Ready once Spark runs")
    assert obj["status"]["sparkApplicationState"] == "RUNNING"
    left = {p.metadata.name for p in core.list_namespaced_pod(ns, label_selector="spark-role=executor").items
            if p.metadata.deletion_timestamp is None}
    assert left == {"live-exec-1", "labelled-exec-1"}, left
    removed = [e.message for e in core.list_namespaced_event(
        ns, field_selector="involvedObject.name=payments").items if e.reason == "SparkExecutorRemoved"]
    assert len(removed) == 1 and "left-exec-1" in removed[0], removed
    failed_uid = app["metadata"]["uid"]
    set_state("FAILED", "driver OOMKilled")
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "payments")) and
                   condition(o, "ProcessingReady").get("reason") == "SparkFailed" and o, 30, what="SparkFailed")
    assert condition(obj, "Ready")["status"] == "False" and "OOMKilled" in condition(obj, "ProcessingReady")["message"]
    # Its retries used up, the operator deletes it; the deletion is seen too and it is submitted again.
    again = wait_for(lambda: (a := _spark_app(custom, ns)) and a["metadata"]["uid"] != failed_uid and a, 30,
                     what="the SparkApplication submitted again")
    # Failed again at once: the next resubmission waits (30 s, then longer), and the pipeline says so.
    set_state("FAILED", "driver OOMKilled")
    obj = wait_for(lambda: (o := get_pipeline(kube_api, ns, "payments")) and "so that waits" in
                   condition(o, "ProcessingReady").get("message", "") and o, 30, what="the next resubmission waiting")
    assert obj["status"]["sparkResubmits"]["count"] == 1, obj["status"]
    assert _spark_app(custom, ns)["metadata"]["uid"] == again["metadata"]["uid"], "resubmitted without a wait"
    told = [e.message for e in client.CoreV1Api(kube_api).list_namespaced_event(
        ns, field_selector="involvedObject.name=payments").items if e.reason == "SparkResubmitted"]
    assert len(told) == 1 and "resubmission 1 " in told[0], told


def _pod(name: str, labels: dict, owners: list) -> dict:
    """A pod that runs (the node agent runs its command as a local process), within the restricted profile."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "image": "localhost/none:0", "command": ["sleep", "600"],
                                     "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"}}}]}}


def _spark_app(custom, ns):
    try:
        return custom.get_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", ns,
                                                   "sparkapplications", "payments-spark")
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


_HANGING_PRODUCER = """
import os, sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[3],
              "transaction.timeout.ms": 900000})
p.init_transactions(30)
p.begin_transaction()
p.produce(sys.argv[2], b"never committed", b"k", partition=0)
p.flush(30)
os._exit(9)  # gone with its transaction open: nothing aborts it for 15 minutes
"""


def test_hanging_transactions_make_the_pipeline_degraded(operator, kube_api, kafka_bootstrap, k8s_namespace):
    """Open transactions that nothing ends, one on the output and one on the source (it holds the
    dedup stage's own read_committed consumer), together so that one wait past the threshold
    serves both: status says where (topic, partition, start offset) and how to abort each, the
    pipeline is Degraded, a metric shows the age of the oldest; it stays Degraded while either is
    open and is Ready again once both are aborted."""
    import subprocess
    import sys
    import urllib.request

    from confluent_kafka import Producer

    ns = k8s_namespace
    # The fixture's threshold is 15 s, for tests under load; nothing else writes here, so a
    # transaction open 5 s is as surely a hanging one, and the wait past it 10 s shorter.
    threshold = 5
    operator.stop(kill=True)
    operator.env["EOPIPE_HANGING_TRANSACTION_SECONDS"] = str(threshold)
    operator.start()
    kubectl_apply(operator.cp, ns, example_manifest("minimal.yaml", kafka_bootstrap,
                                                    **{"source.topic": unique_topic("txn", ns)}))
    obj = wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")
    hung = {"transactions": obj["status"]["topics"]["deduped"], "sourceTransactions": obj["status"]["topics"]["source"]}
    for field, topic in hung.items():
        subprocess.run([sys.executable, "-c", _HANGING_PRODUCER, kafka_bootstrap, topic, f"stuck-{field}-{ns}"],
                       timeout=60)

    def degraded_by(field):
        """Degraded, the message naming the abort of `field`'s transaction at its start offset."""
        def check():
            o = get_pipeline(kube_api, ns, "minimal")
            st = o.get("status") or {}
            dedup = condition(o, "DedupReady")
            start = (st.get(field) or {}).get("0", {}).get("lastStableOffset")
            return (st.get("phase") == "Degraded" and dedup.get("reason") == "HangingTransaction" and start is not None
                    and f"abort --topic {hung[field]} --partition 0 --start-offset {start}" in dedup["message"]
                    and (o, dedup["message"]))
        return check
    # The output's is named first, the source's counted with it.
    obj, message = wait_for(lambda: (r := degraded_by("transactions")()) and "(and 1 more)" in r[1] and r, 120,
                            what="phase Degraded by both transactions")
    assert obj["status"]["sourceTransactions"]["0"]["lastStableOffset"] >= 0, obj["status"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).read().decode()
    age = [float(line.split()[-1]) for line in metrics.splitlines()
           if line.startswith("eopipe_operator_open_transaction_seconds") and f'namespace="{ns}"' in line]
    assert age and age[0] >= threshold, age

    # Each producer's successor (same transactional.id) fences it and aborts what it left open:
    # the output's first, and the source's still holds the pipeline Degraded.
    Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"stuck-transactions-{ns}"}).init_transactions(30)
    obj, _ = wait_for(lambda: (r := degraded_by("sourceTransactions")()) and r[0]["status"]["transactions"] == {}
                      and r, 120, what="Degraded by the source's transaction alone")
    assert "(and" not in condition(obj, "DedupReady")["message"]
    Producer({"bootstrap.servers": kafka_bootstrap,
              "transactional.id": f"stuck-sourceTransactions-{ns}"}).init_transactions(30)
    obj = wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 120, what="Ready again once both are aborted")
    assert obj["status"]["transactions"] == {} and obj["status"]["sourceTransactions"] == {}


def test_operator_health_and_metrics(operator, kube_api, kafka_bootstrap, k8s_namespace):
    import urllib.request

    ns = k8s_namespace
    kubectl_apply(operator.cp, ns, example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": unique_topic("m", ns)}))
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")
    health = urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=10)
    assert health.status == 200
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).read().decode()
    ok = [line for line in metrics.splitlines() if line.startswith('eopipe_operator_reconciles_total{result="ok"}')]
    assert ok and float(ok[0].split()[-1]) >= 1
    assert f'eopipe_operator_pipeline_ready{{name="minimal",namespace="{ns}"}} 1.0' in metrics
    # A deleted pipeline's series go too (else dashboards and alerts see it forever).
    kubectl(operator.cp, "delete", "-n", ns, "exactlyoncepipeline", "minimal", "--wait=true", "--timeout=120s")

    def series_gone():
        text = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).read().decode()
        return f'namespace="{ns}"' not in text
    wait_for(series_gone, 60, what="the deleted pipeline's metric series removed")


def test_render_is_what_the_operator_applies(operator, kube_api, kafka_bootstrap, k8s_namespace, tmp_path):
    """`eopipe render` of the payments example, with the test's namespace, images and bootstrap:
    every field it sets has the same value in the object the operator applied, and the topics
    exist with its partition counts, replication factors and configs."""
    ns, cp = k8s_namespace, operator.cp
    topic = unique_topic("payments", ns)
    doc = example_manifest("payments.yaml", kafka_bootstrap, **{"source.topic": topic,
                                                                "sink.kafka.topic": f"{topic}-enriched"})
    path = tmp_path / "payments.yaml"
    path.write_text(yaml.safe_dump(doc))
    # The operator fixture runs with Settings' defaults, not the chart's: no EOPIPE_IMAGE,
    # EOPIPE_SPARK_IMAGE or EOPIPE_SPARK_DRIVER_CLUSTERROLE, no NetworkPolicies; one broker.
    images = Settings()
    brokers = len(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).brokers)
    res = subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "render", str(path), "--namespace", ns,
                          "--image", images.image, "--spark-image", images.spark_image,
                          "--spark-driver-cluster-role", images.spark_driver_cluster_role, "--no-network-policy",
                          "--brokers", str(brokers)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    *rendered, topics = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert topics["kind"] == "KafkaTopics"

    kubectl_apply(cp, ns, doc)
    custom = client.CustomObjectsApi(kube_api)
    wait_for(lambda: _spark_app(custom, ns), 60, what="SparkApplication")
    custom.patch_namespaced_custom_object_status(  # no Spark operator here: play its part
        "sparkoperator.k8s.io", "v1beta2", ns, "sparkapplications", "payments-spark",
        {"status": {"applicationState": {"state": "RUNNING"}}})
    wait_for(lambda: ready_pipeline(kube_api, ns, "payments"), 240, what="Ready=True")

    applier = Applier(kube_api)
    for want in rendered:
        what = f"{want['kind']} {want['metadata']['name']}"
        live = applier.get(want["apiVersion"], want["kind"], want["metadata"]["name"], ns)
        assert live is not None, f"{what}: not applied"
        if want["kind"] == "Secret":  # render's token is a placeholder; the operator's is random
            want = {k: v for k, v in want.items() if k != "data"}
        assert not list(differences(want, live)), f"{what}: {list(differences(want, live))}"

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    md = admin.list_topics(timeout=10).topics
    for t in topics["topics"]:
        assert t["name"] in md, t["name"]
        parts = md[t["name"]].partitions
        assert (len(parts), len(parts[0].replicas)) == (t["partitions"], t["replicationFactor"]), t["name"]
        res = ConfigResource(ConfigResource.Type.TOPIC, t["name"])
        live = {k: v.value for k, v in admin.describe_configs([res])[res].result(30).items()}
        assert {k: live.get(k) for k in t["config"]} == t["config"], t["name"]
