"""Bringing partition p's store to its committed offset after the producer fenced any older
owner: the I/O around the pure decision of dedup/recovery.py (docs/design.md#recovery).

Functions of the partition's context and its source reader that return the store to install;
the runner (dedup/partition.py) installs it and seeks its consumer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from logging import ERROR

from eopipe.core.wire import Recovery
from eopipe.dedup import recovery
from eopipe.dedup.context import PartitionContext
from eopipe.dedup.logs import event
from eopipe.dedup.partition_store import PartitionStore
from eopipe.dedup.replay import SourceReader

log = logging.getLogger("eopipe.dedup")


@dataclass(frozen=True)
class Restored:
    store: PartitionStore
    plan: recovery.Plan
    committed: int          # where p resumes (the consumer is seeked there)
    recovery: Recovery      # how it went, for /status


def rebuild(ctx: PartitionContext, p: int, source: SourceReader, end: int, lo: int,
            since_ms: int) -> tuple[PartitionStore, int]:
    """The store is missing, ahead of Kafka or stale: an empty one, filled from the source.
    Returns it and the records scanned."""
    ctx.store.drop(p)
    store = ctx.store.open(p)
    ctx.metrics.rebuilds.labels(str(p)).inc()
    return store, source.rebuild(store, end, lo, since_ms=since_ms, reshards=ctx.assignment().reshards,
                                 count=ctx.home_count())


def restore(ctx: PartitionContext, p: int, source: SourceReader, t0: float) -> Restored:
    """Plans p's recovery from the facts (committed offset, log start, the store's meta) and
    carries the plan out: reset, skip, replay or rebuild. `t0`: when the recovery began."""
    cfg = ctx.cfg
    committed = source.committed()
    lo, hi = source.watermarks(p)
    store = ctx.store.open(p)
    applied = store.applied_offset
    count = ctx.home_count()
    a = ctx.assignment()
    rs = a.reshard
    plan = recovery.plan(recovery.Facts(
        partition=p, committed=committed, log_start=lo, applied=applied,
        store_count=store.partition_count, store_reshard=store.reshard_id, home_count=count,
        reshard=recovery.Reshard(int(rs["id"]), int(rs["from"]), int(rs["to"])) if rs else None,
        now_ms=int(time.time() * 1000), window_ms=cfg.window_ms, segment_ms=cfg.segment_ms))
    replayed = 0
    if plan.action is recovery.RESET:
        ctx.store.drop(p)
        store = ctx.store.open(p)
    if plan.skip_below is not None:
        store.apply({}, plan.skip_below)
    if plan.action is recovery.REPLAY:
        replayed = source.replay(store, plan.replay_from, plan.resume_at, reshards=a.reshards, count=count)
    elif plan.action is recovery.REBUILD:
        store, replayed = rebuild(ctx, p, source, plan.resume_at, lo, plan.rebuild_since_ms)
    if plan.lost:
        event(log, ERROR, "records were deleted by retention before they were processed",
              partition=p, committed=plan.resume_at, log_start=lo)
    if plan.mark_complete:
        store.apply({}, None, partition_count=count)
    secs = time.monotonic() - t0
    lbl = str(p)
    m = ctx.metrics
    m.recovery_seconds.labels(lbl).set(secs)
    m.committed.labels(lbl).set(plan.resume_at)
    if replayed:
        m.replayed.labels(lbl).inc(replayed)
    return Restored(store, plan, plan.resume_at, Recovery(
        recovery=plan.action, applied_before=applied, replayed=replayed, recovery_seconds=round(secs, 3),
        high_watermark=hi))
