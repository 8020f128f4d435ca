"""Pure builders: spec in, manifests out (no cluster)."""

import json
from pathlib import Path

import pytest
import yaml

from eopipe.control.builders import dedup, spark, topics
from eopipe.core.assignment import Assignment, assign
from eopipe.core.backupspec import Backup
from eopipe.core.names import Names
from tests.helpers.pipelines import example_names

ROOT = Path(__file__).resolve().parents[2]


def test_topics_of_the_payments_pipeline():
    by_role = {t.role: t for t in topics.desired_topics(example_names())}
    assert sorted(by_role) == ["dead-letter", "deduped", "sink", "source", "spark-commits"]
    assert (by_role["source"].name, by_role["source"].partitions) == ("payments", 8)
    assert by_role["source"].config["retention.ms"] == str(168 * 3600 * 1000)
    # Written topics carry namespace and pipeline: two pipelines on one source never share them.
    assert by_role["deduped"].partitions == 8 and by_role["deduped"].name == "team-a.payments.deduped"
    assert by_role["dead-letter"].name == "team-a.payments.dlq"
    assert by_role["spark-commits"].config["cleanup.policy"] == "compact"
    assert by_role["spark-commits"].name == "eopipe.team-a.payments.spark-commits"
    assert by_role["sink"].name == "payments-enriched"


def test_minimal_pipeline_has_no_spark_topics():
    roles = [t.role for t in topics.desired_topics(example_names("minimal.yaml"))]
    assert roles == ["source", "deduped", "dead-letter"]


def test_statefulset_runs_the_worker_with_the_pipeline_settings():
    n = example_names()
    sts = dedup.statefulset(n, "eopipe:dev")
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "payments-dedup"
    c = sts["spec"]["template"]["spec"]["containers"][0]
    args = dict(zip(c["args"][1::2], c["args"][2::2]))
    assert args["--key"] == "json:id" and args["--window"] == "86400s"
    assert args["--output-topic"] == "team-a.payments.deduped" and args["--namespace"] == "team-a"
    assert args["--dlq-topic"] == "team-a.payments.dlq"
    assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert dedup.statefulset(n, "eopipe:dev", replicas=3)["spec"]["replicas"] == 3


def test_assignment_configmap_round_trips():
    a = Assignment(4, assign(8, ["payments-dedup-0", "payments-dedup-1"]))
    cm = dedup.assignment_configmap(example_names(), a)
    assert cm["metadata"]["annotations"]["eopipe.dev/assignment-generation"] == "4"
    assert Assignment.from_json(json.loads(cm["data"][dedup.ASSIGNMENT_KEY])) == a


def test_the_assignment_configmap_carries_the_pipelines_manifest():
    """What `eopipe restore` reads back from the object store: the same spec, and the same text
    whether the API server filled in the defaults or not (`eopipe render` is compared with it)."""
    from eopipe.core import manifest
    from eopipe.core.spec import PipelineSpec

    plain = example_names()
    assert dedup.MANIFEST_KEY not in dedup.assignment_configmap(plain, Assignment(1, {}))["data"]
    n = Names("team-a", "payments", plain.spec.model_copy(update={"dedup": plain.spec.dedup.model_copy(
        update={"backup": Backup(uri="s3://state/payments")})}))
    doc = yaml.safe_load(dedup.assignment_configmap(n, Assignment(1, {}))["data"][dedup.MANIFEST_KEY])
    assert doc["metadata"] == {"name": "payments", "namespace": "team-a"}
    assert manifest.parse(doc).spec == n.spec
    defaulted = PipelineSpec.model_validate(n.spec.model_dump(mode="json", by_alias=True))  # every field set
    assert defaulted.model_fields_set > n.spec.model_fields_set
    assert dedup.manifest(Names("team-a", "payments", defaulted)) == dedup.manifest(n)


