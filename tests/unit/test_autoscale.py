"""The autoscaler (eopipe.control.autoscale), pure: observed lag and throughput in, desired
replicas and the next status.autoscale out. Tables of the HPA math, the tolerance, the
stabilization windows, the step and the bounds, then a simulated run over a burst."""

from __future__ import annotations

import pytest

from eopipe.control.autoscale import (
    MIN_RATE_INTERVAL_MS,
    Observation,
    decide,
    end_offsets,
    observe,
    recommend,
    stabilize,
    throughput,
)
from eopipe.control.rebalance import Facts, PodFacts
from eopipe.core.spec import Autoscale
from eopipe.core.wire import PodStatus

T0 = 10_000_000


def cfg(**over) -> Autoscale:
    base = {"minReplicas": 1, "maxReplicas": 6, "targetLagPerReplica": 1000,
            "scaleUpStabilization": "0s", "scaleDownStabilization": "0s", "maxStep": 10}
    return Autoscale.model_validate({**base, **over})


@pytest.mark.parametrize("current, total, target, want", [
    (1, 5000, 1000, 5),     # 5x the target: 5 pods
    (2, 2100, 1000, 2),     # 5% over: within the tolerance, no change
    (2, 2200, 1000, 3),     # 10% over, just outside: ceil(2.2)
    (4, 3700, 1000, 4),     # 7.5% under: within the tolerance
    (4, 1000, 1000, 1),     # a quarter: 1 pod
    (3, 0, 1000, 0),        # caught up: as few as allowed (the caller clamps to minReplicas)
    (0, 1500, 1000, 2),     # nothing running yet: no tolerance band to stay in
    (2, None, 1000, None),  # unknown metric: no say
])
def test_recommend_is_the_hpa_formula_with_a_tolerance(current, total, target, want):
    assert recommend(current, total, target) == want


@pytest.mark.parametrize("current, history, up_s, down_s, want", [
    # Scale up to the lowest recommendation of the up window: a burst must last.
    (1, [(-20, 1), (-10, 4), (0, 5)], 15, 300, 4),
    (1, [(-20, 1), (-10, 4), (0, 5)], 30, 300, 1),
    (1, [(0, 5)], 0, 300, 5),
    # Scale down to the highest recommendation of the down window: a lull must last.
    (5, [(-200, 5), (-100, 2), (0, 1)], 0, 300, 5),
    (5, [(-200, 5), (-100, 2), (0, 1)], 0, 150, 2),
    (5, [(-400, 6), (0, 1)], 0, 300, 1),   # older than the window: forgotten
    # Neither: the current count.
    (3, [(-10, 5), (0, 1)], 30, 30, 3),
])
def test_stabilize_as_the_hpa_does(current, history, up_s, down_s, want):
    recs = [{"atMs": T0 + s * 1000, "replicas": r} for s, r in history]
    assert stabilize(current, recs, T0, up_s * 1000, down_s * 1000) == want


def obs(current=2, lag=None, rate=None, partitions=8, **kw) -> Observation:
    return Observation(now_ms=kw.pop("now_ms", T0), current=current, partitions=partitions, lag=lag, rate=rate, **kw)


