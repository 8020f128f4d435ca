"""GitOps on the node tier: Argo CD's own application controller and repo server
(localenv/argocd.py, run in the tier's network namespace) sync eopipe's chart and a pipeline
from a git repository laid out as docs/install.md's "A GitOps repository", through the
app-of-apps of examples/argocd-app-of-apps.yaml, onto the real kubelets; every later change
arrives by a commit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from eopipe.core.names import LABEL_SPARK_SPEC
from localenv import REPO_ROOT
from localenv.argocd import NAMESPACE, ArgoCD, ArgoCDDaemon
from localenv.node.__main__ import KUBECONFIG, forget_api_discovery, kubectl_argv
from localenv.node.images import commit_app_image, commit_spark_image, tree_at
from tests.helpers import nodetier
from tests.helpers.nodepipes import (
    PREVIOUS,
    delete_spark_pipeline,
    delete_topics,
    driver_says,
    pod_lives,
    restarts_seen,
    settled,
    start_load,
    verify_both_stages,
)
from tests.helpers.nodetier import BOOTSTRAP, NODE_TESTS, in_tier, kubectl, kubectl_json, log, wait

pytestmark = NODE_TESTS

NS, NAME, SRC, SINK = "pipelines", "payments", "gitops", "gitops-enriched"  # NS: the docs' watched namespace
PIPELINE_FILE = f"pipelines/{NAME}.yaml"
CRD = "exactlyoncepipelines.eopipe.dev"
ROOT_APP, OPERATOR_APP, PIPELINES_APP = "eopipe", "eopipe-operator", "eopipe-pipelines"
POISON = 20  # malformed records, each to the dead-letter topic
# A stateless change of the payments example's SQL: one more column (keepCheckpoint goes on).
SQL_V2 = ("SELECT id, account, amount_cents, currency, amount_cents >= 1000000 AS large, 'v2' AS rev "
          "FROM events")


@pytest.fixture(scope="module")
def argo(node_tier, tmp_path_factory):
    """Argo CD in the tier's namespace (the API server listens only there), stopped after the
    module; the test's handle drives its git repository and Applications."""
    ArgoCDDaemon.prepare()
    work = tmp_path_factory.mktemp("argocd-tier")
    kubectl_bin = Path(kubectl_argv()[3])
    daemon = ArgoCDDaemon(work, KUBECONFIG, kubectl_bin, wrap=tuple(in_tier()))
    t = time.monotonic()
    daemon.start(timeout=300)
    log(f"Argo CD (application controller, repo server, Redis, git daemon) ready in {time.monotonic() - t:.0f}s")
    try:
        yield ArgoCD.attached(work, kubectl_argv())
    finally:
        daemon.stop()


def _values(images: dict) -> str:
    """values/eopipe.yaml: the chart's images (a user's registry; the tier's images)."""
    (repo, tag), (spark_repo, spark_tag) = images["app"].rsplit(":", 1), images["spark"].rsplit(":", 1)
    return yaml.safe_dump({"image": {"repository": repo, "tag": tag},
                           "sparkImage": {"repository": spark_repo, "tag": spark_tag}})


