"""spec.dedup.lagThreshold (eopipe.control.status.lag_alert): lag above the threshold for the
window makes the pipeline Degraded with reason LagGrowing; a dip below clears it."""

from __future__ import annotations

import pytest

from eopipe.control.status import FAILURE_REASONS, Condition, lag_alert, summarize

T0 = 50_000_000
W = 60_000  # the window


@pytest.mark.parametrize("since, lag, threshold, want_since, degraded", [
    (None, 5000, None, None, False),            # no threshold: never
    (T0 - 10 * W, 5000, None, None, False),     # a threshold removed clears a recorded one
    (None, 5000, 1000, T0, False),              # just went above: counting from now
    (T0 - W // 2, 5000, 1000, T0 - W // 2, False),
    (T0 - W, 5000, 1000, T0 - W, True),         # above for the whole window
    (T0 - 2 * W, 1001, 1000, T0 - 2 * W, True),
    (T0 - 2 * W, 1000, 1000, None, False),      # at the threshold is not above: cleared
    (T0 - 2 * W, 0, 1000, None, False),
    (T0 - 2 * W, None, 1000, T0 - 2 * W, True),  # no lag report: the verdict stands
    (None, None, 1000, None, False),
])
def test_lag_alert(since, lag, threshold, want_since, degraded):
    assert lag_alert(since, lag, T0, threshold, W) == (want_since, degraded)


def test_lag_growing_makes_the_pipeline_degraded():
    stages = [Condition("TopicsReady", True, "TopicsReconciled"),
              Condition("DedupReady", False, "LagGrowing", "lag 5000 > 1000 for 5m"),
              Condition("ProcessingReady", True, "Running")]
    conds, phase = summarize(stages)
    assert "LagGrowing" in FAILURE_REASONS
    assert phase == "Degraded" and conds[0].reason == "LagGrowing" and not conds[1].status
