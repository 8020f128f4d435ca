"""Status derivation: summary conditions, phase, and stable lastTransitionTime."""

import pytest

from eopipe.control.status import (
    FAILURE_REASONS,
    Condition,
    dedup_lag,
    dedup_stats,
    effective_window_seconds,
    merge_conditions,
    open_transactions,
    summarize,
)
from eopipe.core.durations import format_duration
from eopipe.core.wire import PodStatus

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


def test_a_failed_stage_makes_the_pipeline_degraded_not_provisioning():
    stages = [OK[0], Condition("DedupReady", False, "PodsNotReady", "1/2 pods ready"),
              Condition("ProcessingReady", False, "SparkFailed", "driver OOMKilled")]
    conds, phase = summarize(stages)
    c = _by_type(conds)
    assert phase == "Degraded"
    assert (c["Ready"].status, c["Ready"].reason) == (False, "SparkFailed")
    assert "ProcessingReady: driver OOMKilled" in c["Ready"].message
    assert not c["Reconciling"].status and not c["Stalled"].status  # retried, but not progressing


@pytest.mark.parametrize("reason", sorted(FAILURE_REASONS))
def test_every_failure_reason_is_degraded(reason):
    _, phase = summarize([OK[0], Condition("DedupReady", False, reason, "x"), OK[2]])
    assert phase == "Degraded"


def test_effective_window_is_the_shortest_any_partition_covers():
    def pod(*spans):
        return PodStatus.from_json({"partitions": {
            str(i): {"state": "running", "store": {"keys": 1, "effective_window_seconds": s}}
            for i, s in enumerate(spans)}})
    assert effective_window_seconds([pod(86400.0, 3600.5), pod(86400.0)]) == 3600.5
    assert effective_window_seconds([pod(), PodStatus.from_json({"partitions": {"0": {"state": "starting"}}})]) is None
    assert format_duration(3600.5) == "1h" and format_duration(86400) == "24h"
    assert format_duration(5430) == "1h30m30s" and format_duration(0) == "0s"


@pytest.mark.parametrize("pods, lag", [
    ([], None),
    ([{"0": ("starting", None)}], None),                             # nothing running yet
    ([{"0": ("running", 5), "1": ("running", 7)}], 12),              # summed over partitions
    ([{"0": ("running", 5)}, {"1": ("running", 0)}], 5),             # over pods
    ([{"0": ("running", 5)}, {"0": ("running", 9)}], 9),             # a partition at two pods: the higher
    ([{"0": ("stopped", 50)}, {"0": ("running", 3)}], 3),            # a stopped old owner does not count
    ([{"0": ("running", None), "1": ("running", 4)}], 4),
])
def test_dedup_lag(pods, lag):
    docs = [PodStatus.from_json({"partitions": {p: {"state": s, "lag": n} for p, (s, n) in pod.items()}})
            for pod in pods]
    assert dedup_lag(docs) == lag


T = 60_000  # threshold, ms


@pytest.mark.parametrize("previous, offsets, now, record, hanging", [
    (None, {0: (10, 10)}, 0, {}, []),                                              # nothing open
    (None, {0: (7, 10)}, 1000, {"0": {"lastStableOffset": 7, "sinceMs": 1000}}, []),  # just seen
    ({"0": {"lastStableOffset": 7, "sinceMs": 1000}}, {0: (7, 10)}, 1000 + T + 1,
     {"0": {"lastStableOffset": 7, "sinceMs": 1000}}, [0]),                        # stuck too long
    ({"0": {"lastStableOffset": 7, "sinceMs": 1000}}, {0: (9, 12)}, 1000 + T + 1,
     {"0": {"lastStableOffset": 9, "sinceMs": 1000 + T + 1}}, []),                 # it moved: a new one
    ({"0": {"lastStableOffset": 7, "sinceMs": 1000}}, {0: (12, 12)}, 1000 + T + 1, {}, []),  # committed
    ({"1": {"lastStableOffset": 3, "sinceMs": 0}}, {0: (5, 5), 1: (3, 4)}, T + 1,
     {"1": {"lastStableOffset": 3, "sinceMs": 0}}, [1]),
])
def test_open_transactions(previous, offsets, now, record, hanging):
    assert open_transactions(previous, offsets, now, T) == (record, hanging)


def _pod(counts: dict, parts: dict | None = None) -> PodStatus:
    """parts: {partition: (state, keys, bytes)}"""
    return PodStatus.from_json({"counts": counts, "partitions": {
        str(p): {"state": st, "store": {"keys": k, "bytes": b}} for p, (st, k, b) in (parts or {}).items()}})


C0 = {"consumed": 100, "emitted": 80, "duplicates": 19, "deadLettered": 1}
C1 = {"consumed": 1100, "emitted": 880, "duplicates": 199, "deadLettered": 21}
RATE0 = {"consumed": 10.0, "emitted": 8.0, "duplicates": 1.9, "deadLettered": 0.1}


@pytest.mark.parametrize("pods, previous, now, expected", [
    # no pod reports: the last record stays (None)
    ({}, {"sampledAtMs": 0}, 10_000, None),
    # first sample: totals and state, no rates yet; a partition in handoff counted once (running)
    ({"a": _pod(C0, {0: ("running", 10, 100), 1: ("stopped", 7, 70)}), "b": _pod(C0, {1: ("running", 8, 80)})},
     None, 10_000, {"stateKeys": 18, "stateBytes": 180, "records": {k: 2 * v for k, v in C0.items()},
                    "sampledAtMs": 10_000, "perSecond": None}),
    # 10 s later: 1000 more consumed by a -> 100/s
    ({"a": _pod(C1)}, {"sampledAtMs": 0, "pods": {"a": C0}}, 10_000,
     {"perSecond": {"consumed": 100.0, "emitted": 80.0, "duplicates": 18.0, "deadLettered": 2.0}}),
    # a restarted (its counts went down): counted from zero
    ({"a": _pod(C0)}, {"sampledAtMs": 0, "pods": {"a": C1}}, 10_000, {"perSecond": RATE0}),
    # a new pod counts from zero; a pod gone is left out
    ({"b": _pod(C0)}, {"sampledAtMs": 0, "pods": {"a": C1}}, 10_000, {"records": C0, "perSecond": RATE0}),
    # under 5 s since the last sample: that sample stays the base, its rates stand
    ({"a": _pod(C1)}, {"sampledAtMs": 8_000, "pods": {"a": C0}, "perSecond": {"consumed": 7.0}}, 10_000,
     {"sampledAtMs": 8_000, "pods": {"a": C0}, "perSecond": {"consumed": 7.0}, "records": C1}),
])
def test_dedup_stats(pods, previous, now, expected):
    got = dedup_stats(pods, previous, now)
    if expected is None:
        assert got is None
    else:
        assert {k: got.get(k) for k in expected} == expected, got
