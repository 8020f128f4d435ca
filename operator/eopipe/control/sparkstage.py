"""The Spark stage's lifecycle: what the reconcile pass does with the SparkApplication, decided
from facts (pure; the pass reads the facts and acts).

spec.paused stops the Spark application too. The Kubeflow Spark Operator's v1beta2 API got a
`suspend` field only in 2025 (kubeflow/spark-operator#2387); on the releases before it a
structural CRD prunes the unknown field silently and the driver goes on running. So the
operator deletes the SparkApplication while paused, which every release answers by stopping
its driver, and creates it again on resume. The checkpoint is on a claim or a URI that is not the SparkApplication's
(control/builders/checkpoint.py), so the new driver resumes from it: its first batches are the
replay the Kafka sink's markers make exactly-once (spark_app/sink_kafka.py).

Two drivers must never run on one checkpoint, so the application is created again only once
the deleted one is gone and no driver pod of it is left (the Spark Operator labels them
`spark-role=driver`, `sparkoperator.k8s.io/app-name=<app>`; a driver pod outlives its
SparkApplication by its termination grace period).
"""

from __future__ import annotations

from dataclasses import dataclass

from eopipe.control.status import Condition

APPLY, DELETE, WAIT, NONE = "apply", "delete", "wait", "none"
_DONE_PHASES = ("Succeeded", "Failed")  # a driver pod in these runs nothing any more


def driver_selector(app_name: str) -> str:
    return f"spark-role=driver,sparkoperator.k8s.io/app-name={app_name}"


@dataclass(frozen=True)
class Facts:
    paused: bool
    app: dict | None                   # the SparkApplication as read now; None: there is none
    driver_phases: tuple[str, ...] = ()  # status.phase of each of its driver pods still listed
    checkpoint: str = ""               # where the checkpoint lives, for the messages


@dataclass(frozen=True)
class Plan:
    action: str                     # APPLY, DELETE, WAIT (look again soon) or NONE
    condition: Condition | None     # None with APPLY: judged from the applied object (sparkstatus)


def _deleting(app: dict | None) -> bool:
    return app is not None and bool((app.get("metadata") or {}).get("deletionTimestamp"))


def plan(f: Facts) -> Plan:
    live_drivers = sum(1 for phase in f.driver_phases if phase not in _DONE_PHASES)
    kept = f"its checkpoint ({f.checkpoint}) is kept" if f.checkpoint else "its checkpoint is kept"
    if f.paused:
        if f.app is not None and not _deleting(f.app):
            return Plan(DELETE, Condition("ProcessingReady", True, "Paused",
                                          f"stopping the Spark application while paused (SparkApplication "
                                          f"deleted); {kept} and it resumes from there"))
        if f.app is not None or live_drivers:
            return Plan(NONE, Condition("ProcessingReady", True, "Paused",
                                        f"the Spark driver is stopping while paused; {kept}"))
        return Plan(NONE, Condition("ProcessingReady", True, "Paused",
                                    f"stopped while paused; resumes from its checkpoint ({f.checkpoint})"
                                    if f.checkpoint else "stopped while paused; resumes from its checkpoint"))
    if _deleting(f.app) or (f.app is None and live_drivers):
        what = ("the SparkApplication deleted while paused is still being deleted" if f.app is not None
                else f"{live_drivers} driver pod(s) of the deleted SparkApplication still run")
        return Plan(WAIT, Condition("ProcessingReady", False, "SparkStopping",
                                    f"{what}; the application is created again once it is gone (two drivers "
                                    "must never share a checkpoint)"))
    return Plan(APPLY, None)


# ------------------------------------------------------------------ upgradeMode: which checkpoint

def checkpoint_record(mode: str, query_key: str, recorded: dict | None) -> dict:
    """status.sparkCheckpoint: {generation, query}, the checkpoint the driver is given and the
    query (ProcessingSpec.query_key) it was started for. keepCheckpoint stays on the checkpoint
    whatever the query (Spark judges the change; spark_app/upgrade.py); fromSink and reprocess
    start a new generation when the query differs from the one the current generation was
    started for. Nothing is deleted: a generation is a new location (builders/spark.checkpoint_location).
    A pipeline with no record (new, or from before upgradeMode) is on generation 0."""
    if not recorded or not isinstance(recorded.get("generation"), int):
        return {"generation": 0, "query": query_key}
    if mode == "keepCheckpoint" or recorded.get("query") == query_key:
        return {"generation": recorded["generation"], "query": recorded.get("query") or query_key}
    return {"generation": recorded["generation"] + 1, "query": query_key}