@pytest.mark.parametrize("spec, o, previous, desired, reason", [
    # HPA math on the lag, clamped to the bounds.
    ({}, obs(2, lag=6000), {"desiredReplicas": 2}, 6, "LagAboveTarget"),
    ({}, obs(2, lag=60_000), {"desiredReplicas": 2}, 6, "LagAboveTarget"),            # maxReplicas
    ({}, obs(3, lag=0), {"desiredReplicas": 3}, 1, "BelowTarget"),                    # minReplicas
    ({"minReplicas": 2}, obs(3, lag=0), {"desiredReplicas": 3}, 2, "BelowTarget"),
    ({}, obs(2, lag=2150), {"desiredReplicas": 2}, 2, "WithinTarget"),                # tolerance
    ({}, obs(6, lag=60_000), {"desiredReplicas": 6}, 6, "AtMaxReplicas"),
    ({}, obs(1, lag=0), {"desiredReplicas": 1}, 1, "AtMinReplicas"),
    ({}, obs(1, lag=10), {"desiredReplicas": 1}, 1, "WithinTarget"),            # ceil: 1 pod is right
    # The step: at most maxStep pods per move, both ways.
    ({"maxStep": 2}, obs(1, lag=50_000), {"desiredReplicas": 1}, 3, "LagAboveTarget"),
    ({"maxStep": 1}, obs(6, lag=0), {"desiredReplicas": 6}, 5, "BelowTarget"),
    # The partition count caps maxReplicas (a pod owns whole partitions), and minReplicas with it.
    ({}, obs(2, lag=60_000, partitions=4), {"desiredReplicas": 2}, 4, "LagAboveTarget"),
    ({"minReplicas": 3}, obs(1, lag=0, partitions=2), {"desiredReplicas": 1}, 2, "BelowMinReplicas"),
    ({}, obs(5, lag=60_000, partitions=3), {"desiredReplicas": 5}, 3, "AboveMaxReplicas"),
    # Throughput: the larger recommendation wins.
    ({"targetRecordsPerSecondPerReplica": 500}, obs(2, lag=0, rate=2000.0), {"desiredReplicas": 2}, 4,
     "ThroughputAboveTarget"),
    ({"targetRecordsPerSecondPerReplica": 500}, obs(2, lag=5000, rate=600.0), {"desiredReplicas": 2}, 5,
     "LagAboveTarget"),
    ({"targetRecordsPerSecondPerReplica": 500}, obs(4, lag=None, rate=100.0), {"desiredReplicas": 4}, 1,
     "BelowTarget"),
    ({}, obs(2, lag=None, rate=5000.0), {"desiredReplicas": 2}, 2, "NoMetrics"),        # no rate target
    # Holding: while a rebalance runs, while paused, without metrics.
    ({}, obs(3, lag=50_000, rebalancing=True), {"desiredReplicas": 3}, 3, "Rebalancing"),
    ({}, obs(0, lag=None, paused=True), {"desiredReplicas": 4}, 4, "Paused"),
    ({}, obs(2), {"desiredReplicas": 2}, 2, "NoMetrics"),
    ({"maxReplicas": 3}, obs(2), {"desiredReplicas": 5}, 3, "NoMetrics"),          # bounds narrowed
    # A new pipeline starts at spec.dedup.replicas, within the bounds.
    ({}, obs(0, spec_replicas=4), None, 4, "NoMetrics"),
    ({"minReplicas": 2}, obs(0, spec_replicas=1), None, 2, "NoMetrics"),
    ({}, obs(0, spec_replicas=9, partitions=4), None, 4, "NoMetrics"),
])
def test_decide(spec, o, previous, desired, reason):
    d = decide(cfg(**spec), o, previous)
    assert (d.desired, d.reason) == (desired, reason), d.message
    assert d.record["desiredReplicas"] == desired and d.record["reason"] == reason


def test_a_change_is_an_event_and_a_scale_time_and_holding_is_neither():
    d = decide(cfg(), obs(2, lag=6000, now_ms=T0), {"desiredReplicas": 2, "lastScaleTime": "old"})
    assert d.changed and d.record["lastScaleTimeMs"] == T0 and d.record["lastScaleTime"] != "old"
    (ev,) = d.events
    assert ev[:2] == ("Normal", "Autoscaled") and ev[2].startswith("dedup replicas 2 -> 6 (LagAboveTarget): lag 6000")
    same = decide(cfg(), obs(6, lag=6000, now_ms=T0 + 5000), d.record)
    assert not same.changed and same.record["lastScaleTimeMs"] == T0
    # Enabled on a running pipeline: a change from what runs is a scaling too.
    assert decide(cfg(), obs(2, lag=0), None).events[0][2].startswith("dedup replicas 2 -> 1")
    # A new pipeline's first count is none.
    assert not decide(cfg(), obs(0, spec_replicas=3), None).changed


def test_the_message_says_why():
    d = decide(cfg(maxReplicas=8, maxStep=2), obs(1, lag=50_000, partitions=5), {"desiredReplicas": 1})
    assert d.message == ("lag 50000 records over 1 pod (target 1000 lag per pod): recommends 50, +2 per step -> 3; "
                         "maxReplicas 8 capped at the source's 5 partitions")


def test_history_is_kept_for_the_longer_window_only():
    c = cfg(scaleUpStabilization="30s", scaleDownStabilization="1m")
    prev = {"desiredReplicas": 2, "recommendations": [{"atMs": T0 - 61_000, "replicas": 9},
                                                      {"atMs": T0 - 59_000, "replicas": 4}, "junk"]}
    d = decide(c, obs(2, lag=2000), prev)
    assert d.record["recommendations"] == [{"atMs": T0 - 59_000, "replicas": 4}, {"atMs": T0, "replicas": 2}]


