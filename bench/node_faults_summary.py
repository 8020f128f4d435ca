"""The pure half of bench.node_faults: samples of the dedup group's committed offsets and the
source's ends in, the node-loss recovery time and the drain's longest pause out. No I/O:
tests/unit/test_bench_node_faults.py table-tests it.

A sample is (t, committed, ends): wall-clock seconds, and per source partition the group's
committed offset (-1 when none yet) and the source's high watermark, read together.
"""

from __future__ import annotations

from bench.common import percentile

Sample = tuple[float, list[int], list[int]]


def lag(sample: Sample) -> int:
    _, committed, ends = sample
    return sum(e - max(c, 0) for c, e in zip(committed, ends))


def recovered_after(samples: list[Sample], lost_at: float, steady_from: float) -> float | None:
    """Seconds from `lost_at` until the pipeline was back to full rate: every partition had
    committed what the source held at the loss, and the lag was back at or below the p95 of the
    steady lag (the samples from `steady_from` to the loss). None when that never happened."""
    steady = sorted(lag(s) for s in samples if steady_from <= s[0] < lost_at)
    before = [s for s in samples if s[0] <= lost_at]
    if not steady or not before:
        return None
    bound = max(percentile(steady, 0.95), 1)
    ends_at_loss = before[-1][2]
    for s in samples:
        if s[0] > lost_at and lag(s) <= bound and all(c >= e for c, e in zip(s[1], ends_at_loss)):
            return s[0] - lost_at
    return None


def longest_pause(samples: list[Sample], start: float, end: float) -> tuple[float, int | None]:
    """The longest time one partition's committed offset stood still while its source held
    records beyond it, counted within [start, end], and that partition: (seconds, partition)."""
    longest, which = 0.0, None
    moved_at: dict[int, float] = {}
    last: dict[int, int] = {}
    for t, committed, ends in samples:
        if t > end:
            break
        for p, (c, e) in enumerate(zip(committed, ends)):
            if c != last.get(p) or c >= e:
                moved_at[p] = t
            elif t >= start and t - max(moved_at[p], start) > longest:
                longest, which = t - max(moved_at[p], start), p
            last[p] = c
    return longest, which
