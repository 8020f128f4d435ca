"""The API's two versions on the real API server: v1beta1 stored, v1alpha1 served (deprecated),
the same objects through either; docs/install.md's storage-version migration run as written from
the v1alpha1-only CRD of earlier releases; and an Argo CD-style server-side diff of a v1alpha1
manifest that stays clean across the upgrade; and the operator, which watches v1beta1, runs a
pipeline written as v1alpha1.

What is stored is read from etcd itself (a custom resource is stored as JSON under
/registry/<group>/<plural>/<namespace>/<name>): the API answers in whatever version is asked,
so only etcd tells which version an object is stored in.

The upgrade tests start a control plane of their own: the session's has the current CRD, and
once `status.storedVersions` lists v1beta1 the API server refuses a CRD without it, so the
v1alpha1-only CRD cannot be brought back there.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.request

import pytest
import yaml
from kubernetes import client

from eopipe.control import crd
from eopipe.core.spec import DEPRECATED_VERSIONS, GROUP, KIND, PLURAL, VERSION
from localenv.controlplane import ControlPlane, ControlPlaneError
from localenv.fixtures_operator import kubectl, wait_established, wait_for
from tests.helpers.docs import sh_blocks
from tests.helpers.pipelines import REPO, example_manifest, kubectl_apply, ready_pipeline, unique_topic

pytestmark = pytest.mark.k8s

SECTION = "## Upgrading the API version"
CRD_NAME = f"{PLURAL}.{GROUP}"
OLD = DEPRECATED_VERSIONS[0]
ARGO = "argocd-controller"  # the field manager of Argo CD's server-side apply


def old_crd() -> dict:
    """The CRD as releases before v1beta1 shipped it: v1alpha1 alone, served and stored, with
    the schema of today (the two versions share it)."""
    c = crd.crd()
    (old,) = [v for v in c["spec"]["versions"] if v["name"] == OLD]
    old = {k: v for k, v in old.items() if k not in ("deprecated", "deprecationWarning")}
    c["spec"]["versions"] = [{**old, "storage": True}]
    del c["spec"]["conversion"]
    return c


def pipeline(name: str, version: str, **spec) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    doc["apiVersion"], doc["metadata"]["name"] = f"{GROUP}/{version}", name
    doc["spec"].update(spec)
    return doc


def stored_version(cp, ns: str, name: str) -> str:
    """The apiVersion of the object as etcd holds it (etcd's JSON gateway, loopback)."""
    key = f"/registry/{GROUP}/{PLURAL}/{ns}/{name}".encode()
    req = urllib.request.Request(f"{cp.etcd_url}/v3/kv/range", method="POST",
                                 data=json.dumps({"key": base64.b64encode(key).decode()}).encode())
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
        (kv,) = json.load(r)["kvs"]
    return json.loads(base64.b64decode(kv["value"]))["apiVersion"]


def get(cp, ns: str, name: str, version: str) -> dict:
    out = kubectl(cp, "get", f"{PLURAL}.{version}.{GROUP}", name, "-n", ns, "-o", "json",
                  "--show-managed-fields").stdout
    return json.loads(out)


def stored_versions(cp) -> list[str]:
    return json.loads(kubectl(cp, "get", f"crd/{CRD_NAME}", "-o", "json").stdout)["status"]["storedVersions"]


@pytest.fixture
def old_cp(tmp_path_factory, tmp_path):
    """A control plane of this test's own, with the v1alpha1-only CRD applied as the kubectl
    install path of those releases applied it, and a namespace for the pipelines."""
    for attempt in range(3):
        cp = ControlPlane(tmp_path_factory.mktemp("k8s-api-versions"))
        try:
            cp.start()
            break
        except ControlPlaneError as e:
            # Its free ports are picked before the processes bind them: another process (a
            # Kafka broker, an operator of the same run) may take one in between. New ports.
            if "address already in use" not in str(e) or attempt == 2:
                raise
    try:
        path = tmp_path / "old-crd.yaml"
        path.write_text(yaml.safe_dump(old_crd(), sort_keys=False))
        kubectl(cp, "apply", "--server-side", "-f", str(path))
        wait_established(cp, f"crd/{CRD_NAME}")
        kubectl(cp, "create", "namespace", "pipelines")
        assert stored_versions(cp) == [OLD]
        yield cp
    finally:
        cp.stop()


def upgrade_as_documented(cp, tmp_path) -> None:
    """docs/install.md's "Upgrading the API version" block, every command in the doc's order,
    from a folder where its `crds/` is this checkout's."""
    (block,) = sh_blocks("install.md", SECTION)
    (tmp_path / "crds").symlink_to(REPO / "crds")
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "HOME": str(tmp_path),  # kubectl's cache
           "PATH": os.pathsep.join([str(cp.kubectl.parent), os.environ["PATH"]])}
    for command in block:
        res = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"docs/install.md: `{command}` failed ({res.returncode}):\n{res.stderr}{res.stdout}"
    assert json.loads(res.stdout) == [VERSION], res.stdout  # the last command prints storedVersions


