"""The dedup worker loop: DESIGN.md section 3, steps 1-5 and recovery.

Threads: one PartitionRunner per owned partition, each with its own read_committed consumer
(manually assigned to that one partition) and its own transactional producer, so the
partitions' transactions commit concurrently and a partition can be stopped, fenced,
recovered or handed off without touching the others. librdkafka does fetching, batching and
the network in its own threads (outside the GIL); the Python threads only classify, look up
and produce. The control thread (main) follows the assignment, refreshes the source
partition count, restarts failed partitions, serves HTTP and handles SIGTERM.

Per partition p, the loop is:
  consume a batch -> for each record: extract the key (malformed -> DLQ), check its home
  partition (not p -> reroute to it), look it up (multi-get + the open transaction's keys)
  and emit it if unseen -> every ~commit_interval or max_batch records:
  send_offsets_to_transaction + commit_transaction -> then the RocksDB WriteBatch (keys +
  applied_offset). Abortable error: abort, forget the transaction's keys, seek back to the
  committed offset. Fenced: stop p for good. Other fatal errors: the partition is restarted
  from recovery with a new producer (as a pod restart would).

Test-only fault hook, never set in production: EOPIPE_FAULT=crash_after_commit[:N] makes the
process os._exit(137) right after its N-th successful Kafka commit (default 1), before the
RocksDB write; `crash_after_commit:p=0.05` does so with that probability per commit.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import random
import signal
import threading
import time
from logging import ERROR, INFO, WARNING

from confluent_kafka import (TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient

from eopipe import partitioner as partitioners
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.http import STATES, Heartbeat, HttpServer, Metrics
from eopipe.dedup.logs import event
from eopipe.dedup.store import StateStore
from eopipe.keys import MalformedRecord, extract

log = logging.getLogger("eopipe.dedup")

FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
TXN_TIMEOUT_S = 60.0
API_TIMEOUT_S = 15.0
# librdkafka's send_offsets_to_transaction() can block past its timeout when the group
# coordinator went away (librdkafka issues #5456/#5511, seen here on a broker restart). So
# every transactional call runs on a helper thread under a watchdog; a call that outlives
# its timeout by this much wedges the partition, which is then restarted with a new
# producer (whose init_transactions fences the stuck one).
WATCHDOG_GRACE_S = 10.0
REPLAY_FLUSH_KEYS = 100_000

H_REASON = "eopipe.dlq.reason"
H_TOPIC = "eopipe.origin.topic"
H_PARTITION = "eopipe.origin.partition"
H_OFFSET = "eopipe.origin.offset"
H_REROUTED = "eopipe.rerouted.from"


# -- test-only fault hook ----------------------------------------------------------------------
class FaultHook:
    """EOPIPE_FAULT (tests only): crash_after_commit[:N | :p=PROB]."""

    def __init__(self, spec: str | None):
        self.kind = None
        self.nth = 1
        self.prob = None
        self._count = 0
        self._lock = threading.Lock()
        if not spec:
            return
        kind, _, arg = spec.partition(":")
        if kind != "crash_after_commit":
            raise ValueError(f"unknown EOPIPE_FAULT {spec!r}")
        self.kind = kind
        if arg.startswith("p="):
            self.prob = float(arg[2:])
        elif arg:
            self.nth = int(arg)

    def after_commit(self, partition: int) -> None:
        if self.kind is None:
            return
        with self._lock:
            self._count += 1
            hit = random.random() < self.prob if self.prob is not None else self._count >= self.nth
        if hit:
            event(log, ERROR, "fault injected: exiting between Kafka commit and RocksDB write",
                  fault=self.kind, partition=partition, commits=self._count)
            logging.shutdown()
            os._exit(137)


class Fenced(Exception):
    pass


class Abortable(Exception):
    pass


class Stopping(Exception):
    pass


class Wedged(RuntimeError):
    pass


class CallThread:
    """Runs calls one at a time on a daemon thread (a stuck call must not block exit)."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, fut = self._q.get()
            if fn is None:
                return
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def submit(self, fn) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((fn, fut))
        return fut

    def shutdown(self) -> None:
        self._q.put((None, None))


