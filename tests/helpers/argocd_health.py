"""The table of argocd/health.lua: pipelines whose status is built the way the operator builds
it (eopipe.control.status.summarize and merge_conditions), and the Argo CD health each must
get. Run by two Lua runtimes over the same rows: lupa's Lua 5.1 (tests/unit/test_argocd_health.py)
and Argo CD's own code (tests/integration/test_argocd_health_go.py, hack/argocd-health)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from eopipe.control.status import Condition, merge_conditions, summarize

ROOT = Path(__file__).resolve().parents[2]
LUA_PATH = ROOT / "argocd" / "health.lua"
LUA = LUA_PATH.read_text()
README = ROOT / "argocd" / "README.md"
# The argocd-cm key of the script, as Argo CD names resource customizations (<group>_<kind>).
RESOURCE = "eopipe.dev_ExactlyOncePipeline"
CM_KEY = f"resource.customizations.health.{RESOURCE}"
APP_CM_KEY = "resource.customizations.health.argoproj.io_Application"

# Every reason a stage condition can be False with, and how Argo CD should show it.
DEGRADED_REASONS = {"KafkaUnavailable", "NotSupported", "SparkOperatorMissing", "SparkFailed", "InvalidSpec",
                    "ApplyFailed", "AdoptedTopicMismatch", "Conflict", "HangingTransaction", "LagGrowing",
                    "PolicyDenied", "SparkStuck", "CheckpointUnreachable",
                    "DriverNodeLost"}
PROGRESSING_REASONS = {"PodsNotReady", "SparkStarting"}

OK_STAGES = [Condition("TopicsReady", True, "TopicsReconciled", "all topics as specified"),
             Condition("DedupReady", True, "PodsReady", "2/2 pods ready"),
             Condition("ProcessingReady", True, "Running", "Spark application running")]

SPARK_STUCK = ("no Spark batch for 600s (last: batch 41; the trigger is 1000ms) while 5000 records wait in "
               "ns.p.deduped: see the driver's log")
PROCESSING_STATUS = {"lastBatchId": 41, "lastBatchTime": "2026-11-25T23:00:00Z", "batchDurationMs": 250,
                     "inputRowsPerSecond": 100.0, "processedRowsPerSecond": 480.0, "lagRecords": 0}
HANGING = ("p-deduped partition 1: a transaction open at offset 42 for 900s holds every read_committed reader; "
           "find it with `kafka-transactions.sh ... find-hanging` and abort it")
LAGGING = "the dedup lag has stayed above spec.dedup.lagThreshold (10000 records) for 5m"
REBALANCE = {"phase": "Handoff", "generation": 4, "moving": [2, 3]}


def pipeline(stages=None, *, generation=1, observed=1, paused=False, stalled=None, rebalancing=None,
             extra_status=None, status=True) -> dict:
    obj = {"apiVersion": "eopipe.dev/v1beta1", "kind": "ExactlyOncePipeline",
           "metadata": {"name": "p", "namespace": "ns", "generation": generation},
           "spec": {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": "t", "partitions": 4},
                    **({"paused": True} if paused else {})}}
    if not status:
        return obj
    conditions, phase = summarize(list(OK_STAGES if stages is None else stages), stalled=stalled,
                                  rebalancing=rebalancing, paused=paused)
    # Twice, as after two reconcile passes: lastTransitionTime carried over.
    merged = merge_conditions(merge_conditions(None, conditions, observed), conditions, observed)
    obj["status"] = {"observedGeneration": observed, "phase": phase, "conditions": merged,
                     "partitions": 4, "replicas": 2, "readyReplicas": 2, **(extra_status or {})}
    return obj


def stage(type_: str, reason: str, message: str = "") -> list[Condition]:
    return [Condition(c.type, False, reason, message) if c.type == type_ else c for c in OK_STAGES]


# (name, object, Argo CD health status, a part of its message)
CASES = [
    ("created, no status yet", pipeline(status=False), "Progressing", "report status"),
    ("running", pipeline(), "Healthy", "Running"),
    ("spec changed, not observed yet", pipeline(generation=3, observed=2), "Progressing", "generation 3"),
    ("stalled from an older generation", pipeline(generation=2, observed=1,
                                                  stalled=Condition("Stalled", True, "InvalidSpec", "bad")),
     "Progressing", "generation 2"),
    ("dedup pods starting", pipeline(stage("DedupReady", "PodsNotReady", "1/2 pods ready")), "Progressing",
     "1/2 pods ready"),
    ("spark submitted", pipeline(stage("ProcessingReady", "SparkStarting", "Spark application SUBMITTED")),
     "Progressing", "SparkStarting"),
    ("spark failed", pipeline(stage("ProcessingReady", "SparkFailed", "driver OOMKilled")), "Degraded",
     "OOMKilled"),
    ("spark failed behind pods starting",
     pipeline([OK_STAGES[0], Condition("DedupReady", False, "PodsNotReady", "1/2"),
               Condition("ProcessingReady", False, "SparkFailed", "driver OOMKilled")]),
     "Degraded", "SparkFailed: ProcessingReady: driver OOMKilled"),
    ("no spark operator", pipeline(stage("ProcessingReady", "SparkOperatorMissing", "install it")), "Degraded",
     "SparkOperatorMissing"),
    ("kafka unreachable", pipeline([Condition("TopicsReady", False, "KafkaUnavailable", "timed out")]),
     "Degraded", "KafkaUnavailable"),
    ("invalid spec", pipeline([], stalled=Condition("Stalled", True, "InvalidSpec", "spec.source: bad")),
     "Degraded", "InvalidSpec"),
    ("partition decrease refused",
     pipeline([Condition("TopicsReady", False, "NotSupported", "cannot shrink")],
              stalled=Condition("Stalled", True, "NotSupported", "topic t: cannot shrink")),
     "Degraded", "NotSupported"),
    ("paused", pipeline(paused=True), "Suspended", "Paused"),
    ("paused, not observed yet", pipeline(paused=True, generation=2, observed=1), "Progressing", "generation 2"),
    ("rebalancing (phase)", pipeline(rebalancing="moving partitions 2, 3 to p-dedup-1"), "Progressing",
     "Rebalancing"),
    ("rebalancing (status.rebalance)", pipeline(extra_status={"rebalance": REBALANCE}), "Progressing", "Handoff"),
    # Exactly-once health (issue 20): a hanging transaction is Degraded whatever else is going on.
    ("hanging transaction", pipeline(stage("DedupReady", "HangingTransaction", HANGING),
                                     extra_status={"transactions": {"1": {"lastStableOffset": 42,
                                                                          "sinceMs": 1_700_000_000_000}}}),
     "Degraded", "HangingTransaction: DedupReady: p-deduped partition 1"),
    ("hanging transaction during a rebalance",
     pipeline(stage("DedupReady", "HangingTransaction", HANGING), rebalancing="moving partition 2",
              extra_status={"rebalance": REBALANCE}),
     "Degraded", "HangingTransaction"),
    ("hanging transaction while spark starts",
     pipeline([OK_STAGES[0], Condition("DedupReady", False, "HangingTransaction", HANGING),
               Condition("ProcessingReady", False, "SparkStarting", "SUBMITTED")]),
     "Degraded", "HangingTransaction"),
    ("lag growing past the threshold", pipeline(stage("DedupReady", "LagGrowing", LAGGING)), "Degraded",
     "LagGrowing"),
    ("spark stage stuck", pipeline(stage("ProcessingReady", "SparkStuck", SPARK_STUCK),
                                   extra_status={"processing": {**PROCESSING_STATUS, "lagRecords": 5000}}),
     "Degraded", "SparkStuck"),
    ("spark stage running its batches", pipeline(extra_status={"processing": PROCESSING_STATUS}), "Healthy", "Running"),
    # Progressing only while a change is under way: records of work that is over, or of
    # transactions open for less than the threshold, leave the pipeline Healthy.
    ("transaction open, under the threshold",
     pipeline(extra_status={"transactions": {"0": {"lastStableOffset": 7, "sinceMs": 1_700_000_000_000}}}),
     "Healthy", "Running"),
    ("lag above the threshold, within its window",
     pipeline(extra_status={"lag": {"dedup": 20000, "aboveThresholdSinceMs": 1_700_000_000_000}}),
     "Healthy", "Running"),
    ("autoscaler waiting out its stabilization window",
     pipeline(extra_status={"autoscale": {"desiredReplicas": 2, "currentReplicas": 2, "minReplicas": 1,
                                          "maxReplicas": 6, "reason": "ScaleUpStabilizing",
                                          "message": "lag 90000 over 2 pods: recommends 4 -> 2",
                                          "recommendations": [{"replicas": 4, "atMs": 1_700_000_000_000}]}}),
     "Healthy", "Running"),
    ("rebalance finished (empty object)", pipeline(extra_status={"rebalance": {}}), "Healthy", "Running"),
    ("rebalance finished (null, as the status merge patch leaves it)",
     pipeline(extra_status={"rebalance": None, "lastRebalance": {"phase": "Done", "generation": 4}}),
     "Healthy", "Running"),
    ("scaled, new generation observed, rebalance done",
     pipeline(generation=5, observed=5, extra_status={"lastRebalance": {"phase": "Done", "generation": 5}}),
     "Healthy", "Running"),
]


def argocd_cm_text() -> str:
    """The argocd-cm ConfigMap of argocd/README.md, as YAML."""
    m = re.search(r"```yaml\n(apiVersion: v1\nkind: ConfigMap.*?)```", README.read_text(), re.S)
    assert m, "argocd/README.md has no argocd-cm snippet"
    return m.group(1)


def argocd_cm() -> dict:
    return yaml.safe_load(argocd_cm_text())


# The Application health check of the README's argocd-cm: (Application status, Argo CD health).
APP_CASES = [
    (None, "Progressing"),
    ({"health": {"status": "Progressing", "message": "rolling out"}}, "Progressing"),
    ({"health": {"status": "Degraded"}}, "Degraded"),
    ({"health": {"status": "Healthy"}}, "Healthy"),
]


def application(app_status) -> dict:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "eopipe-operator"},
            **({"status": app_status} if app_status else {})}
