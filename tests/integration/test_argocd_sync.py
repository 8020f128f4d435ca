"""Argo CD's own application controller and repo server (localenv/argocd.py: built from the
argo-cd/v3 module) sync the Applications of docs/install.md (`examples/argocd-application.yaml`
as written, `repoURL` set to the test's git server as a user sets it to their repository) from
a git repository holding this repository's chart and two example pipelines (under pipelines/, as
docs/install.md's GitOps repository), into a real API server of the test's own, with eopipe's
health check installed in argocd-cm as argocd/README.md says.

There is no kubelet and no operator on this control plane: the operator's Deployment never runs
and the pipelines' status is written by the test, in the operator's shape
(tests/helpers/argocd_health.py). What it shows is Argo CD's side: every object of the chart and
the pipelines syncs and stays in sync (no permanent OutOfSync against what the API server
defaults), a pipeline's health and message come from its status, a change pushed to git is
applied, and a pipeline removed from git is left for a person to delete (`prune: false`)."""

from __future__ import annotations

import json

import pytest
import yaml

from localenv.argocd import ArgoCD
from localenv.controlplane import ControlPlane
from localenv.fixtures_operator import wait_for
from tests.helpers.argocd_health import pipeline, stage
from tests.helpers.pipelines import REPO

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1200)]

DOCS_APPS = REPO / "examples" / "argocd-application.yaml"
PIPELINES = "pipelines"  # the watched namespace of the docs' Applications


@pytest.fixture(scope="module")
def argo(tmp_path_factory):
    work = tmp_path_factory.mktemp("argocd")
    cp = ControlPlane(work / "cp")
    cp.start()
    a = ArgoCD(work / "argocd", cp.kubeconfig, cp.kubectl)
    try:
        a.start()  # builds the binary first when it is not cached (hack/build-tools.sh argocd)
        yield a
    finally:
        a.stop()
        cp.stop()


def resources(app: dict) -> dict[tuple[str, str], dict]:
    return {(r["kind"], r["name"]): r for r in app["status"].get("resources", [])}


def pipeline_health(argo: ArgoCD, name: str) -> dict:
    return resources(argo.app("eopipe-pipelines"))[("ExactlyOncePipeline", name)].get("health") or {}


def set_status(argo: ArgoCD, name: str, status: dict) -> None:
    argo.kubectl("-n", PIPELINES, "patch", "exactlyoncepipeline", name, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))


