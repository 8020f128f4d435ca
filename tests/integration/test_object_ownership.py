"""The operator with the chart's rights on the real control plane (RBAC on): it binds the Spark
drivers' ClusterRole and can grant nothing else, and it leaves objects it did not make as they
were (control/ownership.py), reporting the conflict in the pipeline's status.

The chart's ServiceAccount and RBAC (watchNamespaces: the test's namespace) are applied from
`helm template`; the operator process authenticates with a token of that ServiceAccount, not
the admin kubeconfig.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.config import new_client_from_config

from eopipe.control.builders import dedup, spark
from eopipe.control.kube import Applier, ApplyError, owner_reference
from eopipe.control.ownership import ObjectConflict
from eopipe.core.assignment import Assignment
from eopipe.core.names import Names
from eopipe.core.spec import RESOURCE, PipelineSpec
from localenv.fixtures_operator import _OP_KEY, OperatorProcess, kubectl, wait_for
from tests.helpers.helm import CHART, run_helm
from tests.helpers.pipelines import condition, example_manifest, get_pipeline, kubectl_apply, unique_topic, wait_passes

pytestmark = pytest.mark.k8s
RBAC = "rbac.authorization.k8s.io"


@dataclass
class ChartRBAC:
    user: str          # the operator's ServiceAccount, as RBAC names it
    driver: str        # the Spark drivers' ClusterRole
    kubeconfig: Path   # a token of the ServiceAccount

    def api(self) -> client.ApiClient:
        return new_client_from_config(config_file=str(self.kubeconfig))


@pytest.fixture
def chart_rbac(tools, helm_env, crds, kube_api, k8s_namespace, tmp_path):
    """The chart's ServiceAccount and RBAC, watching the test's namespace only."""
    ns, release = k8s_namespace, f"own-{uuid.uuid4().hex[:6]}"
    out = run_helm(tools, helm_env, "template", release, str(CHART), "--namespace", ns,
                   "--set", f"watchNamespaces={{{ns}}}", "--show-only", "templates/serviceaccount.yaml",
                   "--show-only", "templates/rbac.yaml").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    (driver,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-spark-driver")]
    kubectl(crds, "apply", "--server-side", "-n", ns, "-f", "-", input=out)
    try:
        token = client.CoreV1Api(kube_api).create_namespaced_service_account_token(
            sa["metadata"]["name"], ns,
            client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))).status.token
        kubeconfig = tmp_path / "operator-sa.kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "c", "cluster": {"server": crds.server, "certificate-authority": str(crds.ca_cert)}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
        yield ChartRBAC(f"system:serviceaccount:{ns}:{sa['metadata']['name']}", driver["metadata"]["name"], kubeconfig)
    finally:
        kubectl(crds, "delete", "-n", ns, "--ignore-not-found", "--wait=false", "-f", "-", input=out, check=False)


def allowed(kube_api, user: str, verb: str, resource: str, namespace: str, name: str | None = None,
            group: str = "") -> bool:
    review = client.AuthorizationV1Api(kube_api).create_subject_access_review(client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(user=user, resource_attributes=client.V1ResourceAttributes(
            verb=verb, group=group, resource=resource, namespace=namespace, name=name))))
    return bool(review.status.allowed)


def create_pipeline(kube_api, ns: str, example: str, name: str, bootstrap: str = "kafka.invalid:9092",
                    **over) -> dict:
    doc = example_manifest(example, bootstrap, **over)
    doc["metadata"] = {"name": name, "namespace": ns}
    group, version, plural = RESOURCE
    return client.CustomObjectsApi(kube_api).create_namespaced_custom_object(group, version, ns, plural, doc)


def names_of(pipeline: dict) -> Names:
    meta = pipeline["metadata"]
    return Names(meta["namespace"], meta["name"], PipelineSpec.model_validate(pipeline["spec"]))


def test_the_operator_binds_the_drivers_cluster_role_and_can_grant_nothing_else(chart_rbac, kube_api, k8s_namespace):
    """The driver's RoleBinding to the chart's ClusterRole and the dedup pods' Role, applied with
    the operator's rights: RBAC's escalation check passes by `bind` (on that ClusterRole only)
    and by the ConfigMap reads the operator holds; the driver may then run executors, the
    operator itself may not, and it cannot bind or grant anything more."""
    ns = k8s_namespace
    pipeline = create_pipeline(kube_api, ns, "payments.yaml", "pay")
    names = names_of(pipeline)
    as_operator = Applier(chart_rbac.api())
    for manifest in [*dedup.rbac(names), *spark.driver_rbac(names, chart_rbac.driver)]:
        live = as_operator.apply(manifest, pipeline)
        assert live["metadata"]["ownerReferences"] == [owner_reference(pipeline)]

    driver_sa = f"system:serviceaccount:{ns}:pay-spark"
    for verb in ("create", "delete", "watch"):
        assert allowed(kube_api, driver_sa, verb, "pods", ns), verb
    assert not allowed(kube_api, driver_sa, "create", "pods", "default")
    assert not allowed(kube_api, driver_sa, "get", "secrets", ns)
    dedup_sa = f"system:serviceaccount:{ns}:pay-dedup"
    assert allowed(kube_api, dedup_sa, "watch", "configmaps", ns, "pay-dedup-assignment")
    assert not allowed(kube_api, dedup_sa, "get", "configmaps", ns, "other")
    assert not allowed(kube_api, chart_rbac.user, "create", "pods", ns)

    def refused(manifest: dict, namespace_ok: bool = True) -> str:
        with pytest.raises(ApplyError) as e:
            as_operator.apply(manifest, pipeline if namespace_ok else None)
        assert e.value.status == 403, e.value
        return str(e.value)

    meta = {"name": "grab", "namespace": ns}
    for role in ("admin", "edit", "cluster-admin"):
        refused({"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": meta,
                 "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
                 "subjects": [{"kind": "ServiceAccount", "name": "pay-spark", "namespace": ns}]})
    # The driver's rights in a Role of the operator's making: not held, so not grantable.
    assert "attempting to grant RBAC permissions not currently held" in refused(
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta, "rules": spark.DRIVER_RULES})
    # Outside the watched namespace, not even the driver's ClusterRole.
    binding = spark.driver_rbac(Names("default", "pay", names.spec), chart_rbac.driver)[1]
    refused(binding, namespace_ok=False)
    assert [Applier(kube_api).get(f"{RBAC}/v1", kind, "grab", ns) for kind in ("Role", "RoleBinding")] == [None, None]


class StaleRead(Applier):
    """An Applier whose read is stale: what a pass saw before someone else wrote the object."""

    def __init__(self, api, seen: dict | None):
        super().__init__(api)
        self.seen = seen

    def get(self, *args, **kw):
        return self.seen


def test_an_object_written_by_someone_else_since_the_read_is_never_overwritten(crds, kube_api, k8s_namespace):
    """A ConfigMap someone made after the pass found none (the create is a POST: 409), or made
    again after the pass found its own (the apply names the uid it read: 422), is left byte for
    byte; and what the operator creates is as if applied: its field manager's Apply entry owns
    the fields alone, so a field the manifest leaves out later goes."""
    ns = k8s_namespace
    pipeline = create_pipeline(kube_api, ns, "minimal.yaml", "race")
    names = names_of(pipeline)
    manifest = dedup.assignment_configmap(names, Assignment(1, {0: "race-dedup-0"}))
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(ns, {"metadata": {"name": names.assignment_configmap},
                                           "data": {"theirs": "yes"}})
    before = Applier(kube_api).get("v1", "ConfigMap", names.assignment_configmap, ns)

    conflict = f"ConfigMap {ns}/race-dedup-assignment exists and is not this pipeline's"
    with pytest.raises(ObjectConflict, match=conflict):
        Applier(kube_api).apply(manifest, pipeline)
    with pytest.raises(ObjectConflict, match=conflict):
        StaleRead(kube_api, None).apply(manifest, pipeline)
    ours_once = {"metadata": {**manifest["metadata"], "uid": str(uuid.uuid4()),
                              "ownerReferences": [owner_reference(pipeline)]}}
    with pytest.raises(ApplyError) as e:
        StaleRead(kube_api, ours_once).apply(manifest, pipeline)
    assert e.value.status == 422 and "uid" in str(e.value), e.value
    assert Applier(kube_api).get("v1", "ConfigMap", names.assignment_configmap, ns) == before

    core.delete_namespaced_config_map(names.assignment_configmap, ns)
    made = Applier(kube_api).apply(manifest, pipeline)
    assert [(m["manager"], m["operation"]) for m in made["metadata"]["managedFields"]] == [("eopipe-operator", "Apply")]
    assert made["metadata"]["ownerReferences"] == [owner_reference(pipeline)]
    later = dedup.assignment_configmap(names, Assignment(2, {0: "race-dedup-0"}))
    del later["metadata"]["labels"]["app.kubernetes.io/component"]
    again = Applier(kube_api).apply(later, pipeline)
    assert again["metadata"]["uid"] == made["metadata"]["uid"]
    assert again["metadata"]["annotations"]["eopipe.dev/assignment-generation"] == "2"
    assert "app.kubernetes.io/component" not in again["metadata"]["labels"]


@pytest.fixture
def chart_operator(chart_rbac, crds, k8s_namespace, tmp_path, request):
    """The operator process as the chart's ServiceAccount, watching the test's namespace."""
    op = OperatorProcess(crds, k8s_namespace, tmp_path, name="chart-operator",
                         env={"KUBECONFIG": str(chart_rbac.kubeconfig),
                              "EOPIPE_SPARK_DRIVER_CLUSTERROLE": chart_rbac.driver})
    request.node.stash[_OP_KEY] = op  # its log on failure
    op.start()
    yield op
    try:  # its finalizer goes with it, else the namespace would wait for it
        kubectl(crds, "delete", "exactlyoncepipelines", "--all", "-n", k8s_namespace, "--timeout=60s", check=False)
    finally:
        op.stop()


def _stalled(kube_api, ns: str, name: str) -> dict | None:
    obj = get_pipeline(kube_api, ns, name)
    return obj if condition(obj, "Stalled").get("status") == "True" else None


@pytest.mark.kafka
def test_objects_made_by_someone_else_are_left_as_they_were(chart_rbac, chart_operator, kube_api, kafka_bootstrap,
                                                           k8s_namespace):
    """A token Secret `a-dedup-token`, a ServiceAccount `b-spark` and a Role `b-spark` made by
    someone else: pipelines `a` and `b` stall with reason Conflict naming them (and a Warning
    event), and the objects stay byte for byte as they were. Once they are gone, the operator,
    with no more than the chart's rights, makes the pipelines' own."""
    ns, cp = k8s_namespace, chart_operator.cp
    core, admin = client.CoreV1Api(kube_api), Applier(kube_api)
    core.create_namespaced_secret(ns, {"metadata": {"name": "a-dedup-token"}, "data": {"token": "dGhlaXJz"}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "b-spark"}})
    client.RbacAuthorizationV1Api(kube_api).create_namespaced_role(ns, {
        "metadata": {"name": "b-spark"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
    theirs = [("v1", "Secret", "a-dedup-token"), ("v1", "ServiceAccount", "b-spark"), (f"{RBAC}/v1", "Role", "b-spark")]
    before = {t: admin.get(*t, ns) for t in theirs}

    for name, example in (("a", "minimal.yaml"), ("b", "payments.yaml")):
        doc = example_manifest(example, kafka_bootstrap, **{"source.topic": unique_topic(f"own-{name}", ns)})
        if "sink" in doc["spec"]:
            doc["spec"]["sink"]["kafka"]["topic"] = unique_topic(f"own-{name}-out", ns)
        doc["metadata"]["name"] = name
        kubectl_apply(cp, ns, doc)

    for name, what in (("a", f"Secret {ns}/a-dedup-token"), ("b", f"ServiceAccount {ns}/b-spark")):
        obj = wait_for(lambda: _stalled(kube_api, ns, name), 180, what=f"{name} Stalled")
        stalled = condition(obj, "Stalled")
        assert stalled["reason"] == "Conflict" and stalled["message"].startswith(
            f"{what} exists and is not this pipeline's"), stalled
        assert obj["status"]["phase"] == "Failed"
        # The event is posted apart from the status (kopf queues it): it may come a moment later.
        def told() -> bool:
            events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
            return any(e.type == "Warning" and e.reason == "Conflict" and what in e.message for e in events)
        wait_for(told, 30, what=f"a Warning event Conflict naming {what}")
    wait_passes(chart_operator, 2)
    assert {t: admin.get(*t, ns) for t in theirs} == before
    # `a` went no further than its Secret: no pods that would read someone else's token.
    assert admin.get("apps/v1", "StatefulSet", "a-dedup", ns) is None
    # `b`'s dedup stage is its own, made with the chart's rights.
    uid_b = get_pipeline(kube_api, ns, "b")["metadata"]["uid"]
    for kind, obj_name in (("Secret", "b-dedup-token"), ("ServiceAccount", "b-dedup")):
        assert admin.get("v1", kind, obj_name, ns)["metadata"]["ownerReferences"][0]["uid"] == uid_b
    assert admin.get(f"{RBAC}/v1", "RoleBinding", "b-spark-driver", ns) is None

    core.delete_namespaced_secret("a-dedup-token", ns)
    core.delete_namespaced_service_account("b-spark", ns)
    for name in ("a", "b"):
        wait_for(lambda: condition(get_pipeline(kube_api, ns, name), "Stalled").get("status") == "False", 120,
                 what=f"{name} no longer Stalled")
    uid_a = get_pipeline(kube_api, ns, "a")["metadata"]["uid"]
    assert admin.get("v1", "Secret", "a-dedup-token", ns)["metadata"]["ownerReferences"][0]["uid"] == uid_a
    binding = wait_for(lambda: admin.get(f"{RBAC}/v1", "RoleBinding", "b-spark-driver", ns), 60,
                       what="the driver's RoleBinding")
    assert binding["roleRef"] == {"apiGroup": RBAC, "kind": "ClusterRole", "name": chart_rbac.driver}
    assert admin.get("sparkoperator.k8s.io/v1beta2", "SparkApplication", "b-spark", ns) is not None
    assert allowed(kube_api, f"system:serviceaccount:{ns}:b-spark", "create", "pods", ns)
    # The old-style Role of that name stays someone else's: never applied, never bound.
    assert admin.get(f"{RBAC}/v1", "Role", "b-spark", ns) == before[(f"{RBAC}/v1", "Role", "b-spark")]
    assert "Forbidden" not in chart_operator.tail(400), chart_operator.tail(60)
