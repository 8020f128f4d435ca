"""The operator's watch of SparkApplications and dedup StatefulSets (control/sparkwatch.py):
which events reconcile the owning pipeline, and how often a flapping driver may make it do so."""

from __future__ import annotations

import pytest

from eopipe.control.sparkwatch import MIN_GAP_SECONDS, Decision, Watch, decide, owner, ready_of, state_of

GAP = MIN_GAP_SECONDS
# seen (None: never), state now, deleted, last pass (None: never), now -> decision
CASES = [
    ("first sight (the listing at start, or just created): the resume/create pass covers it",
     None, "RUNNING", False, None, 100.0, Decision(False)),
    ("a status patch that keeps the state", "RUNNING", "RUNNING", False, None, 100.0, Decision(False)),
    ("the driver failed: at once", "RUNNING", "FAILED", False, None, 100.0, Decision(True, 0.0)),
    ("a state the application did not have (new -> submitted)", "", "SUBMITTED", False, None, 100.0,
     Decision(True, 0.0)),
    ("a change long after the last pass: at once", "RUNNING", "FAILING", False, 100.0 - 2 * GAP, 100.0,
     Decision(True, 0.0)),
    ("a change inside the gap: after its end, not dropped", "FAILING", "RUNNING", False, 99.0, 100.0,
     Decision(True, 99.0 + GAP - 100.0)),
    ("a change while a pass is due: none more (that pass reads the state then)", "FAILING", "RUNNING", False,
     102.0, 100.0, Decision(False)),
    ("deleted after being seen: the pass creates it again", "FAILED", "FAILED", True, None, 100.0,
     Decision(True, 0.0)),
    ("deleted, never seen: nothing", None, "", True, None, 100.0, Decision(False)),
]


@pytest.mark.parametrize("seen,state,deleted,last,now,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(seen, state, deleted, last, now, want):
    assert decide(seen, state, deleted, last, now) == want


REF = {"apiVersion": "eopipe.dev/v1beta1", "kind": "ExactlyOncePipeline", "name": "payments", "controller": True}
OWNERS = [
    ("the pipeline's controller reference", [REF], "payments"),
    ("no owner", [], None),
    ("a reference that is not the controller", [{**REF, "controller": False}], None),
    ("another kind's controller", [{**REF, "kind": "Deployment", "apiVersion": "apps/v1"}], None),
    ("another group's kind of that name", [{**REF, "apiVersion": "example.com/v1"}], None),
]


@pytest.mark.parametrize("refs,want", [c[1:] for c in OWNERS], ids=[c[0] for c in OWNERS])
def test_owner(refs, want):
    assert owner({"ownerReferences": refs}) == want


def test_state_of():
    assert state_of({"status": {"applicationState": {"state": "FAILED"}}}) == "FAILED"
    assert state_of({}) == state_of({"status": {}}) == ""


def test_ready_of():
    assert ready_of({"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}) == "1/2"
    assert ready_of({"spec": {"replicas": 2}, "status": {}}) == "0/2"  # the field is left out at 0


def test_a_statefulset_and_an_application_of_one_pipeline_keep_one_gap():
    """A dedup pod turning NotReady right after a driver change: one pipeline, so the second
    pass waits for the gap whichever child changed."""
    w, pipe = Watch(), ("ns", "p")
    sts, app = ("StatefulSet", "ns", "p-dedup"), ("SparkApplication", "ns", "p-spark")
    w.observe(sts, pipe, "2/2", False, 0.0)
    w.observe(app, pipe, "RUNNING", False, 0.0)
    assert w.observe(app, pipe, "FAILING", False, 10.0) == Decision(True, 0.0)
    assert w.observe(sts, pipe, "1/2", False, 11.0) == Decision(True, GAP - 1.0)
    assert not w.observe(sts, pipe, "1/2", False, 20.0).trigger  # unchanged


def test_a_flapping_driver_is_one_pass_per_gap():
    """Events every 0.5 s alternating RUNNING/FAILING for 20 s: passes are at least the gap apart."""
    w, app, pipe = Watch(), ("ns", "p-spark"), ("ns", "p")
    passes = []
    assert not w.observe(app, pipe, "", False, 0.0).trigger  # created: first sight
    for i in range(40):
        now = 1.0 + i * 0.5
        d = w.observe(app, pipe, "FAILING" if i % 2 else "RUNNING", False, now)
        if d.trigger:
            passes.append(now + d.delay)
    assert passes and all(b - a >= GAP for a, b in zip(passes, passes[1:])), passes
    assert len(passes) <= 20 / GAP + 1
    w.observe(app, pipe, "RUNNING", True, 30.0)
    assert app not in w.seen  # a deleted application is forgotten


def test_a_cordon_reconciles_every_pipeline_with_dedup_pods_once():
    """A node seen uncordoned, then cordoned: each pipeline with a dedup StatefulSet, in the gap
    of its own passes; the first sight of a node, a node's other changes, its uncordon and a
    deleted StatefulSet's pipeline: nothing."""
    w = Watch()
    w.observe(("StatefulSet", "a", "p-dedup"), ("a", "p"), "2/2", False, 0.0)
    w.observe(("StatefulSet", "b", "q-dedup"), ("b", "q"), "2/2", False, 0.0)
    w.observe(("StatefulSet", "c", "r-dedup"), ("c", "r"), "2/2", False, 0.0)
    w.observe(("StatefulSet", "c", "r-dedup"), ("c", "r"), "2/2", True, 0.0)  # r deleted
    assert w.observe(("StatefulSet", "a", "p-dedup"), ("a", "p"), "1/2", False, 10.0) == Decision(True, 0.0)
    assert w.cordon("n1", True, False, 10.0) == []  # first sight, already cordoned: the pass at start
    assert w.cordon("n2", False, False, 11.0) == []
    assert w.cordon("n2", False, False, 12.0) == []  # a status change of the node
    assert w.cordon("n2", True, False, 12.0) == [(("a", "p"), GAP - 2.0), (("b", "q"), 0.0)]
    assert w.cordon("n2", True, False, 13.0) == []  # still cordoned
    assert w.cordon("n2", False, False, 30.0) == []  # uncordoned
    assert w.cordon("n2", True, True, 31.0) == []  # deleted
    assert ("Node", "", "n2") not in w.seen
