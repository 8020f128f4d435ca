"""The worker's Prometheus metrics (one CollectorRegistry per worker), its liveness beat and
its stall dump."""

from __future__ import annotations

import faulthandler
import sys
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from eopipe.core.names import COUNT_KINDS
from eopipe.core.wire import PartitionState


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.totals = Totals()
        lp = ["partition"]
        self.consumed = Counter("eopipe_dedup_consumed", "Source records consumed and committed", lp, registry=r)
        self.emitted = Counter("eopipe_dedup_emitted", "Records emitted to the deduped topic", lp, registry=r)
        self.duplicates = Counter("eopipe_dedup_duplicates", "Records dropped as duplicates", lp, registry=r)
        self.rerouted = Counter("eopipe_dedup_rerouted", "Records re-produced to their home partition", lp, registry=r)
        self.dead_lettered = Counter("eopipe_dedup_dead_lettered", "Malformed records sent to the DLQ", lp, registry=r)
        self.aborts = Counter("eopipe_dedup_aborted_transactions", "Transactions aborted and retried", lp, registry=r)
        self.replayed = Counter("eopipe_dedup_replayed", "Source records replayed into the state on recovery", lp, registry=r)
        self.rebuilds = Counter("eopipe_dedup_rebuilds", "Full state rebuilds from the source topic", lp, registry=r)
        self.commit_latency = Histogram(
            "eopipe_dedup_commit_seconds", "send_offsets_to_transaction + commit_transaction", lp,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30), registry=r)
        self.batch_records = Histogram("eopipe_dedup_transaction_records", "Source records per transaction", lp,
                                       buckets=(1, 10, 100, 1000, 5000, 10000, 20000, 50000), registry=r)
        self.lag = Gauge("eopipe_dedup_lag_records", "High watermark minus committed offset", lp, registry=r)
        self.committed = Gauge("eopipe_dedup_committed_offset", "Committed source offset", lp, registry=r)
        self.state_keys = Gauge("eopipe_dedup_state_keys", "Keys in the dedup state (estimate)", lp, registry=r)
        self.state_bytes = Gauge("eopipe_dedup_state_bytes", "Dedup state size (SST + memtables)", lp, registry=r)
        self.effective_window = Gauge("eopipe_dedup_effective_window_seconds",
                                      "Window over which duplicates are surely caught", lp, registry=r)
        self.recovery_seconds = Gauge("eopipe_dedup_recovery_seconds", "Duration of the last recovery", lp, registry=r)
        self.partition_state = Gauge("eopipe_dedup_partition_state", "1 for the partition's current state",
                                     ["partition", "state"], registry=r)
        self.window = Gauge("eopipe_dedup_window_seconds", "Configured dedup window", registry=r)
        self.generation = Gauge("eopipe_dedup_assignment_generation", "Assignment generation applied", registry=r)
        self.owned = Gauge("eopipe_dedup_partitions_owned", "Partitions in the current assignment", registry=r)
        self.source_partitions = Gauge("eopipe_dedup_source_partitions", "Source topic partition count", registry=r)
        self.memory = Gauge("eopipe_dedup_rocksdb_memory_bytes", "RocksDB shared memory", ["kind"], registry=r)


class PartitionMetrics:
    """Partition p's series, labelled once (the runner's thread updates them)."""

    def __init__(self, m: Metrics, partition: int):
        self.m = m
        lbl = self.lbl = str(partition)
        self.consumed = m.consumed.labels(lbl)
        self.emitted = m.emitted.labels(lbl)
        self.duplicates = m.duplicates.labels(lbl)
        self.rerouted = m.rerouted.labels(lbl)
        self.dead_lettered = m.dead_lettered.labels(lbl)
        self.aborts = m.aborts.labels(lbl)
        self.commit_latency = m.commit_latency.labels(lbl)
        self.batch_records = m.batch_records.labels(lbl)

    def state(self, state: PartitionState) -> None:
        for s in PartitionState:
            self.m.partition_state.labels(self.lbl, s.value).set(1 if s is state else 0)

    def committed(self, done) -> None:
        """A transaction committed (dedup/txn.Committed): its counts, latency and size."""
        c = done.counts
        self.commit_latency.observe(done.seconds)
        self.consumed.inc(c.consumed)
        self.emitted.inc(c.emitted)
        self.duplicates.inc(c.duplicates)
        self.rerouted.inc(c.rerouted)
        self.dead_lettered.inc(c.dead_lettered)
        self.m.totals.add(c.consumed, c.emitted, c.duplicates, c.dead_lettered)
        self.batch_records.observe(c.consumed)

    def progress(self, committed: int | None, lag: int | None, store_stats: dict) -> None:
        lbl, m = self.lbl, self.m
        if lag is not None:
            m.lag.labels(lbl).set(lag)
        m.committed.labels(lbl).set(committed or 0)
        m.state_keys.labels(lbl).set(store_stats["keys"])
        m.state_bytes.labels(lbl).set(store_stats["bytes"])
        m.effective_window.labels(lbl).set(store_stats["effective_window_seconds"])


class Totals:
    """What the pod's partitions committed since it started (the counters above, summed over
    partitions), for /status: the operator turns them into records per second."""

    KINDS = COUNT_KINDS  # the status' names: the operator sums what /status reports

    def __init__(self):
        self._lock = threading.Lock()  # partition threads add after each commit
        self._n = dict.fromkeys(self.KINDS, 0)

    def add(self, consumed: int, emitted: int, duplicates: int, dead_lettered: int) -> None:
        with self._lock:
            for k, v in zip(self.KINDS, (consumed, emitted, duplicates, dead_lettered)):
                self._n[k] += v

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._n)


class StallDump:
    """Every thread's stack on stderr once the control loop has not called arm() for `after`
    seconds. faulthandler's watchdog thread needs no GIL, so a call that holds it and never
    returns shows too. Re-armed at most every `after / 6` s: each arm starts a thread."""

    def __init__(self, after: float, file=None):
        self.after = after
        self.file = file
        self._armed = float("-inf")

    def arm(self) -> None:
        now = time.monotonic()
        if now - self._armed >= self.after / 6:
            faulthandler.dump_traceback_later(self.after, file=self.file or sys.stderr)
            self._armed = now

    def cancel(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        self._armed = float("-inf")


class Heartbeat:
    """The control loop beats; /healthz fails if it stopped beating."""

    def __init__(self, max_silence: float = 60.0):
        self.max_silence = max_silence
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self._last < self.max_silence