def test_spark_application():
    app = spark.spark_application(example_names(), "eopipe-spark:dev")
    assert app["spec"]["type"] == "Python" and app["spec"]["restartPolicy"]["type"] == "OnFailure"
    conf = json.loads(app["spec"]["arguments"][1])
    assert conf["source_topic"] == "team-a.payments.deduped"  # the topic the dedup stage writes
    assert conf["sink"] == {"kind": "kafka", "topic": "payments-enriched",
                            "commit_topic": "eopipe.team-a.payments.spark-commits"}
    assert app["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "2"  # 1 executor x 1 core
    n = example_names()
    bigger = n.spec.processing.model_copy(update={"executors": n.spec.processing.executors.model_copy(
        update={"instances": 3, "cores": 4})})
    n = Names(n.namespace, n.pipeline, n.spec.model_copy(update={"processing": bigger}))
    assert spark.spark_application(n, "img")["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "24"


def test_kafka_credentials_reach_pods_as_secret_refs_and_the_operator_as_values():
    from eopipe.core import kafkaconf
    from eopipe.core.spec import KafkaSpec

    kafka = KafkaSpec.model_validate({
        "bootstrapServers": "k:9093", "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": {"name": "kc", "key": "user"},
                 "password": {"name": "kc", "key": "pass"}},
        "tls": {"ca": {"name": "kca", "key": "ca.crt"}}})
    secrets = {("kc", "user"): "alice", ("kc", "pass"): "s3cret", ("kca", "ca.crt"): "PEM"}
    conf = kafkaconf.client_config(kafka, lambda ref: secrets[(ref.name, ref.key)])
    assert conf == {"bootstrap.servers": "k:9093", "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                    "sasl.password": "s3cret", "ssl.ca.pem": "PEM"}

    n = example_names()
    n = Names(n.namespace, n.pipeline, n.spec.model_copy(update={"kafka": kafka}))
    env = {e["name"]: e for e in dedup.statefulset(n, "img")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EOPIPE_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kc", "key": "pass"}
    # What the worker reads back from its environment is the operator's config less bootstrap.
    pod_env = {k: secrets[(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])]
               if "valueFrom" in e and "secretKeyRef" in e["valueFrom"] else e.get("value")
               for k, e in env.items() if k.startswith("EOPIPE_KAFKA_")}
    assert kafkaconf.from_env(pod_env) == {k: v for k, v in conf.items() if k != "bootstrap.servers"}
    # The Spark driver gets the same variables (spark_app reads them, see spark_app/config.py).
    driver = spark.spark_application(n, "img")["spec"]["driver"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e for e in driver["env"]} == {k: e for k, e in env.items() if k.startswith("EOPIPE_KAFKA_")}


def test_dedup_pods_watch_their_assignment_with_a_least_privilege_service_account():
    n = example_names()
    pod = dedup.statefulset(n, "eopipe:dev")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--assignment-configmap") + 1] == n.assignment_configmap
    sa, role, binding = dedup.rbac(n)
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == binding["subjects"][0]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": [n.assignment_configmap], "verbs": ["get", "list", "watch"]}]
    assert "--assignment-configmap" not in dedup.worker_args(n, watch_configmap=False)


def test_the_spark_driver_is_bound_to_the_charts_cluster_role_in_its_namespace_only():
    n = example_names()
    sa, binding = spark.driver_rbac(n, "eopipe-ops-spark-driver")
    assert (sa["kind"], binding["kind"]) == ("ServiceAccount", "RoleBinding")
    assert binding["metadata"]["namespace"] == sa["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "eopipe-ops-spark-driver"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "payments-spark", "namespace": "team-a"}]
    # Not `payments-spark`: older releases' RoleBinding of that name has an immutable roleRef (a Role).
    assert binding["metadata"]["name"] == "payments-spark-driver"
    assert spark.spark_application(n, "img")["spec"]["driver"]["serviceAccount"] == "payments-spark"
    assert spark.driver_rbac(n)[1]["roleRef"]["name"] == spark.DRIVER_CLUSTER_ROLE


# -- the Spark stage's storage and pass-through settings
def _with_processing(names: Names, **processing) -> Names:
    """`names` with spec.processing (and sink) replaced, validated as a manifest would be."""
    from eopipe.core.spec import PipelineSpec

    raw = names.spec.model_dump(by_alias=True, exclude_none=True)
    raw["processing"] = {**{k: v for k, v in raw["processing"].items() if k != "checkpoint"}, **processing}
    if "sink" in processing:
        raw["sink"] = raw["processing"].pop("sink")
    return Names(names.namespace, names.pipeline, PipelineSpec.model_validate(raw))


def _spark_examples():
    root = Path(__file__).resolve().parents[2] / "examples"
    return [p.name for p in sorted(root.glob("*.yaml")) if "processing:" in p.read_text()]


@pytest.mark.parametrize("example", _spark_examples())
def test_every_example_checkpoints_on_a_mounted_volume_or_a_remote_uri(example):
    """A replaced driver pod finds its checkpoint: the path is under a volume mount of the
    driver, or a remote URI; a files sink's output is where every executor writes too."""
    from eopipe.core.processing import is_remote

    names = example_names(example)
    app = spark.spark_application(names, "img")
    conf = json.loads(app["spec"]["arguments"][1])

    def mounted(path, pod):
        template = app["spec"][pod]["template"]["spec"]
        claims = {v["name"] for v in template.get("volumes", []) if "persistentVolumeClaim" in v}
        return any(m["name"] in claims and path.startswith(m["mountPath"].rstrip("/") + "/")
                   for m in template["containers"][0].get("volumeMounts", []))
    assert is_remote(conf["checkpoint_location"]) or mounted(conf["checkpoint_location"], "driver")
    if conf["sink"]["kind"] == "files":
        path = conf["sink"]["path"]
        assert is_remote(path) or (mounted(path, "driver") and mounted(path, "executor"))


@pytest.mark.parametrize("checkpoint, deletion, claim, mounts", [
    # (spec.processing.checkpoint, deletionPolicy) -> (the claim the operator creates, the driver's and executors' mounts)
    ({"pvc": {}}, "Retain", ("payments-spark-checkpoint", ["ReadWriteOnce"], "1Gi", None, False),
     ("payments-spark-checkpoint", "/var/lib/eopipe", False)),
    ({"pvc": {"size": "5Gi", "storageClassName": "fast", "accessMode": "ReadWriteMany", "mountPath": "/ck"}}, "Delete",
     ("payments-spark-checkpoint", ["ReadWriteMany"], "5Gi", "fast", True), ("payments-spark-checkpoint", "/ck", True)),
    ({"pvc": {"claimName": "team-claim"}}, "Delete", None, ("team-claim", "/var/lib/eopipe", False)),
    ({"uri": "s3a://bucket/ck"}, "Retain", None, None),
])
def test_the_checkpoint_claim_and_its_mounts(checkpoint, deletion, claim, mounts):
    from eopipe.control.builders import checkpoint as ck

    names = _with_processing(example_names(), checkpoint=checkpoint)
    names = Names(names.namespace, names.pipeline, names.spec.model_copy(update={"deletion_policy": deletion}))
    pvc = ck.claim(names)
    if claim is None:
        assert pvc is None
    else:
        name, modes, size, sc, owned = claim
        assert pvc["metadata"]["name"] == name and pvc["metadata"]["namespace"] == "team-a"
        assert pvc["spec"]["accessModes"] == modes and pvc["spec"]["resources"]["requests"]["storage"] == size
        assert pvc["spec"].get("storageClassName") == sc and ck.owned(names) is owned
    app = spark.spark_application(names, "img")["spec"]
    # Only in the pod templates, which Spark applies: the Spark Operator's webhook (when on)
    # would add spec.volumes a second time, and without it they would be dropped.
    assert "volumes" not in app and "volumeMounts" not in app["driver"] and "volumeMounts" not in app["executor"]
    driver, executor = (app[role]["template"]["spec"] for role in ("driver", "executor"))
    if mounts is None:
        assert "volumes" not in driver and "volumeMounts" not in driver["containers"][0]
        return
    claim_name, path, executors = mounts
    assert driver["volumes"] == [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": claim_name}}]
    assert driver["containers"][0]["volumeMounts"] == [{"name": "checkpoint", "mountPath": path}]
    assert ("volumeMounts" in executor["containers"][0]) is executors  # a ReadWriteOnce claim only in the driver
    assert ("volumes" in executor) is executors
    assert json.loads(app["arguments"][1])["checkpoint_location"] == f"{path}/checkpoints/payments"


def test_processing_settings_reach_the_spark_application_and_spark_app():
    names = _with_processing(
        example_names(), checkpoint={"uri": "s3a://b/ck"}, schema="user STRUCT<id: STRING>, ts TIMESTAMP",
        watermark={"column": "ts", "delay": "10 seconds"}, outputMode="update", maxOffsetsPerTrigger=500,
        transform="mypkg.jobs:enrich", sparkConf={"spark.sql.shuffle.partitions": "7", "spark.x": "y"},
        hadoopConf={"fs.s3a.endpoint": "http://minio:9000"}, serviceAccount="own-sa",
        driver={"cores": 2, "memory": "2g", "memoryOverhead": "512m"},
        executors={"instances": 3, "cores": 2, "memory": "4g", "memoryOverhead": "1g"},
        nodeSelector={"pool": "spark"}, tolerations=[{"key": "spark", "operator": "Exists"}],
        affinity={"nodeAffinity": {}},
        env=[{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}}],
        envFrom=[{"secretRef": {"name": "s3-extra"}}])
    app = spark.spark_application(names, "img")["spec"]
    conf = json.loads(app["arguments"][1])
    assert conf["schema"] == "user STRUCT<id: STRING>, ts TIMESTAMP" and conf["output_mode"] == "update"
    assert conf["watermark"] == {"column": "ts", "delay": "10 seconds"}
    assert conf["transform"] == "mypkg.jobs:enrich" and conf["max_offsets_per_trigger"] == 500
    assert app["sparkConf"]["spark.sql.shuffle.partitions"] == "7" and app["sparkConf"]["spark.x"] == "y"
    assert "RocksDBStateStoreProvider" in app["sparkConf"]["spark.sql.streaming.stateStore.providerClass"]
    assert app["hadoopConf"] == {"fs.s3a.endpoint": "http://minio:9000"}
    driver, executor = app["driver"], app["executor"]
    assert (driver["cores"], driver["memory"], driver["memoryOverhead"]) == (2, "2g", "512m")
    assert (executor["instances"], executor["cores"], executor["memory"], executor["memoryOverhead"]) == \
        (3, 2, "4g", "1g")
    assert driver["serviceAccount"] == "own-sa"
    for part in (driver, executor):  # pod fields in the pod template (Spark applies it)
        pod = part["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "spark"} and pod["tolerations"][0]["key"] == "spark"
        assert pod["affinity"] == {"nodeAffinity": {}}
        assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "s3-extra"}}]
        assert {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}} \
            in pod["containers"][0]["env"]
        assert not {"nodeSelector", "tolerations", "affinity", "env", "envFrom"} & set(part)
    driver_env = driver["template"]["spec"]["containers"][0]["env"]
    assert [e for e in driver_env if e["name"].startswith("EOPIPE_KAFKA_")]  # the operator's, kept
    # Unset: nothing extra in the application (Spark's and the operator's defaults apply).
    plain = spark.spark_application(example_names(), "img")["spec"]
    assert "hadoopConf" not in plain and "memoryOverhead" not in plain["driver"]
    assert "env" not in plain["executor"]["template"]["spec"]["containers"][0]
    assert plain["driver"]["serviceAccount"] == "payments-spark"
    assert "schema" in json.loads(plain["arguments"][1])  # payments.yaml declares its schema


@pytest.mark.parametrize("replicas, drains, max_unavailable", [
    (2, True, 0),   # the operator moves the partitions off a cordoned node, then deletes the pod
    (3, True, 0),
    (1, True, 1),   # no other pod to take them: the drain evicts it
    (2, False, 1),  # node handling off (EOPIPE_NODE_LOST_SECONDS=0): nothing would delete it
])
def test_the_budget_leaves_a_drain_to_the_operator_only_when_it_acts(replicas, drains, max_unavailable):
    pdb = dedup.pod_disruption_budget(example_names(), replicas, drains)
    assert pdb["spec"]["maxUnavailable"] == max_unavailable
    assert pdb["spec"]["selector"]["matchLabels"] == example_names().selector("dedup")
