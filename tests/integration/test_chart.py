"""The Helm chart: lint, render, schema checks, and the chart installed on the real control plane.

- `helm lint --strict` and `helm template` for the default and non-default values.
- Every rendered manifest (and the examples) validated by `kubeconform -strict` against JSON
  schemas made from the test API server's own OpenAPI v3 (`/openapi/v3`): the usual schema
  website is not reachable here, and the API server is the authority for its version anyway
  (CRD kinds included). See `openapi_to_json_schemas`.
- values.schema.json rejects bad values.
- The chart installed with `helm install` on the local control plane. Its operator Deployment
  runs as a pod through the node agent, authenticated as the chart's ServiceAccount (not the
  admin kubeconfig: values `serviceAccountKubeconfig`), and reconciles examples/minimal.yaml
  to Ready in a watched namespace. That proves the namespaced RBAC is sufficient.

helm and kubeconform are built from the Go module proxy by hack/build-tools.sh (cached; the `tools`
fixture in conftest.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from eopipe.core.names import LABEL_MANAGED_BY, MANAGED_BY
from localenv.fixtures_operator import kubectl
from tests.helpers.helm import CHART, ROOT, run_helm
from tests.helpers.podsecurity import dry_run_create, pod_from_template, restrict_namespace, restricted_problems

CRD_FILE = "exactlyoncepipelines.eopipe.dev.yaml"

# Kinds with no schema on the test API server (no Prometheus Operator, no Argo CD there).
NO_SCHEMA_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule", "Application")

VALUE_SETS = {
    "default": [],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}", "--set", "logLevel=debug",
                   "--set", "image.tag=1.2.3", "--set", "image.pullPolicy=Always"],
    "monitoring": ["--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prom",
                   "--set", "podMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
                   "--set", "logFormat=json", "--set", "serviceAccountKubeconfig.enabled=true",
                   "--set", "nodeSelector.kubernetes\\.io/os=linux",
                   "--set", "tolerations[0].key=dedicated", "--set", "tolerations[0].operator=Exists",
                   "--set", "podAnnotations.team=data"],
}


# ---------------------------------------------------------------------------------------
# helpers (the fixtures `tools` and `helm_env` are in conftest.py)
# ---------------------------------------------------------------------------------------

def render(tools, helm_env, *values: str, namespace: str = "eopipe-system", crds: bool = False) -> list[dict]:
    args = ["template", "eopipe", str(CHART), "--namespace", namespace, *values]
    if crds:
        args.append("--include-crds")
    out = run_helm(tools, helm_env, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


# ---------------------------------------------------------------------------------------
# static checks: lint, render, values schema
# ---------------------------------------------------------------------------------------

def test_chart_crd_is_the_repo_crd():
    assert (CHART / "crds" / CRD_FILE).read_bytes() == (ROOT / "crds" / CRD_FILE).read_bytes(), \
        "charts/eopipe/crds/ is out of date: cp crds/*.yaml charts/eopipe/crds/"


def test_chart_app_version_matches_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert chart["appVersion"] == version


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_helm_lint(tools, helm_env, values):
    res = run_helm(tools, helm_env, "lint", "--strict", str(CHART), *VALUE_SETS[values])
    assert "0 chart(s) failed" in res.stdout


def test_default_render(tools, helm_env):
    from eopipe.control.settings import Settings

    docs = render(tools, helm_env)
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment",
         "Service", "PodDisruptionBudget", "NetworkPolicy", "ValidatingAdmissionPolicy",
         "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"])
    # The driver policy's parameters: the SparkApplications the operator labels as its own.
    (driver,) = [b for b in by_kind(docs, "ValidatingAdmissionPolicyBinding") if "paramRef" in b["spec"]]
    assert driver["spec"]["paramRef"]["selector"]["matchLabels"] == {LABEL_MANAGED_BY: MANAGED_BY}
    dep = by_kind(docs, "Deployment")[0]
    # The operator enforces the same tenant policy the admission policy renders (docs/security.md).
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert Settings.from_env({"EOPIPE_TENANT_POLICY": env["EOPIPE_TENANT_POLICY"]}).tenant_policy == Settings().tenant_policy
    # Two replicas, one leader (a Lease); a rollout starts a follower before stopping one.
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": dep["spec"]["selector"]}
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["eopipe"] and c["args"][0] == "operator"
    assert not any(a.startswith("--namespace") for a in c["args"])  # cluster-wide
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")[0]["metadata"]["name"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["EOPIPE_IMAGE"] == "eopipe:0.1.0" and env["EOPIPE_SPARK_IMAGE"] == "eopipe-spark:0.1.0"
    assert "KUBECONFIG" not in env and "automountServiceAccountToken" not in pod
    assert env["EOPIPE_LEADER_ELECTION"] == "true" and env["EOPIPE_LEASE_NAME"] == "eopipe-leader"
    assert (env["EOPIPE_LEASE_DURATION_SECONDS"], env["EOPIPE_RENEW_DEADLINE_SECONDS"],
            env["EOPIPE_RETRY_PERIOD_SECONDS"]) == ("15", "10", "2")
    assert env["EOPIPE_RESYNC_SECONDS"] == "60"
    assert Settings.from_env({"EOPIPE_KAFKA_TIMEOUT_SECONDS": env["EOPIPE_KAFKA_TIMEOUT_SECONDS"]}) \
        .kafka_timeout_seconds == Settings().kafka_timeout_seconds
    assert env["EOPIPE_NODE_LOST_SECONDS"] == "60"
    assert Settings.from_env({"EOPIPE_NODE_LOST_SECONDS": env["EOPIPE_NODE_LOST_SECONDS"]}).node_lost_seconds == \
        Settings().node_lost_seconds
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert refs["POD_NAME"] == "metadata.name" and refs["POD_NAMESPACE"] == "metadata.namespace"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    (role,) = by_kind(docs, "Role")
    assert role["metadata"] == {**role["metadata"], "name": "eopipe-leader-election", "namespace": "eopipe-system"}
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["eopipe-leader"],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    (binding,) = by_kind(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "eopipe", "namespace": "eopipe-system"}]
    svc = by_kind(docs, "Service")[0]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    (operator_role,) = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "eopipe-eopipe-system"]
    assert any(r["resources"] == ["namespaces"] for r in operator_role["rules"])
    # The Spark drivers' ClusterRole, which the operator binds per pipeline, by this name.
    assert env["EOPIPE_SPARK_DRIVER_CLUSTERROLE"] == "eopipe-eopipe-system-spark-driver"
    assert driver_cluster_role(docs)["metadata"]["name"] == "eopipe-eopipe-system-spark-driver"
    settings = Settings.from_env({**{k: v for k, v in env.items() if v is not None}, "POD_NAMESPACE": "eopipe-system"})
    assert settings.spark_driver_cluster_role == "eopipe-eopipe-system-spark-driver"


def test_single_replica_without_leader_election(tools, helm_env):
    docs = render(tools, helm_env, "--set", "replicas=1", "--set", "leaderElection.enabled=false")
    assert not by_kind(docs, "PodDisruptionBudget") and not by_kind(docs, "Role")
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EOPIPE_LEADER_ELECTION"] == "false" and "EOPIPE_LEASE_NAME" not in env
    assert "affinity" not in dep["spec"]["template"]["spec"]


@pytest.mark.parametrize("args, message", [
    (["--set", "leaderElection.enabled=false"], "replicas > 1 needs leaderElection.enabled"),
    (["--set", "leaderElection.renewDeadlineSeconds=15"],
     "retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds"),
])
def test_leader_election_settings_that_cannot_work_are_refused(tools, helm_env, args, message):
    res = run_helm(tools, helm_env, "template", "eopipe", str(CHART), *args, check=False)
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_network_policies_render(tools, helm_env):
    """networkPolicy: the operator pods' own policy in the chart, and the settings with which the
    operator makes each pipeline's (builders/access.py) select exactly the chart's operator pods."""
    from eopipe.control.settings import Settings

    docs = render(tools, helm_env, "--set", "allowedRegistries={ghcr.io/acme,registry.example.com:5000}")
    (np,) = by_kind(docs, "NetworkPolicy")
    dep = by_kind(docs, "Deployment")[0]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert np["spec"]["ingress"][1] == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": "metrics"}]}
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = Settings.from_env({**{k: v for k, v in env.items() if v is not None},
                                  "POD_NAMESPACE": "eopipe-system"})
    assert settings.allowed_registries == ("ghcr.io/acme", "registry.example.com:5000")
    peers = settings.network_policy
    assert peers is not None and peers.operator_namespace == "eopipe-system"
    assert dict(peers.operator_labels).items() <= pod_labels.items()
    assert dict(peers.operator_labels) == dep["spec"]["selector"]["matchLabels"]
    assert peers.metrics_namespace_selector == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    # Off: no policy, and the operator makes none.
    docs = render(tools, helm_env, "--set", "networkPolicy.enabled=false")
    assert not by_kind(docs, "NetworkPolicy")
    env = {e["name"]: e.get("value") for e in
           by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "EOPIPE_NETWORK_POLICIES" not in env and "EOPIPE_ALLOWED_REGISTRIES" not in env
    # No metrics namespaces: only the health port stays open.
    (np,) = by_kind(render(tools, helm_env, "--set", "networkPolicy.metricsNamespaceSelector=null"), "NetworkPolicy")
    assert np["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": "health"}]}]


def test_namespaced_render(tools, helm_env):
    docs = render(tools, helm_env, *VALUE_SETS["namespaced"])
    leader = "eopipe-leader-election"
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] != leader]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] != leader]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "eopipe", "namespace": "eopipe-system"}]
    # The only cluster-wide grants left: reading CRDs and namespaces (Kopf observes both), Nodes
    # (node loss: each by name, and a watch for a cordon) and PersistentVolumes by name; the Spark
    # drivers' ClusterRole is bound by the operator in a pipeline's namespace, to drivers.
    (cluster_role,) = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("-kopf")]
    assert sorted(d["metadata"]["name"] for d in by_kind(docs, "ClusterRole")) == [
        "eopipe-eopipe-system-kopf", "eopipe-eopipe-system-spark-driver"]
    assert cluster_role["rules"] == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"]}]
    c = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=team-a" in c["args"] and "--namespace=team-b" in c["args"] and "--verbose" in c["args"]
    assert c["image"] == "eopipe:1.2.3" and c["imagePullPolicy"] == "Always"


def test_monitoring_render(tools, helm_env):
    docs = render(tools, helm_env, *VALUE_SETS["monitoring"])
    (sm,) = by_kind(docs, "ServiceMonitor")
    svc = by_kind(docs, "Service")[0]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # honorLabels: eopipe_operator_pipeline_ready's `namespace` is the pipeline's (the alerts use it).
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "honorLabels": True,
                                        "interval": "30s", "scrapeTimeout": "10s"}]
    assert len(by_kind(docs, "PodMonitor")) == 1 and len(by_kind(docs, "PrometheusRule")) == 1  # test_alerts.py
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["eopipe-system"]}
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert "--log-json" in pod["containers"][0]["args"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    # Credentials from a projected ServiceAccount token through KUBECONFIG, no automount.
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["KUBECONFIG"] == "/var/run/eopipe/kube/kubeconfig"
    (cm,) = by_kind(docs, "ConfigMap")
    kc = yaml.safe_load(cm["data"]["kubeconfig"])
    assert kc["users"][0]["user"] == {"tokenFile": "token"}
    assert kc["clusters"][0]["cluster"]["certificate-authority"] == "ca.crt"


@pytest.mark.parametrize("values, fullname, name", [
    ([], "eopipe", "eopipe"),
    (["--set", "nameOverride=streams"], "eopipe-streams", "streams"),
    (["--set", "fullnameOverride=data-eo"], "data-eo", "eopipe"),
    (["--set", "nameOverride=streams", "--set", "fullnameOverride=data-eo"], "data-eo", "streams"),
])
def test_name_overrides(tools, helm_env, values, fullname, name):
    """nameOverride and fullnameOverride: every object's name and the name label follow."""
    docs = render(tools, helm_env, *values, "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                  "--set", "prometheusRule.enabled=true")
    for d in docs:
        assert d["metadata"]["name"].startswith(fullname), d["metadata"]["name"]
        assert d["metadata"]["labels"]["app.kubernetes.io/name"] == name
    dep = by_kind(docs, "Deployment")[0]
    assert dep["metadata"]["name"] == fullname
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == fullname
    assert dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == name
    assert by_kind(docs, "Service")[0]["metadata"]["name"] == f"{fullname}-metrics"
    assert by_kind(docs, "ClusterRoleBinding")[0]["subjects"][0]["name"] == fullname


# ---------------------------------------------------------------------------------------
# RBAC: what the rendered chart grants the operator, and the Spark drivers' ClusterRole
# ---------------------------------------------------------------------------------------

LEADER_SUFFIX = "-leader-election"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def operator_env(docs: list[dict]) -> dict[str, str | None]:
    (dep,) = by_kind(docs, "Deployment")
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def driver_cluster_role(docs: list[dict]) -> dict:
    """The ClusterRole the operator binds for Spark drivers: the one its env names."""
    name = operator_env(docs)["EOPIPE_SPARK_DRIVER_CLUSTERROLE"]
    (role,) = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == name]
    return role