def _apps_file(repo_url: str) -> str:
    """apps/eopipe.yaml: examples/argocd-application.yaml, its repoURL set."""
    docs = [d for d in yaml.safe_load_all((REPO_ROOT / "examples" / "argocd-application.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "Application":
            d["spec"]["source"]["repoURL"] = repo_url
    return yaml.safe_dump_all(docs, sort_keys=False)


def _rebalanced_by_commit(argo: ArgoCD, pipeline: str, what: str, via: tuple[str, ...] = ()) -> list:
    """The pipeline's file committed; Healthy in Argo CD once each of `via` was seen, settled
    after a rebalance newer than the last, and Healthy then; the health statuses seen first."""
    st = kubectl_json("-n", NS, "get", "exactlyoncepipeline", NAME).get("status") or {}
    before = (st.get("lastRebalance") or {}).get("id", -1)
    _push(argo, {PIPELINE_FILE: pipeline}, f"{NAME}: {what}", PIPELINES_APP)
    seen = _health_until(argo, "Healthy", 300, what, via=via)[0] if via else []
    wait(lambda: settled(NS, NAME, before), 300, f"{NAME} settled after {what}")
    _health_until(argo, "Healthy", 120, what)
    return seen


def _resource(app: dict, kind: str, name: str) -> dict:
    return next((r for r in app["status"].get("resources", []) if (r["kind"], r["name"]) == (kind, name)), {})


def _health_until(argo: ArgoCD, want: str, timeout: float, what: str, via: tuple[str, ...] = ()) -> tuple[list, dict]:
    """The pipeline's health in its Application, polled until `want` once each of `via` was seen
    (in order); returns the statuses seen (repeats dropped) and the last health."""
    seen, deadline, left, said = [], time.monotonic() + timeout, list(via), None
    while True:
        h = _resource(argo.app(PIPELINES_APP), "ExactlyOncePipeline", NAME).get("health") or {}
        status = h.get("status")
        if status and (not seen or seen[-1] != status):
            seen.append(status)
        if status and said != (status, h.get("message")):
            said = (status, h.get("message"))
            log(f"Argo CD: {NAME} {status}: {h.get('message', '')[:200]}")
        if left and status == left[0]:
            left.pop(0)
        if status == want and not left:
            return seen, h
        assert time.monotonic() < deadline, f"{what}: health {seen} after {timeout:.0f}s, not {want} via {via}"
        time.sleep(0.5)


def _this_specs_query_runs() -> bool:
    """The driver pod is of the SparkApplication's spec as it is now (its digest label) and says
    its streaming query runs."""
    app = kubectl_json("-n", NS, "get", "sparkapplication", f"{NAME}-spark")
    pod = json.loads(kubectl("-n", NS, "get", "pod", f"{NAME}-spark-driver", "-o", "json", check=False) or "{}")
    label = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_SPARK_SPEC)
    return (label == app["spec"]["driver"]["labels"][LABEL_SPARK_SPEC]
            and driver_says(NS, f"{NAME}-spark", "streaming query running"))


def _in_sync_after_a_hard_refresh(argo: ArgoCD) -> None:
    """Compared afresh with the operator running: what it and the API server write (status, its
    finalizer, defaults) makes no difference Argo CD would show, with no ignoreDifferences, and
    the comparison starts no sync. The children first: while a child syncs, its `operation`
    field is a difference the app-of-apps sees. Each is compared once first and its syncs let
    end: an app's periodic comparison may only now see the last commit and sync (a child's
    self-heal, the app-of-apps seeing that child's `operation`), which the hard refresh did not start."""
    for name in (PIPELINES_APP, OPERATOR_APP, ROOT_APP):
        before = ArgoCD.last_sync(argo.compare_now(name))
        app = argo.compare_now(name, "hard")
        out = [r for r in app["status"].get("resources", []) if r["status"] != "Synced"]
        assert app["status"]["sync"]["status"] == "Synced" and not out, (name, out)
        assert ArgoCD.last_sync(app) == before, (name, "synced again", app["status"].get("operationState"))


def _sink_end() -> int:
    return sum(json.loads(nodetier.python(
        "import json; from tests.helpers.sparkfiles import end_offsets; "
        f"print(json.dumps(end_offsets({BOOTSTRAP!r}, {SINK!r})))")).values())


def _sink_has(field: str) -> bool:
    return nodetier.python(
        "import json; from eopipe.tools.verify import TopicReader\n"
        f"print(any({field!r} in json.loads(m.value()) for m in TopicReader({BOOTSTRAP!r}).read({SINK!r})))",
        timeout=300).strip() == "True"


def _push(argo: ArgoCD, files: dict, message: str, *apps: str) -> str:
    """A commit, then each app asked to look at git now (as a webhook does)."""
    sha = argo.commit(files, message)
    for a in apps:
        argo.refresh(a)
    log(f"git: {message} ({sha[:12]})")
    return sha


def test_argo_cd_syncs_upgrades_and_changes_a_pipeline_under_load_exactly_once(node_tier, argo, tmp_path):
    """The GitOps repository holds the chart and images as of PREVIOUS and that commit's
    examples/payments.yaml (v1alpha1, set for this tier); the app-of-apps applied once by hand
    makes the watched namespace, the operator's Application and the pipelines', in their sync
    waves, and everything after is a commit. Under duplicated load:
    - the chart of this tree and its images: Argo CD upgrades the CRD (server-side apply) and the
      operator; the dedup pods roll, a driver of the new Spark image goes on from the checkpoint;
      the v1alpha1 manifest in sync against the upgraded CRD after at most one self-heal sync
      (which stores the new CRD's defaults);
    - dedup.replicas 1 -> 3: the pipeline Progressing in Argo CD while partitions move, then Healthy;
    - processing.sql with one more column: Progressing, then Healthy, the new column in the sink;
    - a change the operator cannot apply (the dedup claims' size): Degraded with the operator's
      reason and message, the pipeline running on as it was; the commit reverted: Healthy.
    After the load, 4 -> 6 source partitions; then `eopipe verify` of both stages: nothing lost,
    nothing twice, each malformed record dead-lettered. The pipeline's file removed
    from git: it stays (prune off for pipelines), OutOfSync and requiring pruning, until a
    person deletes it. Deleting the app-of-apps with Argo CD's cascade removes the operator and
    leaves the CRD. Pod faults and scaling down are other tests' (the demo, test_node_loss.py,
    test_rebalance.py): a commit here is what only Argo CD does."""
    t = time.monotonic()
    old_app, archive = commit_app_image(PREVIOUS)
    old_spark, spark_archive = commit_spark_image(PREVIOUS, node_tier["spark"])
    nodetier.import_image(archive)
    nodetier.import_image(spark_archive)
    old = tree_at(PREVIOUS, tmp_path, "charts/eopipe", "examples/payments.yaml")
    old_images = {"app": old_app, "spark": old_spark}
    log(f"{old_app} and {old_spark} (as of {PREVIOUS[:12]}) on the nodes in {time.monotonic() - t:.0f}s")
    # An earlier test's uninstall leaves this tree's CRD; Argo CD would not downgrade it.
    kubectl("delete", "crd", CRD, "--ignore-not-found", "--timeout=60s")

    doc = yaml.safe_load((old / "examples" / "payments.yaml").read_text())
    assert doc["apiVersion"] == "eopipe.dev/v1alpha1", doc["apiVersion"]
    doc["spec"]["source"].update(topic=SRC, partitions=4)
    doc["spec"]["dedup"]["replicas"] = 1
    doc["spec"]["sink"]["kafka"] = {"topic": SINK, "partitions": 4}

    def pipeline_file() -> str:
        return yaml.safe_dump(doc, sort_keys=False)

    root = yaml.safe_load((REPO_ROOT / "examples" / "argocd-app-of-apps.yaml").read_text())
    root["spec"]["source"]["repoURL"] = argo.repo_url
    sha = _push(argo, {**ArgoCD.tree(old / "charts" / "eopipe", "charts/eopipe"),
                       "values/eopipe.yaml": _values(old_images), "apps/eopipe.yaml": _apps_file(argo.repo_url),
                       # The path stays when the last pipeline leaves (an Application whose path is
                       # gone cannot compare); Argo CD reads only the YAML and JSON files there.
                       "pipelines/README.md": "The ExactlyOncePipelines of this cluster, one file each.\n",
                       PIPELINE_FILE: pipeline_file()}, f"eopipe as of {PREVIOUS[:12]}, payments")
    load = None
    try:
        t = time.monotonic()
        argo.apply([root])
        argo.wait_app(OPERATOR_APP, revision=sha, timeout=300)
        forget_api_discovery()  # v1alpha1 alone now, and kubectl still knows the earlier test's v1beta1
        argo.wait_app(PIPELINES_APP, revision=sha, timeout=600)
        argo.wait_app(ROOT_APP, revision=sha, timeout=120)  # its last wave Healthy
        log(f"app-of-apps: the operator, then {NAME} Healthy in Argo CD, in {time.monotonic() - t:.0f}s")
        # Healthy is Ready: the driver pod runs; its query starts a little later.
        wait(lambda: settled(NS, NAME) and driver_says(NS, f"{NAME}-spark", "streaming query running"), 300,
             f"{NAME}'s streaming query running")
        _in_sync_after_a_hard_refresh(argo)

        # The malformed records first (a load stopped early would send only some), then the load
        # that runs through every change below.
        poison = nodetier.eopipe("load", "--bootstrap", BOOTSTRAP, "--topic", SRC, "--count", "0", "--poison",
                                 str(POISON), "--seed", "34", "--quiet", "--json")
        assert poison.returncode == 0, poison.stderr
        load = start_load(SRC, "1000000", "500", "34")
        wait(lambda: _sink_end() > 0, 300, "the load's first records in the sink", interval=3)

        # The operator upgraded by a commit: this tree's chart and images.
        t, watch = time.monotonic(), pod_lives(NS, NAME)
        pipelines_synced = ArgoCD.last_sync(argo.app(PIPELINES_APP))
        # One commit, seen by the operator's Application alone: the chart and its values together.
        sha = _push(argo, {**ArgoCD.tree(REPO_ROOT / "charts" / "eopipe", "charts/eopipe"),
                           "values/eopipe.yaml": _values(node_tier)},
                    "eopipe: this tree's chart and images", OPERATOR_APP)
        argo.wait_app(OPERATOR_APP, revision=sha, timeout=300)
        forget_api_discovery()
        wait(lambda: kubectl("-n", NS, "get", "statefulset", f"{NAME}-dedup", "-o",
                             "jsonpath={.spec.template.spec.containers[0].image}") == node_tier["app"],
             300, "the new operator's image in the dedup StatefulSet")
        kubectl("-n", NS, "rollout", "status", f"statefulset/{NAME}-dedup", "--timeout=300s", timeout=320)
        watch.terminate()
        lives = restarts_seen(watch.communicate(timeout=30)[0])
        log(f"upgrade: replacements + restarts per dedup pod {lives}")
        # The one rollout the new image makes, nothing more.
        assert set(lives) == {f"{NAME}-dedup-0"} and max(lives.values()) <= 1, lives
        wait(lambda: settled(NS, NAME) and kubectl(
            "-n", NS, "get", "pod", f"{NAME}-spark-driver", "-o", "jsonpath={.spec.containers[0].image}",
            check=False) == node_tier["spark"] and driver_says(NS, f"{NAME}-spark", "streaming query running"),
            600, "a driver of the new Spark image running the query, the pipeline Ready")
        # The file in git says v1alpha1; the upgraded CRD serves it as both.
        for version in ("v1beta1", "v1alpha1"):
            got = kubectl_json("-n", NS, "get", f"exactlyoncepipelines.{version}.eopipe.dev", NAME)
            assert got["apiVersion"] == f"eopipe.dev/{version}" and got["spec"]["dedup"]["replicas"] == 1, got
        # The upgraded CRD defaults fields the old one did not have (processing.upgradeMode and
        # reprocessFrom): Argo CD's server-side diff may show the pipeline, stored without them,
        # OutOfSync once, and self-heal applies the same file again, which stores them
        # (docs/install.md). At most that one sync of the pipelines' Application since the commit.
        app = argo.compare_now(PIPELINES_APP, timeout=300)
        heals = ArgoCD.last_sync(app) - pipelines_synced
        sync = app["status"]["sync"]
        assert sync["status"] == "Synced" and sync.get("revision") == sha and heals <= 1, (heals, app["status"])
        log(f"upgraded through git: CRD, operator, dedup pods and driver in {time.monotonic() - t:.0f}s; "
            f"the v1alpha1 file synced again by self-heal {heals} time(s)")
        _in_sync_after_a_hard_refresh(argo)

        # dedup.replicas 1 -> 3: Progressing while partitions move, then Healthy.
        doc["spec"]["dedup"]["replicas"] = 3
        seen = _rebalanced_by_commit(argo, pipeline_file(), "replicas 1 -> 3", via=("Progressing",))
        log(f"replicas 1 -> 3 in Argo CD: {' -> '.join(seen)}")

        # A stateless SQL change: Progressing, then Healthy, the new column in the sink.
        doc["spec"]["processing"]["sql"] = SQL_V2
        _push(argo, {PIPELINE_FILE: pipeline_file()}, f"{NAME}: one more column", PIPELINES_APP)
        seen, _ = _health_until(argo, "Healthy", 600, "the SQL change", via=("Progressing",))
        # Healthy once the changed query runs: the new driver has started it (its log line follows
        # the word in its /progress by a moment), not while the old driver or a starting one runs.
        wait(_this_specs_query_runs, 30, "the changed query running when Argo CD says Healthy")
        wait(lambda: _sink_has("rev"), 300, "the new SQL's column in the sink", interval=5)
        log(f"SQL change in Argo CD: {' -> '.join(seen)}")

        # A change the operator cannot apply: Degraded with its reason; reverted: Healthy.
        good = doc["spec"]["dedup"]["storage"]
        doc["spec"]["dedup"]["storage"] = {**good, "size": "3Gi"}
        _push(argo, {PIPELINE_FILE: pipeline_file()}, f"{NAME}: bigger dedup claims", PIPELINES_APP)
        _, h = _health_until(argo, "Degraded", 300, "the claims' size change")
        assert "ApplyFailed" in h["message"] and f"StatefulSet {NAME}-dedup" in h["message"], h
        assert argo.app(PIPELINES_APP)["status"]["health"]["status"] == "Degraded"
        sts = kubectl_json("-n", NS, "get", "statefulset", f"{NAME}-dedup")
        assert sts["status"].get("readyReplicas") == 3, sts["status"]  # running on as it was
        doc["spec"]["dedup"]["storage"] = good
        sha = _push(argo, {PIPELINE_FILE: pipeline_file()}, f"{NAME}: revert the claims' size", PIPELINES_APP)
        _health_until(argo, "Healthy", 300, "the revert")
        argo.wait_app(PIPELINES_APP, revision=sha)

        assert load.poll() is None, "the load ended before the changes did: raise its count"
        load.terminate()
        out, err = load.communicate(timeout=300)
        assert load.returncode == 0, err
        sent = json.loads(out)
        load = None
        log(f"load: {sent}")
        # Source partitions 4 -> 6, after the load.
        doc["spec"]["source"]["partitions"] = 6
        _rebalanced_by_commit(argo, pipeline_file(), "source partitions 4 -> 6")
        log(f"kubectl get pods -A -o wide\n{kubectl('get', 'pods', '-A', '-o', 'wide')}")
        rep = verify_both_stages(NS, NAME, SRC, SINK)["dedup stage"]
        assert rep["unique_in"] == sent["unique"], rep
        assert rep["malformed_in"] == rep["dead_lettered"] == POISON, rep

        # Prune is off for pipelines: removed from git, it stays until a person deletes it.
        sha = _push(argo, {PIPELINE_FILE: None}, f"{NAME} leaves git", PIPELINES_APP)
        app = argo.wait_app(PIPELINES_APP, sync="OutOfSync", health=None, revision=sha)
        gone = _resource(app, "ExactlyOncePipeline", NAME)
        assert gone["status"] == "OutOfSync" and gone.get("requiresPruning") is True, gone
        assert settled(NS, NAME), "the pipeline left git and stopped"
        delete_spark_pipeline(NS, NAME)
        argo.refresh(PIPELINES_APP)
        argo.wait_app(PIPELINES_APP, health=None, revision=sha)
    finally:
        if load is not None:
            load.kill()
        _uninstall(argo)
        delete_topics(NS, NAME, SRC, SINK)
        # This tree's CRD for the next tests, also when the test stopped before Argo CD upgraded it.
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "charts/eopipe/crds"))
        forget_api_discovery()
    # What the next test's `helm install` needs: no object of the chart left, the CRD kept.
    left = kubectl("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,"
                   "validatingadmissionpolicybindings", "-l", "app.kubernetes.io/name=eopipe", "-o", "name").split()
    assert not left, left
    kubectl("get", "crd", CRD)