def _run(c, load, *, interval_s=15, start=1):
    """Decisions over a series of total lags, the decided count running by the next pass."""
    current, previous, counts = start, {"desiredReplicas": start}, []
    for i, lag in enumerate(load):
        d = decide(c, obs(current, lag=lag, now_ms=T0 + i * interval_s * 1000), previous)
        previous, current = d.record, d.desired
        counts.append(current)
    return counts


def test_a_burst_scales_up_after_the_up_window_and_down_after_the_down_window():
    c = cfg(maxReplicas=4, targetLagPerReplica=1000, scaleUpStabilization="30s", scaleDownStabilization="1m",
            maxStep=2)
    # A one-pass spike is ignored; a lasting burst scales up two at a time; the lull must last 1m.
    counts = _run(c, [0, 9000, 0, 0, 5000, 8000, 9000, 9000, 9000, 0, 0, 0, 0, 0, 0, 0])
    assert counts == [1, 1, 1, 1, 1, 1, 3, 4, 4, 4, 4, 4, 4, 2, 1, 1], counts


def test_flapping_around_the_target_does_not_move_pods():
    c = cfg(targetLagPerReplica=1000, scaleUpStabilization="30s", scaleDownStabilization="1m")
    assert set(_run(c, [2100, 1900, 2050, 1850, 2150, 1950] * 3, start=2)) == {2}


def _pod(partitions: dict[int, tuple[str, int | None, int | None]]) -> PodStatus:
    return PodStatus.from_json({"partitions": {p: {"state": s, "committed": c, "lag": n}
                                               for p, (s, c, n) in partitions.items()}})


def test_end_offsets_are_committed_plus_lag_of_running_partitions():
    pods = [_pod({0: ("running", 100, 5), 1: ("stopping", 50, 1), 2: ("running", None, 3)}),
            _pod({0: ("running", 90, 10), 1: ("fetching", 0, 0), 3: ("running", 7, 0)})]
    assert end_offsets(pods) == {0: 105, 3: 7}


@pytest.mark.parametrize("sample, ends, now, want_sample_at, rate", [
    (None, {0: 100}, T0, T0, None),                                                  # first sample
    ({"atMs": T0 - 10_000, "offsets": {"0": 100, "1": 0}}, {0: 600, 1: 500}, T0, T0, 100.0),
    ({"atMs": T0 - 10_000, "offsets": {"0": 100}}, {0: 600, 1: 9999}, T0, T0, 50.0),  # only both
    ({"atMs": T0 - 1_000, "offsets": {"0": 100}}, {0: 600}, T0, T0 - 1_000, 42.0),    # too close: last rate
    ({"atMs": T0 - 10_000, "offsets": {"0": 900}}, {0: 600}, T0, T0, None),            # went back: start over
    ({"atMs": T0 - 10_000, "offsets": {"0": 100}}, {}, T0, T0 - 10_000, None),        # nothing reported
    ({"atMs": "x"}, {0: 1}, T0, T0, None),                                            # unreadable
])
def test_throughput(sample, ends, now, want_sample_at, rate):
    kept, r = throughput(sample, ends, now, last_rate=42.0)
    assert kept["atMs"] == want_sample_at and r == rate
    assert MIN_RATE_INTERVAL_MS > 1_000


def test_observe_reads_the_rebalance_facts():
    pods = {f"p-dedup-{i}": PodFacts(f"p-dedup-{i}", "10.0.0.1", True,
                                     _pod({i: ("running", 1000 * (i + 1), 2500)})) for i in range(2)}
    facts = Facts(now_ms=T0, pod_prefix="p-dedup", replicas=2, partitions=4, actual_partitions=4,
                  sts_replicas=2, pods=pods)
    prev = {"desiredReplicas": 2, "sample": {"atMs": T0 - 10_000, "offsets": {"0": 2500, "1": 3500}}}
    d = observe(cfg(targetRecordsPerSecondPerReplica=100), facts, None, prev)
    # lag 5000 over 2 pods -> 5, capped at the 4 partitions; 200 records/s recorded.
    assert (d.desired, d.record["lag"], d.record["recordsPerSecond"]) == (4, 5000, 200.0)
    assert d.record["sample"] == {"atMs": T0, "offsets": {"0": 3500, "1": 4500}}
    assert observe(cfg(), facts, {"phase": "HandingOff"}, prev).reason == "Rebalancing"