def test_an_object_reads_the_same_through_either_version_and_is_stored_as_v1beta1(crds, k8s_namespace):
    ns = k8s_namespace
    res = kubectl_apply(crds, ns, pipeline("written-old", OLD, deletionPolicy="Delete"))
    assert f"{GROUP}/{OLD} {KIND} is deprecated; use {GROUP}/{VERSION}" in res.stderr, res.stderr
    new = kubectl_apply(crds, ns, pipeline("written-new", VERSION, deletionPolicy="Delete"))
    assert "deprecated" not in new.stderr, new.stderr
    for name in ("written-old", "written-new"):
        as_old, as_new = get(crds, ns, name, OLD), get(crds, ns, name, VERSION)
        assert (as_old["apiVersion"], as_new["apiVersion"]) == (f"{GROUP}/{OLD}", f"{GROUP}/{VERSION}")
        assert as_old["spec"] == as_new["spec"] and as_new["spec"]["deletionPolicy"] == "Delete"
        assert as_old["metadata"]["generation"] == as_new["metadata"]["generation"] == 1
        assert stored_version(crds, ns, name) == f"{GROUP}/{VERSION}"
    # A change made through the old version is the same change through the new one.
    kubectl(crds, "patch", f"{PLURAL}.{OLD}.{GROUP}", "written-new", "-n", ns, "--type=merge",
            "-p", '{"spec": {"source": {"partitions": 6}}}')
    assert get(crds, ns, "written-new", VERSION)["spec"]["source"]["partitions"] == 6


def ssa(cp, doc: dict, *extra: str) -> subprocess.CompletedProcess:
    return kubectl(cp, "apply", "--server-side", f"--field-manager={ARGO}", "-n", "pipelines", "-o", "json",
                   *extra, "-f", "-", input=yaml.safe_dump(doc))