def test_the_documented_applications_sync_stay_in_sync_and_report_pipeline_health(argo):
    files = {**ArgoCD.tree(REPO / "charts" / "eopipe", "charts/eopipe"),
             "values/eopipe.yaml": "{}\n",  # the chart's defaults: no image runs here
             **{f"pipelines/{n}": (REPO / "examples" / n).read_text() for n in ("minimal.yaml", "payments.yaml")}}
    sha = argo.commit(files, "eopipe's chart and pipelines")
    docs = [d for d in yaml.safe_load_all(DOCS_APPS.read_text()) if d]
    for d in docs:
        if d["kind"] == "Application":
            d["spec"]["source"]["repoURL"] = argo.repo_url
    # Both Applications at once, as `kubectl apply -f` of the file does (the waves order them
    # only inside an app-of-apps): the pipelines may sync before the chart's CRD exists.
    argo.apply(docs)

    # No kubelet: the operator's Deployment stays Progressing; every object is Synced.
    op = argo.wait_app("eopipe-operator", health=None, revision=sha, timeout=300)
    pipes = argo.wait_app("eopipe-pipelines", health=None, revision=sha, timeout=300)
    kinds = {k for k, _ in resources(op)}
    assert {"Deployment", "ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy"} <= kinds, kinds
    assert set(resources(pipes)) == {("ExactlyOncePipeline", "minimal"), ("ExactlyOncePipeline", "payments")}
    # Argo CD renders the chart's CRD (crds/) and applies it, but never tracks a CRD (it is not
    # pruned with the chart, nor deleted with the Application): the pipelines outlive both.
    crd = json.loads(argo.kubectl("get", "crd", "exactlyoncepipelines.eopipe.dev", "-o", "json"))
    assert "argocd.argoproj.io/tracking-id" not in crd["metadata"].get("annotations", {})
    live = json.loads(argo.kubectl("-n", PIPELINES, "get", "exactlyoncepipeline", "payments", "-o", "json"))
    assert live["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"].startswith("eopipe-pipelines:")

    # Still in sync after a fresh comparison: the API server's defaults (the CRD's, the
    # Deployment's, the admission policy's) make no difference Argo CD would show.
    for name in ("eopipe-operator", "eopipe-pipelines"):
        before = ArgoCD.last_sync(argo.compare_now(name))  # any sync a periodic comparison began, ended
        app = argo.compare_now(name, "hard")
        assert app["status"]["sync"]["status"] == "Synced" and ArgoCD.last_sync(app) == before, app["status"]
        assert {r["status"] for r in app["status"]["resources"]} == {"Synced"}, app["status"]["resources"]

    # Health from the status (argocd/health.lua run by the controller): none yet, running, failing.
    assert pipeline_health(argo, "minimal")["status"] == "Progressing"
    set_status(argo, "minimal", pipeline()["status"])
    h = wait_for(lambda: (x := pipeline_health(argo, "minimal"))["status"] == "Healthy" and x, 60,
                 what="minimal Healthy")
    assert "Running" in h["message"], h
    set_status(argo, "minimal", pipeline(stage("DedupReady", "KafkaUnavailable", "no broker"))["status"])
    h = wait_for(lambda: (x := pipeline_health(argo, "minimal"))["status"] == "Degraded" and x, 60,
                 what="minimal Degraded")
    assert "KafkaUnavailable" in h["message"] and "no broker" in h["message"], h
    assert argo.app("eopipe-pipelines")["status"]["health"]["status"] == "Degraded"

    # A change pushed to git is applied; until the operator observes the new generation the
    # pipeline is Progressing, whatever its older conditions say.
    set_status(argo, "minimal", pipeline()["status"])
    changed = yaml.safe_load(files["pipelines/minimal.yaml"])
    changed["spec"]["dedup"] = {"replicas": 3}
    sha = argo.commit({"pipelines/minimal.yaml": yaml.safe_dump(changed, sort_keys=False)}, "minimal: 3 dedup pods")
    argo.refresh("eopipe-pipelines")
    argo.wait_app("eopipe-pipelines", health=None, revision=sha)
    live = json.loads(argo.kubectl("-n", PIPELINES, "get", "exactlyoncepipeline", "minimal", "-o", "json"))
    assert live["spec"]["dedup"]["replicas"] == 3 and live["metadata"]["generation"] == 2
    h = wait_for(lambda: (x := pipeline_health(argo, "minimal"))["status"] == "Progressing" and x, 60,
                 what="minimal Progressing on its new generation")
    assert "generation 2" in h["message"], h

    # A pipeline removed from git: prune is off for pipelines (docs/install.md), so it stays,
    # and the Application says it is out of sync until a person deletes it.
    sha = argo.commit({"pipelines/payments.yaml": None}, "payments leaves git")
    argo.refresh("eopipe-pipelines")
    app = argo.wait_app("eopipe-pipelines", sync="OutOfSync", health=None, revision=sha)
    gone = resources(app)[("ExactlyOncePipeline", "payments")]
    assert gone["status"] == "OutOfSync" and gone.get("requiresPruning") is True, gone
    argo.kubectl("-n", PIPELINES, "get", "exactlyoncepipeline", "payments")  # still there
    argo.kubectl("-n", PIPELINES, "delete", "exactlyoncepipeline", "payments", "--wait=false")
    argo.refresh("eopipe-pipelines")
    argo.wait_app("eopipe-pipelines", health=None, revision=sha)
    print("argocd RSS MiB:", {k: round(v) for k, v in argo.rss_mib().items()})
