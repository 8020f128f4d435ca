"""When the pass writes the SparkApplication (control/sparkwrites.py): once to create it, then not
again until the Spark Operator has recorded its submission, unless the wanted spec differs."""

import pytest

from eopipe.control.sparkwrites import write_now

WANT = {"metadata": {"name": "p-spark", "labels": {"app": "p"}},
        "spec": {"image": "img", "driver": {"memory": "1g", "env": [{"name": "A", "value": "1"}]}}}


def _live(state=None, **spec_changes):
    spec = {**WANT["spec"], "driver": {**WANT["spec"]["driver"], "cores": 1}, **spec_changes}  # webhook default
    live = {"metadata": {"name": "p-spark", "uid": "u", "labels": {"app": "p", "extra": "x"}}, "spec": spec}
    if state is not None:
        live["status"] = {"applicationState": {"state": state}}
    return live


@pytest.mark.parametrize(("live", "want", "write"), [
    (None, WANT, True),                                               # missing: the one create
    (_live(), WANT, False),                                           # not submitted yet, same spec: hold
    ({**_live(), "status": {}}, WANT, False),                        # status without a state yet: hold
    (_live(image="old"), WANT, True),                                 # the spec really changed
    (_live(driver={"memory": "1g", "env": []}), WANT, True),          # a list differs
    (_live(driver={"memory": "1g", "env": [{"name": "A", "value": "1"}, {"name": "B"}]}), WANT, True),
    ({**_live(), "metadata": {"name": "p-spark", "labels": {}}}, WANT, True),  # a label is missing
    ({**_live(), "status": {"applicationState": {"state": ""}}}, WANT, False),  # v2.5.2's NEW
    (_live("SUBMITTED"), WANT, True),                                 # submitted: applies as usual
    (_live("SUBMISSION_FAILED"), WANT, True),
    (_live("RUNNING", image="old"), WANT, True),
])
def test_write_now(live, want, write):
    assert write_now(live, want) is write
