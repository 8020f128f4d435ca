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


def steady_bound(samples: list[Sample], lost_at: float, steady_from: float) -> float | None:
    """The lag the pipeline is held to after the loss: what it was before (the samples from
    `steady_from` to the loss), at or below its p95 then, or one second of the source's rate then
    if that is more (a p95 of a few quiet seconds is no bound to hold a pipeline to)."""
    steady = [s for s in samples if steady_from <= s[0] < lost_at]
    if not steady:
        return None
    span = steady[-1][0] - steady[0][0]
    rate = (sum(steady[-1][2]) - sum(steady[0][2])) / span if span > 0 else 0.0
    return max(percentile(sorted(lag(s) for s in steady), 0.95), rate, 1)


def recovered_after(samples: list[Sample], lost_at: float, steady_from: float) -> float | None:
    """Seconds from `lost_at` until the pipeline was back to full rate: every partition had
    committed what the source held at the loss, and the lag was within steady_bound. None when
    that never happened."""
    bound = steady_bound(samples, lost_at, steady_from)
    before = [s for s in samples if s[0] <= lost_at]
    if bound is None or not before:
        return None
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