class SourceInfo:
    """The source topic's current partition count, refreshed by the control loop."""

    def __init__(self, admin: AdminClient, topic: str):
        self.admin = admin
        self.topic = topic
        self.partitions = 0

    def refresh(self, timeout: float = 10.0) -> int:
        md = self.admin.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if md is None or md.error is not None or not md.partitions:
            raise RuntimeError(f"source topic {self.topic!r} not available: {md.error if md else 'missing'}")
        n = len(md.partitions)
        if n != self.partitions:
            if self.partitions:
                event(log, WARNING, "source partition count changed", old=self.partitions, new=n)
            self.partitions = n
        return n


# -- one partition -----------------------------------------------------------------------------
class PartitionRunner(threading.Thread):
    def __init__(self, worker: "Worker", partition: int):
        super().__init__(name=f"partition-{partition}", daemon=True)
        self.w = worker
        self.cfg: WorkerConfig = worker.cfg
        self.p = partition
        self.state = "starting"
        self.error: str | None = None
        self.committed: int | None = None      # the group's committed offset == store's applied
        self.lag: int | None = None
        self.recovery: dict = {}
        self._halt = threading.Event()
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.store = None
        self._calls = None          # single-thread executor for transactional calls
        self._wedged = False
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
        self._set_state("starting")

    # -- lifecycle --------------------------------------------------------------------------
    def stop(self) -> None:
        self._halt.set()

    def _set_state(self, state: str) -> None:
        self.state = state
        for s in STATES:
            self.w.metrics.partition_state.labels(str(self.p), s).set(1 if s == state else 0)

    def run(self) -> None:
        try:
            self._open_clients()
            self._recover()
            self._publish_stats()
            self._set_state("running")
            event(log, INFO, "partition running", partition=self.p, committed=self.committed,
                  **self.recovery)
            self._loop()
            self._set_state("stopped")
            event(log, INFO, "partition stopped", partition=self.p, committed=self.committed)
        except Stopping:
            self._set_state("stopped")
        except Fenced as e:
            self.error = str(e)
            self._set_state("fenced")
            event(log, ERROR, "partition fenced: another owner took it; not producing for it any more",
                  partition=self.p, error=str(e))
        except Exception as e:  # noqa: BLE001 - the control loop restarts the partition
            self.error = f"{type(e).__name__}: {e}"
            self._set_state("failed")
            log.exception("partition failed", extra={"fields": {"partition": self.p}})
        finally:
            self._close_clients()

    def _client_base(self) -> dict:
        # librdkafka's own logs go through Python logging (JSON lines like ours).
        return {"bootstrap.servers": self.cfg.bootstrap, "logger": logging.getLogger("rdkafka"),
                **self.cfg.kafka_config}

    def _open_clients(self) -> None:
        txid = self.cfg.transactional_id(self.p)
        self.consumer = Consumer({
            **self._client_base(),
            "group.id": self.cfg.group_id,
            "client.id": f"{txid}.consumer",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "queued.max.messages.kbytes": 16384,
            "fetch.wait.max.ms": 100,
        })
        self.producer = Producer({
            **self._client_base(),
            "client.id": f"{txid}.producer",
            "transactional.id": txid,
            "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "delivery.report.only.error": True,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 262_144,
            "partitioner": partitioners.LIBRDKAFKA_NAMES.get(self.cfg.partitioner, "murmur2_random"),
        })

    def _close_clients(self) -> None:
        if self._calls is not None:
            self._calls.shutdown()
            self._calls = None
        if self._wedged:
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

    # -- transactional calls ------------------------------------------------------------------
    def _txn(self, what: str, fn, *, deadline: float | None = None):
        """Runs a transactional producer call, retrying retriable errors.

        Raises Fenced (stop the partition), Abortable (abort and go back) or re-raises."""
        delay = 0.1
        if self._calls is None:
            self._calls = CallThread(f"txn-{self.p}")
        while True:
            try:
                return self._calls.submit(fn).result(API_TIMEOUT_S + WATCHDOG_GRACE_S)
            except concurrent.futures.TimeoutError:
                self._wedged = True
                raise Wedged(f"{what} did not return within {API_TIMEOUT_S + WATCHDOG_GRACE_S:.0f}s; "
                             "restarting the partition with a new producer") from None
            except KafkaException as e:
                err = e.args[0]
                if err.fatal():
                    if err.code() in FENCED_CODES:
                        raise Fenced(f"{what}: {err}") from None
                    raise RuntimeError(f"fatal producer error in {what}: {err}") from None
                if err.txn_requires_abort():
                    raise Abortable(f"{what}: {err}") from None
                if err.retriable() and (deadline is None or time.monotonic() < deadline):
                    event(log, WARNING, "retrying transactional call", partition=self.p, call=what,
                          error=str(err))
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                raise Abortable(f"{what}: {err}") from None

    def _assign(self, offset: int) -> None:
        self.consumer.assign([TopicPartition(self.cfg.source_topic, self.p, offset)])

    # -- recovery -----------------------------------------------------------------------------
    def _recover(self) -> None:
        self._set_state("recovering")
        t0 = time.monotonic()
        # Fence any older owner of p (a zombie, a pod on a cut-off node): Kafka is the fence.
        self._txn("init_transactions", lambda: self.producer.init_transactions(API_TIMEOUT_S))
        tp = TopicPartition(self.cfg.source_topic, self.p)
        committed = self._retry("committed offset",
                                lambda: self.consumer.committed([tp], timeout=30)[0].offset)
        lo, hi = self._retry("watermarks", lambda: self.consumer.get_watermark_offsets(tp, timeout=30))
        store = self.store = self.w.store.open(self.p)
        applied = store.applied_offset
        action, replayed = "none", 0
        if committed < 0:
            # Nothing was ever committed for p: a new pipeline (or the group's offsets expired).
            start = lo
            if applied is not None and applied != lo:
                self.w.store.drop(self.p)
                store = self.store = self.w.store.open(self.p)
                action = "reset"
            store.apply({}, start)
            committed = start
        elif applied is None or applied > committed:
            action = "rebuild"
            replayed = self._rebuild(committed, lo)
        elif applied < committed:
            action = "replay"
            replayed = self._replay(applied, committed)
        if committed < lo:
            event(log, ERROR, "records were deleted by retention before they were processed",
                  partition=self.p, committed=committed, log_start=lo)
        self.committed = committed
        self._assign(committed)
        secs = time.monotonic() - t0
        self.w.metrics.recovery_seconds.labels(str(self.p)).set(secs)
        self.w.metrics.committed.labels(str(self.p)).set(committed)
        if replayed:
            self.w.metrics.replayed.labels(str(self.p)).inc(replayed)
        self.recovery = {"recovery": action, "applied_before": applied, "replayed": replayed,
                         "recovery_seconds": round(secs, 3), "high_watermark": hi}

    def _retry(self, what: str, fn, attempts: int = 30):
        for i in range(attempts):
            if self._halt.is_set():
                raise Stopping()
            try:
                return fn()
            except KafkaException as e:
                if i == attempts - 1:
                    raise
                event(log, WARNING, "retrying", partition=self.p, call=what, error=str(e.args[0]))
                time.sleep(1)

    def _rebuild(self, committed: int, lo: int) -> int:
        """The store is missing or ahead of Kafka: rebuild it over the window from the source."""
        self.w.store.drop(self.p)
        self.store = self.w.store.open(self.p)
        self.w.metrics.rebuilds.labels(str(self.p)).inc()
        since = int(time.time() * 1000) - self.cfg.window_ms - self.cfg.segment_ms
        off = self._retry("offsets_for_times", lambda: self.consumer.offsets_for_times(
            [TopicPartition(self.cfg.source_topic, self.p, since)], timeout=30)[0].offset)
        start = committed if off < 0 else min(max(off, lo), committed)
        # If retention already removed part of the window, say so: the effective window shrinks.
        partial = lo > 0 and start == lo
        event(log, WARNING, "rebuilding dedup state from the source topic", partition=self.p,
              start=start, end=committed, since_ms=since)
        return self._replay(start, committed, partial_coverage=partial)

    def _replay(self, start: int, end: int, partial_coverage: bool = False) -> int:
        """Inserts the keys of [start, end) whose home is p, producing nothing: every record
        below the committed offset was already emitted, dropped as a duplicate or rerouted."""
        store = self.store
        if start >= end:
            store.apply({}, end)
            return 0
        event(log, INFO, "replaying source into state", partition=self.p, start=start, end=end)
        self._assign(start)
        home = partitioners.get(self.cfg.partitioner)
        spec = self.cfg.key_spec
        entries: dict[bytes, int] = {}
        covered_since = None
        n = 0
        last = start - 1
        done = False
        idle_deadline = time.monotonic() + 120
        while not done:
            if self._halt.is_set():
                raise Stopping()
            msgs = self.consumer.consume(self.cfg.consume_batch, 0.5)
            if msgs:
                idle_deadline = time.monotonic() + 120
            elif time.monotonic() > idle_deadline:
                raise RuntimeError(f"replay of partition {self.p} stalled at offset {last + 1} < {end}")
            nparts = self.w.source.partitions
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True  # the end of the committed data: nothing more below `end`
                        break
                    raise KafkaException(err)
                off = m.offset()
                if off >= end:
                    done = True
                    break
                last = off
                n += 1
                ts_type, ts = m.timestamp()
                if covered_since is None and partial_coverage:
                    covered_since = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else int(time.time() * 1000)
                try:
                    k = extract(spec, m.key(), m.value(), m.headers())
                except MalformedRecord:
                    continue
                if home(k, nparts) != self.p:
                    continue
                entries[k] = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else 0
            if len(entries) >= REPLAY_FLUSH_KEYS:
                store.apply(entries, last + 1, covered_since_ms=covered_since)
                entries = {}
        store.apply(entries, end, covered_since_ms=covered_since)
        return n

    # -- steady state ---------------------------------------------------------------------------
    def _loop(self) -> None:
        cfg = self.cfg
        self._reset_txn()
        next_stats = 0.0
        consume = self.consumer.consume
        while not self._halt.is_set():
            now = time.monotonic()
            if self._txn_open:
                timeout = max(0.0, self._txn_deadline - now)
                want = min(cfg.consume_batch, cfg.max_batch - self._txn_records)
            else:
                timeout, want = 0.2, cfg.consume_batch
            msgs = consume(want, timeout)
            if msgs:
                try:
                    self._process(msgs)
                except Abortable as e:
                    self._abort(str(e))
                    continue
            if self._txn_open and (self._txn_records >= cfg.max_batch
                                   or time.monotonic() >= self._txn_deadline):
                self._commit()
            if time.monotonic() >= next_stats:
                self._publish_stats()
                next_stats = time.monotonic() + 5
            self.w.heartbeat.beat()
        # Clean stop (SIGTERM, partition moved away): commit what is open, then close.
        self._set_state("stopping")
        if self._txn_open:
            self._commit(deadline=time.monotonic() + 30)
        self._publish_stats()

    def _reset_txn(self) -> None:
        self._txn_open = False
        self._txn_records = 0
        self._txn_deadline = 0.0
        self._pending: dict[bytes, int] = {}
        self._next_offset = self.committed
        self._counts = [0, 0, 0, 0, 0]  # consumed, emitted, duplicates, rerouted, dead-lettered

    def _begin(self) -> None:
        self._txn("begin_transaction", self.producer.begin_transaction)
        self._txn_open = True
        self._txn_deadline = time.monotonic() + self.cfg.commit_interval_ms / 1000

    def _process(self, msgs) -> None:
        cfg = self.cfg
        p = self.p
        src = cfg.source_topic
        spec = cfg.key_spec
        home = partitioners.get(cfg.partitioner)
        nparts = self.w.source.partitions
        produce = self.producer.produce
        pending = self._pending
        candidates = []
        rerouted = dead = n = 0
        last = None
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise KafkaException(err)
                event(log, WARNING, "consumer error", partition=p, error=str(err))
                continue
            if not self._txn_open:
                self._begin()
            last = m
            n += 1
            key, value, headers = m.key(), m.value(), m.headers()
            try:
                k = extract(spec, key, value, headers)
            except MalformedRecord as e:
                hdrs = list(headers or ())
                hdrs += [(H_REASON, str(e).encode()), (H_TOPIC, src.encode()),
                         (H_PARTITION, str(p).encode()), (H_OFFSET, str(m.offset()).encode())]
                self._produce(produce, cfg.dlq_topic, value, key, -1,
                              self._ts(m), hdrs)
                dead += 1
                continue
            h = home(k, nparts)
            if h != p:
                hdrs = list(headers or ())
                hdrs.append((H_REROUTED, f"{p}:{m.offset()}".encode()))
                self._produce(produce, src, value, key, h, self._ts(m), hdrs)
                rerouted += 1
                continue
            candidates.append((m, k))
        if last is None:
            return
        # Dedup: the open transaction's keys, then one batched multi-get per live segment.
        lookup = list({k for _, k in candidates if k not in pending})
        seen = self.store.contains(lookup) if lookup else ()
        out = cfg.output_topic
        emitted = dups = 0
        for m, k in candidates:
            if k in pending or k in seen:
                dups += 1
                continue
            ts_type, ts = m.timestamp()
            if ts_type == TIMESTAMP_NOT_AVAILABLE:
                ts = 0
            pending[k] = ts
            hdrs = m.headers()
            try:  # the hot path: inline; the helper handles a full queue and errors
                if hdrs:
                    produce(out, m.value(), m.key(), timestamp=ts, headers=hdrs)
                else:
                    produce(out, m.value(), m.key(), timestamp=ts)
            except (BufferError, KafkaException):
                self._produce(produce, out, m.value(), m.key(), -1, ts, hdrs)
            emitted += 1
        self.producer.poll(0)
        c = self._counts
        c[0] += n
        c[1] += emitted
        c[2] += dups
        c[3] += rerouted
        c[4] += dead
        self._txn_records += n
        self._next_offset = last.offset() + 1

    @staticmethod
    def _ts(m) -> int:
        ts_type, ts = m.timestamp()
        return ts if ts_type != TIMESTAMP_NOT_AVAILABLE else 0

    def _produce(self, produce, topic, value, key, partition, ts, headers) -> None:
        while True:
            try:
                if headers:
                    produce(topic, value, key, partition, timestamp=ts, headers=headers)
                else:
                    produce(topic, value, key, partition, timestamp=ts)
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as e:
                err = e.args[0]
                if err.fatal() and err.code() in FENCED_CODES:
                    raise Fenced(f"produce: {err}") from None
                if err.fatal():
                    raise
                raise Abortable(f"produce: {err}") from None

    def _commit(self, deadline: float | None = None) -> None:
        offsets = [TopicPartition(self.cfg.source_topic, self.p, self._next_offset)]
        t0 = time.monotonic()
        try:
            self._txn("send_offsets_to_transaction", lambda: self.producer.send_offsets_to_transaction(
                offsets, self.consumer.consumer_group_metadata(), API_TIMEOUT_S), deadline=deadline)
            self._txn("commit_transaction", lambda: self.producer.commit_transaction(API_TIMEOUT_S),
                      deadline=deadline)
        except Abortable as e:
            self._abort(str(e))
            return
        self.m_commit.observe(time.monotonic() - t0)
        self.w.fault.after_commit(self.p)
        # Only now is the batch's effect final: remember its keys, atomically with the offset.
        self.store.apply(self._pending, self._next_offset)
        self.committed = self._next_offset
        c = self._counts
        self.m_consumed.inc(c[0])
        self.m_emitted.inc(c[1])
        self.m_dups.inc(c[2])
        self.m_rerouted.inc(c[3])
        self.m_dlq.inc(c[4])
        self.m_batch.observe(self._txn_records)
        self._reset_txn()

    def _abort(self, why: str) -> None:
        event(log, WARNING, "aborting transaction; going back to the committed offset",
              partition=self.p, reason=why, committed=self.committed)
        self.m_aborts.inc()
        try:
            self._txn("abort_transaction", lambda: self.producer.abort_transaction(API_TIMEOUT_S))
        except Abortable as e:
            raise RuntimeError(f"abort failed: {e}") from None
        self._reset_txn()
        self._assign(self.committed)

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

    def status(self) -> dict:
        return {"state": self.state, "error": self.error, "committed": self.committed,
                "lag": self.lag, "recovery": self.recovery,
                "store": getattr(self, "stats", None)}


