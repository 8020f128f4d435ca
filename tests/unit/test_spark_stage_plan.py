"""What the reconcile pass does with the SparkApplication (control/sparkstage.py): deleted while
paused, created again on resume only once the old driver is gone, state mapped to ProcessingReady."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from eopipe.control import sparkstage
from eopipe.control.sparkstage import APPLY, DELETE, NONE, WAIT, Facts, driver_selector, plan, resubmission

LIVE = {"metadata": {"name": "p-spark"}, "status": {"applicationState": {"state": "RUNNING"}}}
DELETING = {"metadata": {"name": "p-spark", "deletionTimestamp": "2025-01-01T00:00:00Z"}}
CKPT = "/var/lib/eopipe/checkpoints/p on claim p-spark-checkpoint"


@pytest.mark.parametrize("paused, app, drivers, action, status, reason", [
    # paused: the running application is deleted (its driver stops), and stays away
    (True, LIVE, ("Running",), DELETE, True, "Paused"),
    (True, DELETING, ("Running",), NONE, True, "Paused"),     # deleted already: not again
    (True, None, ("Running",), NONE, True, "Paused"),         # its driver pod terminating
    (True, None, (), NONE, True, "Paused"),                   # stopped
    (True, None, ("Succeeded", "Failed"), NONE, True, "Paused"),
    # resumed: created again, but never beside a driver of the deleted one
    (False, None, (), APPLY, None, None),
    (False, DELETING, (), WAIT, False, "SparkStopping"),
    (False, None, ("Running",), WAIT, False, "SparkStopping"),
    (False, None, ("Pending",), WAIT, False, "SparkStopping"),
    (False, None, ("Succeeded", "Failed"), APPLY, None, None),  # finished pods run nothing
    # running: applied as always (its own driver is not a reason to wait)
    (False, LIVE, ("Running",), APPLY, None, None),
    (False, LIVE, (), APPLY, None, None),
])
def test_plan(paused, app, drivers, action, status, reason):
    p = plan(Facts(paused=paused, app=app, driver_phases=drivers, checkpoint=CKPT))
    assert p.action == action
    if status is None:
        assert p.condition is None  # read from the applied object instead
        return
    assert (p.condition.type, p.condition.status, p.condition.reason) == ("ProcessingReady", status, reason)
    if paused:
        assert CKPT in p.condition.message  # says where it resumes from


def test_paused_messages_say_what_happens():
    assert "deleted" in plan(Facts(True, LIVE, (), CKPT)).condition.message
    assert "stopping" in plan(Facts(True, DELETING, (), CKPT)).condition.message
    assert plan(Facts(True, None, (), CKPT)).condition.message.startswith("stopped while paused; resumes")
    assert "1 driver pod(s)" in plan(Facts(False, None, ("Running",), CKPT)).condition.message


def test_driver_selector_is_the_spark_operators_labels():
    assert driver_selector("p-spark") == "spark-role=driver,sparkoperator.k8s.io/app-name=p-spark"


T0 = datetime(2026, 12, 2, 15, 0, tzinfo=timezone.utc)


def _at(s: float) -> str:
    return (T0 + timedelta(seconds=s)).isoformat()


def _rec(count: int, last_s: float, spec: str = "s1") -> dict:
    return {"count": count, "last": _at(last_s), "spec": spec}


@pytest.mark.parametrize("recorded, failed, now_s, state, submitted_s, now, record, wait", [
    # the first resubmission at once; then each waits longer, up to five minutes
    (None, True, 0, "FAILED", -60, True, _rec(1, 0), 0),
    (_rec(1, 0), True, 10, "FAILED", 5, False, _rec(1, 0), 20),
    (_rec(1, 0), True, 30, "FAILED", 5, True, _rec(2, 30), 0),
    (_rec(2, 0), True, 59, "FAILED", 5, False, _rec(2, 0), 1),
    (_rec(5, 0), True, 200, "FAILED", 5, False, _rec(5, 0), 100),
    (_rec(40, 0), True, 300, "FAILED", 5, True, _rec(41, 300), 0),
    # not failed: the record kept while the new submission is young, cleared once it ran steady
    (_rec(3, 0), False, 100, "RUNNING", 20, False, _rec(3, 0), 0),
    (_rec(3, 0), False, 700, "RUNNING", 20, False, None, 0),
    (_rec(3, 0), False, 700, "SUBMITTED", 20, False, _rec(3, 0), 0),
    (_rec(3, 0), False, 700, "RUNNING", "2026-12-02T15:00:20", False, None, 0),  # no zone: UTC
    # failed long after the last: due, and counted on (a steady run is seen RUNNING by a resync)
    (_rec(3, 0), True, 700, "FAILED", 20, True, _rec(4, 700), 0),
    # a changed spec, or a record that is not one: counted from the start
    (_rec(4, 0, spec="s0"), True, 10, "FAILED", 5, True, _rec(1, 10), 0),
    ({"count": "x", "last": _at(0), "spec": "s1"}, True, 10, "FAILED", 5, True, _rec(1, 10), 0),
    ({"count": 2, "last": "yesterday", "spec": "s1"}, True, 10, "FAILED", 5, True, _rec(1, 10), 0),
    (None, False, 10, "FAILED", None, False, None, 0),
], ids=["first at once", "second waits 30s", "second due", "third waits 60s", "capped at 5 minutes",
        "capped and due", "young run keeps the count", "steady run clears it", "steady only when RUNNING", "a time without a zone",
        "failed long after the last", "changed spec", "count not a number", "time not a time", "nothing to do"])
def test_a_failed_application_is_resubmitted_after_a_growing_wait(recorded, failed, now_s, state, submitted_s,
                                                                   now, record, wait):
    submitted = submitted_s if submitted_s is None or isinstance(submitted_s, str) else _at(submitted_s)
    r = resubmission(recorded, failed, T0 + timedelta(seconds=now_s), state, submitted, "s1")
    assert (r.now, r.record, round(r.wait_s, 3)) == (now, record, wait)


# -- executor pods a replaced driver left (sparkstage.left_behind) ---------------------------------
def _executor(name, phase="Running", controlled=False, deleting=False, of_app=True):
    return sparkstage.Executor(name=name, uid=f"uid-{name}", phase=phase, controlled=controlled, of_app=of_app,
                               deleting=deleting)


@pytest.mark.parametrize("executors, removed", [
    ((), ()),
    ((_executor("live", controlled=True),), ()),                      # its driver pod is its controller
    ((_executor("orphan"),), ("orphan",)),                            # the driver's reference dropped by GC
    ((_executor("orphan", phase="Pending"),), ("orphan",)),
    ((_executor("done", phase="Succeeded"), _executor("failed", phase="Failed")), ()),  # runs nothing
    ((_executor("going", deleting=True),), ()),                       # already being deleted
    ((_executor("labelled", of_app=False),), ()),                     # a tenant's pod with the labels only
    ((_executor("live", controlled=True), _executor("old-1"), _executor("old-2")), ("old-1", "old-2")),
])
def test_executors_whose_driver_is_gone_are_removed(executors, removed):
    assert tuple(e.name for e in sparkstage.left_behind(executors)) == removed
