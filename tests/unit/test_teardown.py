"""Which claims a deleted pipeline's teardown deletes (control/teardown.state_claims): the ones
its dedup StatefulSet made, whatever else carries its labels."""

import pytest

from eopipe.control.teardown import Found, state_claims


@pytest.mark.parametrize("names, deleted", [
    (["state-payments-dedup-0", "state-payments-dedup-1"], ["state-payments-dedup-0", "state-payments-dedup-1"]),
    # a scaled-down ordinal's claim (whenScaled: Retain) goes too
    (["state-payments-dedup-7"], ["state-payments-dedup-7"]),
    # another pipeline's set whose name starts the same, a hand-made claim, the Spark checkpoint
    (["state-payments-dedup-x-0", "state-payments-dedup", "payments-spark-checkpoint", "mine"], []),
    # not an ordinal the controller writes
    (["state-payments-dedup-01", "state-payments-dedup--1", "state-payments-dedup-1a", "state-payments-dedup-\u0661"],
     []),
    ([], []),
], ids=["its pods'", "scaled down", "not its set's", "not an ordinal", "none"])
def test_only_the_claims_its_set_made(names, deleted):
    found = [Found(n, f"uid-{n}") for n in names]
    assert [c.name for c in state_claims("payments", found)] == deleted
    assert all(c.uid == f"uid-{c.name}" for c in state_claims("payments", found))


def test_a_pipeline_name_is_matched_literally():
    # a name is a DNS label, but the pattern must not read it as a regular expression
    assert state_claims("a.b", [Found("state-aXb-dedup-0", "u")]) == []