# -- the process -------------------------------------------------------------------------------
class Worker:
    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.metrics.window.set(cfg.window_seconds)
        self.heartbeat = Heartbeat()
        self.fault = FaultHook(os.environ.get("EOPIPE_FAULT"))
        self.store = StateStore(cfg.state_dir, window_ms=cfg.window_ms, segment_ms=cfg.segment_ms,
                                memory_bytes=cfg.memory_mb << 20)
        self._admin = AdminClient({"bootstrap.servers": cfg.bootstrap, "logger": logging.getLogger("rdkafka"),
                                   **cfg.kafka_config})
        self.source = SourceInfo(self._admin, cfg.source_topic)
        self.runners: dict[int, PartitionRunner] = {}
        self.generation: int | None = None
        self.owned: tuple[int, ...] = ()
        self._halt = threading.Event()
        self._restart_at: dict[int, float] = {}
        self.http: HttpServer | None = None

    # -- readiness / status ------------------------------------------------------------------
    def ready(self) -> bool:
        return (not self._halt.is_set() and self.generation is not None
                and all(p in self.runners and self.runners[p].state == "running" for p in self.owned))

    def status(self) -> dict:
        return {"pipeline": self.cfg.pipeline, "namespace": self.cfg.namespace,
                "generation": self.generation, "owned": list(self.owned),
                "source_partitions": self.source.partitions,
                "window_seconds": self.cfg.window_seconds, "ready": self.ready(),
                "partitions": {p: r.status() for p, r in sorted(self.runners.items())},
                "memory": self.store.memory()}

    def request_stop(self, *_args) -> None:
        self._halt.set()

    # -- control loop -----------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self.http = HttpServer(cfg.http_host, cfg.http_port, self.metrics, self.status, self.ready,
                               self.heartbeat.alive)
        self.http.start()
        event(log, INFO, "dedup worker starting", pipeline=cfg.pipeline, namespace=cfg.namespace,
              source=cfg.source_topic, output=cfg.output_topic, dlq=cfg.dlq_topic,
              key=str(cfg.key_spec), window_seconds=cfg.window_seconds,
              partitioner=cfg.partitioner, http=f"{cfg.http_host}:{self.http.port}",
              state_dir=str(cfg.state_dir), memory_mb=cfg.memory_mb, fault=self.fault.kind)
        while not self._halt.is_set():
            try:
                self.source.refresh()
                break
            except Exception as e:  # noqa: BLE001
                event(log, WARNING, "waiting for the source topic", error=str(e))
                self._halt.wait(2)
        next_meta = time.monotonic() + cfg.metadata_refresh_seconds
        while not self._halt.is_set():
            self.heartbeat.beat()
            self._follow_assignment()
            if time.monotonic() >= next_meta:
                try:
                    self.metrics.source_partitions.set(self.source.refresh())
                except Exception as e:  # noqa: BLE001
                    event(log, WARNING, "source metadata refresh failed", error=str(e))
                next_meta = time.monotonic() + cfg.metadata_refresh_seconds
            mem = self.store.memory()
            for kind in ("cache_usage_bytes", "write_buffer_usage_bytes", "budget_bytes"):
                self.metrics.memory.labels(kind).set(mem[kind])
            self._halt.wait(0.5)
        event(log, INFO, "stopping: committing open transactions")
        for r in self.runners.values():
            r.stop()
        for r in self.runners.values():
            r.join(60)
        self.store.close()
        self.http.stop()
        event(log, INFO, "dedup worker stopped",
              partitions={p: r.committed for p, r in self.runners.items()})
        return 0

    def _follow_assignment(self) -> None:
        try:
            generation, owned = self.cfg.current_assignment()
        except (OSError, ValueError) as e:
            if self.generation is None:
                event(log, WARNING, "assignment not readable yet", error=str(e))
            return
        if generation != self.generation or owned != self.owned:
            event(log, INFO, "assignment", generation=generation, partitions=list(owned),
                  previous=list(self.owned))
            self.generation, self.owned = generation, owned
            self.metrics.generation.set(generation)
            self.metrics.owned.set(len(owned))
        for p in [p for p in self.runners if p not in self.owned]:
            r = self.runners.pop(p)
            r.stop()
            r.join(60)
        for p in self.owned:
            r = self.runners.get(p)
            if r is None:
                self._start(p)
            elif r.state == "failed" and not r.is_alive():
                # Like a pod restart: back off, then recover with a fresh producer.
                at = self._restart_at.setdefault(p, time.monotonic() + 2)
                if time.monotonic() >= at:
                    self._restart_at.pop(p, None)
                    event(log, WARNING, "restarting failed partition", partition=p, error=r.error)
                    self._start(p)

    def _start(self, p: int) -> None:
        r = self.runners[p] = PartitionRunner(self, p)
        r.start()


def run(cfg: WorkerConfig) -> int:
    return Worker(cfg).run()
