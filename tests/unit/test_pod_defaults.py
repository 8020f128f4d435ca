"""Production defaults of the pods the operator makes: the restricted Pod Security Standard,
resources and the RocksDB budget derived from them, spreading over nodes, image pull secrets,
and the dedup pod template a spec may add to (docs/operations.md#pod-defaults)."""

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from eopipe.control.builders import dedup, spark
from eopipe.core.names import LABEL_COMPONENT, LABEL_PIPELINE, Names
from eopipe.core.spec import (
    CEL_RULES,
    OPERATOR_ENV,
    OPERATOR_LABELS,
    POD_ENV_MESSAGE,
    POD_ENV_VALUE_MESSAGE,
    POD_LABELS_MESSAGE,
    EnvVar,
    PipelineSpec,
    PodTemplate,
    Resources,
)
from tests.helpers.pipelines import example_names
from tests.helpers.podsecurity import POD_TEMPLATE, restricted_problems, spark_pod


def _names(example: str = "payments.yaml", **spec_over) -> Names:
    n = example_names(example)
    raw = n.spec.model_dump(by_alias=True, exclude_none=True)
    for path, value in spec_over.items():
        node = raw
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return Names(n.namespace, n.pipeline, PipelineSpec.model_validate(raw))


def _pod(n: Names) -> dict:
    return dedup.statefulset(n, "eopipe:dev")["spec"]["template"]


# ---------------------------------------------------------------------------------------
# restricted Pod Security Standard
# ---------------------------------------------------------------------------------------

def test_dedup_pods_meet_the_restricted_standard():
    pod = _pod(_names())["spec"]
    assert restricted_problems(pod) == []
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                      "fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch",
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    (c,) = pod["containers"]
    assert c["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    # A read-only root: the state is on the volume claim, /tmp an emptyDir, nothing else writable.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/var/lib/eopipe": "state", "/etc/eopipe/assignment": "assignment", "/tmp": "tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "64Mi"}
    args = c["args"]
    assert args[args.index("--state-dir") + 1] == "/var/lib/eopipe"


def test_the_checker_sees_what_the_standard_refuses():
    """The unit check is not vacuous: the pod spec this project shipped before fails it."""
    pod = _pod(_names())["spec"]
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}
    assert restricted_problems(pod) == ["dedup: seccompProfile None"]
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    pod["containers"][0]["securityContext"] = {"runAsNonRoot": True}
    assert len(restricted_problems(pod)) == 4


