"""Smoke tests of the real local control plane: the versions are the pinned ones and the
controllers the operator relies on (garbage collector, namespace, serviceaccount, root CA
publisher) really run."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

# Fixtures (control_plane, kube_api, k8s_namespace): localenv/fixtures_k8s.py, loaded by
# tests/conftest.py.

pytestmark = pytest.mark.k8s

K8S_VERSION = "v1.35.4"


def wait_for(what: str, predicate, timeout: float = 60, interval: float = 0.5):
    """Polls predicate() until it returns a truthy value; fails the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def gone(read) -> bool:
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def test_kubectl_version_reports_pinned_release(control_plane, kube_api):
    out = control_plane.kubectl_run("version", "-o", "json").stdout
    versions = json.loads(out)
    assert versions["clientVersion"]["gitVersion"] == K8S_VERSION
    assert versions["serverVersion"]["gitVersion"] == K8S_VERSION
    assert (versions["serverVersion"]["major"], versions["serverVersion"]["minor"]) == ("1", "35")
    # The same through the Python client (what the operator uses).
    assert client.VersionApi(kube_api).get_code().git_version == K8S_VERSION


def test_admin_kubeconfig_is_cluster_admin(control_plane):
    # RBAC is on (Node,RBAC); the admin identity is in system:masters and may do anything.
    r = control_plane.kubectl_run("auth", "can-i", "*", "*", "--all-namespaces")
    assert r.stdout.strip() == "yes"
    r = control_plane.kubectl_run("auth", "can-i", "create", "pods", "--as=nobody", check=False)
    assert r.stdout.strip() == "no"


def _configmap(name: str, owner: client.V1ConfigMap | None = None,
               block_owner_deletion: bool = False) -> client.V1ConfigMap:
    refs = None
    if owner is not None:
        refs = [client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name=owner.metadata.name,
            uid=owner.metadata.uid, block_owner_deletion=block_owner_deletion)]
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, owner_references=refs),
                              data={"k": "v"})


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
def test_garbage_collector_deletes_dependents(kube_api, k8s_namespace, policy):
    core = client.CoreV1Api(kube_api)
    ns = k8s_namespace
    owner = core.create_namespaced_config_map(ns, _configmap("owner"))
    assert owner.metadata.uid
    dependent = core.create_namespaced_config_map(
        ns, _configmap("dependent", owner, block_owner_deletion=(policy == "Foreground")))
    bystander = core.create_namespaced_config_map(ns, _configmap("bystander"))
    assert dependent.metadata.owner_references[0].uid == owner.metadata.uid

    core.delete_namespaced_config_map(
        "owner", ns, body=client.V1DeleteOptions(propagation_policy=policy))

    if policy == "Foreground":
        # The owner is kept (foregroundDeletion finalizer) until the collector removed the
        # dependent: nothing but the real garbage collector can finish this. (The collector
        # may already be done by now, so a 404 here is fine; the waits below decide.)
        try:
            o = core.read_namespaced_config_map("owner", ns)
        except ApiException as e:
            assert e.status == 404, e
        else:
            assert o.metadata.deletion_timestamp is not None
            assert "foregroundDeletion" in (o.metadata.finalizers or [])

    wait_for("the dependent ConfigMap to be garbage collected",
             lambda: gone(lambda: core.read_namespaced_config_map("dependent", ns)), timeout=60)
    wait_for("the owner ConfigMap to be gone",
             lambda: gone(lambda: core.read_namespaced_config_map("owner", ns)), timeout=60)
    # Objects without an owner are left alone.
    assert core.read_namespaced_config_map("bystander", ns).metadata.uid == bystander.metadata.uid


def test_namespace_deletion_completes(kube_api):
    core = client.CoreV1Api(kube_api)
    apps = client.AppsV1Api(kube_api)
    name = f"smoke-ns-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        core.create_namespaced_config_map(name, _configmap("content"))
        apps.create_namespaced_deployment(name, client.V1Deployment(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1DeploymentSpec(
                replicas=0,
                selector=client.V1LabelSelector(match_labels={"app": "web"}),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "web"}),
                    spec=client.V1PodSpec(containers=[
                        client.V1Container(name="c", image="example.invalid/none")])))))

        core.delete_namespace(name)
        ns = core.read_namespace(name)
        # The apiserver only marks it; the namespace controller empties it and removes the
        # "kubernetes" finalizer.
        assert ns.status.phase == "Terminating"
        assert "kubernetes" in (ns.spec.finalizers or [])
        wait_for(f"namespace {name} to be deleted",
                 lambda: gone(lambda: core.read_namespace(name)), timeout=90)
        assert gone(lambda: core.read_namespaced_config_map("content", name))
        assert gone(lambda: apps.read_namespaced_deployment("web", name))
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


def test_new_namespace_gets_serviceaccount_and_root_ca(kube_api, k8s_namespace):
    # serviceaccount and root-ca-cert-publisher controllers: what every Pod mounts.
    core = client.CoreV1Api(kube_api)

    def present(read):
        try:
            return read()
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    wait_for("the default ServiceAccount",
             lambda: present(lambda: core.read_namespaced_service_account("default",
                                                                           k8s_namespace)),
             timeout=30)
    cm = wait_for("the kube-root-ca.crt ConfigMap",
                  lambda: present(lambda: core.read_namespaced_config_map("kube-root-ca.crt",
                                                                           k8s_namespace)),
                  timeout=30)
    assert "BEGIN CERTIFICATE" in cm.data["ca.crt"]


def test_serviceaccount_token_is_issued_and_accepted(control_plane, kube_api, k8s_namespace,
                                                    tmp_path):
    # TokenRequest signs with the service-account key; the apiserver must accept it back.
    core = client.CoreV1Api(kube_api)
    wait_for("the default ServiceAccount",
             lambda: not gone(lambda: core.read_namespaced_service_account("default",
                                                                           k8s_namespace)),
             timeout=30)
    tr = core.create_namespaced_service_account_token(
        "default", k8s_namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[])))
    token = tr.status.token
    # Only the token authenticates: no kubeconfig, hence no client certificate.
    empty = tmp_path / "empty.kubeconfig"
    empty.write_text("")
    r = subprocess.run(
        [str(control_plane.kubectl), "--kubeconfig", str(empty), "--server", control_plane.server,
         "--certificate-authority", str(control_plane.ca_cert), "--token", token,
         "auth", "whoami", "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    who = json.loads(r.stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{k8s_namespace}:default"
