"""One owned source partition p, on its own thread: take it over, recover, run, stop.

p has its own read_committed consumer (assigned by hand to p alone) and its own transactional
producer, so the partitions' transactions commit concurrently and p can be stopped, fenced,
recovered or handed off without touching the others. librdkafka fetches, batches and does the
network in its own threads (outside the GIL); this thread only classifies, looks up and
produces (dedup/batch.py).

The steady state (docs/design.md#the-exactly-once-protocol): every ~commit_interval or
max_batch records, send_offsets_to_transaction + commit_transaction, then the RocksDB
WriteBatch (keys + applied offset). Abortable error: abort, forget the transaction's keys,
seek back to the committed offset. Stalled commit (timed out, or past the watchdog): abort if
possible, replace producer and consumer, init_transactions (fencing the old producer) and
recover from the committed offset, on this thread, at once. Fenced: stop p for good. Other
errors: p fails, and the control loop restarts it from recovery with a new producer (as a pod
restart would).
"""

from __future__ import annotations

import logging
import threading
import time
from logging import ERROR, INFO, WARNING
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from eopipe.core.wire import Migration, PartitionState, PartitionStatus, Recovery
from eopipe.dedup import clients, handoff, recovery
from eopipe.dedup.batch import Transaction
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.logs import event
from eopipe.dedup.replay import SourceReader
from eopipe.dedup.txn import (
    API_TIMEOUT_S,
    Abortable,
    Fenced,
    Stalled,
    Stopping,
    TxnCalls,
    Wedged,
    fencing_was_a_timeout,
)

if TYPE_CHECKING:
    from eopipe.dedup.worker import Worker

log = logging.getLogger("eopipe.dedup")


