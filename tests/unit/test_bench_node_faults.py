"""bench.node_faults_summary: samples of committed offsets and source ends in, the node-loss
recovery time and the drain's longest pause out."""

from __future__ import annotations

import pytest

from bench.node_faults import table
from bench.node_faults_summary import lag, longest_pause, recovered_after


def steady(t0: float, t1: float, step: float = 1.0, parts: int = 2, behind: int = 2) -> list:
    """Every partition committing `behind` records short of a source growing 10 per second."""
    out, t = [], t0
    while t < t1:
        end = int(t * 10)
        out.append((t, [end - behind] * parts, [end] * parts))
        t += step
    return out


@pytest.mark.parametrize("sample, expected", [
    ((0.0, [5, 7], [10, 10]), 8),
    ((0.0, [-1, 3], [4, 3]), 4),  # no commit yet counts from offset 0
    ((0.0, [], []), 0),
])
def test_lag(sample, expected):
    assert lag(sample) == expected


def stalled(t0, t1, frozen_at, part=0, parts=2):
    """Partition `part` stuck at its commit of `frozen_at` from t0 to t1; the others steady."""
    out = []
    for t, committed, ends in steady(t0, t1, parts=parts):
        committed = list(committed)
        committed[part] = int(frozen_at * 10) - 2
        out.append((t, committed, ends))
    return out


@pytest.mark.parametrize("name, samples, lost_at, expected", [
    ("back 20 s after the loss",
     steady(0, 10) + stalled(10, 25, 10) + steady(25, 40), 10.0, 15.0),
    # the lag is back only when the stuck partition has caught up, not at its first commit
    ("first commit is not recovery",
     steady(0, 10) + stalled(10, 20, 10) + stalled(20, 24, 15) + steady(24, 40), 10.0, 14.0),
    ("never back", steady(0, 10) + stalled(10, 40, 10), 10.0, None),
    ("no samples before the loss", steady(10, 20), 5.0, None),
    # a lag that was 0 all along: the bound is one second of the source's rate (20 records here)
    ("steady lag 0, back within a second's records",
     [(t, [t * 10] * 2, [t * 10] * 2) for t in range(10)] + stalled(10, 15, 10)
     + [(t, [t * 10] * 2, [t * 10 + 9] * 2) for t in range(15, 20)], 10.0, 5.0),
    ("steady lag 0, a second's records still behind",
     [(t, [t * 10] * 2, [t * 10] * 2) for t in range(10)] + stalled(10, 15, 10)
     + [(t, [t * 10] * 2, [t * 10 + 11] * 2) for t in range(15, 20)], 10.0, None),
    # a busy steady lag above a second's records: its p95 is the bound
    ("steady lag above the rate", steady(0, 10, behind=30) + stalled(10, 20, 10) + steady(20, 30, behind=30),
     10.0, 10.0),
])
def test_recovered_after(name, samples, lost_at, expected):
    assert recovered_after(samples, lost_at, steady_from=0.0) == expected, name


@pytest.mark.parametrize("name, samples, window, expected", [
    ("no pause", steady(0, 20), (5, 15), (0.0, None)),
    # its last still sample is 5 s after the commit it stands on
    ("partition 1 stands", steady(0, 8) + stalled(8, 14, 8, part=1) + steady(14, 20), (5, 15), (5.0, 1)),
    # counted from the window's start when the pause began before it
    ("pause began before the window", steady(0, 3) + stalled(3, 12, 3) + steady(12, 20), (5, 15), (6.0, 0)),
    ("after the window", steady(0, 16) + stalled(16, 20, 16), (5, 15), (0.0, None)),
    # a partition with nothing to commit is not paused
    ("idle source", [(t, [7, 7], [7, 7]) for t in range(20)], (0, 20), (0.0, None)),
])
def test_longest_pause(name, samples, window, expected):
    assert longest_pause(samples, *window) == expected, name


def test_table_prints_every_row_and_a_dash_for_none():
    text = table({"rate": 400, "sample_every_s": 0.24, "not_ready_s": 45.2, "moved_s": 57.1, "pods_ready_s": 70.0,
                  "threshold_s": 10,
                  "full_rate_s": None, "lag_bound": 362.5, "lag_at_end": 7, "drain_pause_s": 28.04, "drain_s": 24.0})
    assert "NotReady" in text and "45.2" in text and "28.0" in text and "57.1" in text
    assert [ln.split()[-3:] for ln in text.splitlines() if "to a live pod" in ln] == [["threshold", "10", "s"]]
    assert "400 records/s" in text and "a sample every 0.24 s" in text and "under 362 records (7 at the end)" in text
    assert [ln.split()[6:9] for ln in text.splitlines() if "full rate" in ln] == [["-", "goal", "60"]]
