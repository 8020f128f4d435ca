"""Pipelines on the node tier, as the node-tier tests drive them (tests/e2e/test_node_*.py): the
operator installed by Helm, a pipeline settled, load, `eopipe verify` of both stages, deletion."""

from __future__ import annotations

import json
import subprocess

from eopipe.core import names
from eopipe.core.names import LABEL_COMPONENT, LABEL_PIPELINE
from localenv import REPO_ROOT
from localenv.node.__main__ import kubectl_argv
from tests.helpers import nodetier
from tests.helpers.nodetier import BOOTSTRAP, EOPIPE, eopipe, helm, in_tier, kubectl, kubectl_json, log, wait


def settled(ns: str, name: str, after: int | None = None) -> dict | None:
    """The pipeline, once Ready, Running, with no rebalance under way and its generation observed
    (and a rebalance newer than `after` recorded); else None."""
    obj = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)
    st = obj.get("status") or {}
    ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
    ok = (ready.get("status") == "True" and st.get("phase") == "Running" and not st.get("rebalance")
          and st.get("observedGeneration") == obj["metadata"]["generation"]
          and (after is None or (st.get("lastRebalance") or {}).get("id", -1) > after))
    return obj if ok else None


def helm_bin() -> str:
    return subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "helm"], check=True,
                          capture_output=True, text=True).stdout.split()[-1]


# The last commit whose operator and CRD know only v1alpha1 (fdf4142 added v1beta1 and stores
# it): the upgrade test (test_gitops.py's, through Argo CD) starts from its chart, images and
# examples/payments.yaml. There is no release yet; when there is, pin
# the previous CHANGELOG entry's commit here instead.
PREVIOUS = "ebd4bedf8db71f1e23992e9ee3983f6e4df8417c"

# The admin's grant the Spark lifecycle test's restore into another namespace needs
# (tenantPolicy.restores); no other test's namespaces match it.
RESTORE_GRANT = ("--set-json", 'tenantPolicy.restores=[{"from": "sparklife", "to": "sparklife-restored"}]')


def install_operator(images: dict, *extra: str) -> None:
    """The operator of this tree by `helm install` of charts/eopipe, with RESTORE_GRANT (`extra`:
    more helm flags)."""
    (repo, tag), (spark_repo, spark_tag) = images["app"].rsplit(":", 1), images["spark"].rsplit(":", 1)
    helm(helm_bin(), "install", "eopipe", str(REPO_ROOT / "charts" / "eopipe"), "-n", "eopipe-system",
         "--create-namespace", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
         "--set", f"sparkImage.repository={spark_repo}", "--set", f"sparkImage.tag={spark_tag}",
         *RESTORE_GRANT, *extra, "--wait", "--timeout", "180s")


def start_load(topic: str, count: str, rate: str, seed: str, dup_ratio: str = "0.3", *extra: str) -> subprocess.Popen:
    """`eopipe load` with 30% duplicates (or `dup_ratio`) and `extra` options, in the background
    (SIGTERM: it stops, flushes, reports)."""
    return subprocess.Popen(in_tier(EOPIPE, "load", "--bootstrap", BOOTSTRAP, "--topic", topic, "--count", count,
                                    "--rate", rate, "--dup-ratio", dup_ratio, "--seed", seed, "--quiet", "--json",
                                    *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def driver_says(ns: str, app_name: str, *words: str) -> bool:
    text = kubectl("-n", ns, "logs", f"{app_name}-driver", check=False)
    return all(w in text for w in words)


def spark_caught_up(ns: str, name: str, timeout: float = 600) -> dict:
    """status.processing once the running driver has read the deduped topic to its end (lag 0,
    its progress answered on the operator's last pass): after faults, the driver may still be
    starting again, and a sink that has not moved for a verify's settle time is not yet done."""
    def done() -> dict | None:
        proc = (kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}).get("processing")
        return proc if proc and proc.get("lagRecords") == 0 and not proc.get("error") else None
    return wait(done, timeout, "the Spark stage at the deduped topic's end (status.processing)", interval=2)


def verify_both_stages(ns: str, name: str, source: str, sink: str, topics_of: str | None = None) -> dict[str, dict]:
    """`eopipe verify` of the dedup stage and, once the Spark stage has caught up, end to end,
    each with nothing lost and nothing twice; the reports by stage. `topics_of`: the namespace
    whose topic names a restored pipeline kept (its origin's, deleted since)."""
    named = topics_of or ns
    common = ["--bootstrap", BOOTSTRAP, "--source", source, "--key", "json:id",
              "--dlq", names.dlq_topic(named, name), "--json", "--timeout", "400"]
    reports = {}
    for what, extra in (("dedup stage", ["--output", names.deduped_topic(named, name)]),
                        ("end to end", ["--output", sink, "--no-order", "--settle", "30"])):
        if what == "end to end":
            proc = spark_caught_up(ns, name)
            log(f"Spark caught up: batch {proc.get('lastBatchId')} ended {proc.get('lastBatchTime')}, lag 0")
        res = eopipe("verify", *common, *extra)
        log(f"eopipe verify, {what}: {res.stdout}{res.stderr}")
        rep = reports[what] = json.loads(res.stdout)
        assert res.returncode == 0 and rep["lost"] == 0 and rep["duplicated"] == 0, (what, rep)
    return reports


def delete_spark_pipeline(ns: str, name: str, check: bool = True) -> None:
    """Deleted with its Spark pods gone: a driver left running holds the node's cores, and the
    next Spark test's driver would stay Pending."""
    kubectl("-n", ns, "delete", "exactlyoncepipeline", name, "--timeout=180s", check=check)
    wait(lambda: not kubectl("-n", ns, "get", "pods", "-l", "spark-role", "-o", "name"), 120, "the Spark pods gone")


def delete_topics(ns: str, name: str, src: str, sink: str) -> None:
    """A Spark test pipeline's topics, its Spark commit markers' included, so the next test starts
    on none of its records."""
    made = (names.deduped_topic(ns, name), names.dlq_topic(ns, name), names.spark_commit_topic(ns, name))
    nodetier.python("from confluent_kafka.admin import AdminClient\n"
                    f"a = AdminClient({{'bootstrap.servers': '{BOOTSTRAP}'}})\n"
                    f"left = [t for t in {(src, sink, *made)!r} "
                    "if t in a.list_topics(timeout=10).topics]\n"
                    "[f.result(30) for f in a.delete_topics(left).values()] if left else None")


def pod_lives(ns: str, name: str) -> subprocess.Popen:
    """A watch of the pipeline's dedup pods: one line per change, name, uid and restart count."""
    return subprocess.Popen(kubectl_argv("-n", ns, "get", "pods", "-l", f"{LABEL_PIPELINE}={name},{LABEL_COMPONENT}=dedup",
                                         "--watch",
                                         "--no-headers", "-o", "custom-columns=N:.metadata.name,U:.metadata.uid,"
                                         "R:.status.containerStatuses[0].restartCount"),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def restarts_seen(lines: str) -> dict[str, int]:
    """Per pod name: its replacements (uids after the first) plus its containers' restarts."""
    uids: dict[str, dict[str, int]] = {}
    for ln in lines.splitlines():
        pod, uid, restarts = ln.split()
        seen = uids.setdefault(pod, {})
        seen[uid] = max(seen.get(uid, 0), int(restarts) if restarts.isdigit() else 0)
    return {pod: len(seen) - 1 + sum(seen.values()) for pod, seen in uids.items()}
