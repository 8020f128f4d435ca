"""The Spark driver's token under the chart's driver policy (docs/security.md#the-spark-drivers-token),
on the real API server: the tenant's query runs in the driver, whose ServiceAccount may create
pods, so whatever it asks for is held to the executors the operator's SparkApplication describes.
Requests are made as the driver's ServiceAccount (impersonated, with the driver's RBAC rules);
pods by server-side dry run, through every admission plugin, storing nothing, where nothing is
to be stored."""

from __future__ import annotations

import pytest
import yaml

from eopipe.control.builders import spark
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from localenv.fixtures_operator import kubectl, wait_for
from tests.helpers.helm import CHART, run_helm
from tests.helpers.manifests import changed, example
from tests.helpers.podsecurity import spark_pod

pytestmark = pytest.mark.k8s

OPENED = "kafka-creds"  # the Secret the pipeline's executors read (the operator checked its opt-in)
SECRET_ENV = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": OPENED, "key": "token"}}}
HOST_PATH = {"name": "host", "hostPath": {"path": "/"}}

# Fields whose value in REFUSED is added to the executor's, not put in its place.
ADDED = {"spec.volumes": lambda pod, v: pod["spec"]["volumes"] + v,
         "metadata.labels": lambda pod, v: {**pod["metadata"]["labels"], **v}}