@pytest.mark.parametrize("role", ["driver", "executor"])
def test_spark_pods_get_the_restricted_security_fields(role):
    """The role's pod template carries the security contexts (Spark applies it, with the Spark
    Operator's webhook on or off), and the pod Spark makes of it passes the restricted profile."""
    app = spark.spark_application(_names(), "eopipe-spark:dev")
    part = app["spec"][role]
    template = part["template"]["spec"]
    assert template["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                           "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    assert template["containers"][0]["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                                            "capabilities": {"drop": ["ALL"]}}
    # Not the webhook's fields too: with the webhook on they would be applied a second time.
    assert "podSecurityContext" not in part and "securityContext" not in part
    pod = spark_pod(app, role)["spec"]
    assert pod["securityContext"] == template["securityContext"]
    assert restricted_problems(pod) == []


# ---------------------------------------------------------------------------------------
# resources and the RocksDB budget
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("limit, budget_mb", [
    ("1Gi", 409),          # the default limit: 40%
    ("2Gi", 819),
    ("4Gi", 1638),
    ("1536Mi", 614),
    ("1.5Gi", 614),
    ("1G", 381),           # decimal units: 10^9 bytes
    ("1000M", 381),
    ("512Mi", 204),
    ("160Mi", 64),         # 40% is exactly the floor
    ("128Mi", 64),         # below it: the floor
    ("64Mi", 64),
    ("1073741824", 409),   # plain bytes
    ("1073741824000m", 409),
])
def test_rocksdb_budget_from_the_memory_limit(limit, budget_mb):
    assert dedup.memory_budget_mb(limit) == budget_mb


@pytest.mark.parametrize("requests, limits, want_requests, want_limits", [
    ({}, {}, {"cpu": "250m", "memory": "512Mi"}, {"memory": "1Gi"}),
    ({"cpu": "2"}, {}, {"cpu": "2", "memory": "512Mi"}, {"memory": "1Gi"}),
    ({}, {"memory": "4Gi"}, {"cpu": "250m", "memory": "512Mi"}, {"memory": "4Gi"}),
    # A defaulted limit never below the spec's request, a defaulted request never above its limit.
    ({"memory": "2Gi"}, {}, {"cpu": "250m", "memory": "2Gi"}, {"memory": "2Gi"}),
    ({}, {"memory": "256Mi"}, {"cpu": "250m", "memory": "256Mi"}, {"memory": "256Mi"}),
    ({}, {"cpu": "100m"}, {"cpu": "100m", "memory": "512Mi"}, {"cpu": "100m", "memory": "1Gi"}),
    ({"memory": "768Mi"}, {"memory": "3Gi"}, {"cpu": "250m", "memory": "768Mi"}, {"memory": "3Gi"}),
    ({"ephemeral-storage": "1Gi"}, {}, {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
     {"memory": "1Gi"}),
])
def test_pod_resources_fill_what_the_spec_leaves_out(requests, limits, want_requests, want_limits):
    got = dedup.pod_resources(Resources(requests=requests, limits=limits))
    assert got == {"requests": want_requests, "limits": want_limits}


@pytest.mark.parametrize("resources, budget_mb", [
    ({}, 409),
    ({"limits": {"memory": "2Gi"}}, 819),
    ({"requests": {"memory": "3Gi"}}, 1228),  # the limit follows the request
])
def test_the_worker_gets_the_budget_of_its_container(resources, budget_mb):
    from eopipe.dedup import cli

    n = _names(**{"dedup.resources": resources})
    c = _pod(n)["spec"]["containers"][0]
    assert c["resources"] == dedup.pod_resources(n.spec.dedup.resources)
    # The worker parses the command line the operator built.
    sub = argparse.ArgumentParser().add_subparsers()
    cli.add_parser(sub)
    # POD_NAME comes from the downward API in a pod.
    args = sub.choices["dedup"].parse_args(c["args"][1:] + ["--pod-name", "payments-dedup-0"])
    assert cli.config_from_args(args).memory_mb == budget_mb
    assert dedup.worker_args(n).count("--memory-mb") == 1


@pytest.mark.parametrize("backup, args, env", [
    (None, None, []),
    ({"uri": "s3://state/payments"}, ["--backup-uri", "s3://state/payments", "--backup-interval", "300s",
                                      "--backup-retention", "3"], []),
    ({"uri": "s3://state", "endpoint": "http://seaweedfs.storage.svc:8333", "interval": "1m", "retention": 5,
      "credentials": {"accessKeyId": {"name": "s3", "key": "id"}, "secretAccessKey": {"name": "s3", "key": "secret"}}},
     ["--backup-uri", "s3://state", "--backup-endpoint", "http://seaweedfs.storage.svc:8333",
      "--backup-interval", "60s", "--backup-retention", "5"],
     [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}},
      {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}}]),
])
def test_backups_reach_the_worker_as_it_parses_them(backup, args, env):
    """spec.dedup.backup becomes the worker's --backup-* options (parsed by the worker itself) and
    its credentials env from the pipeline's Secret, never a literal value."""
    from eopipe.dedup import cli

    n = _names(**({"dedup.backup": backup} if backup else {}))
    c = _pod(n)["spec"]["containers"][0]
    assert [a for a in c["args"] if a.startswith("--backup")] == [a for a in args or [] if a.startswith("--backup")]
    if args:
        i = c["args"].index("--backup-uri")
        assert c["args"][i:i + len(args)] == args
    assert [e for e in c["env"] if e["name"].startswith("AWS_")] == env
    sub = argparse.ArgumentParser().add_subparsers()
    cli.add_parser(sub)
    cfg = cli.config_from_args(sub.choices["dedup"].parse_args(c["args"][1:] + ["--pod-name", "payments-dedup-0"]))
    assert cfg.backup_uri == (backup or {}).get("uri")
    # The pipeline's manifest is kept beside the snapshots: the ConfigMap's file, as mounted.
    mounted = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "assignment")
    assert cfg.pipeline_manifest == (Path(mounted) / dedup.MANIFEST_KEY if backup else None)
    if backup:
        assert (cfg.backup_interval_seconds, cfg.backup_retention) == (int(args[args.index("--backup-interval") + 1][:-1]),
                                                                       backup.get("retention", 3))


# ---------------------------------------------------------------------------------------
# spreading, image pull secrets, the pod template
# ---------------------------------------------------------------------------------------

def test_dedup_pods_prefer_different_nodes():
    n = _names()
    (term,) = _pod(n)["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": n.selector("dedup")},
                                       "topologyKey": "kubernetes.io/hostname"}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in _pod(n)["spec"]["affinity"]["podAntiAffinity"]