def operator_rules(docs: list[dict]) -> dict[str, list[dict]]:
    """The rules the chart's bindings give the operator's ServiceAccount, by where they apply:
    "*" (ClusterRoleBindings) or a namespace (RoleBindings); the leader-election Role apart."""
    (dep,) = by_kind(docs, "Deployment")
    sa = {"kind": "ServiceAccount", "name": dep["spec"]["template"]["spec"]["serviceAccountName"],
          "namespace": dep["metadata"]["namespace"]}
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: dict[str, list[dict]] = {}
    for b in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding"):
        if sa not in b["subjects"] or b["roleRef"]["name"].endswith(LEADER_SUFFIX):
            continue
        ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        ref = b["roleRef"]
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
        out.setdefault(ns or "*", []).extend(role["rules"])
    return out


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rbac_is_least_privilege(tools, helm_env, values):
    """What the operator holds is what it uses: of pod writes only delete, for a dedup pod on a
    lost node (the Spark drivers' rights are a ClusterRole it may only bind, by name), Secrets
    read and the token Secret created, deletes only of the SparkApplication it stops on pause and
    of a lost node's pod and claim; of nodes and volumes only get; no wildcard, escalate or
    impersonate."""
    from eopipe.control.builders.spark import DRIVER_RULES

    docs = render(tools, helm_env, *VALUE_SETS[values])
    driver = driver_cluster_role(docs)
    assert driver["rules"] == DRIVER_RULES
    # Bound by the operator per pipeline (builders/spark.py driver_rbac), by no chart binding.
    bindings = by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
    assert all(b["roleRef"]["name"] != driver["metadata"]["name"] for b in bindings)
    for doc in by_kind(docs, "Role") + by_kind(docs, "ClusterRole"):
        for rule in doc["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert not {"escalate", "impersonate"} & set(rule["verbs"]), rule

    bound = operator_rules(docs)
    assert set(bound) == ({"team-a", "team-b", "*"} if values == "namespaced" else {"*"})
    for rule in (r for rules in bound.values() for r in rules):
        verbs = set(rule["verbs"])
        if {"pods", "pods/exec", "pods/eviction"} & set(rule["resources"]):  # node loss deletes, no more
            assert rule["resources"] == ["pods"] and verbs & WRITES <= {"delete"}, rule
        if {"nodes", "persistentvolumes"} & set(rule["resources"]):  # read only; PVs by name
            assert verbs <= ({"get", "list", "watch"} if rule["resources"] == ["nodes"] else {"get"}), rule
        if "bind" in verbs:  # one ClusterRole, by name
            assert (rule["resources"], rule["verbs"], rule.get("resourceNames")) == \
                (["clusterroles"], ["bind"], [driver["metadata"]["name"]]), rule
        if "secrets" in rule["resources"]:  # read by name, the token Secret created; never listed
            assert rule["resources"] == ["secrets"] and rule["verbs"] == ["get", "create"], rule
        if verbs & {"delete", "deletecollection"}:  # spec.paused stops the SparkApplication; node loss
            assert rule["resources"] in (["sparkapplications"], ["pods"], ["persistentvolumeclaims"]) \
                and verbs & {"delete", "deletecollection"} == {"delete"}, rule
    # And the Spark drivers may do what they must: the ClusterRole is theirs.
    assert {"create", "delete"} <= set(driver["rules"][0]["verbs"]) and "pods" in driver["rules"][0]["resources"]


def _grants(rules: list[dict], named: bool = False) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of the rules without resourceNames, or with them (named)."""
    return {(g, r, v) for rule in rules if bool(rule.get("resourceNames")) == named
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rbac_grants_exactly_the_operators_api_access(tools, helm_env, values):
    """control/permissions.py (checked against the code by tests/unit/test_permissions.py) and
    the rules the chart binds to the operator: every access granted where it is needed, the named
    ones (bind) on the driver's ClusterRole only, and nothing beyond."""
    from eopipe.control import permissions as p

    docs = render(tools, helm_env, *VALUE_SETS[values])
    bound = operator_rules(docs)
    (lease_role,) = [d for d in by_kind(docs, "Role") if d["metadata"]["name"].endswith(LEADER_SUFFIX)]
    assert lease_role["metadata"]["namespace"] == "eopipe-system"
    assert {n for r in lease_role["rules"] for n in r.get("resourceNames", [])} == {"eopipe-leader"}
    own = _grants(lease_role["rules"]) | _grants(lease_role["rules"], named=True)

    need = {p.WATCHED: set(), p.OWN: set(), p.CLUSTER: set()}
    named = set()
    for a in (*p.API_ACCESS, *p.IMPLIED):
        (named if a.named else need[a.scope]).update((a.group, a.resource, v) for v in a.verbs)
    assert all(a.scope == p.WATCHED for a in (*p.API_ACCESS, *p.IMPLIED) if a.named)
    assert own == need[p.OWN]
    watched = {ns: rules for ns, rules in bound.items() if ns != "*"} or {"*": bound["*"]}
    cluster = _grants(bound["*"]) - (need[p.WATCHED] if "*" in watched else set())
    assert cluster == need[p.CLUSTER], sorted(cluster ^ need[p.CLUSTER])
    driver = driver_cluster_role(docs)["metadata"]["name"]
    for ns, rules in watched.items():
        grants = _grants(rules) - (need[p.CLUSTER] if ns == "*" else set())
        assert grants == need[p.WATCHED], (ns, sorted(grants ^ need[p.WATCHED]))
        assert _grants(rules, named=True) == named, ns
        assert {n for r in rules for n in r.get("resourceNames", [])} == {driver}, ns
    if "*" not in watched:  # namespaced: the ClusterRole is Kopf's reads only
        assert not _grants(bound["*"], named=True)


@pytest.mark.parametrize("args, message", [
    (["--set", "logLevel=loud"], "/logLevel"),
    (["--set", "logFormat=xml"], "/logFormat"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
    (["--set", "healthPort=0"], "/healthPort"),
    (["--set", "metrics.port=70000"], "/metrics/port"),
    (["--set", "serviceMonitor.enabled=yes"], "/serviceMonitor/enabled"),
    (["--set", "serviceMonitor.interval=soon"], "/serviceMonitor/interval"),
    (["--set", "kafka.deleteAttempts=0"], "/kafka/deleteAttempts"),
    (["--set", "kafka.timeoutSeconds=0"], "/kafka/timeoutSeconds"),
    (["--set", "nodeLoss.thresholdSeconds=-1"], "/nodeLoss/thresholdSeconds"),
    (["--set", "replicas=0"], "/replicas"),
    (["--set", "leaderElection.enabled=yes"], "/leaderElection/enabled"),
    (["--set", "leaderElection.leaseSeconds=9"], "additional properties 'leaseSeconds'"),
    (["--set", "image.repository="], "/image/repository"),
    (["--set", "podMonitor.enabled=yes"], "/podMonitor/enabled"),
    (["--set", "prometheusRule.dedupLag.records=-1"], "/prometheusRule/dedupLag/records"),
    (["--set", "prometheusRule.effectiveWindow.ratio=1.5"], "/prometheusRule/effectiveWindow/ratio"),
    (["--set", "prometheusRule.transactionAborts.perSecond=fast"], "/prometheusRule/transactionAborts/perSecond"),
    (["--set", "prometheusRule.pipelineNotReady.for=soon"], "/prometheusRule/pipelineNotReady/for"),
    (["--set", "prometheusRule.thresholds.lag=1"], "additional properties 'thresholds'"),
    (["--set", "fullnameOverride=" + "x" * 64], "/fullnameOverride"),
    (["--set", "networkPolicy.enabled=maybe"], "/networkPolicy/enabled"),
    (["--set", "allowedRegistries={https://ghcr.io}"], "/allowedRegistries/0"),
])
def test_values_schema_rejects_bad_values(tools, helm_env, args, message):
    res = run_helm(tools, helm_env, "template", "eopipe", str(CHART), *args, check=False)
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_service_monitor_needs_the_metrics_service(tools, helm_env):
    res = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--set", "serviceMonitor.enabled=true",
                   "--set", "metrics.service.enabled=false", check=False)
    assert res.returncode != 0 and "serviceMonitor.enabled needs metrics.service.enabled" in res.stderr


# ---------------------------------------------------------------------------------------
# kubeconform against schemas from the real API server
# ---------------------------------------------------------------------------------------

def _resolve(node, schemas: dict, stack: frozenset = frozenset()):
    """One OpenAPI v3 schema node -> a standalone, strict JSON schema (refs inlined)."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        if name in stack:  # a recursive type (JSONSchemaProps): left open at the repeat
            return _resolve(rest, schemas, stack)
        return {**_resolve(schemas[name], schemas, stack | {name}), **_resolve(rest, schemas, stack)}
    if len(node.get("allOf") or ()) == 1:  # how v3 attaches a default/description to a $ref
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return {**_resolve(node["allOf"][0], schemas, stack), **_resolve(rest, schemas, stack)}
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: _resolve(sub, schemas, stack) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = _resolve(value, schemas, stack)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_resolve(sub, schemas, stack) for sub in value]
        else:
            out[key] = value
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string"):
        out.setdefault("type", ["string", "integer"])
    # Strict, as kubeconform -strict expects of its schemas: no undocumented fields.
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def openapi_to_json_schemas(documents: list[dict], dest: Path) -> dict[str, Path]:
    """Writes one JSON schema per kind in kubeconform's file layout
    (`<kind><-group-prefix>-<version>.json`, as `{{ .ResourceKind }}{{ .KindSuffix }}.json`)."""
    schemas: dict = {}
    for doc in documents:
        schemas.update((doc.get("components") or {}).get("schemas") or {})
    written: dict[str, Path] = {}
    dest.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas.items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            if gvk["kind"].endswith("List") or "properties" not in schema:
                continue
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
            path = dest / f"{kind.lower()}{suffix}.json"
            resolved = _resolve(schema, schemas, frozenset({name}))
            # apiVersion and kind must be exactly this GVK.
            resolved["properties"]["apiVersion"] = {"enum": [f"{group}/{version}" if group else version]}
            resolved["properties"]["kind"] = {"enum": [kind]}
            path.write_text(json.dumps(resolved))
            written[f"{group}/{version}/{kind}"] = path
    return written


@pytest.fixture(scope="session")
def k8s_json_schemas(crds, tmp_path_factory) -> str:
    """JSON schemas from the test API server's /openapi/v3, with our CRD installed; returns
    the kubeconform -schema-location template."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(crds.kubeconfig))
    try:
        def get(path: str) -> dict:
            resp = api.call_api(path, "GET", _preload_content=False, auth_settings=["BearerToken"])
            return json.loads(resp[0].data)

        def wanted(gv_path: str) -> bool:
            return gv_path == "api/v1" or gv_path.startswith("apis/")

        # The API server publishes a new CRD's OpenAPI a moment after it is Established.
        deadline = time.monotonic() + 60
        while not {"apis/eopipe.dev/v1beta1", "apis/eopipe.dev/v1alpha1"} <= set(index := get("/openapi/v3")["paths"]) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        docs = [get("/openapi/v3/" + p) for p in sorted(index) if wanted(p)]
    finally:
        api.close()
    dest = tmp_path_factory.mktemp("k8s-json-schemas")
    written = openapi_to_json_schemas(docs, dest)
    for gvk in ("apps/v1/Deployment", "/v1/Service", "rbac.authorization.k8s.io/v1/Role",
                "eopipe.dev/v1beta1/ExactlyOncePipeline", "eopipe.dev/v1alpha1/ExactlyOncePipeline",
                "apiextensions.k8s.io/v1/CustomResourceDefinition"):
        assert gvk in written, sorted(written)
    return str(dest / "{{ .ResourceKind }}{{ .KindSuffix }}.json")


def kubeconform(tools, schema_location: str, manifests: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(tools["kubeconform"]), "-strict", "-summary", "-output", "text",
                           "-schema-location", schema_location, "-skip", ",".join(NO_SCHEMA_KINDS),
                           *extra, "-"],
                          input=manifests, capture_output=True, text=True, timeout=120)