def test_the_storage_migration_of_install_md_stores_v1beta1_and_an_argocd_diff_stays_clean(old_cp, tmp_path):
    """One upgrade of one old control plane (each costs a control plane's start) shows both:
    every object, applied as kubectl did or as Argo CD's server-side apply, is stored as v1beta1
    afterwards, and the Argo CD-applied one stays clean in Argo CD's diff."""
    cp, names = old_cp, ("a", "b", "c")
    for name in names:
        kubectl_apply(cp, "pipelines", pipeline(name, OLD))
    before = {name: get(cp, "pipelines", name, OLD) for name in names}
    assert {stored_version(cp, "pipelines", n) for n in names} == {f"{GROUP}/{OLD}"}
    manifest = pipeline("synced", OLD)
    ssa(cp, manifest)
    live = get(cp, "pipelines", "synced", OLD)

    upgrade_as_documented(cp, tmp_path)

    assert stored_versions(cp) == [VERSION]
    for name in names:
        assert stored_version(cp, "pipelines", name) == f"{GROUP}/{VERSION}", name
        after = get(cp, "pipelines", name, VERSION)
        assert after["apiVersion"] == f"{GROUP}/{VERSION}"
        assert after["spec"] == before[name]["spec"]
        assert after["metadata"]["generation"] == before[name]["metadata"]["generation"]
        assert get(cp, "pipelines", name, OLD)["spec"] == before[name]["spec"]  # still served
    assert stored_version(cp, "pipelines", "synced") == f"{GROUP}/{VERSION}"

    now = get(cp, "pipelines", "synced", OLD)
    assert now["spec"] == live["spec"] and now["metadata"]["generation"] == live["metadata"]["generation"]
    # The rewrite changed no field, so it took none over: Argo CD still owns the whole spec.
    spec_owners = {(m["manager"], m["operation"]) for m in now["metadata"]["managedFields"]
                   if "f:spec" in (m.get("fieldsV1") or {})}
    assert spec_owners == {(ARGO, "Apply")}, now["metadata"]["managedFields"]
    # Argo CD's diff: a server-side dry run of the same manifest, compared with the live object;
    # then of the manifest moved to v1beta1, as a user would next.
    for doc in (manifest, {**manifest, "apiVersion": f"{GROUP}/{VERSION}"}):
        predicted = json.loads(ssa(cp, doc, "--dry-run=server").stdout)
        live_now = get(cp, "pipelines", "synced", doc["apiVersion"].split("/")[1])
        assert predicted["spec"] == live_now["spec"], doc["apiVersion"]
        assert predicted["metadata"]["generation"] == live["metadata"]["generation"], doc["apiVersion"]
        assert predicted["metadata"].get("labels") == live["metadata"].get("labels")
        assert predicted["metadata"].get("annotations") == live["metadata"].get("annotations")
        diff = kubectl(cp, "diff", "--server-side", f"--field-manager={ARGO}", "-n", "pipelines", "-f", "-",
                       input=yaml.safe_dump(doc), check=False)
        assert diff.returncode == 0, diff.stdout + diff.stderr  # kubectl diff: 1 means differences
    # And a real sync of the old manifest is a no-op.
    ssa(cp, manifest)
    assert get(cp, "pipelines", "synced", VERSION)["metadata"]["generation"] == live["metadata"]["generation"]
    fields = [m for m in get(cp, "pipelines", "synced", VERSION)["metadata"]["managedFields"] if m["manager"] == ARGO]
    assert [m["operation"] for m in fields] == ["Apply"], fields
    assert re.fullmatch(rf"{GROUP}/v1(alpha|beta)1", fields[0]["apiVersion"])


def test_the_operator_reconciles_a_pipeline_written_as_v1alpha1_and_writes_v1beta1(
        operator, kube_api, kafka_bootstrap, k8s_namespace):
    """The operator watches v1beta1: a pipeline applied as v1alpha1 is the same object to it, and
    everything it writes (status, its finalizer, the children's ownerReferences) names v1beta1."""
    ns, cp = k8s_namespace, operator.cp
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": unique_topic("events", ns),
                                                         "dedup.replicas": 1})
    doc["apiVersion"] = f"{GROUP}/{OLD}"
    kubectl_apply(cp, ns, doc)
    wait_for(lambda: ready_pipeline(kube_api, ns, "minimal"), 180, what="Ready=True")
    sts = client.AppsV1Api(kube_api).read_namespaced_stateful_set("minimal-dedup", ns)
    assert [(r.api_version, r.kind) for r in sts.metadata.owner_references] == [(f"{GROUP}/{VERSION}", KIND)]
    obj = get(cp, ns, "minimal", VERSION)
    written = {(m["manager"], m.get("subresource", ""), m["apiVersion"]) for m in obj["metadata"]["managedFields"]}
    ours = {w for w in written if not w[0].startswith("kubectl")}
    assert ours and {w[2] for w in ours} == {f"{GROUP}/{VERSION}"}, written
    assert any(w[1] == "status" for w in ours), written
    assert stored_version(cp, ns, "minimal") == f"{GROUP}/{VERSION}"
