"""Bringing partition p's store to its committed offset after the producer fenced any older
owner: the I/O around the pure decision of dedup/recovery.py (docs/design.md#recovery).

Functions of the partition's context and its source reader that return the store to install;
the runner (dedup/partition.py) installs it and seeks its consumer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from logging import ERROR, WARNING

from eopipe.core.wire import Recovery
from eopipe.dedup import backup, recovery, snapshot
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
    # Complete since `since_ms`, unless the scan starts at the log start (it then notes that).
    store.note(covered_since_ms=since_ms, window_ms=ctx.cfg.window_ms)
    return store, source.rebuild(store, end, lo, since_ms=since_ms, reshards=ctx.assignment().reshards,
                                 count=ctx.home_count())


def extend(ctx: PartitionContext, p: int, store: PartitionStore, source: SourceReader, end: int, lo: int,
           since_ms: int) -> int:
    """A longer window than the store was kept for: the keys of the records since `since_ms`
    are scanned into the kept store (as a rebuild would, without dropping what it has).
    Returns the records scanned."""
    before = store.covered_since_ms
    event(log, WARNING, "the dedup window grew: scanning the source into the state to cover it",
          partition=p, covered_since_ms=before, since_ms=since_ms)
    store.note(covered_since_ms=since_ms)
    n = source.rebuild(store, end, lo, since_ms=since_ms, reshards=ctx.assignment().reshards,
                       count=ctx.home_count())
    # A scan from the log start covers less (the scan noted from when): the store is complete
    # since the older of that and what it was complete since before.
    store.note(covered_since_ms=min(before, store.covered_since_ms))
    return n


def restore(ctx: PartitionContext, p: int, source: SourceReader, t0: float) -> Restored:
    """Plans p's recovery from the facts (committed offset, log start, the store's meta) and
    carries the plan out: reset, skip, replay or rebuild. A store that is gone is first restored
    from the newest snapshot if backups are on and it is usable. `t0`: when the recovery began."""
    cfg = ctx.cfg
    committed = source.committed()
    lo, hi = source.watermarks(p)
    count = ctx.home_count()
    a = ctx.assignment()
    rs = a.reshard
    restored = None
    if cfg.backup_uri and not ctx.store.exists(p):
        # The volume was lost: the newest snapshot, if usable, is the store the plan replays
        # forward from its offset (docs/design.md#snapshots); else the plan rebuilds.
        restored = backup.restore_latest(cfg, ctx.store, ctx.metrics, snapshot.Facts(
            store_present=False, committed=committed, log_start=lo, source_topic=cfg.source_topic, group=cfg.group_id,
            home_count=count, reshard=rs is not None, now_ms=int(time.time() * 1000), window_ms=cfg.window_ms,
            segment_ms=cfg.segment_ms, snapshot=None), p)
    store = ctx.store.open(p)
    applied = store.applied_offset
    plan = recovery.plan(recovery.Facts(
        partition=p, committed=committed, log_start=lo, applied=applied,
        store_count=store.partition_count, store_reshard=store.reshard_id, home_count=count,
        reshard=recovery.Reshard(rs.id, rs.source, rs.target) if rs else None,
        now_ms=int(time.time() * 1000), window_ms=cfg.window_ms, segment_ms=cfg.segment_ms,
        store_covered_since=store.covered_since_ms, store_watermark=store.watermark_ms,
        store_window=store.kept_window_ms))
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
    if plan.extend_since_ms is not None:
        replayed += extend(ctx, p, store, source, plan.resume_at, lo, plan.extend_since_ms)
    # A shorter window takes effect at once: the segments it no longer needs are dropped now.
    store.expire()
    store.note(window_ms=cfg.window_ms)
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
    # Set only when it happened: the JSON keeps the keys a writer set (core/wire).
    from_snapshot = {"snapshot_offset": applied} if restored and restored.choice is snapshot.Choice.RESTORE else {}
    return Restored(store, plan, plan.resume_at, Recovery(
        recovery=plan.action, applied_before=applied, replayed=replayed, recovery_seconds=round(secs, 3),
        high_watermark=hi, **from_snapshot))