# (what the driver's pod asks for beyond its executor, a part of the refusal)
REFUSED = [
    ("spec.serviceAccountName", "admin", "runs as its ServiceAccount"),
    ("spec.containers.0.image", "evil:1", "runs its executor image"),
    ("spec.containers.0.env", [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-root", "key": "pw"}}}],
     "may not read Secret db-root"),
    ("spec.containers.0.envFrom", [{"secretRef": {"name": "db-root"}}], "may not read Secret db-root"),
    ("spec.volumes", [HOST_PATH], "may not mount volume host"),
    ("spec.volumes", [{"name": "s", "secret": {"secretName": "db-root"}}], "may not mount volume s"),
    ("spec.volumes", [{"name": "p", "projected": {"sources": [{"secret": {"name": "db-root"}}]}}],
     "may not mount volume p"),
    ("spec.volumes", [{"name": "c", "persistentVolumeClaim": {"claimName": "state-other-dedup-0"}}],
     "may not mount volume c"),
    ("spec.containers.0.securityContext", {"privileged": True}, "may not be privileged"),
    ("spec.hostNetwork", True, "may not be privileged or use the host's namespaces"),
    ("spec.nodeName", "cp", "is placed by the scheduler, not on a node it names"),
    ("spec.tolerations", [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
     "may not tolerate node-role.kubernetes.io/control-plane"),
    ("spec.tolerations", [{"operator": "Exists"}], "may not tolerate every taint"),
    ("metadata.labels", {"spark-role": "driver"}, "is an executor"),
    ("metadata.labels", {"app.kubernetes.io/component": "dedup"}, "may not carry label app.kubernetes.io/component"),
    ("metadata.labels", {"app": "payments-db"}, "may not carry label app"),
]


def _app(ns: str) -> dict:
    doc = changed(example("payments.yaml"), **{"spec.processing.env": [SECRET_ENV]})
    app = spark.spark_application(Names(ns, doc["metadata"]["name"], PipelineSpec.model_validate(doc["spec"])),
                                  "eopipe-spark:dev")
    app["metadata"]["namespace"] = ns
    return app


def _driver_account(cp, ns: str, sa: str) -> None:
    """The driver's ServiceAccount with the driver's rules (control/builders/spark.DRIVER_RULES)
    in a Role of this namespace, so RBAC lets its requests through to admission."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": sa, "namespace": ns},
            "rules": spark.DRIVER_RULES}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": sa, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
               "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
    kubectl(cp, "create", "serviceaccount", "-n", ns, sa)
    kubectl(cp, "create", "serviceaccount", "-n", ns, "admin")
    kubectl(cp, "apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))


@pytest.fixture
def driver(crds, kube_api, k8s_namespace, tools, helm_env):
    """(control plane, namespace, the driver's user name, the SparkApplication, its executor pod)
    with the driver policy bound to the namespace and in effect."""
    cp, ns = crds, k8s_namespace
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--namespace", ns, "--show-only",
                   "templates/sparkdriverpolicy.yaml", "--set", f"watchNamespaces={{{ns}}}").stdout
    app = _app(ns)
    sa = app["spec"]["driver"]["serviceAccount"]
    _driver_account(cp, ns, sa)
    kubectl(cp, "apply", "-f", "-", input=yaml.safe_dump(app))
    kubectl(cp, "apply", "-f", "-", input=out)
    user = f"system:serviceaccount:{ns}:{sa}"
    executor = spark_pod(app, "executor")
    probe = changed(executor, **{"spec.volumes": ADDED["spec.volumes"](executor, [HOST_PATH])})
    wait_for(lambda: "may not mount volume host" in _create(cp, ns, probe, user).stderr, timeout=60,
             what="the driver policy to take effect")
    yield cp, ns, user, app, executor
    kubectl(cp, "delete", "--ignore-not-found", "-f", "-", input=out)


def _create(cp, ns: str, obj: dict, user: str | None = None, dry: bool = True):
    args = ["create", "-n", ns, "-f", "-"] + (["--dry-run=server"] if dry else []) + (["--as", user] if user else [])
    return kubectl(cp, *args, input=yaml.safe_dump(obj), check=False)


def test_the_drivers_token_makes_only_its_executors(driver):
    cp, ns, user, app, executor = driver
    res = _create(cp, ns, executor, user)  # the executor as Spark makes it, reading OPENED: the control case
    assert res.returncode == 0, res.stderr
    for path, value, said in REFUSED:
        if path in ADDED:
            value = ADDED[path](executor, value)
        res = _create(cp, ns, changed(executor, **{path: value}), user)
        assert res.returncode != 0 and said in res.stderr and app["metadata"]["name"] in res.stderr, (path, res.stderr)
    # Anyone else is not this policy's concern (the host path pod, as the admin).
    host = changed(executor, **{"spec.volumes": ADDED["spec.volumes"](executor, [HOST_PATH])})
    assert _create(cp, ns, host).returncode == 0


def test_the_drivers_token_changes_only_what_spark_made(driver):
    cp, ns, user, app, executor = driver
    # Others' objects (the dedup pods' assignment, a pod) are neither deleted nor changed, even
    # by a deletion of every ConfigMap at once (a deletecollection, as Spark deletes by label).
    kubectl(cp, "create", "configmap", "-n", ns, "payments-assignment", "--from-literal=a=1")
    every = f"--raw=/api/v1/namespaces/{ns}/configmaps"
    res = kubectl(cp, "delete", every, "--as", user, check=False)
    assert res.returncode != 0 and "may change or delete only the configmaps Spark made" in res.stderr, res.stderr
    assert kubectl(cp, "get", "-n", ns, "configmap", "payments-assignment", check=False).returncode == 0
    other = changed(executor, **{"metadata.labels": {"app": "db"}, "metadata.name": "db"})
    assert _create(cp, ns, other, dry=False).returncode == 0
    res = kubectl(cp, "delete", "-n", ns, "pod", "db", "--as", user, "--dry-run=server", check=False)
    assert res.returncode != 0 and "may change or delete only the pods Spark made" in res.stderr, res.stderr
    # What Spark made: its executor (a label changed, not its image) and its ConfigMap.
    assert _create(cp, ns, executor, user, dry=False).returncode == 0
    name = executor["metadata"]["name"]
    res = kubectl(cp, "patch", "-n", ns, "pod", name, "--as", user, "-p",
                  '{"metadata": {"labels": {"spark-exec-id": "2"}}}', check=False)
    assert res.returncode == 0, res.stderr
    res = kubectl(cp, "patch", "-n", ns, "pod", name, "--as", user, "-p",
                  '{"spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "evil:1"}]}}', check=False)
    assert res.returncode != 0 and "runs its executor image" in res.stderr, res.stderr
    res = kubectl(cp, "delete", "-n", ns, "pod", name, "--as", user, "--wait=false", check=False)
    assert res.returncode == 0, res.stderr
    conf = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spark-exec-conf", "labels": {
        "spark-app-selector": "spark-1", "spark-role": "executor"}}, "data": {"a": "1"}}
    assert _create(cp, ns, conf, user, dry=False).returncode == 0
    res = kubectl(cp, "delete", f"{every}?labelSelector=spark-app-selector%3Dspark-1", "--as", user, check=False)
    assert res.returncode == 0, res.stderr
    assert kubectl(cp, "get", "-n", ns, "configmap", "spark-exec-conf", check=False).returncode != 0


def test_the_drivers_token_reads_and_makes_no_more_than_spark_needs(driver):
    """Its RBAC rules (control/builders/spark.DRIVER_RULES), as the API server decides them: no
    ConfigMap, Service or Secret of the namespace to read, no claim or Service to make."""
    cp, ns, user, _, _ = driver
    for verb, resource, allowed in (("list", "pods", True), ("create", "pods", True), ("create", "configmaps", True),
                                    ("get", "configmaps", False), ("list", "configmaps", False),
                                    ("get", "services", False), ("get", "secrets", False),
                                    ("create", "persistentvolumeclaims", False), ("create", "services", False),
                                    ("update", "configmaps", False)):
        res = kubectl(cp, "auth", "can-i", verb, resource, "-n", ns, "--as", user, check=False)
        assert res.stdout.strip() == ("yes" if allowed else "no"), (verb, resource, res.stdout, res.stderr)
