"""Status derivation: summary conditions, phase, and stable lastTransitionTime."""

from eopipe.status import Condition, merge_conditions, summarize

OK = [Condition("TopicsReady", True, "TopicsReconciled"), Condition("DedupReady", True, "PodsReady"),
      Condition("ProcessingReady", True, "Running")]


def _by_type(conds):
    return {c.type: c for c in conds}


def test_all_ready_is_running():
    conds, phase = summarize(OK)
    c = _by_type(conds)
    assert phase == "Running" and c["Ready"].status and not c["Reconciling"].status and not c["Stalled"].status


def test_a_stage_not_ready_is_provisioning_and_reconciling():
    stages = [OK[0], Condition("DedupReady", False, "PodsNotReady", "1/2 pods ready"), OK[2]]
    conds, phase = summarize(stages)
    c = _by_type(conds)
    assert phase == "Provisioning" and not c["Ready"].status and c["Ready"].reason == "PodsNotReady"
    assert c["Reconciling"].status and "1/2" in c["Ready"].message


def test_stalled_wins_and_is_not_reconciling():
    conds, phase = summarize(OK, stalled=Condition("Stalled", True, "NotSupported", "cannot shrink"))
    c = _by_type(conds)
    assert phase == "Failed" and c["Stalled"].status and not c["Reconciling"].status
    assert c["Ready"].reason == "NotSupported"


def test_paused():
    conds, phase = summarize(OK, paused=True)
    assert phase == "Paused" and not _by_type(conds)["Ready"].status


def test_last_transition_time_moves_only_on_flips():
    first = merge_conditions([], [Condition("Ready", False, "PodsNotReady")], 1, now="T1")
    same = merge_conditions(first, [Condition("Ready", False, "StillWaiting", "x")], 2, now="T2")
    flipped = merge_conditions(same, [Condition("Ready", True, "Running")], 2, now="T3")
    assert first[0]["lastTransitionTime"] == "T1"
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["reason"] == "StillWaiting"
    assert flipped[0]["lastTransitionTime"] == "T3" and flipped[0]["observedGeneration"] == 2