@pytest.mark.k8s
@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rendered_chart_is_valid_for_kubeconform_strict(tools, helm_env, k8s_json_schemas, values):
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--include-crds",
                   "--namespace", "eopipe-system", *VALUE_SETS[values]).stdout
    res = kubeconform(tools, k8s_json_schemas, out)
    assert res.returncode == 0, res.stdout + res.stderr
    n_docs = len([d for d in yaml.safe_load_all(out) if d])
    skipped = len([d for d in yaml.safe_load_all(out) if d and d["kind"] in NO_SCHEMA_KINDS])
    assert f"Valid: {n_docs - skipped}, Invalid: 0, Errors: 0" in res.stdout, res.stdout


@pytest.mark.k8s
def test_kubeconform_strict_catches_mistakes(tools, k8s_json_schemas):
    """The generated schemas are strict: an unknown field or a wrong type fails."""
    bad = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "templat": {}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
         "spec": {"ports": [{"port": "http"}]}},
        *({"apiVersion": f"eopipe.dev/{version}", "kind": "ExactlyOncePipeline", "metadata": {"name": "x"},
           "spec": {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": "t", "partitions": "many"}}}
          for version in ("v1beta1", "v1alpha1")),  # the deprecated version is checked as strictly
    ]
    for doc in bad:
        res = kubeconform(tools, k8s_json_schemas, yaml.safe_dump(doc))
        assert res.returncode != 0 and "Invalid: 1" in res.stdout, (doc, res.stdout)


@pytest.mark.k8s
def test_examples_are_valid_for_kubeconform_strict(tools, k8s_json_schemas):
    files = sorted((ROOT / "examples").glob("*.yaml"))
    text = "\n---\n".join(f.read_text() for f in files)
    res = kubeconform(tools, k8s_json_schemas, text)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.k8s
@pytest.mark.parametrize("example", ["minimal.yaml", "payments.yaml", "file-sink.yaml"])
def test_examples_are_accepted_by_the_api_server(crds, k8s_namespace, example):
    """Each example passes the API server's schema and CEL rules (server-side dry run)."""
    res = kubectl(crds, "apply", "--dry-run=server", "-n", k8s_namespace, "-f", str(ROOT / "examples" / example))
    assert "(server dry run)" in res.stdout


# ---------------------------------------------------------------------------------------
# the chart on the real control plane
# ---------------------------------------------------------------------------------------

def _can_i(cp, sa: str, *args: str) -> bool:
    res = kubectl(cp, "auth", "can-i", f"--as={sa}", *args, check=False)
    return res.stdout.strip() == "yes"


@pytest.mark.k8s
@pytest.mark.parametrize("values", ["default", "monitoring"])
def test_operator_pod_is_admitted_in_a_restricted_namespace(tools, helm_env, kube_api, k8s_namespace, values):
    """The operator's own pod meets the restricted Pod Security Standard: a Pod of the chart's
    Deployment template, server-side dry-run created where PodSecurity enforces `restricted`
    (with the projected kubeconfig volume in "monitoring"). The Deployment itself would be
    admitted whatever its template: only pods are enforced."""
    from kubernetes import client

    ns = k8s_namespace
    restrict_namespace(kube_api, ns)
    docs = render(tools, helm_env, *VALUE_SETS[values], namespace=ns)
    (dep,) = by_kind(docs, "Deployment")
    (sa,) = by_kind(docs, "ServiceAccount")
    client.CoreV1Api(kube_api).create_namespaced_service_account(ns, sa)
    pod = pod_from_template(dep["spec"]["template"], f"{dep['metadata']['name']}-0")
    assert restricted_problems(pod["spec"]) == []
    assert dry_run_create(kube_api, ns, pod) is None
    # The same template without the chart's security values is refused there.
    bare = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--namespace", ns, *VALUE_SETS[values],
                    "--set", "podSecurityContext=null", "--set", "securityContext=null").stdout
    (dep,) = [d for d in yaml.safe_load_all(bare) if d and d["kind"] == "Deployment"]
    refused = dry_run_create(kube_api, ns, pod_from_template(dep["spec"]["template"], "bare"))
    assert refused and "violates PodSecurity" in refused, refused


