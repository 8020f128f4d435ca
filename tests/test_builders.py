"""Pure builders: spec in, manifests out (no cluster)."""

import json
from pathlib import Path

import yaml

from eopipe.assignment import Assignment, assign
from eopipe.builders import dedup, spark, topics
from eopipe.builders.names import Names
from eopipe.spec import PipelineSpec

ROOT = Path(__file__).resolve().parents[1]


def _names(example="payments.yaml", ns="team-a"):
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    return Names(ns, doc["metadata"]["name"], PipelineSpec.model_validate(doc["spec"]))


def test_topics_of_the_payments_pipeline():
    by_role = {t.role: t for t in topics.desired_topics(_names())}
    assert sorted(by_role) == ["dead-letter", "deduped", "sink", "source", "spark-commits"]
    assert (by_role["source"].name, by_role["source"].partitions) == ("payments", 8)
    assert by_role["source"].config["retention.ms"] == str(168 * 3600 * 1000)
    assert by_role["deduped"].partitions == 8 and by_role["deduped"].name == "payments.deduped"
    assert by_role["spark-commits"].config["cleanup.policy"] == "compact"
    assert by_role["spark-commits"].name == "eopipe.team-a.payments.spark-commits"
    assert by_role["sink"].name == "payments-enriched"


def test_minimal_pipeline_has_no_spark_topics():
    roles = [t.role for t in topics.desired_topics(_names("minimal.yaml"))]
    assert roles == ["source", "deduped", "dead-letter"]


def test_statefulset_runs_the_worker_with_the_pipeline_settings():
    n = _names()
    sts = dedup.statefulset(n, "eopipe:dev")
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "payments-dedup"
    c = sts["spec"]["template"]["spec"]["containers"][0]
    args = dict(zip(c["args"][1::2], c["args"][2::2]))
    assert args["--key"] == "json:id" and args["--window"] == "86400s"
    assert args["--output-topic"] == "payments.deduped" and args["--namespace"] == "team-a"
    assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert dedup.statefulset(n, "eopipe:dev", replicas=3)["spec"]["replicas"] == 3


def test_assignment_configmap_round_trips():
    a = Assignment(4, assign(8, ["payments-dedup-0", "payments-dedup-1"]))
    cm = dedup.assignment_configmap(_names(), a)
    assert cm["metadata"]["annotations"]["eopipe.dev/assignment-generation"] == "4"
    assert Assignment.from_json(json.loads(cm["data"][dedup.ASSIGNMENT_KEY])) == a


def test_spark_application():
    app = spark.spark_application(_names(), "eopipe-spark:dev")
    assert app["spec"]["type"] == "Python" and app["spec"]["restartPolicy"]["type"] == "OnFailure"
    conf = json.loads(app["spec"]["arguments"][1])
    assert conf["source_topic"] == "payments.deduped"
    assert conf["sink"] == {"kind": "kafka", "topic": "payments-enriched",
                            "commit_topic": "eopipe.team-a.payments.spark-commits"}
    assert app["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "2"  # 1 executor x 1 core
    n = _names()
    bigger = n.spec.processing.model_copy(update={"executors": n.spec.processing.executors.model_copy(
        update={"instances": 3, "cores": 4})})
    n = Names(n.namespace, n.pipeline, n.spec.model_copy(update={"processing": bigger}))
    assert spark.spark_application(n, "img")["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "24"


def test_kafka_credentials_reach_pods_as_secret_refs_and_the_operator_as_values():
    from eopipe import kafkaconf
    from eopipe.spec import KafkaSpec

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

    n = _names()
    n = Names(n.namespace, n.pipeline, n.spec.model_copy(update={"kafka": kafka}))
    env = {e["name"]: e for e in dedup.statefulset(n, "img")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EOPIPE_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kc", "key": "pass"}
    # What the worker reads back from its environment is the operator's config less bootstrap.
    pod_env = {k: secrets[(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])]
               if "valueFrom" in e and "secretKeyRef" in e["valueFrom"] else e.get("value")
               for k, e in env.items() if k.startswith("EOPIPE_KAFKA_")}
    assert kafkaconf.from_env(pod_env) == {k: v for k, v in conf.items() if k != "bootstrap.servers"}
    # The Spark driver gets the same variables (spark_app reads them, see spark_app/config.py).
    driver = spark.spark_application(n, "img")["spec"]["driver"]
    assert {e["name"]: e for e in driver["env"]} == {k: e for k, e in env.items() if k.startswith("EOPIPE_KAFKA_")}


def test_dedup_pods_watch_their_assignment_with_a_least_privilege_service_account():
    n = _names()
    pod = dedup.statefulset(n, "eopipe:dev")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--assignment-configmap") + 1] == n.assignment_configmap
    sa, role, binding = dedup.rbac(n)
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == binding["subjects"][0]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": [n.assignment_configmap], "verbs": ["get", "list", "watch"]}]
    assert "--assignment-configmap" not in dedup.worker_args(n, watch_configmap=False)
