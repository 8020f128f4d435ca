"""The restricted Pod Security Standard on the real API server: the PodSecurity admission plugin
(on by default) in a namespace labelled `pod-security.kubernetes.io/enforce=restricted` admits
the pods the operator's objects lead to. Server-side dry runs: every admission plugin runs,
nothing is stored and nothing runs. The operator's own pod (the chart's Deployment) is checked
in test_chart.py, the dedup pods created by the StatefulSet controller in
tests/e2e/test_operator.py (test_minimal_pipeline_becomes_ready)."""

from __future__ import annotations

import pytest
from kubernetes import client

from eopipe.control.builders import dedup, spark
from tests.helpers.pipelines import example_names
from tests.helpers.podsecurity import dry_run_create, pod_from_template, restrict_namespace, spark_pod

pytestmark = pytest.mark.k8s


def _service_account(kube_api, ns: str, name: str) -> None:
    """The ServiceAccount admission plugin refuses a pod whose ServiceAccount does not exist."""
    client.CoreV1Api(kube_api).create_namespaced_service_account(ns, {"metadata": {"name": name}})


def test_the_namespace_really_enforces_the_restricted_standard(kube_api, k8s_namespace):
    """The control case: a pod without a seccomp profile is refused, so the other tests'
    acceptance means something."""
    restrict_namespace(kube_api, k8s_namespace)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
           "spec": {"containers": [{"name": "c", "image": "busybox",
                                    "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}}]}}
    refused = dry_run_create(kube_api, k8s_namespace, pod)
    assert refused and 'violates PodSecurity \\"restricted:latest\\"' in refused and "seccompProfile" in refused, \
        refused


def test_dedup_pods_are_admitted(kube_api, k8s_namespace):
    ns = k8s_namespace
    restrict_namespace(kube_api, ns)
    names = example_names("payments.yaml", ns)
    sts = dedup.statefulset(names, "eopipe:dev")
    pod = pod_from_template(sts["spec"]["template"], f"{names.dedup}-0")
    # What the StatefulSet controller adds: the claim of the volume claim template.
    pod["spec"]["volumes"].append({"name": "state",
                                   "persistentVolumeClaim": {"claimName": f"state-{names.dedup}-0"}})
    _service_account(kube_api, ns, names.dedup)
    assert dry_run_create(kube_api, ns, pod) is None


@pytest.mark.parametrize("role", ["driver", "executor"])
def test_spark_pods_are_admitted(kube_api, k8s_namespace, role):
    """The driver and executor pods as the Spark Operator completes them from the
    SparkApplication's podSecurityContext and securityContext (tests/helpers/podsecurity.py)."""
    ns = k8s_namespace
    restrict_namespace(kube_api, ns)
    names = example_names("payments.yaml", ns)
    app = spark.spark_application(names, "eopipe-spark:dev")
    _service_account(kube_api, ns, app["spec"]["driver"]["serviceAccount"])
    assert dry_run_create(kube_api, ns, spark_pod(app, role)) is None
