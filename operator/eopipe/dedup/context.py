"""What a partition runner may use of its worker (dedup/partition.py), and nothing more.

The runner gets this instead of the Worker, so the partition thread cannot reach into the
control loop's state: the configuration, the process-wide store, the metrics, the worker's
current assignment as an immutable snapshot (the control loop replaces it whole, never edits
it) and the partition count of the home check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from eopipe.core.assignment import Assignment
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.faults import FaultHook
from eopipe.dedup.metrics import Heartbeat, Metrics
from eopipe.dedup.store import StateStore


@dataclass(frozen=True)
class PartitionContext:
    cfg: WorkerConfig
    store: StateStore
    metrics: Metrics
    heartbeat: Heartbeat
    fault: FaultHook
    # The assignment the worker follows now: one immutable snapshot per call (each phase of the
    # runner reads it once: take-over, recovery, re-shard, the migration record).
    assignment: Callable[[], Assignment]
    # The partition count of the home check, read per batch: the operator's published count,
    # else the source topic's current one (docs/design.md#the-exactly-once-protocol).
    home_count: Callable[[], int]
    # A fresh read of the published assignment (the fencing check of an old transaction).
    read_assignment: Callable[[], Assignment]
