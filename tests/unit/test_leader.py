"""Leader election's decision (control/leader.py): facts in, plan out."""

import pytest

from eopipe.control.leader import Facts, Record, decide

NOW = "2026-01-01T00:00:00.000000Z"


def facts(lease=None, *, leading=False, unchanged_for=0.0, since_renewed=0.0, error=""):
    return Facts(me="op-a", lease=lease, unchanged_for=unchanged_for, leading=leading,
                 since_renewed=since_renewed, duration=15, renew_deadline=10, now=NOW, error=error)


def rec(holder, duration=15.0, transitions=3):
    return Record(holder=holder, duration=duration, transitions=transitions,
                  acquire_time="2025-12-31T00:00:00.000000Z", version="42")


CASES = [
    # (what, facts, action, transitions written)
    ("no Lease: create it", facts(None), "acquire", 0),
    ("held by another, fresh: wait", facts(rec("op-b"), unchanged_for=14.9), "wait", None),
    ("held by another, unchanged for its duration: take over", facts(rec("op-b"), unchanged_for=15), "acquire", 4),
    ("the record's own duration counts, not ours", facts(rec("op-b", duration=30), unchanged_for=20), "wait", None),
    ("a record without a duration: ours", facts(rec("op-b", duration=0), unchanged_for=15), "acquire", 4),
    ("released (empty holder): take at once", facts(rec(""), unchanged_for=0), "acquire", 4),
    ("held by my own previous process: take at once", facts(rec("op-a"), unchanged_for=0), "acquire", 3),
    ("follower whose read failed: wait", facts(None, error="reading: 503"), "wait", None),
    ("leader, renewed in time: renew", facts(rec("op-a"), leading=True, since_renewed=2), "renew", 3),
    ("leader, past the renew deadline: lost", facts(rec("op-a"), leading=True, since_renewed=10), "lost", None),
    ("leader whose read failed, within the deadline: wait",
     facts(None, leading=True, since_renewed=4, error="timeout"), "wait", None),
    ("leader whose reads fail past the deadline: lost",
     facts(None, leading=True, since_renewed=11, error="timeout"), "lost", None),
    ("leader, Lease now held by another: lost", facts(rec("op-b"), leading=True, since_renewed=2), "lost", None),
    ("leader, Lease released by someone: lost", facts(rec(""), leading=True, since_renewed=2), "lost", None),
    ("leader, Lease deleted: lost", facts(None, leading=True, since_renewed=2), "lost", None),
]


@pytest.mark.parametrize("what, f, action, transitions", CASES, ids=[c[0] for c in CASES])
def test_decide(what, f, action, transitions):
    plan = decide(f)
    assert plan.action == action, plan
    if action in ("acquire", "renew"):
        assert plan.spec["holderIdentity"] == "op-a" and plan.spec["renewTime"] == NOW
        assert plan.spec["leaseDurationSeconds"] == 15
        assert plan.spec["leaseTransitions"] == transitions
    else:
        assert plan.spec is None and plan.why


def test_renewing_keeps_the_acquire_time_and_taking_over_sets_it():
    assert decide(facts(rec("op-a"), leading=True)).spec["acquireTime"] == "2025-12-31T00:00:00.000000Z"
    assert decide(facts(rec("op-b"), unchanged_for=99)).spec["acquireTime"] == NOW
