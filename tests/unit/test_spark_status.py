"""The SparkApplication's status -> ProcessingReady, phase Failed, submit again (control/sparkstatus.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from eopipe.control.sparkstatus import (CONFIG_EXIT, DRIVER_START_GRACE_S, INCOMPATIBLE, DriverExit, driver_exits,
                                       driver_waiting, judge, kept_stall, query_starting, stall_key, stall_record)
from eopipe.control.status import summarize
from eopipe.core.names import LABEL_SPARK_SPEC

SPARK_SAYS = ("invalid spark_app config:\n  - sql: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or "
              "function parameter with name `nope` cannot be resolved. SQLSTATE: 42703")
KUBEFLOW_2 = "driver container failed with ExitCode: 2, Reason: Error"  # what the real operator writes
STAND_IN_2 = f"{KUBEFLOW_2}: {SPARK_SAYS}"                              # localenv/sparkrunner.py
KUBEFLOW_1 = "driver container failed with ExitCode: 1, Reason: Error"
OOM = "driver container failed with ExitCode: 137, Reason: OOMKilled"


def app(state, error=""):
    return {"status": {"applicationState": {"state": state, "errorMessage": error}}} if state else {}


# state, errorMessage, driver pods' exits -> ProcessingReady (status, reason), Failed, resubmit, in message
CASES = [
    ("RUNNING", "", (), True, "Running", False, False, "running"),
    (None, "", (), False, "SparkStarting", False, False, "NEW"),
    ("SUBMITTED", "", (), False, "SparkStarting", False, False, "SUBMITTED"),
    ("PENDING_RERUN", "", (), False, "SparkStarting", False, False, "PENDING_RERUN"),
    # a spec Spark cannot analyse: Failed at the first failed attempt, with Spark's words
    ("FAILING", STAND_IN_2, (), False, "SparkFailed", True, False, "UNRESOLVED_COLUMN"),
    ("PENDING_RERUN", STAND_IN_2, (), False, "SparkFailed", True, False, "UNRESOLVED_COLUMN"),
    ("FAILED", STAND_IN_2, (), False, "SparkFailed", True, False, "UNRESOLVED_COLUMN"),
    # on a cluster: the exit code from errorMessage, Spark's words from the driver pod
    ("FAILED", KUBEFLOW_2, (DriverExit(CONFIG_EXIT, SPARK_SAYS),), False, "SparkFailed", True, False,
     "cannot be resolved"),
    ("FAILING", "", (DriverExit(CONFIG_EXIT, SPARK_SAYS),), False, "SparkFailed", True, False, "SQLSTATE: 42703"),
    ("FAILED", KUBEFLOW_2, (), False, "SparkFailed", True, False, "ExitCode: 2"),  # pod gone: the exit code
    # the pod's exit code wins over a stale errorMessage
    ("FAILED", KUBEFLOW_2, (DriverExit(1, "query failed: broker down"),), False, "SparkFailed", False, True,
     "broker down"),
    # anything else is retried: by the Spark Operator while it can, then by the operator
    ("FAILING", KUBEFLOW_1, (), False, "SparkFailed", False, False, "restarts it"),
    ("PENDING_RERUN", OOM, (), False, "SparkFailed", False, False, "OOMKilled"),
    ("FAILED", OOM, (), False, "SparkFailed", False, True, "submits the application again"),
    ("FAILED", "", (), False, "SparkFailed", False, True, "FAILED"),
    ("SUBMISSION_FAILED", "no image", (), False, "SparkFailed", False, False, "no image"),
    # a streaming driver that ended with 0 was stopped from outside: OnFailure leaves it there
    ("COMPLETED", "", (DriverExit(0),), False, "SparkStarting", False, True, "status 0"),
]


@pytest.mark.parametrize("state, error, drivers, ready, reason, failed, resubmit, in_message", CASES)
def test_judge(state, error, drivers, ready, reason, failed, resubmit, in_message):
    v = judge(app(state, error), drivers)
    assert v.state == (state or "NEW")
    c = v.condition
    assert (c.type, c.status, c.reason) == ("ProcessingReady", ready, reason)
    assert in_message in c.message
    assert v.resubmit == resubmit
    assert (v.stalled is not None) == failed
    if failed:
        assert (v.stalled.type, v.stalled.status, v.stalled.reason) == ("Stalled", True, "SparkFailed")
        assert v.stalled.message == c.message and "not submitted again" in c.message


def test_a_config_failure_makes_the_pipeline_failed_with_sparks_message():
    v = judge(app("FAILED", STAND_IN_2))
    conditions, phase = summarize([v.condition], stalled=v.stalled)
    ready = conditions[0]
    assert phase == "Failed" and (ready.type, ready.status, ready.reason) == ("Ready", False, "SparkFailed")
    # one line, Spark's words kept, the exit code said once
    assert "\n" not in ready.message and "name `nope` cannot be resolved" in ready.message
    assert "ExitCode" not in ready.message and ready.message.count("exit status 2") == 1


def test_a_retried_failure_is_degraded_not_failed():
    v = judge(app("FAILING", KUBEFLOW_1))
    _, phase = summarize([v.condition], stalled=v.stalled)
    assert phase == "Degraded"


def test_long_messages_are_cut():
    v = judge(app("FAILED", "driver container failed with ExitCode: 2, Reason: Error: " + "x" * 10_000))
    assert len(v.condition.message) < 2000


def _pod(name, state=None, last=None, spec=None):
    return client.V1Pod(metadata=client.V1ObjectMeta(labels={LABEL_SPARK_SPEC: spec} if spec else None),
                        status=client.V1PodStatus(container_statuses=[client.V1ContainerStatus(
        name=name, image="i", image_id="", ready=False, restart_count=0, state=state, last_state=last)]))


def _terminated(code, message=None):
    return client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=code, message=message))


def test_driver_exits_from_pods():
    pods = [_pod("spark-kubernetes-driver", _terminated(2, SPARK_SAYS), spec="abc"),
            _pod("spark-kubernetes-driver", client.V1ContainerState(running=client.V1ContainerStateRunning()),
                 _terminated(137)),
            _pod("spark-kubernetes-driver", client.V1ContainerState(running=client.V1ContainerStateRunning())),
            _pod("istio-proxy", _terminated(1, "sidecar"))]
    assert driver_exits(pods) == (DriverExit(2, SPARK_SAYS, "abc"), DriverExit(137, ""))
    assert driver_exits([client.V1Pod(status=None)]) == ()


SPEC, OLD = "d1gest0f1tsspec0", "d1gest0fanother0"  # LABEL_SPARK_SPEC of this spec's pods, of an older one's
KEY = stall_key("uid-1", SPEC)
REFUSED = (DriverExit(CONFIG_EXIT, "checkpoint refused: the changed query's state does not fit; upgradeMode "
                                   "fromSink would run it", SPEC),)


# the first failed run's status and pods -> Stalled, recorded for this application
RECORDS = [
    ("FAILING", KUBEFLOW_2, REFUSED, True, True),
    ("PENDING_RERUN", "", REFUSED, True, True),
    # only the status says exit 2: it may still be the run before a change, so not recorded
    ("FAILED", KUBEFLOW_2, (), True, False),
    # the old spec's driver pod, still there after a change: not this spec's failure at all
    ("PENDING_RERUN", "", (DriverExit(CONFIG_EXIT, "checkpoint refused: ...", OLD),), False, False),
    ("RUNNING", "", (DriverExit(CONFIG_EXIT, "checkpoint refused: ...", OLD),), False, False),
]


@pytest.mark.parametrize("state, error, drivers, stalled, recorded", RECORDS)
def test_only_a_driver_pod_of_this_spec_records_a_stall(state, error, drivers, stalled, recorded):
    v = judge(app(state, error), drivers, None, SPEC)
    assert (v.stalled is not None, v.recorded) == (stalled, recorded)


# the application after a stall was recorded for it -> still Stalled, resubmitted?
KEPT = [
    ("PENDING_RERUN", "", ()),       # the Spark Operator's one retry of the same spec
    ("SUBMITTED", "", ()),
    ("RUNNING", "", ()),             # a refused checkpoint fails only once records arrive
    ("FAILED", OOM, ()),             # the retry died otherwise: the spec is still the stalled one
    ("FAILED", OOM, (DriverExit(137, "", SPEC),)),
]


@pytest.mark.parametrize("state, error, drivers", KEPT)
def test_a_recorded_stall_holds_while_the_spark_operator_retries_the_same_spec(state, error, drivers):
    first = judge(app("FAILING", KUBEFLOW_2), REFUSED, None, SPEC)
    assert first.stalled is not None and first.stalled.reason == INCOMPATIBLE and first.recorded
    v = judge(app(state, error), drivers, kept_stall(stall_record(first.stalled, KEY), KEY), SPEC)
    assert v.stalled == first.stalled and v.recorded and not v.resubmit
    assert (v.condition.status, v.condition.reason) == (False, "SparkFailed")
    assert "upgradeMode fromSink" in v.condition.message


@pytest.mark.parametrize("recorded", [
    None,
    {"spec": stall_key("uid-1", OLD), "reason": INCOMPATIBLE, "message": "m"},  # the spec changed: a new try
    {"spec": stall_key("uid-0", SPEC), "reason": INCOMPATIBLE, "message": "m"},  # a new application
    {"spec": KEY, "reason": "Ready", "message": "m"},                   # not a stall this writes
    {"spec": KEY, "reason": INCOMPATIBLE, "message": 7},
    ["not", "a", "record"],
])
def test_no_stall_is_kept_for_another_spec_or_a_malformed_record(recorded):
    assert kept_stall(recorded, KEY) is None
    v = judge(app("RUNNING"), (), kept_stall(recorded, KEY), SPEC)
    assert v.condition.status is True and not v.recorded


def test_the_record_is_the_stall_and_none_without_one():
    assert stall_record(None, KEY) is None
    c = judge(app("FAILED", STAND_IN_2)).stalled
    assert kept_stall(stall_record(c, KEY), KEY) == c
    assert stall_key("u", SPEC) != stall_key("u", OLD) and stall_key("u", SPEC) != stall_key("v", SPEC)


# The application RUNNING: (the running driver's spec label, its query running per /progress
# (None: no answer), the pod's age) -> SparkStarting's message, or None (ready as its state says)
STARTING = [
    ("a driver of the previous spec", OLD, True, 900, "previous spec.processing still runs"),
    ("this spec's driver, its query starting", SPEC, False, 30, "its streaming query is starting"),
    ("this spec's driver, not answering yet", SPEC, None, 30, "the Spark driver is starting"),
    ("this spec's driver silent past the grace", SPEC, None, DRIVER_START_GRACE_S + 1, None),
    ("this spec's query running", SPEC, True, 30, None),
    ("a pod without the label (an earlier operator's)", "", True, 30, None),
]


@pytest.mark.parametrize("case, label, running, age, says", STARTING, ids=[c[0] for c in STARTING])
def test_running_is_ready_once_this_specs_query_runs(case, label, running, age, says):
    c = query_starting(label, SPEC, running, age, "ConnectionRefusedError: refused")
    if says is None:
        assert c is None
    else:
        assert (c.type, c.status, c.reason) == ("ProcessingReady", False, "SparkStarting") and says in c.message


UNBOUND = ("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are "
           "available: 3 Preemption is not helpful for scheduling.")


def _pending(spec=SPEC, scheduled=None, waiting=None, phase="Pending"):
    conditions = [client.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                        message=scheduled)] if scheduled else None
    statuses = [client.V1ContainerStatus(name="spark-kubernetes-driver", image="i", image_id="", ready=False,
                                         restart_count=0, state=client.V1ContainerState(
                                             waiting=client.V1ContainerStateWaiting(reason=waiting[0],
                                                                                    message=waiting[1])))
                ] if waiting else None
    return client.V1Pod(metadata=client.V1ObjectMeta(labels={LABEL_SPARK_SPEC: spec}),
                        status=client.V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses))


@pytest.mark.parametrize("pods, says", [
    ([_pending(scheduled=UNBOUND)], "is not scheduled: 0/3 nodes are available: pod has unbound immediate"),
    ([_pending(waiting=("ImagePullBackOff", 'Back-off pulling image "r/eopipe-spark:9"'))],
     'waits: ImagePullBackOff: Back-off pulling image "r/eopipe-spark:9"'),
    ([_pending(waiting=("CreateContainerConfigError", 'secret "s3" not found'))],
     'waits: CreateContainerConfigError: secret "s3" not found'),
    ([_pending(waiting=("ContainerCreating", None))], None),           # on its way: nothing to tell
    ([_pending(OLD, scheduled=UNBOUND)], None),                        # another spec's pod
    ([_pending(scheduled=UNBOUND, phase="Running")], None),
    ([_pending(waiting=("ContainerCreating", None)), _pending(scheduled=UNBOUND)], "is not scheduled"),
    ([client.V1Pod(status=None)], None),
])
def test_why_a_driver_pod_waits(pods, says):
    got = driver_waiting(pods, SPEC)
    assert (got is None) if says is None else (got is not None and got.startswith(says)), got


def test_a_waiting_driver_is_said_while_submitted_only():
    submitted = {"status": {"applicationState": {"state": "SUBMITTED"}}}
    v = judge(submitted, (), None, SPEC, "is not scheduled: 0/3 nodes are available")
    assert (v.condition.reason, v.condition.message) == (
        "SparkStarting", "Spark application SUBMITTED; the driver pod is not scheduled: 0/3 nodes are available")
    running = {"status": {"applicationState": {"state": "RUNNING"}}}
    assert judge(running, (), None, SPEC, "waits: x").condition.message == "Spark application running"
