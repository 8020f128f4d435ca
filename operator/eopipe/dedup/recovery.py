"""How a partition's dedup state is made right before it runs (docs/design.md#recovery): pure.

`plan(facts) -> Plan`. The facts: what Kafka says (the group's committed offset for p, the
log start) and what the store says (its applied offset, the partition count its keys are
complete for, the last re-shard it imported), the count of the home check now, the re-shard in
progress, the window. The plan: what to do to the store, where p resumes, and what to report.
The PartitionRunner reads the facts and carries out the plan's I/O (dedup/partition.py, its
scans in dedup/replay.py). A snapshot installed by a handoff runs before this and is simply the
store here; one that failed leaves no store.

Kafka's committed offset is the truth (docs/design.md#state-after-commit): the store's keys are
written only after the transaction that emitted them committed, so the store is either at the
committed offset, behind it (a crash between the two: replay the gap, producing nothing), or
wrong (ahead, missing, complete for another partition count: rebuild over the window).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from eopipe.core.assignment import ReshardEra
from eopipe.core.wire import RecoveryAction

NONE, RESET, REBUILD, REPLAY = RecoveryAction.NONE, RecoveryAction.RESET, RecoveryAction.REBUILD, RecoveryAction.REPLAY


class Reshard(NamedTuple):
    """The re-shard in progress (the assignment's reshard block)."""
    id: int
    old_count: int
    new_count: int


@dataclass(frozen=True)
class Facts:
    partition: int
    committed: int               # the group's committed offset for p; < 0: none (new, or expired)
    log_start: int               # p's first offset still in the log (retention moves it)
    applied: int | None          # the store's applied offset; None: no store (new, deleted, not fetched)
    store_count: int | None      # the partition count the store's keys are complete for
    store_reshard: int | None    # the last re-shard imported into the store
    home_count: int              # the partition count of the home check now
    reshard: Reshard | None      # the re-shard in progress, if any
    now_ms: int
    window_ms: int
    segment_ms: int
    # The store's coverage (dedup/partition_store.py): complete since this event time (None:
    # since it began), its watermark, and the window it was last kept for (None: not noted).
    store_covered_since: int | None = None
    store_watermark: int | None = None
    store_window: int | None = None


@dataclass(frozen=True)
class Plan:
    action: RecoveryAction
    resume_at: int                       # the committed offset p resumes from
    skip_below: int | None = None        # no commit yet: the store starts here, nothing below is read
    replay_from: int | None = None       # REPLAY: the keys of [replay_from, resume_at) go into the store
    rebuild_since_ms: int | None = None  # REBUILD: an empty store, filled from the records since then
    extend_since_ms: int | None = None   # a kept store, scanned from the records since then (a longer window)
    mark_complete: bool = True           # the keys are complete for home_count (else an import completes them)
    lost: int = 0                        # records retention deleted before they were processed

    @property
    def fresh_store(self) -> bool:
        return self.action in (RESET, REBUILD)


def plan(f: Facts) -> Plan:
    rs = f.reshard
    # A store complete for another partition count missed a re-shard, unless it is exactly the
    # state the running re-shard is about to export and import into.
    stale = (f.store_count is not None and f.store_count != f.home_count
             and not (rs and f.store_count == rs.old_count and f.store_reshard != rs.id))
    if f.committed < 0 and not stale:
        # Nothing was ever committed for p (a new pipeline, a new partition) or the group's
        # offsets expired: start at the log start. A store at another offset is from an earlier
        # life of the topic or the group: reset.
        action = RESET if f.applied is not None and f.applied != f.log_start else NONE
        p = Plan(action, f.log_start, skip_below=f.log_start)
    elif f.applied is None or f.applied > f.committed or stale:
        p = Plan(REBUILD, max(f.committed, f.log_start),
                 rebuild_since_ms=window_start_ms(f.now_ms, f.window_ms, f.segment_ms))
    elif f.applied < f.committed:
        p = Plan(REPLAY, f.committed, replay_from=f.applied)
    else:
        p = Plan(NONE, f.committed)
    # During a re-shard, p's keys become complete for the new count only by its import; a
    # rebuild reads them by the new count (and history) already.
    reshard_id = None if p.fresh_store else f.store_reshard
    importing = rs is not None and f.partition < rs.new_count and reshard_id != rs.id
    return replace(p, mark_complete=not importing or p.action == REBUILD,
                   lost=max(0, f.log_start - p.resume_at),
                   extend_since_ms=None if p.fresh_store else extend_since_ms(f))


def extend_since_ms(f: Facts) -> int | None:
    """Where a kept store is scanned from so that it covers a window longer than the one it
    was kept for (docs/design.md#window-changes), or None.

    A store kept for a shorter window expired the keys older than that window; the window now
    promises duplicates of records since `head - window` (head: its watermark, at most now).
    The scan covers them as a rebuild would, keeping the keys the store has; a store already
    complete that far back (it never expired anything, or did so under a longer window) needs
    none. A window that did not grow never scans: a store that a rebuild could fill only from
    the log start reports its shorter effective window instead of rescanning at each restart."""
    if f.store_window is not None and f.window_ms <= f.store_window:
        return None
    if f.store_covered_since is None:
        return None
    head = f.now_ms if f.store_watermark is None else min(f.now_ms, f.store_watermark)
    if f.store_covered_since <= head - f.window_ms:
        return None
    return window_start_ms(head, f.window_ms, f.segment_ms)


def window_start_ms(now_ms: int, window_ms: int, segment_ms: int) -> int:
    """Where a rebuild starts reading: a store keeps whole segments, so up to one segment more
    than the window."""
    return now_ms - window_ms - segment_ms


def reshard_bounds(reshards: tuple[ReshardEra, ...], partition: int) -> dict[int, int]:
    """The other partitions a rebuild of `partition` must scan, each up to its highest re-shard
    boundary: keys that now belong to `partition` were deduplicated there before a re-shard."""
    bounds: dict[int, int] = {}
    for r in reshards:
        for q, o in r.offsets.items():
            if q != partition:
                bounds[q] = max(bounds.get(q, 0), o)
    return bounds