def test_image_pull_secrets_reach_dedup_pods_and_the_spark_application():
    n = _names(imagePullSecrets=[{"name": "registry-a"}, {"name": "registry-b"}])
    assert _pod(n)["spec"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    app = spark.spark_application(n, "eopipe-spark:dev")
    assert app["spec"]["imagePullSecrets"] == ["registry-a", "registry-b"]  # v1beta2: names
    assert spark_pod(app, "driver")["spec"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    n = _names()
    assert "imagePullSecrets" not in _pod(n)["spec"]
    assert "imagePullSecrets" not in spark.spark_application(n, "img")["spec"]


def test_the_pod_template_adds_to_the_operators_settings():
    n = _names(**{"dedup.podTemplate": POD_TEMPLATE})
    sts = dedup.statefulset(n, "eopipe:dev")
    tpl = sts["spec"]["template"]
    pod = tpl["spec"]
    assert tpl["metadata"]["labels"] == {**POD_TEMPLATE["labels"], **n.labels("dedup")}
    assert sts["spec"]["selector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
    # Annotations are hints: the template's win (here: no annotation-based scraping).
    assert tpl["metadata"]["annotations"] == {"prometheus.io/scrape": "false", "prometheus.io/port": "8080",
                                              "example.com/owner": "data"}
    assert pod["nodeSelector"] == {"pool": "stateful"} and pod["tolerations"] == POD_TEMPLATE["tolerations"]
    assert pod["priorityClassName"] == "data-critical"
    # The template's nodeAffinity joins the operator's podAntiAffinity.
    assert pod["affinity"]["nodeAffinity"] == POD_TEMPLATE["affinity"]["nodeAffinity"]
    assert "podAntiAffinity" in pod["affinity"]
    env = pod["containers"][0]["env"]
    assert [e["name"] for e in env[:len(OPERATOR_ENV)]] == list(OPERATOR_ENV)
    assert env[-2:] == POD_TEMPLATE["env"]
    # Security settings and resources stay the operator's.
    assert restricted_problems(pod) == [] and pod["containers"][0]["resources"]["limits"] == {"memory": "1Gi"}
    # The template's podAntiAffinity replaces the operator's.
    mine = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}
    assert _pod(_names(**{"dedup.podTemplate": {"affinity": mine}}))["spec"]["affinity"] == mine


def test_the_operators_labels_and_env_win_even_past_validation():
    """The builder itself never lets a template change the selector's labels or the worker's env."""
    n = _names()
    bad = PodTemplate.model_construct(
        labels={LABEL_PIPELINE: "other", LABEL_COMPONENT: "x", "team": "data"}, annotations={}, node_selector={},
        tolerations=[], affinity=None, priority_class_name=None,
        env=[EnvVar.model_construct(name="POD_NAME", value="spoofed", value_from=None)])
    spec = n.spec.model_copy(update={"dedup": n.spec.dedup.model_copy(update={"pod_template": bad})})
    tpl = _pod(Names(n.namespace, n.pipeline, spec))
    assert tpl["metadata"]["labels"][LABEL_PIPELINE] == n.pipeline
    assert tpl["metadata"]["labels"][LABEL_COMPONENT] == "dedup" and tpl["metadata"]["labels"]["team"] == "data"
    env = tpl["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "POD_NAME"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


@pytest.mark.parametrize("template, message", [
    ({"labels": {LABEL_PIPELINE: "other"}}, POD_LABELS_MESSAGE),
    ({"labels": {"app.kubernetes.io/managed-by": "me"}}, POD_LABELS_MESSAGE),
    ({"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}, POD_ENV_MESSAGE),
    ({"env": [{"name": "EOPIPE_KAFKA_ISOLATION_LEVEL", "value": "read_uncommitted"}]}, POD_ENV_MESSAGE),
    ({"env": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]},
     POD_ENV_VALUE_MESSAGE),
])
def test_a_template_may_not_set_what_the_operator_owns(template, message):
    with pytest.raises(ValidationError) as e:
        _names(**{"dedup.podTemplate": template})
    (err,) = e.value.errors()
    # The same words as the API server's CEL rule at the same place.
    assert (err["loc"], str(err["ctx"]["error"])) == (("dedup", "podTemplate"), message)
    assert message in [r["message"] for r in CEL_RULES[("dedup", "podTemplate")]]


def test_the_reserved_names_are_what_the_builder_sets():
    n = _names()
    c = _pod(n)["spec"]["containers"][0]
    assert set(n.labels("dedup")) == set(OPERATOR_LABELS)
    own = [e["name"] for e in c["env"]]
    assert all(name in OPERATOR_ENV or name.startswith("EOPIPE_KAFKA_") for name in own), own


def test_the_crd_passes_kubernetes_objects_through():
    from eopipe.control import crd

    tpl = crd.spec_schema()["properties"]["dedup"]["properties"]["podTemplate"]["properties"]
    assert tpl["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert tpl["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert tpl["env"]["items"]["properties"]["valueFrom"]["x-kubernetes-preserve-unknown-fields"] is True
    # Bounded, so the API server accepts the CEL rules' estimated cost.
    assert tpl["env"]["maxItems"] == 64 and tpl["labels"]["maxProperties"] == 64