class PartitionRunner(threading.Thread):
    def __init__(self, worker: Worker, partition: int):
        super().__init__(name=f"partition-{partition}", daemon=True)
        self.w = worker
        self.cfg: WorkerConfig = worker.cfg
        self.p = partition
        self.error: str | None = None
        self.committed: int | None = None      # the group's committed offset == store's applied
        self.lag: int | None = None
        self.plan: recovery.Plan | None = None
        self.recovery = Recovery()
        self.migration: Migration | None = None  # how p's state got here (handoff / re-shard)
        self.stats: dict | None = None
        self.halt = threading.Event()
        self.calls = TxnCalls(partition, self.halt)
        self.replaced = 0                      # producer + consumer replacements after a stall
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.source: SourceReader | None = None
        self.store = None
        self.txn: Transaction | None = None
        self.started_at_ms = int(time.time() * 1000)
        m = worker.metrics
        lbl = str(partition)
        self.m_consumed = m.consumed.labels(lbl)
        self.m_emitted = m.emitted.labels(lbl)
        self.m_dups = m.duplicates.labels(lbl)
        self.m_rerouted = m.rerouted.labels(lbl)
        self.m_dlq = m.dead_lettered.labels(lbl)
        self.m_aborts = m.aborts.labels(lbl)
        self.m_commit = m.commit_latency.labels(lbl)
        self.m_batch = m.batch_records.labels(lbl)
        self.set_state(PartitionState.STARTING)

    # -- lifecycle --------------------------------------------------------------------------
    def stop(self) -> None:
        self.halt.set()

    def set_state(self, state: PartitionState) -> None:
        self.state = state
        for s in PartitionState:
            self.w.metrics.partition_state.labels(str(self.p), s.value).set(1 if s is state else 0)

    def run(self) -> None:
        try:
            handoff.take_over(self)
            self._open_clients()
            self._recover()
            handoff.reshard(self)
            self._publish_stats()
            handoff.record_migration(self)
            # Logged before /readyz can say so: whoever saw the pod ready finds the recovery
            # in the log (a test read it a millisecond too early).
            event(log, INFO, "partition running", partition=self.p, committed=self.committed,
                  **self.recovery.to_json())
            self.set_state(PartitionState.RUNNING)
            self._loop()
            self.set_state(PartitionState.STOPPED)
            event(log, INFO, "partition stopped", partition=self.p, committed=self.committed)
        except Stopping:
            self.set_state(PartitionState.STOPPED)
        except Fenced as e:
            self.error = str(e)
            self.set_state(PartitionState.FENCED)
            event(log, ERROR, "partition fenced: another owner took it; not producing for it any more",
                  partition=self.p, error=str(e))
        except Exception as e:  # noqa: BLE001 - the control loop restarts the partition
            self.error = f"{type(e).__name__}: {e}"
            self.set_state(PartitionState.FAILED)
            log.exception("partition failed", extra={"fields": {"partition": self.p}})
        finally:
            self._close_clients()

    def _open_clients(self) -> None:
        self.consumer = Consumer(clients.consumer_config(self.cfg, self.p))
        self.producer = Producer(clients.producer_config(self.cfg, self.p))
        self.source = SourceReader(self.consumer, self.cfg, self.p, self.halt)

    def _close_clients(self) -> None:
        self.calls.close()
        if self.calls.wedged:
            # A call is stuck inside this producer: leave it to the fencing by its successor.
            self.producer = None
        if self.producer is not None:
            try:
                self.producer.flush(5)
            except Exception:  # noqa: BLE001
                pass
            self.producer = None
        if self.consumer is not None:
            try:
                self.consumer.close()
            except Exception:  # noqa: BLE001
                pass
            self.consumer = None
        self.w.store.close_partition(self.p)
        self.store = None

    def assign(self, offset: int) -> None:
        self.consumer.assign([TopicPartition(self.cfg.source_topic, self.p, offset)])

    # -- recovery (the decision: dedup/recovery.py) ------------------------------------------
    def _recover(self) -> None:
        self.set_state(PartitionState.RECOVERING)
        t0 = time.monotonic()
        # Fence any older owner of p (a zombie, a pod on a cut-off node): Kafka is the fence.
        clients.connect(self.producer, self.cfg.output_topic)
        self.calls("init_transactions", lambda: self.producer.init_transactions(API_TIMEOUT_S))
        committed = self.source.committed()
        lo, hi = self.source.watermarks(self.p)
        store = self.store = self.w.store.open(self.p)
        applied = store.applied_offset
        count = self.w.home_count()
        rs = self.w.assignment.reshard
        plan = self.plan = recovery.plan(recovery.Facts(
            partition=self.p, committed=committed, log_start=lo, applied=applied,
            store_count=store.partition_count, store_reshard=store.reshard_id, home_count=count,
            reshard=recovery.Reshard(int(rs["id"]), int(rs["from"]), int(rs["to"])) if rs else None,
            now_ms=int(time.time() * 1000), window_ms=self.cfg.window_ms, segment_ms=self.cfg.segment_ms))
        replayed = 0
        if plan.action is recovery.RESET:
            self._fresh_store()
        if plan.skip_below is not None:
            self.store.apply({}, plan.skip_below)
        if plan.action is recovery.REPLAY:
            replayed = self.source.replay(self.store, plan.replay_from, plan.resume_at,
                                          reshards=self.w.assignment.reshards, count=count)
        elif plan.action is recovery.REBUILD:
            replayed = self.rebuild(plan.resume_at, lo, plan.rebuild_since_ms)
        if plan.lost:
            event(log, ERROR, "records were deleted by retention before they were processed",
                  partition=self.p, committed=plan.resume_at, log_start=lo)
        if plan.mark_complete:
            self.store.apply({}, None, partition_count=count)
        self.committed = plan.resume_at
        self.assign(self.committed)
        secs = time.monotonic() - t0
        lbl = str(self.p)
        self.w.metrics.recovery_seconds.labels(lbl).set(secs)
        self.w.metrics.committed.labels(lbl).set(self.committed)
        if replayed:
            self.w.metrics.replayed.labels(lbl).inc(replayed)
        self.recovery = Recovery(recovery=plan.action, applied_before=applied, replayed=replayed,
                                 recovery_seconds=round(secs, 3), high_watermark=hi)

    def _fresh_store(self) -> None:
        self.w.store.drop(self.p)
        self.store = self.w.store.open(self.p)

    def rebuild(self, end: int, lo: int, since_ms: int) -> int:
        """The store is missing, ahead of Kafka or stale: an empty one, filled from the source."""
        self._fresh_store()
        self.w.metrics.rebuilds.labels(str(self.p)).inc()
        return self.source.rebuild(self.store, end, lo, since_ms=since_ms,
                                   reshards=self.w.assignment.reshards, count=self.w.home_count())

    # -- steady state -------------------------------------------------------------------------
    def _new_txn(self) -> Transaction:
        self.txn = Transaction(self.cfg, self.p, self.producer, self.store, self.calls, self.w.home_count,
                               self.w.fault.no_dedup, self.committed)
        return self.txn

    def _loop(self) -> None:
        cfg = self.cfg
        t = self._new_txn()
        next_stats = 0.0
        consume = self.consumer.consume
        while not self.halt.is_set():
            if self.txn is not t:  # the clients were replaced after a stall
                t, consume = self.txn, self.consumer.consume
            now = time.monotonic()
            if t.open:
                want = min(cfg.consume_batch, cfg.max_batch - t.records)
                msgs = consume(want, max(0.0, t.deadline - now))
            else:
                # Idle: wake on the first record, not after a full batch or the timeout (a
                # batch call waits for both), then take what is already fetched. Waiting here
                # added up to 200 ms to every transaction at low rates.
                msgs = consume(1, 0.2)
                if msgs:
                    msgs += consume(cfg.consume_batch - 1, 0)
            if msgs:
                try:
                    t.process(msgs)
                except Abortable as e:
                    self._abort(str(e))
                    continue
            if t.open and (t.records >= cfg.max_batch or time.monotonic() >= t.deadline):
                self._commit()
            if time.monotonic() >= next_stats:
                self._publish_stats()
                next_stats = time.monotonic() + 5
            self.w.heartbeat.beat()
        # Clean stop (SIGTERM, partition moved away): commit what is open, then close.
        self.set_state(PartitionState.STOPPING)
        t = self.txn
        if t.open:
            self._commit(deadline=time.monotonic() + 30)
        self._publish_stats()

    def _commit(self, deadline: float | None = None) -> None:
        t = self.txn
        offsets = [TopicPartition(self.cfg.source_topic, self.p, t.next_offset)]
        t0 = time.monotonic()
        # A commit never outlives the transaction timeout: by then the coordinator aborts the
        # transaction and bumps the epoch, so waiting longer cannot help; give up a second
        # before, replace the producer and let its init_transactions settle the transaction.
        stall_by = max(t0 + 1.0, t.began + self.cfg.transaction_timeout_seconds - 1.0)
        deadline = stall_by if deadline is None else min(deadline, stall_by)

        def left() -> float:
            return max(1.0, min(API_TIMEOUT_S, deadline - time.monotonic()))

        producer, consumer = self.producer, self.consumer
        try:
            self.calls("send_offsets_to_transaction", lambda: producer.send_offsets_to_transaction(
                offsets, consumer.consumer_group_metadata(), left()), deadline=deadline, timeout=left(),
                stall=True)
            self.calls("commit_transaction", lambda: producer.commit_transaction(left()),
                       deadline=deadline, timeout=left(), stall=True)
        except Abortable as e:
            self._abort(str(e))
            return
        except Stalled as e:
            self._replace_clients(str(e))
            return
        except Fenced as e:
            if not self._timed_out_not_fenced(t):
                raise
            self._replace_clients(f"{e} (after the transaction timeout)")
            return
        self.m_commit.observe(time.monotonic() - t0)
        self.w.fault.after_commit(self.p)
        # Only now is the batch's effect final: remember its keys, atomically with the offset.
        self.store.apply(t.pending, t.next_offset)
        self.committed = t.next_offset
        c = t.counts
        self.m_consumed.inc(c[0])
        self.m_emitted.inc(c[1])
        self.m_dups.inc(c[2])
        self.m_rerouted.inc(c[3])
        self.m_dlq.inc(c[4])
        self.w.metrics.totals.add(c[0], c[1], c[2], c[4])
        self.m_batch.observe(t.records)
        t.reset(self.committed)

    def _abort(self, why: str) -> None:
        event(log, WARNING, "aborting transaction; going back to the committed offset",
              partition=self.p, reason=why, committed=self.committed)
        self.m_aborts.inc()
        timeout = min(API_TIMEOUT_S, self.cfg.transaction_timeout_seconds)
        producer = self.producer
        try:
            self.calls("abort_transaction", lambda: producer.abort_transaction(timeout), timeout=timeout,
                       deadline=time.monotonic() + timeout, stall=True)
        except (Abortable, Stalled) as e:
            self._replace_clients(f"abort failed: {e}", aborted=True)
            return
        except Fenced as e:
            if not self._timed_out_not_fenced(self.txn):
                raise
            self._replace_clients(f"{e} (after the transaction timeout)", aborted=True)
            return
        self.txn.reset(self.committed)
        self.assign(self.committed)

    def _timed_out_not_fenced(self, t: Transaction) -> bool:
        """Replace the producer rather than stop p for good? (txn.fencing_was_a_timeout)"""
        age = time.monotonic() - t.began
        a = None
        if age >= self.cfg.transaction_timeout_seconds and self.cfg.partitions is None:
            try:
                a = self.w.assignments.read()
            except Exception:  # noqa: BLE001 - unknown ownership: stay fenced
                a = None
        return fencing_was_a_timeout(age, self.cfg.transaction_timeout_seconds, self.cfg.partitions is not None,
                                     a, self.cfg.me, self.p)

    def _replace_clients(self, why: str, aborted: bool = False) -> None:
        """A commit-path call timed out or hung: whether the transaction committed is unknown,
        and this producer may be stuck. Abort if it still answers, give up producer and consumer
        (closed in the background), open new ones with the same transactional.id: their
        init_transactions bumps the epoch, fences the old producer and completes or aborts its
        transaction; then recovery reads the committed offset (replaying into the store a
        commit that did go through) and p goes on from there, without the control loop."""
        event(log, WARNING, "transaction stalled; replacing producer and consumer and fencing the old producer",
              partition=self.p, reason=why, committed=self.committed, replaced=self.replaced + 1)
        self.replaced += 1
        self.m_aborts.inc()
        calls, producer, consumer = self.calls, self.producer, self.consumer
        if not calls.wedged and not aborted:
            try:  # best effort, briefly: the new producer's init_transactions aborts it anyway
                calls("abort_transaction", lambda: producer.abort_transaction(2.0), timeout=2.0,
                      deadline=time.monotonic() + 2, stall=True)
            except (Abortable, Stalled, Fenced, RuntimeError) as e:
                event(log, INFO, "abort before replacing the producer failed", partition=self.p, error=str(e))
        calls.close()
        clients.discard(producer, consumer, stuck=calls.wedged)
        self.calls = TxnCalls(self.p, self.halt)
        self.producer = self.consumer = None
        try:
            self._open_clients()
            self._recover()
        except Wedged as e:  # init_transactions hung too: the control loop's restart takes over
            raise RuntimeError(str(e)) from None
        event(log, INFO, "partition running", partition=self.p, committed=self.committed, replaced=self.replaced,
              **self.recovery.to_json())
        self.set_state(PartitionState.RUNNING)
        self._new_txn()

    # -- reporting ------------------------------------------------------------------------------
    def _publish_stats(self) -> None:
        lbl = str(self.p)
        m = self.w.metrics
        try:
            _, hi = self.consumer.get_watermark_offsets(
                TopicPartition(self.cfg.source_topic, self.p), cached=True)
            if hi is not None and hi >= 0 and self.committed is not None:
                self.lag = max(0, hi - self.committed)
                m.lag.labels(lbl).set(self.lag)
        except KafkaException:
            pass
        m.committed.labels(lbl).set(self.committed or 0)
        st = self.store.stats()
        m.state_keys.labels(lbl).set(st["keys"])
        m.state_bytes.labels(lbl).set(st["bytes"])
        m.effective_window.labels(lbl).set(st["effective_window_seconds"])
        self.stats = st

    def status(self) -> PartitionStatus:
        return PartitionStatus(state=self.state, error=self.error, committed=self.committed, lag=self.lag,
                               recovery=self.recovery, migration=self.migration, store=self.stats)
