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

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from eopipe.core.wire import Migration, MigrationMethod, PartitionState, PartitionStatus, Recovery, RecoveryAction
from eopipe.dedup import clients, direct, incoming, recovery, restore
from eopipe.dedup.batch import Transaction
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.context import PartitionContext
from eopipe.dedup.logs import event
from eopipe.dedup.metrics import PartitionMetrics
from eopipe.dedup.partition_store import PartitionStore
from eopipe.dedup.recovery import window_start_ms
from eopipe.dedup.replay import SourceReader
from eopipe.dedup.txn import (API_TIMEOUT_S, Abortable, Fenced, ProducerFatal, Stalled, Stopping, TxnCalls, Wedged,
                               fencing_was_a_timeout)

log = logging.getLogger("eopipe.dedup")
NOT_DIRECT = "records through confluent-kafka's Python API, not directly"  # slower, as exact


class PartitionRunner(threading.Thread):
    def __init__(self, ctx: PartitionContext, partition: int):
        super().__init__(name=f"partition-{partition}", daemon=True)
        self.ctx = ctx
        self.cfg: WorkerConfig = ctx.cfg
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
        self.client_logs: tuple = ()           # the clients' ClientLogs (dedup/logs.py)
        self.source: SourceReader | None = None
        self.client_ids: tuple[str, str] = ("", "")  # the consumer's and the producer's client.id
        self.reader = self.writer = None       # direct.Reader and Writer: the loop's records through librdkafka
        self.store: PartitionStore | None = None
        self.txn: Transaction | None = None
        self.started_at_ms = int(time.time() * 1000)
        self.metrics = PartitionMetrics(ctx.metrics, partition)
        self.set_state(PartitionState.STARTING)

    # -- lifecycle --------------------------------------------------------------------------
    def stop(self) -> None:
        self.halt.set()

    def set_state(self, state: PartitionState) -> None:
        self.state = state
        self.metrics.state(state)

    def run(self) -> None:
        try:
            self.migration = incoming.take_over(self.cfg, self.ctx.store, self.ctx.assignment(), self.p, self.halt,
                                                fetching=lambda: self.set_state(PartitionState.FETCHING))
            self._open_clients()
            self._recover()
            self._reshard()
            self._publish_stats()
            if self.migration is not None:
                self.migration = incoming.record_migration(self.ctx.store, self.p, self.migration,
                                                           self.ctx.assignment().generation, self.started_at_ms)
            # Logged before /readyz can say so: whoever saw the pod ready finds the recovery
            # in the log (a test read it a millisecond too early).
            event(log, INFO, "partition running", partition=self.p, committed=self.committed,
                  **self.recovery.to_json())
            self.set_state(PartitionState.RUNNING)
            self._loop()
            self.set_state(PartitionState.STOPPED)
            event(log, INFO, "partition stopped", partition=self.p, committed=self.committed)
        except Stopping:  # told to stop while recovering: nothing committed since `committed`
            self.set_state(PartitionState.STOPPED)
            event(log, INFO, "partition stopped", partition=self.p, committed=self.committed, interrupted=True)
        except Fenced as e:
            self.error = str(e)
            self.set_state(PartitionState.FENCED)
            event(log, ERROR, "partition fenced: another owner took it; not producing for it any more",
                  partition=self.p, error=str(e))
        except ProducerFatal as e:  # known: the restart replaces the producer; no traceback
            self.error = str(e)
            self.set_state(PartitionState.FAILED)
            event(log, WARNING, f"producer fatal: {e.code}; replaced", partition=self.p, error=e.reason)
        except Exception as e:  # noqa: BLE001 - the control loop restarts the partition
            self.error = f"{type(e).__name__}: {e}"
            self.set_state(PartitionState.FAILED)
            log.exception("partition failed", extra={"fields": {"partition": self.p}})
        finally:
            self._close_clients()

    def _open_clients(self) -> None:
        ccfg, pcfg = clients.consumer_config(self.cfg, self.p), clients.producer_config(self.cfg, self.p)
        self.client_logs = (ccfg["logger"], pcfg["logger"])
        self.client_ids = (ccfg["client.id"], pcfg["client.id"])
        self.consumer = Consumer(ccfg)
        self.producer = Producer(pcfg)
        self.source = SourceReader(self.consumer, self.cfg, self.p, self.halt)

    def _close_clients(self) -> None:
        self._close_direct()
        self.calls.close()
        clients.close(self.producer, self.consumer, stuck=self.calls.wedged)
        self.producer = self.consumer = None
        self.ctx.store.close_partition(self.p)
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
        done = restore.restore(self.ctx, self.p, self.source, t0)
        self.store, self.plan, self.committed = done.store, done.plan, done.committed
        self.assign(self.committed)
        self.recovery = done.recovery

    def _reshard(self) -> None:
        """Installs what a re-shard gives p (dedup/incoming.reshard): its keys, or a rebuild."""
        imp = incoming.reshard(self.cfg, self.ctx.store, self.ctx.assignment(), self.p, self.store,
                               self.plan.action is RecoveryAction.REBUILD, self.halt,
                               importing=lambda: self.set_state(PartitionState.IMPORTING))
        if imp is None:
            return
        if imp.rebuild:
            lo, _ = self.source.watermarks(self.p)
            self.store, _ = restore.rebuild(self.ctx, self.p, self.source, self.committed, lo, window_start_ms(
                int(time.time() * 1000), self.cfg.window_ms, self.cfg.segment_ms))
        try:  # a batch at a time; the marker last, so a restart midway imports again (the same puts)
            for batch in imp.batches():
                self.store.apply(batch, None)
            self.store.apply((), None, partition_count=imp.to, reshard_id=imp.reshard)
        finally:
            imp.discard()
        if imp.rebuild:
            self.assign(self.committed)
        self.migration = imp.migration
        if imp.migration.method is MigrationMethod.RESHARD_IMPORT:
            event(log, INFO, "re-shard import done", partition=self.p, reshard=imp.reshard,
                  keys=imp.migration.keys, bytes=imp.migration.bytes)

    # -- steady state -------------------------------------------------------------------------
    def _new_txn(self) -> Transaction:
        self._open_direct()
        self.txn = Transaction(self.cfg, self.p, self.producer, self.consumer, self.store, self.calls,
                               self.ctx.home_count, self.ctx.fault.no_dedup, self.committed,
                               after_commit=self.ctx.fault.after_commit, writer=self.writer)
        return self.txn

    def _open_direct(self) -> None:
        """From the committed offset on, p's records straight from librdkafka (dedup/direct.pyx)
        where this process can, else through confluent-kafka's consume(), as recovery read them."""
        self._close_direct()
        w = direct.writer(self.producer, self.client_ids[1])
        r = direct.reader(self.consumer, self.client_ids[0], self.cfg.source_topic, self.p) if w else None
        if r is None:
            why = direct.unavailable() or "the clients are not confluent-kafka's as this build knows them"
            event(log, WARNING, NOT_DIRECT, partition=self.p, reason=why)
            return
        self.reader, self.writer = r, w
        # What the consumer's own queue already holds is outdated by a seek (not by assigning
        # again right away: that left the records there, and the reader saw none).
        clients.seek_when_fetching(self.consumer, TopicPartition(self.cfg.source_topic, self.p, self.committed),
                                   self.halt)

    def _close_direct(self) -> None:
        for d in (self.reader, self.writer):
            if d is not None:
                d.close()
        self.reader = self.writer = None

    def _read(self, t: Transaction):
        """The next records: a direct.Batch or a list of Messages; None or [] for none."""
        cfg, reader = self.cfg, self.reader
        if t.open:
            want, wait = min(cfg.consume_batch, cfg.max_batch - t.records), max(0.0, t.deadline - time.monotonic())
            return reader.read(want, wait) if reader is not None else self.consumer.consume(want, wait)
        # Idle: wake on the first record, not after a full batch or the timeout (a batch call
        # waits for both), then take what is already fetched. Waiting here added up to 200 ms to
        # every transaction at low rates.
        if reader is not None:
            return reader.read(cfg.consume_batch, 0.2, first_only=True)
        msgs = self.consumer.consume(1, 0.2)
        if msgs:
            msgs += self.consumer.consume(cfg.consume_batch - 1, 0)
        return msgs

    def _serve_consumer(self, t: Transaction) -> None:
        """With a Reader, the consumer's own queue holds only its logs and client-wide errors:
        served here (its logs go to Python logging), the errors to the transaction as before."""
        events = self.consumer.consume(100, 0)
        if any(m.error() is None for m in events):
            raise RuntimeError("a record reached the consumer's queue past the reader")  # the restart replays it
        if events:
            t.process(events)

    def _loop(self) -> None:
        cfg = self.cfg
        t = self._new_txn()
        next_stats = 0.0
        heartbeat = self.ctx.heartbeat.beat
        while not self.halt.is_set():
            t = self.txn  # replaced with the clients after a stall
            msgs = self._read(t)
            aborted = None
            try:
                if self.reader is not None:
                    self._serve_consumer(t)
                if msgs:
                    t.process(msgs)
            except Abortable as e:
                aborted = str(e)
            finally:  # a batch's records go back before an abort may replace (and close) the consumer
                if type(msgs) is direct.Batch:
                    msgs.free()
            if aborted is not None:
                self._abort(aborted)
                continue
            if t.open and (t.records >= cfg.max_batch or time.monotonic() >= t.deadline):
                self._commit()
            if time.monotonic() >= next_stats:
                self._publish_stats()
                next_stats = time.monotonic() + 5
            heartbeat()
        # Clean stop (SIGTERM, partition moved away): commit what is open, then close.
        self.set_state(PartitionState.STOPPING)
        t = self.txn
        if t.open:
            self._commit(deadline=time.monotonic() + 30)
        self._publish_stats()

    def _commit(self, deadline: float | None = None) -> None:
        t = self.txn
        try:
            done = t.commit(deadline)
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
        self.committed = done.offset
        self.metrics.committed(done)

    def _abort(self, why: str) -> None:
        event(log, WARNING, "aborting transaction; going back to the committed offset",
              partition=self.p, reason=why, committed=self.committed)
        self.metrics.aborts.inc()
        try:
            self.txn.abort()
        except (Abortable, Stalled) as e:
            self._replace_clients(f"abort failed: {e}", aborted=True)
            return
        except Fenced as e:
            if not self._timed_out_not_fenced(self.txn):
                raise
            self._replace_clients(f"{e} (after the transaction timeout)", aborted=True)
            return
        self.assign(self.committed)

    def _timed_out_not_fenced(self, t: Transaction) -> bool:
        """Replace the producer rather than stop p for good? (txn.fencing_was_a_timeout)"""
        age, cfg, a = time.monotonic() - t.began, self.cfg, None
        if age >= cfg.transaction_timeout_seconds and cfg.partitions is None:
            try:
                a = self.ctx.read_assignment()
            except Exception:  # noqa: BLE001 - unknown ownership: stay fenced
                pass
        return fencing_was_a_timeout(age, cfg.transaction_timeout_seconds, cfg.partitions is not None, a, cfg.me, self.p)

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
        self.metrics.aborts.inc()
        calls, producer, consumer = self.calls, self.producer, self.consumer
        if not calls.wedged and not aborted:
            try:  # best effort, briefly: the new producer's init_transactions aborts it anyway
                self.txn.abort(2.0)
            except (Abortable, Stalled, Fenced, RuntimeError) as e:
                event(log, INFO, "abort before replacing the producer failed", partition=self.p, error=str(e))
        calls.close()
        self._close_direct()
        clients.discard(producer, consumer, calls.stuck_call, self.client_logs)
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
        lag = None
        try:
            _, hi = self.consumer.get_watermark_offsets(
                TopicPartition(self.cfg.source_topic, self.p), cached=True)
            if hi is not None and hi >= 0 and self.committed is not None:
                lag = self.lag = max(0, hi - self.committed)
        except KafkaException:
            pass
        self.stats = self.store.stats()
        self.metrics.progress(self.committed, lag, self.stats)

    def status(self) -> PartitionStatus:
        return PartitionStatus(state=self.state, error=self.error, committed=self.committed, lag=self.lag,
                               recovery=self.recovery, migration=self.migration, store=self.stats)
