"""What the reconcile pass does with the SparkApplication (control/sparkstage.py): deleted while
paused, created again on resume only once the old driver is gone, state mapped to ProcessingReady."""

from __future__ import annotations

import pytest

from eopipe.control.sparkstage import APPLY, DELETE, NONE, WAIT, Facts, driver_selector, plan

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
