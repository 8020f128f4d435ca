"""The SparkApplication's status -> the pipeline's ProcessingReady, whether the pipeline is
Failed, and whether the operator submits the application again. Pure: the reconcile pass reads
the application and its driver pods and acts on the verdict.

spark_app exits with status 2 for a configuration Spark cannot analyse (a schema that does not
parse, SQL over a missing column, a transform that cannot be loaded; spark_app/main.py) and
writes the reason to its termination log. The same spec fails the same way every time, so that
exit ends the pipeline in phase Failed (Stalled, reason SparkFailed) with Spark's own message,
as soon as it is seen, and the operator does not submit the application again until the spec
changes (a new spec is a new submission). The Kubeflow Spark Operator cannot tell that exit from
another; its own retries are bounded (builders/spark.py, onFailureRetries), after which the
application stays FAILED.

Where the message comes from: the Kubeflow operator's `errorMessage` says only "driver container
failed with ExitCode: <n>, Reason: <r>"; Spark's words are the driver pod's termination message
(its container status), read while the pod is there. The local stand-in (localenv/sparkrunner.py)
has no driver pod and appends them to `errorMessage`.

A changed query that Spark cannot run on the checkpoint's state (upgradeMode keepCheckpoint), and
a query with no checkpoint over a sink a stateful query wrote to (a lost checkpoint, or fromSink),
are such an exit too: the driver's words start with CHECKPOINT_REFUSED (spark_app/upgrade.py) and
name the upgradeMode that would run; Stalled with reason CheckpointIncompatible, with those words.

Such a stall holds until the spec changes, whatever the application does meanwhile: the Spark
Operator still runs its one retry of the same spec (restartPolicy), and that driver is RUNNING
until it fails the same way (a refused checkpoint: when records arrive, which may be never). So
the stall is recorded in status.sparkStall for the application (`stall_key`: its uid and the
digest of its spec that its pods carry, LABEL_SPARK_SPEC), and a pass that finds the record for
that application stays Stalled. Only a driver pod of this spec records a stall: after a change,
the application's status and the old driver pod still tell of the old spec's run for a moment
(the Spark Operator resets them when it sees the change), so those are judged as before but not
recorded, and the exits of pods of another spec are not this spec's at all. A new application
(deleted by hand, to run the same spec again once the cause is fixed outside the spec, e.g. a
restored checkpoint) or a changed spec is a new try.

Any other failure is worth retrying: while the Spark Operator retries (FAILING, PENDING_RERUN) the
stage is Degraded; once it has given up (FAILED), or the driver ended with status 0 (SIGTERM on
an eviction: a streaming query has no end of its own, and OnFailure does not restart a success),
the operator deletes the application and the next pass creates it again, resuming from the
checkpoint (sparkstage.plan waits until no driver of the old one runs).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Iterable

from eopipe.control.status import Condition
from eopipe.core.names import LABEL_SPARK_SPEC

CONFIG_EXIT = 2          # spark_app/main.py: bad configuration, including what Spark cannot analyse
DRIVER_CONTAINER = "spark-kubernetes-driver"  # Spark's name for the driver pod's container
_EXIT_CODE = re.compile(r"ExitCode: (-?\d+)")
# The Kubeflow operator's words before what the stand-in appends (the driver's own)
_OPERATOR_WORDS = re.compile(r"^driver container failed with ExitCode: -?\d+, Reason: [^:]*: (?=\S)")
_MAX_MESSAGE = 1500
CHECKPOINT_REFUSED = "checkpoint refused:"  # spark_app/upgrade.py starts its reason so
INCOMPATIBLE = "CheckpointIncompatible"
STARTING = "SparkStarting"
# A driver whose /progress has not answered this long after its pod started is no longer
# "starting": it is reported in status.processing.error, and readiness stays with its state.
DRIVER_START_GRACE_S = 300


_SUBMITTED = ("SUBMITTED", "NEW", "PENDING_SUBMISSION", "INVALIDATING", "UNKNOWN")
# A container's waiting reasons on its way to running: nothing to tell.
_STARTING_REASONS = ("ContainerCreating", "PodInitializing")


@dataclass(frozen=True)
class DriverExit:
    """A terminated driver container (from a driver pod's status)."""
    exit_code: int
    message: str = ""
    spec: str = ""               # the pod's LABEL_SPARK_SPEC: the spec it ran


@dataclass(frozen=True)
class Verdict:
    state: str                   # status.applicationState.state (NEW when there is none)
    condition: Condition         # ProcessingReady
    stalled: Condition | None    # set: phase Failed until the spec changes
    resubmit: bool = False       # delete the application; the next pass creates it again
    recorded: bool = False       # `stalled` is this spec's own (status.sparkStall)


def _flat(text: str) -> str:
    """One line: the termination log and errorMessage may hold several."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())[:_MAX_MESSAGE]


def stall_key(uid: str, spec: str) -> str:
    """The SparkApplication a stall holds for: its uid and its spec's digest (LABEL_SPARK_SPEC)."""
    return hashlib.sha256(json.dumps([uid, spec]).encode()).hexdigest()[:16]


def stall_record(stalled: Condition | None, key: str) -> dict | None:
    """status.sparkStall: the stall and the application it holds for (None: no stall)."""
    return None if stalled is None else {"spec": key, "reason": stalled.reason, "message": stalled.message}


def kept_stall(recorded, key: str) -> Condition | None:
    """The recorded stall, when it was recorded for the application `key` (`stall_key`)."""
    if (isinstance(recorded, dict) and recorded.get("spec") == key
            and recorded.get("reason") in (INCOMPATIBLE, "SparkFailed")
            and isinstance(recorded.get("message"), str)):
        return Condition("Stalled", True, recorded["reason"], recorded["message"][:_MAX_MESSAGE])
    return None


def judge(app: dict | None, drivers: Iterable[DriverExit] = (), kept: Condition | None = None,
          spec: str | None = None, waiting: str | None = None) -> Verdict:
    """kept: this application's recorded stall (`kept_stall`); it holds whatever the application
    does. spec: the digest this spec's pods carry; the exits of other pods are left out.
    waiting: why this spec's driver pod waits (`driver_waiting`), said while it is submitted."""
    drivers = [d for d in drivers if spec is None or d.spec == spec]
    verdict = _judge(app, drivers)
    if waiting and verdict.state in _SUBMITTED:
        verdict = replace(verdict, condition=replace(
            verdict.condition, message=f"{verdict.condition.message}; the driver pod {waiting}"[:_MAX_MESSAGE]))
    if verdict.stalled is not None:
        own = spec is not None and any(d.exit_code == CONFIG_EXIT for d in drivers)
        return replace(verdict, recorded=own or kept is not None)
    if kept is None:
        return verdict
    return Verdict(verdict.state, Condition("ProcessingReady", False, "SparkFailed", kept.message), kept,
                   recorded=True)


def query_starting(driver_spec: str, spec: str, query_running: bool | None, driver_age_s: float,
                   error: str | None) -> Condition | None:
    """The application is RUNNING, but is this spec's query at work yet? SparkStarting while the
    driver of an earlier spec still runs (before the Spark Operator replaces it), while this
    spec's driver says its query has not started (query_running False), or while it has not
    answered (None) for less than DRIVER_START_GRACE_S since its pod started. None: no objection.
    driver_spec: the running driver pod's LABEL_SPARK_SPEC ("" when it has none)."""
    if driver_spec and driver_spec != spec:
        why = "the driver of the previous spec.processing still runs; the Spark Operator replaces it"
    elif query_running is False:
        why = "the Spark driver runs; its streaming query is starting"
    elif query_running is None and driver_age_s < DRIVER_START_GRACE_S:
        why = f"the Spark driver is starting (its progress: {error or 'no answer'})"
    else:
        return None
    return Condition("ProcessingReady", False, STARTING, why)


def _judge(app: dict | None, drivers: Iterable[DriverExit]) -> Verdict:
    app_state = ((app or {}).get("status") or {}).get("applicationState") or {}
    state, err = app_state.get("state") or "NEW", _flat(app_state.get("errorMessage") or "")
    if state == "RUNNING":
        return Verdict(state, Condition("ProcessingReady", True, "Running", "Spark application running"), None)
    if state in _SUBMITTED:
        return Verdict(state, Condition("ProcessingReady", False, "SparkStarting", f"Spark application {state}"), None)
    exits = [d for d in drivers if d.exit_code != 0] or list(drivers)
    spark_words = next((_flat(d.message) for d in exits if d.message.strip()), "")
    code = exits[0].exit_code if exits else None
    if code is None and (m := _EXIT_CODE.search(err)):
        code = int(m.group(1))
    detail = spark_words or _OPERATOR_WORDS.sub("", err) or f"Spark application {state}"
    if state in ("FAILING", "PENDING_RERUN", "FAILED") and code == CONFIG_EXIT and CHECKPOINT_REFUSED in detail:
        # The driver's reason names the upgradeMode that would run (spark_app/upgrade.py).
        msg = f"{detail}. It is not submitted again until spec.processing changes"
        return Verdict(state, Condition("ProcessingReady", False, "SparkFailed", msg),
                       Condition("Stalled", True, INCOMPATIBLE, msg))
    if state in ("FAILING", "PENDING_RERUN", "FAILED") and code == CONFIG_EXIT:
        msg = (f"Spark cannot run this spec.processing (driver exit status {CONFIG_EXIT}): {detail}. "
               "The same spec fails the same way, so it is not submitted again: fix the SQL, schema, "
               "watermark or transform")
        return Verdict(state, Condition("ProcessingReady", False, "SparkFailed", msg),
                       Condition("Stalled", True, "SparkFailed", msg))
    if state == "FAILED":
        return Verdict(state, Condition("ProcessingReady", False, "SparkFailed",
                                        f"{detail}; the Spark Operator's retries are used up, so the "
                                        "operator submits the application again (it resumes from its checkpoint)"),
                       None, resubmit=True)
    if state == "COMPLETED":
        return Verdict(state, Condition("ProcessingReady", False, "SparkStarting",
                                        "the Spark driver ended with status 0 (stopped from outside, e.g. "
                                        "evicted); the operator submits the application again"), None, resubmit=True)
    if state in ("FAILING", "PENDING_RERUN") and not (err or exits):
        return Verdict(state, Condition("ProcessingReady", False, "SparkStarting", f"Spark application {state}"), None)
    if state in ("FAILING", "PENDING_RERUN", "SUBMISSION_FAILED"):
        return Verdict(state, Condition("ProcessingReady", False, "SparkFailed",
                                        f"{detail}; the Spark Operator restarts it (restartPolicy)"), None)
    return Verdict(state, Condition("ProcessingReady", False, "SparkStarting", f"Spark application {state}"), None)


def driver_exits(pods) -> tuple[DriverExit, ...]:
    """The terminated driver containers of the application's driver pods (kubernetes V1Pod)."""
    out = []
    for pod in pods:
        for cs in (pod.status.container_statuses if pod.status else None) or ():
            if cs.name != DRIVER_CONTAINER:
                continue
            for st in (cs.state, cs.last_state):
                t = st.terminated if st is not None else None
                if t is not None:
                    spec = ((pod.metadata.labels if pod.metadata else None) or {}).get(LABEL_SPARK_SPEC, "")
                    out.append(DriverExit(int(t.exit_code), t.message or "", spec))
                    break
    return tuple(out)


def driver_waiting(pods, spec: str) -> str | None:
    """Why a Pending driver pod of this spec (LABEL_SPARK_SPEC) waits, in the scheduler's or
    the kubelet's words: not scheduled (a claim that does not bind, no node with room), or its
    container kept from starting (an image that cannot be pulled, a missing Secret). None: no
    such pod, or nothing said yet."""
    for pod in pods:
        st = pod.status
        labels = (pod.metadata.labels if pod.metadata else None) or {}
        if st is None or st.phase != "Pending" or labels.get(LABEL_SPARK_SPEC, "") != spec:
            continue
        for c in st.conditions or ():
            if c.type == "PodScheduled" and c.status == "False" and c.message:
                return f"is not scheduled: {_flat(c.message)}"
        for cs in st.container_statuses or ():
            w = cs.state.waiting if cs.name == DRIVER_CONTAINER and cs.state else None
            if w is not None and w.reason and w.reason not in _STARTING_REASONS:
                return f"waits: {w.reason}" + (f": {_flat(w.message)}" if w.message else "")
    return None