def _uninstall(argo: ArgoCD) -> None:
    """Argo CD's Applications gone and the operator with them, its CRD left (Argo CD never tracks
    one), as the next test's `helm install` needs (the test checks it; run after a failure too):
    the app-of-apps deleted without cascade (it would re-create what it holds), the pipelines'
    Application too, the pipelines deleted by a person while the operator runs (its finalizer),
    then the operator's Application with Argo CD's cascade (its finalizer, as `argocd app
    delete` sets it)."""
    for name in (ROOT_APP, PIPELINES_APP):
        argo.kubectl("-n", NAMESPACE, "delete", "application", name, "--ignore-not-found", "--timeout=120s",
                     check=False)
    for ref in kubectl("-n", NS, "get", "exactlyoncepipelines", "-o", "name", check=False).split():
        delete_spark_pipeline(NS, ref.split("/")[-1], check=False)
    argo.kubectl("-n", NAMESPACE, "patch", "application", OPERATOR_APP, "--type=merge", "-p",
                 json.dumps({"metadata": {"finalizers": ["resources-finalizer.argocd.argoproj.io"]}}), check=False)
    argo.kubectl("-n", NAMESPACE, "delete", "application", OPERATOR_APP, "--ignore-not-found", "--timeout=300s",
                 check=False)
    # What the app-of-apps made (the watched namespace) and CreateNamespace (the operator's).
    kubectl("delete", "namespace", "eopipe-system", NS, "--ignore-not-found", "--timeout=180s", timeout=200,
            check=False)
