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
EOPIPE_FAULT=no_dedup breaks the dedup step on purpose (every record counts as new): the demo
and its verdict test use it to show that verification catches a broken pipeline.
"""

from __future__ import annotations

import concurrent.futures
import json
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
from eopipe.assignment import Assignment, era_count
from eopipe.dedup import migrate
from eopipe.dedup.assignment_source import AssignmentSource
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
    """EOPIPE_FAULT (tests only): crash_after_commit[:N | :p=PROB] | no_dedup."""

    def __init__(self, spec: str | None):
        self.kind = None
        self.nth = 1
        self.prob = None
        self._count = 0
        self._lock = threading.Lock()
        if not spec:
            return
        kind, _, arg = spec.partition(":")
        if kind not in ("crash_after_commit", "no_dedup"):
            raise ValueError(f"unknown EOPIPE_FAULT {spec!r}")
        self.kind = kind
        if arg.startswith("p="):
            self.prob = float(arg[2:])
        elif arg:
            self.nth = int(arg)

    @property
    def no_dedup(self) -> bool:
        return self.kind == "no_dedup"

    def after_commit(self, partition: int) -> None:
        if self.kind != "crash_after_commit":
            return
        with self._lock:
            self._count += 1
            hit = random.random() < self.prob if self.prob is not None else self._count >= self.nth
        if hit:
            event(log, ERROR, "fault injected: exiting between Kafka commit and RocksDB write",
                  fault=self.kind, partition=partition, commits=self._count)
            logging.shutdown()
            os._exit(137)


def tarfile_error():
    import tarfile
    return tarfile.TarError


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
        self.migration: dict = {}   # how p's state got here (handoff / re-shard), for /status
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
            self._take_over()
            self._open_clients()
            self._recover()
            self._reshard()
            self._publish_stats()
            self._set_state("running")
            self._migrated()
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
        count = self.w.home_count()
        rs = self.w.assignment.reshard
        # A store complete for another partition count is stale (it missed a re-shard), unless
        # it is exactly the state the running re-shard is about to export and import into.
        stale = (store.partition_count is not None and store.partition_count != count
                 and not (rs and store.partition_count == rs["from"] and store.reshard_id != rs["id"]))
        action, replayed = "none", 0
        if committed < 0 and not stale:
            # Nothing was ever committed for p: a new pipeline, a new partition (or the group's
            # offsets expired).
            start = lo
            if applied is not None and applied != lo:
                self.w.store.drop(self.p)
                store = self.store = self.w.store.open(self.p)
                action = "reset"
            store.apply({}, start)
            committed = start
        elif applied is None or applied > committed or stale:
            action = "rebuild"
            committed = max(committed, lo) if committed >= 0 else lo
            replayed = self._rebuild(committed, lo)
        elif applied < committed:
            action = "replay"
            replayed = self._replay(applied, committed)
        if committed < lo:
            event(log, ERROR, "records were deleted by retention before they were processed",
                  partition=self.p, committed=committed, log_start=lo)
        if not (rs and self.p < rs["to"] and self.store.reshard_id != rs["id"]) or action == "rebuild":
            # The keys are complete for the current count (a re-shard import sets it later).
            self.store.apply({}, None, partition_count=count)
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

    def _window_start(self, partition: int, lo: int, end: int) -> int:
        since = int(time.time() * 1000) - self.cfg.window_ms - self.cfg.segment_ms
        off = self._retry("offsets_for_times", lambda: self.consumer.offsets_for_times(
            [TopicPartition(self.cfg.source_topic, partition, since)], timeout=30)[0].offset)
        return end if off < 0 else min(max(off, lo), end)

    def _rebuild(self, committed: int, lo: int) -> int:
        """The store is missing, ahead of Kafka or stale: rebuild it over the window from the
        source. After a re-shard within the window, keys that now belong to p may have been
        deduplicated in other partitions before it: those partitions' history (below their
        re-shard boundary, records they processed at home) is scanned too."""
        self.w.store.drop(self.p)
        self.store = self.w.store.open(self.p)
        self.w.metrics.rebuilds.labels(str(self.p)).inc()
        start = self._window_start(self.p, lo, committed)
        partial = lo > 0 and start == lo
        reshards = self.w.assignment.reshards
        count = self.w.home_count()
        bounds: dict[int, int] = {}
        for r in reshards:
            for q, o in (r.get("offsets") or {}).items():
                if int(q) != self.p:
                    bounds[int(q)] = max(bounds.get(int(q), 0), int(o))
        event(log, WARNING, "rebuilding dedup state from the source topic", partition=self.p,
              start=start, end=committed, other_partitions=sorted(bounds))
        n = 0
        for q, bound in sorted(bounds.items()):
            qlo, _ = self._retry("watermarks", lambda: self.consumer.get_watermark_offsets(
                TopicPartition(self.cfg.source_topic, q), timeout=30))
            qstart = self._window_start(q, qlo, bound)
            n += self._scan(q, qstart, bound, applied=None, target=self.p, target_count=count)
        return n + self._replay(start, committed, partial_coverage=partial)

    def _replay(self, start: int, end: int, partial_coverage: bool = False) -> int:
        """Inserts the keys of [start, end) that p deduplicated (home p by the partition count
        of that time), producing nothing: every record below the committed offset was already
        emitted, dropped as a duplicate or rerouted."""
        return self._scan(self.p, start, end, applied=end, partial_coverage=partial_coverage)

    def _scan(self, partition: int, start: int, end: int, *, applied: int | None,
              target: int | None = None, target_count: int | None = None,
              partial_coverage: bool = False) -> int:
        store = self.store
        if start >= end:
            store.apply({}, applied)
            return 0
        event(log, INFO, "replaying source into state", partition=self.p, source_partition=partition,
              start=start, end=end)
        self.consumer.assign([TopicPartition(self.cfg.source_topic, partition, start)])
        home = partitioners.get(self.cfg.partitioner)
        spec = self.cfg.key_spec
        reshards = self.w.assignment.reshards
        current = self.w.home_count()
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
                raise RuntimeError(f"replay of partition {partition} stalled at offset {last + 1} < {end}")
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
                cnt = era_count(reshards, partition, off, current) if reshards else current
                if home(k, cnt) != partition:
                    continue  # rerouted, not deduplicated here
                if target is not None and home(k, target_count) != target:
                    continue
                entries[k] = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else 0
            if len(entries) >= REPLAY_FLUSH_KEYS:
                store.apply(entries, last + 1 if applied is not None else None,
                            covered_since_ms=covered_since)
                entries = {}
        store.apply(entries, applied, covered_since_ms=covered_since)
        return n

    # -- handoff and re-shard (DESIGN.md section 4) ----------------------------------------------
    def _take_over(self) -> None:
        """If p is being handed to this pod, fetch the old owner's snapshot and install it as
        p's store. Any failure leaves the store missing, so recovery rebuilds it: slower, never
        wrong. Runs before the store is opened and before init_transactions."""
        a = self.w.assignment
        ho = a.handoffs.get(self.p)
        me = self.cfg.me
        if not ho or ho.get("from") in (None, me):
            return
        rec = self.w.migration_record(self.p)
        if self.w.store.exists(self.p):
            if rec and rec.get("generation") == a.generation:
                self.migration = {**rec, "restarted": True}
            else:
                self.migration = {"method": "local", "generation": a.generation, "from": ho.get("from")}
            return
        self._set_state("fetching")
        t0 = time.monotonic()
        url = f"{ho['url'].rstrip('/')}/snapshots/{self.p}?generation={a.generation}"
        tmp = self.w.store.root / "snapshots" / f"incoming-{self.p}.tar"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        self.migration = {"generation": a.generation, "from": ho.get("from")}
        try:
            facts = migrate.fetch_with_retries(
                url, tmp, deadline=time.monotonic() + self.cfg.handoff_timeout_seconds,
                should_stop=self._halt.is_set,
                on_retry=lambda e: event(log, INFO, "snapshot not available yet; retrying",
                                         partition=self.p, error=str(e)))
            migrate.install_snapshot(tmp, self.w.store, self.p)
            stopped = facts.get(migrate.H_STOPPED)
            self.migration.update(method="snapshot", bytes=facts["bytes"], sha256=facts["sha256"],
                                  fetch_ms=int((time.monotonic() - t0) * 1000),
                                  stopped_at_ms=int(stopped) if stopped else None)
            event(log, INFO, "snapshot installed", partition=self.p, bytes=facts["bytes"],
                  source=ho.get("from"), fetch_ms=self.migration["fetch_ms"])
        except (migrate.TransferError, OSError, tarfile_error()) as e:
            if self._halt.is_set():
                raise Stopping() from None
            self.w.store.drop(self.p)
            self.migration.update(method="rebuild", bytes=0, reason=str(e)[:300])
            event(log, WARNING, "snapshot transfer failed: rebuilding from the source topic",
                  partition=self.p, source=ho.get("from"), error=str(e))
        finally:
            tmp.unlink(missing_ok=True)

    def _reshard(self) -> None:
        """During a re-shard (N -> N2, all partitions were paused first): export the keys of
        this old partition whose home moved, then import the keys that moved into p from every
        old partition's owner. p runs only once its state is complete for N2."""
        a = self.w.assignment
        rs = a.reshard
        if not rs:
            return
        rid, frm, to = int(rs["id"]), int(rs["from"]), int(rs["to"])
        store = self.store
        home = partitioners.get(self.cfg.partitioner)
        root = self.w.store.root
        if self.p < frm and migrate.read_export_manifest(root, rid, self.p) is None:
            # A store rebuilt just now holds keys by the new count only: say so, and the
            # importers rebuild their partitions instead of trusting this export.
            missing = self.recovery.get("recovery") == "rebuild"
            man = migrate.write_exports(root, rid, self.p, store.iter_keys(), home, to, missing=missing)
            event(log, INFO, "re-shard export written", partition=self.p, reshard=rid, missing=missing,
                  targets={q: t["keys"] for q, t in man["targets"].items()})
        if store.reshard_id == rid or self.p >= to:
            return
        t0 = time.monotonic()
        if self.recovery.get("recovery") == "rebuild":
            store.apply({}, None, partition_count=to, reshard_id=rid)
            self.migration = {"method": "rebuild", "reshard": rid, "keys": 0, "bytes": 0}
            return
        self._set_state("importing")
        deadline = time.monotonic() + self.cfg.handoff_timeout_seconds
        entries: list[tuple[bytes, int]] = []
        nbytes = 0
        try:
            for src in range(frm):
                if src == self.p:
                    continue
                owner = a.owners.get(src)
                if owner == self.cfg.me:
                    man = None
                    while man is None:
                        man = migrate.read_export_manifest(root, rid, src)
                        if man is None:
                            if time.monotonic() > deadline or self._halt.is_set():
                                raise migrate.TransferError(f"own export of {src} not written")
                            time.sleep(0.2)
                    if man.get("missing"):
                        raise migrate.TransferError(f"export of {src} unavailable", final=True)
                    f = migrate.export_dir(root, rid, src) / f"to-{self.p}.bin"
                    data = f.read_bytes() if f.exists() else b""
                else:
                    url = (rs.get("peers") or {}).get(owner)
                    if not url:
                        raise migrate.TransferError(f"no address for {owner}, owner of {src}", final=True)
                    tmp = root / "reshard" / f"incoming-{self.p}-{src}.bin"
                    tmp.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        migrate.fetch_with_retries(f"{url.rstrip('/')}/reshard/{rid}/{src}/{self.p}", tmp,
                                                   deadline=deadline, should_stop=self._halt.is_set)
                        data = tmp.read_bytes()
                    finally:
                        tmp.unlink(missing_ok=True)
                nbytes += len(data)
                entries.extend(migrate.parse_export(data))
        except migrate.TransferError as e:
            if self._halt.is_set():
                raise Stopping() from None
            event(log, WARNING, "re-shard import failed: rebuilding from the source topic",
                  partition=self.p, reshard=rid, error=str(e))
            lo, _ = self._retry("watermarks", lambda: self.consumer.get_watermark_offsets(
                TopicPartition(self.cfg.source_topic, self.p), timeout=30))
            self._rebuild(self.committed, lo)
            self.store.apply({}, None, partition_count=to, reshard_id=rid)
            self._assign(self.committed)
            self.migration = {"method": "rebuild", "reshard": rid, "reason": str(e)[:300]}
            return
        store.apply(entries, None, partition_count=to, reshard_id=rid)
        self.migration = {"method": "reshard-import", "reshard": rid, "keys": len(entries),
                          "bytes": nbytes, "import_ms": int((time.monotonic() - t0) * 1000)}
        event(log, INFO, "re-shard import done", partition=self.p, reshard=rid, keys=len(entries),
              bytes=nbytes)

    def _migrated(self) -> None:
        if not self.migration:
            return
        now = int(time.time() * 1000)
        if "pause_ms" not in self.migration:
            since = self.migration.get("stopped_at_ms") or self.started_at_ms
            self.migration["pause_ms"] = max(0, now - since)
        self.migration["generation"] = self.w.assignment.generation
        self.migration["running_at_ms"] = now
        self.w.save_migration_record(self.p, self.migration)

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
        nparts = self.w.home_count()
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
        broken = self.w.fault.no_dedup
        out = cfg.output_topic
        emitted = dups = 0
        for m, k in candidates:
            if (k in pending or k in seen) and not broken:
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
                "lag": self.lag, "recovery": self.recovery, "migration": self.migration or None,
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
        self.assignments = AssignmentSource(cfg.me, cfg.partitions, cfg.assignment_file,
                                            cfg.namespace, cfg.assignment_configmap)
        self.runners: dict[int, PartitionRunner] = {}
        self.generation: int | None = None
        self.owned: tuple[int, ...] = ()
        self.assignment: Assignment = Assignment(-1)
        self.released: dict[int, dict] = {}   # partitions handed off by this pod: snapshot manifests
        self._stuck: list[PartitionRunner] = []
        self._halt = threading.Event()
        self._restart_at: dict[int, float] = {}
        self.http: HttpServer | None = None

    def home_count(self) -> int:
        """The partition count of the home check: the one the operator published (never a
        newer one read from metadata while a re-shard is in progress), else the topic's."""
        return self.assignment.partition_count or self.source.partitions

    def runnable(self) -> tuple[int, ...]:
        return () if self.assignment.paused else self.owned

    # -- readiness / status ------------------------------------------------------------------
    def ready(self) -> bool:
        return (not self._halt.is_set() and self.generation is not None
                and all(p in self.runners and self.runners[p].state == "running" for p in self.runnable()))

    def paused(self) -> bool:
        """Told to pause, and nothing runs any more: the operator may change the partitions."""
        return (self.assignment.paused and not any(r.is_alive() for r in self.runners.values())
                and not any(r.is_alive() for r in self._stuck))

    def status(self) -> dict:
        return {"pipeline": self.cfg.pipeline, "namespace": self.cfg.namespace, "pod": self.cfg.me,
                "generation": self.generation, "owned": list(self.owned),
                "paused": self.paused(), "partition_count": self.home_count(),
                "source_partitions": self.source.partitions,
                "window_seconds": self.cfg.window_seconds, "ready": self.ready(),
                "partitions": {p: r.status() for p, r in sorted(self.runners.items())},
                "released": {p: {k: v for k, v in m.items()} for p, m in sorted(self.released.items())},
                "memory": self.store.memory()}

    def request_stop(self, *_args) -> None:
        self._halt.set()

    # -- migration records (survive a restart of the new owner) ----------------------------------
    def _migration_path(self, p: int):
        return self.store.root / "migrations" / f"p-{p}.json"

    def migration_record(self, p: int) -> dict | None:
        try:
            return json.loads(self._migration_path(p).read_text())
        except (OSError, ValueError):
            return None

    def save_migration_record(self, p: int, rec: dict) -> None:
        path = self._migration_path(p)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, default=str))
        os.replace(tmp, path)

    # -- state transfer endpoints ---------------------------------------------------------------
    def files(self, path: str, query: str):
        parts = path.strip("/").split("/")
        try:
            if parts[0] == "snapshots" and len(parts) == 2:
                return self._snapshot_response(int(parts[1]), query)
            if parts[0] == "reshard" and len(parts) == 4:
                return self._export_response(int(parts[1]), int(parts[2]), int(parts[3]))
        except ValueError:
            return 400, {}, b"bad request\n"
        return None

    def _snapshot_response(self, p: int, query: str):
        want = 0
        for kv in query.split("&"):
            k, _, v = kv.partition("=")
            if k == "generation" and v.isdigit():
                want = int(v)
        man = self.released.get(p) or migrate.read_snapshot_manifest(self.store.root, p)
        if man is not None and (p not in self.owned):
            tar_path, _ = migrate.snapshot_paths(self.store.root, p)
            return 200, {migrate.H_SHA: man["sha256"], migrate.H_APPLIED: man.get("applied_offset"),
                         migrate.H_STOPPED: man.get("stopped_at_ms"), migrate.H_KEYS: man.get("keys")}, tar_path
        if (self.generation or 0) < want or p in self.owned or p in self.runners:
            return 503, {"Retry-After": "1"}, b"not released yet\n"
        ho = self.assignment.handoffs.get(p)
        if ho and ho.get("from") == self.cfg.me and self.store.exists(p):
            return 503, {"Retry-After": "1"}, b"snapshot being prepared\n"
        return 404, {}, b"no state for this partition here\n"

    def _export_response(self, rid: int, p: int, q: int):
        man = migrate.read_export_manifest(self.store.root, rid, p)
        if man is None:
            return 503, {"Retry-After": "1"}, b"export not written yet\n"
        if man.get("missing"):
            return 410, {}, b"state of this partition was rebuilt; rebuild instead\n"
        t = man["targets"].get(str(q))
        if t is None:
            return 200, {migrate.H_SHA: "", migrate.H_KEYS: 0}, b""
        return 200, {migrate.H_SHA: t["sha256"], migrate.H_KEYS: t["keys"]}, \
            migrate.export_dir(self.store.root, rid, p) / f"to-{q}.bin"

    # -- control loop -----------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self.http = HttpServer(cfg.http_host, cfg.http_port, self.metrics, self.status, self.ready,
                               self.heartbeat.alive, files=self.files)
        self.http.start()
        self.assignments.start()
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
        self.assignments.stop()
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
            a = self.assignments.read()
        except (OSError, ValueError, KeyError, TypeError) as e:
            if self.generation is None:
                event(log, WARNING, "assignment not readable yet", error=str(e))
            return
        owned = tuple(a.partitions_of(self.cfg.me))
        if a != self.assignment:
            event(log, INFO, "assignment", generation=a.generation, partitions=list(owned),
                  previous=list(self.owned), paused=a.paused, partition_count=a.partition_count,
                  handoffs=sorted(a.handoffs), reshard=a.reshard)
            self.assignment, self.generation, self.owned = a, a.generation, owned
            self.metrics.generation.set(a.generation)
            self.metrics.owned.set(len(owned))
        runnable = self.runnable()
        stopped: dict[int, int] = {}
        for p in [p for p in self.runners if p not in runnable]:
            r = self.runners[p]
            r.stop()
            r.join(60)
            # Removed only now: until its last commit is done, /status must not call it paused.
            del self.runners[p]
            if r.is_alive():
                self._stuck.append(r)
            stopped[p] = int(time.time() * 1000)
        self._stuck = [r for r in self._stuck if r.is_alive()]
        self._release(a, owned, stopped)
        for p in runnable:
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

    def _release(self, a: Assignment, owned: tuple[int, ...], stopped: dict[int, int]) -> None:
        """Handed-off partitions: snapshot and serve them, then drop the local store. Stores of
        partitions this pod neither owns nor hands off are stale: dropped."""
        me = self.cfg.me
        if self.cfg.partitions is not None:
            return  # fixed ownership (tests, local runs): nothing moves
        busy = set(self.runners) | {r.p for r in self._stuck}
        for p in self.store.partitions_on_disk():
            if p in owned or p in busy:
                continue
            ho = a.handoffs.get(p)
            if ho and ho.get("from") == me:
                if migrate.read_snapshot_manifest(self.store.root, p) is None:
                    t0 = time.monotonic()
                    try:
                        man = migrate.make_snapshot(self.store, p, generation=a.generation,
                                                    stopped_at_ms=stopped.get(p, int(time.time() * 1000)))
                    except Exception as e:  # noqa: BLE001 - the new owner rebuilds
                        event(log, ERROR, "snapshot failed; the new owner will rebuild", partition=p,
                              error=str(e))
                        continue
                    event(log, INFO, "partition released: snapshot ready", partition=p, to=a.owners.get(p),
                          bytes=man["bytes"], applied_offset=man["applied_offset"], keys=man["keys"],
                          snapshot_ms=int((time.monotonic() - t0) * 1000))
            self.store.drop(p)
        # Serve what is on disk for the handoffs from this pod; forget the rest.
        for p in range(max([0, *a.handoffs, *self.released]) + 1):
            ho = a.handoffs.get(p)
            if ho and ho.get("from") == me and p not in owned:
                man = migrate.read_snapshot_manifest(self.store.root, p)
                if man is not None:
                    self.released[p] = man
            elif p in self.released or migrate.read_snapshot_manifest(self.store.root, p) is not None:
                self.released.pop(p, None)
                migrate.remove_snapshot(self.store.root, p)
        keep = {int(a.reshard["id"])} if a.reshard else set()
        migrate.cleanup_reshards(self.store.root, keep)

    def _start(self, p: int) -> None:
        r = self.runners[p] = PartitionRunner(self, p)
        r.start()


def run(cfg: WorkerConfig) -> int:
    return Worker(cfg).run()
