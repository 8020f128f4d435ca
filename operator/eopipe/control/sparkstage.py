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
from datetime import datetime, timezone

from eopipe.control.status import Condition

APPLY, DELETE, WAIT, NONE = "apply", "delete", "wait", "none"
_DONE_PHASES = ("Succeeded", "Failed")  # a driver pod in these runs nothing any more


def driver_selector(app_name: str) -> str:
    return f"spark-role=driver,sparkoperator.k8s.io/app-name={app_name}"


def app_pods_selector(app_name: str) -> str:
    """The application's driver and executor pods (their `spark-role` label tells which)."""
    return f"sparkoperator.k8s.io/app-name={app_name}"


@dataclass(frozen=True)
class Executor:
    name: str
    uid: str
    phase: str                  # status.phase
    controlled: bool            # an ownerReference with controller: true (its driver pod)
    of_app: bool                # an ownerReference to this SparkApplication (by uid)
    deleting: bool              # deletionTimestamp set


def left_behind(executors: tuple[Executor, ...]) -> tuple[Executor, ...]:
    """The executor pods a replaced driver left: Spark makes its driver pod their controller, and
    the Spark Operator (v2.5.2) adds the SparkApplication as a second owner, not a controller
    (kubeflow/spark-operator#2961). When the driver pod is deleted, Kubernetes' garbage collector
    drops its reference but keeps the pod for the other owner: no driver uses it any more, and
    `kubectl drain` refuses a pod without a controller. Only a pod the SparkApplication owns (which
    the garbage collector deletes with it anyway: no pod a tenant merely labelled); finished or
    already deleting: left alone."""
    return tuple(e for e in executors
                 if e.of_app and not e.controlled and not e.deleting and e.phase not in _DONE_PHASES)


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


# ------------------------------------------------------------------ resubmitting a failed application

# An application FAILED once the Spark Operator's own retries are used up is submitted again by
# the operator (sparkstatus): at once the first time, then after these waits, as the kubelet backs
# off a crashing container, so that a cause that lasts does not start a driver a minute forever.
RESUBMIT_WAITS_S = (0, 30, 60, 120, 240, 300)  # before the n-th resubmission; the last repeats
STEADY_S = 600  # a submission RUNNING this long starts the count again


@dataclass(frozen=True)
class Resubmit:
    now: bool            # delete the application now; the next pass creates it again
    record: dict | None  # status.sparkResubmits: {count, last, spec}; None: none since a steady run
    wait_s: float = 0.0  # until the next resubmission is due (0 when `now`)


def _when(text) -> datetime | None:
    """An RFC 3339 time as written in status (a time without a zone is UTC); None if it is not one."""
    try:
        t = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return t.replace(tzinfo=timezone.utc) if t is not None and t.tzinfo is None else t


def resubmission(recorded, failed: bool, now: datetime, state: str, submitted: str | None,
                 spec: str) -> Resubmit:
    """Whether to resubmit now (failed: the verdict says the Spark Operator has given up), from
    status.sparkResubmits as recorded, the application's state and lastSubmissionAttemptTime, and
    the digest of its spec (LABEL_SPARK_SPEC): a changed spec starts the count again."""
    ok = isinstance(recorded, dict) and recorded.get("spec") == spec
    last = _when(recorded.get("last")) if ok else None
    count = recorded.get("count") if last is not None else 0
    if not isinstance(count, int) or count < 0:
        count, last = 0, None
    since = _when(submitted)
    if state == "RUNNING" and since is not None and (now - since).total_seconds() >= STEADY_S:
        count, last = 0, None
    record = {"count": count, "last": last.isoformat(), "spec": spec} if last is not None else None
    if not failed:
        return Resubmit(False, record)
    due = last.timestamp() + RESUBMIT_WAITS_S[min(count, len(RESUBMIT_WAITS_S) - 1)] if last else now.timestamp()
    if now.timestamp() >= due:
        return Resubmit(True, {"count": count + 1, "last": now.isoformat(), "spec": spec})
    return Resubmit(False, record, due - now.timestamp())


def resubmitted(record: dict) -> str:
    """The event of a resubmission."""
    n = record["count"]
    wait = RESUBMIT_WAITS_S[min(n, len(RESUBMIT_WAITS_S) - 1)]
    return (f"the Spark application failed after the Spark Operator's retries: submitted again "
            f"(resubmission {n} since it last ran {STEADY_S // 60} minutes); if it fails again, the next waits {wait}s")


def resubmit_later(condition: Condition, r: Resubmit) -> Condition:
    """ProcessingReady while a resubmission waits: the verdict's, and when it comes."""
    return Condition(condition.type, condition.status, condition.reason,
                     f"{condition.message}; it failed {r.record['count']} times since it last ran "
                     f"{STEADY_S // 60} minutes, so that waits {r.wait_s:.0f}s more (the wait doubles up to "
                     f"{RESUBMIT_WAITS_S[-1] // 60} minutes)")