def allowed(kube_api, user: str, verb: str, group: str, resource: str, namespace: str | None = None,
            name: str | None = None) -> bool:
    """The API server's answer (a SubjectAccessReview) to: may `user` do this?"""
    from kubernetes import client

    attrs = client.V1ResourceAttributes(verb=verb, group=group, resource=resource.split("/")[0],
                                        subresource=resource.partition("/")[2] or None,
                                        namespace=namespace, name=name)
    review = client.AuthorizationV1Api(kube_api).create_subject_access_review(client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(user=user, resource_attributes=attrs)))
    return bool(review.status.allowed)


@pytest.mark.k8s
def test_cluster_wide_rbac_grants_what_the_operator_needs(tools, helm_env, crds, kube_api, k8s_namespace):
    """The kubectl path of docs/install.md (helm template | kubectl apply), cluster-wide mode:
    the ServiceAccount may do its job (control/permissions.py) in any namespace, and nothing
    more: of pod writes only delete (node loss), and of the ClusterRoles only the Spark drivers'
    to bind."""
    from eopipe.control import permissions as p

    ns, cp = k8s_namespace, crds
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    full = run_helm(tools, helm_env, "template", release, str(CHART), "--namespace", ns).stdout
    res = kubectl(cp, "apply", "--server-side", "--dry-run=server", "-n", ns, "-f", "-", input=full)
    assert f"deployment.apps/{release}-eopipe serverside-applied (server dry run)" in res.stdout, res.stdout
    # Only the ServiceAccount and RBAC for real: a cluster-wide operator pod would reconcile
    # the pipelines of every other test on this shared control plane.
    out = run_helm(tools, helm_env, "template", release, str(CHART), "--namespace", ns,
                   "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml").stdout
    kubectl(cp, "apply", "--server-side", "-n", ns, "-f", "-", input=out)
    try:
        sa = f"system:serviceaccount:{ns}:{release}-eopipe"
        driver = f"{release}-eopipe-{ns}-spark-driver"
        other = "default"
        for a in (*p.API_ACCESS, *p.IMPLIED):
            where = {p.WATCHED: other, p.OWN: ns, p.CLUSTER: None}[a.scope]
            name = driver if a.named else (f"{release}-eopipe-leader" if a.scope == p.OWN else None)
            for verb in a.verbs:
                assert allowed(kube_api, sa, verb, a.group, a.resource, where, name), (verb, a.resource, where)
        rbac = "rbac.authorization.k8s.io"
        for verb, group, resource, name in [
                *[(v, "", "pods", None) for v in ("create", "patch", "update", "deletecollection")],
                ("create", "", "pods/exec", None), ("create", "", "pods/eviction", None),
                ("delete", "", "services", None), ("delete", "", "configmaps", None),
                ("deletecollection", "", "persistentvolumeclaims", None), ("list", "", "secrets", None),
                ("patch", "", "nodes", None), ("list", "", "persistentvolumes", None),
                ("delete", "", "persistentvolumes", None),
                ("delete", "apps", "statefulsets", None), ("delete", "eopipe.dev", "exactlyoncepipelines", None),
                ("create", rbac, "clusterroles", None), ("escalate", rbac, "roles", None),
                ("bind", rbac, "clusterroles", "admin"), ("bind", rbac, "clusterroles", "cluster-admin"),
                ("bind", rbac, "roles", None), ("create", "coordination.k8s.io", "leases", None)]:
            assert not allowed(kube_api, sa, verb, group, resource, other, name), (verb, resource, name)
        # What the drivers' ClusterRole grants, once bound (test_object_ownership.py binds it for real).
        assert {"create", "delete"} <= {v for r in yaml.safe_load_all(out) if r and r["kind"] == "ClusterRole"
                                        and r["metadata"]["name"] == driver for rule in r["rules"]
                                        for v in rule["verbs"]}
        # Leader election: its own Lease, in the release's namespace.
        lease = f"leases.coordination.k8s.io/{release}-eopipe-leader"
        assert _can_i(cp, sa, "get", lease, "-n", ns) and _can_i(cp, sa, "update", lease, "-n", ns)
        assert _can_i(cp, sa, "create", "leases.coordination.k8s.io", "-n", ns)
        assert not _can_i(cp, sa, "update", "leases.coordination.k8s.io/kube-scheduler", "-n", ns)
    finally:
        kubectl(cp, "delete", "-n", ns, "--ignore-not-found", "--wait=false", "-f", "-", input=out, check=False)
