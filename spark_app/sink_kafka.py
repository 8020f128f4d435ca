"""Exactly-once Kafka sink for Structured Streaming, through foreachBatch.

Spark's built-in Kafka sink is at-least-once: a micro-batch that is re-run after a driver
crash writes its rows again. This sink makes every (batch, unit) idempotent, where a unit
names the rows one task writes (sink_units.py): `src-<p>` for a task that reads source
partition p straight from the scan, `task-<i>` for task i of a plan that shuffles by key.

* Each unit `u` of micro-batch `B` is written by a transactional producer with
  `transactional.id = eopipe.<namespace>.<pipeline>.spark.<u's suffix>`. In ONE Kafka
  transaction it writes the task's rows to the sink topic and a marker
  `u -> {batch: B, query: Q, source ranges}` to the pipeline's compacted commit topic. Either
  both are visible to read_committed readers or neither is.
* A task that cannot rule out an earlier writer of (B, u) -- a retry, or the first batch a
  driver runs, which may be a replay -- creates its producer and calls init_transactions(),
  which fences every older producer with the same transactional.id (an earlier attempt, a
  zombie of a previous driver) and completes or aborts its open transaction; it then reads its
  marker (read_committed; after the init it is final). If the marker already holds B for the
  same streaming query, the unit's rows are in the sink already and it writes nothing.
* Any other task creates its producer and calls init_transactions() too, but reads no marker;
  unless its Python worker kept the unit's producer from the unit's last commit (where an
  executor runs one task at a time, `keep_producers`): then no init, and its first row is the
  proof: the broker takes it only if no newer producer of the unit exists, so none has written
  since that commit. If the broker refuses it (fenced), the newer one may be a copy of this very
  task that committed B (a speculative copy, a retry on another executor): the task goes the
  first way, with a new producer and the marker.

* Where the whole job has one task slot, the batch of a plan without a shuffle is written by
  one task (sink_units.one_task_unit) that writes every unit's marker in its one transaction:
  to a replay that runs the tasks apart, each finds its unit written. The driver's first batch
  of a run writes that way only if its units' markers hold none or all of it (fence_and_read
  first), since a previous run may have written part of it task by task.

Why a unit of a replayed micro-batch holds the same rows as in the batch's first run:
  1. Spark writes the offset range of batch B (per Kafka partition: from, until) to the
     checkpoint's offset log BEFORE running B, and marks B done in the commit log only AFTER
     foreachBatch returned. A driver that restarts re-runs the last batch that has offsets but
     no commit with exactly the logged ranges; it never recomputes them from the broker.
     With isolation.level=read_committed the records inside a logged range are fixed too:
     the range ends at or below the last stable offset, so every transaction in it had
     already committed or aborted when the range was chosen.
  2. The Kafka source turns the logged ranges into input partitions: one per topic-partition
     range with data (we never set minPartitions; its splitting is a pure function of the
     ranges). Their ORDER is not fixed: for up to four partitions it follows the order the
     offsets were read in, which differs between the first run and a replay. Hence units are
     named by the source range a task reads, not by its index, where the plan is narrow.
  3. The transform is a deterministic plan over those partitions: a stateless query keeps the
     source partitioning; a stateful one hash-partitions into spark.sql.shuffle.partitions,
     which Spark pins in the checkpoint, so shuffle partition i holds the same keys whatever
     the order of the map tasks; it reads state store version B-1 and uses the watermark and
     batch timestamp logged with B. Adaptive query execution, which could coalesce partitions
     based on runtime statistics, is switched off by main.py. A plan whose tasks depend on the
     scan's order without a hash shuffle (round robin, range, coalesce) is refused. Even a
     non-deterministic expression (rand(), uuid()) changes only values, not which input
     records a unit covers, so each input record still reaches the sink exactly once.
So the rows of unit u in a replay of B are its rows in the first run of B, and skipping a
unit whose marker holds B loses nothing and duplicates nothing.

Task retries (attempt > 0) inside one driver run (an executor lost, a broker restart making
a transaction fail, speculative copies) are handled the same way: the retry's producer fences
the failed attempt, and the retry consults the marker, so a first attempt that committed and
then failed to report success is not written twice.

A marker newer than the batch being written (same query) means the checkpoint went back in
time (restored from an old copy); writing on would duplicate output, skipping would lose it,
so the task fails loudly instead. A marker from another query id (the checkpoint was deleted
and the job starts over) is ignored: a new checkpoint means a new run by definition.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from spark_app.sink_position import watermarks
from spark_app.sink_units import (ONE_TASK_SUFFIX, Unit, UnknownLegacyWrites, decide, legacy_may_hold, legacy_written,
                                  observe, one_task_may_write, one_task_unit)
from spark_app.upgrade import CHECKPOINT_REFUSED

# Fault-test hook only: seconds to sleep between writing a task's rows and committing, so a
# SIGKILL lands inside an open transaction. Never set in production.
COMMIT_DELAY_ENV = "EOPIPE_SPARK_TEST_COMMIT_DELAY"
TIMEOUT_S = 60.0
_DEBUG = bool(os.environ.get("EOPIPE_SPARK_SINK_DEBUG"))


class InconsistentCheckpoint(RuntimeError):
    pass


@dataclass(frozen=True)
class SinkParams:
    """What the tasks need; pickled into every task (small)."""
    topic: str
    commit_topic: str
    transactional_id_prefix: str
    client_config: dict  # librdkafka settings incl. bootstrap.servers and credentials
    # Keep each unit's producer in the Python worker between batches (one_task_at_a_time).
    keep_producers: bool = False
    # Write a narrow plan's batch in one task (sink_units.one_task_unit): the job has one slot.
    one_task: bool = False

    def transactional_id(self, unit: Unit) -> str:
        return f"{self.transactional_id_prefix}.{unit.txn_suffix}"

    def legacy_transactional_id(self, unit: Unit) -> str:
        """What the task-index sink (before an upgrade) wrote this task's index under."""
        return f"{self.transactional_id_prefix}.{unit.task}"


@dataclass
class Marker:
    task: int
    batch: int
    query: str | None
    rows: int | None = None

    def encode(self, unit: Unit, attempt: int, rows: int | None) -> bytes:
        # The source ranges the unit's rows came from: what a query that lost its checkpoint
        # needs to know where the sink stands.
        return json.dumps({"task": self.task, "batch": self.batch, "query": self.query,
                           "attempt": attempt, "rows": rows, "unit": unit.marker_key,
                           "source": [r.as_json() for r in unit.ranges], "parts": unit.parts,
                           "committed_at_ms": int(time.time() * 1000)}).encode()

    @classmethod
    def decode(cls, value: bytes) -> "Marker":
        d = json.loads(value)
        rows = d.get("rows")
        return cls(int(d["task"]), int(d["batch"]), d.get("query"), rows if isinstance(rows, int) else None)


# ---------------------------------------------------------------------------- executor side

def _new_producer(params: SinkParams, transactional_id: str) -> Producer:
    """A transactional producer under `transactional_id`, initialised: init_transactions() fences every
    older producer with this transactional.id (an earlier attempt, a zombie of a previous
    driver) and completes or aborts its open transaction.

    One per task run, never cached across tasks: Spark hands a partition to whichever Python
    worker is idle, so a cached producer per worker would fence its twin in the other worker
    on every move and fail the next batch there."""
    p = Producer({
        **params.client_config,
        "transactional.id": transactional_id,
        # Java clients' default partitioner, so keyed output lands where Java expects it.
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "transaction.timeout.ms": 60000,
        "message.timeout.ms": 55000,
        # librdkafka connects to a learnt broker no sooner than half this after the bootstrap
        # connection is dropped (its sparse-connect interval, at least 11 ms): with the default
        # 100 ms every task's producer waited 50 ms before init_transactions() could begin.
        "reconnect.backoff.ms": 20,
    })
    # librdkafka drops its bootstrap connection as soon as it has learnt the brokers; when
    # init_transactions()' coordinator lookup falls into that gap it retries only after a
    # fixed 500 ms (rdkafka_idempotence.c), which hit ~1 task in 3. The second metadata
    # request returns only once a learnt broker is connected, so the lookup goes out at once.
    for _ in range(2):
        p.list_topics(params.commit_topic, timeout=TIMEOUT_S)
    p.init_transactions(TIMEOUT_S)
    return p


# Per Python worker: each unit's producer after its last commit (no transaction open), by
# transactional.id; only with SinkParams.keep_producers.
_IDLE: dict[str, Producer] = {}


def task_slots(conf: dict[str, str], cpus: int | None = None) -> tuple[int, int | None]:
    """(task slots per executor, executors) from the Spark settings (`cpus`: the machine's, for
    local[*]): 0 slots where unknown (local-cluster, a setting that does not parse), None
    executors where their number varies (dynamic allocation)."""
    master = conf.get("spark.master", "")
    try:
        m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
        if m:
            cores = (cpus or os.cpu_count() or 0) if m.group(1) == "*" else int(m.group(1) or 1)
            executors = 1
        elif master.startswith("local"):  # local-cluster[...]: several executors, unknown slots
            return 0, None
        else:
            cores = int(conf.get("spark.executor.cores", "1"))
            # Spark on Kubernetes starts 2 executors when the number is not set.
            executors = None if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true" \
                else int(conf.get("spark.executor.instances", "2"))
        return cores // int(conf.get("spark.task.cpus", "1")), executors
    except (ValueError, ZeroDivisionError):
        return 0, None


def one_task_at_a_time(conf: dict[str, str], cpus: int | None = None) -> bool:
    """Whether each executor runs one task at a time: then it has one Python worker, and as
    Kafka's source prefers one executor for each partition's task, a unit comes back to the
    worker that kept its producer. With more task slots units move between workers, and each
    move would fence the kept producer (costing a marker read instead of saving an init)."""
    return task_slots(conf, cpus)[0] == 1


def one_slot(conf: dict[str, str], cpus: int | None = None) -> bool:
    """Whether the whole job runs one task at a time: then a narrow plan's tasks would run one
    after another anyway, and the sink writes a batch in one task (sink_units.one_task_unit)."""
    return task_slots(conf, cpus) == (1, 1)


def _still_newest(producer: Producer, params: SinkParams, row) -> bool:
    """Begins a transaction with `row` and waits until the broker has it: False if the broker
    refused it (a newer producer of this transactional.id exists: fenced) or did not answer in
    time. Nothing of a refused transaction becomes visible; the next producer's init aborts it."""
    taken: list[bool] = []
    try:
        producer.begin_transaction()
        producer.produce(params.topic, key=row[0], value=row[1],
                         on_delivery=lambda err, _msg: taken.append(err is None))
        producer.flush(TIMEOUT_S)
    except Exception:  # fenced: confluent-kafka raises the fatal error from the delivery callback
        return False
    return taken == [True]


def _keep(params: SinkParams, transactional_id: str, producer: Producer) -> None:
    if params.keep_producers:
        _IDLE[transactional_id] = producer


_COMMIT_PARTITIONS: dict[str, int] = {}


def _log(msg: str) -> None:
    print(f"eopipe-spark-sink: {msg}", file=sys.stderr, flush=True)


def commit_partitions(params: SinkParams, client: Producer | None = None) -> int:
    n = _COMMIT_PARTITIONS.get(params.commit_topic)
    if n is None:
        client = client or Producer(params.client_config)
        md = client.list_topics(params.commit_topic, timeout=TIMEOUT_S).topics[params.commit_topic]
        if md.error is not None or not md.partitions:
            raise RuntimeError(f"commit topic {params.commit_topic!r}: {md.error or 'no partitions'}")
        n = _COMMIT_PARTITIONS[params.commit_topic] = len(md.partitions)
    return n


def read_marker(params: SinkParams, marker_key: str, partition: int, timeout: float = TIMEOUT_S,
                window: int = 2000) -> Marker | None:
    """The last committed marker under `marker_key`, or None.

    Reads the tail of the commit topic partition with read_committed, up to the high
    watermark taken now (every transaction of ours is complete, so our last marker is below
    it; another task's open transaction may hold the stable offset back a little, so we wait
    for it rather than stopping early). The window doubles backwards until the key is found
    or the start is reached; compaction keeps the topic short."""
    key = marker_key.encode()
    group = f"{params.transactional_id_prefix}.{marker_key}.marker"
    hw_probe = Consumer({**params.client_config, "group.id": group,
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    try:
        low, high = watermarks(hw_probe, TopicPartition(params.commit_topic, partition), timeout)
    finally:
        hw_probe.close()
    if high <= low:
        return None
    c = Consumer({**params.client_config, "group.id": group, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.wait.max.ms": 10})
    try:
        deadline = time.monotonic() + timeout
        stop_at, start = high, max(low, high - window)
        while True:
            found: Marker | None = None
            c.assign([TopicPartition(params.commit_topic, partition, start)])
            done = False
            while not done:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading markers of {params.commit_topic}[{partition}] "
                                       f"did not reach offset {stop_at} in {timeout:.0f}s")
                # consume(n, timeout) waits for n messages OR the timeout, so a tail shorter
                # than n always cost the full timeout: wake on the first, then take what has
                # arrived already. Same messages, same order, same stop conditions.
                msgs = c.consume(1, timeout=0.5)
                msgs += c.consume(999, timeout=0) if msgs else []
                for m in msgs:
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            done = m.offset() >= stop_at
                            continue
                        raise KafkaException(m.error())
                    if m.offset() >= stop_at:
                        done = True
                        break
                    if m.key() == key:
                        found = Marker.decode(m.value())
                    if m.offset() + 1 >= stop_at:
                        done = True
            if found is not None or start <= low:
                return found
            stop_at, start = start, max(low, start - 2 * window)
            window *= 2
    finally:
        c.close()


def _check_not_rewound(params: SinkParams, key: str, marker: Marker, batch_id: int) -> None:
    if marker.batch > batch_id:
        raise InconsistentCheckpoint(
            f"{CHECKPOINT_REFUSED} commit topic {params.commit_topic} says {key} committed batch "
            f"{marker.batch}, but the checkpoint is at batch {batch_id}: the checkpoint was restored "
            "from an older copy; refusing to write duplicates")


def write_partition(params: SinkParams, batch_id: int, first_batch_of_run: int,
                    units: list[Unit], rows: Iterable, old_sink_wrote: frozenset[int] = frozenset()) -> None:
    """Runs in a Spark task: rows are (key, value) pairs of str/bytes/None. `old_sink_wrote`:
    the tasks of a replayed batch that the task-index sink wrote before an upgrade (the
    driver's `legacy_done`)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    task, attempt = ctx.partitionId(), ctx.attemptNumber()
    unit = units[task]
    # Spark sets the query's id (stable across restarts from one checkpoint) as a local
    # property of every job of the query; it reaches the tasks.
    query = ctx.getLocalProperty("sql.streaming.queryId")
    it = iter(rows)
    first = next(it, None)
    if first is None:
        return  # nothing to write; an empty task needs no marker

    t0 = time.monotonic()
    tid = params.transactional_id(unit)
    # Could an earlier writer have committed (B, unit)? Only two cases:
    # * a retry (attempt > 0, including speculative copies): attempt 0 may have committed
    #   and then failed to report success;
    # * the first batch this driver runs: it may be the replay of a batch that a previous
    #   driver (crashed, or a zombie still running) wrote before Spark's commit log said so.
    # Any later batch N of this run was planned by this driver, which won the atomic write of
    # offsets/N in the checkpoint (a second driver on the same checkpoint fails there and
    # never runs N), and attempt 0 is the first writer of (N, unit) in this run.
    check = attempt > 0 or batch_id <= first_batch_of_run
    producer = None if check else _IDLE.pop(tid, None)
    sent = False
    if producer is not None:
        sent = _still_newest(producer, params, first)
        if not sent:  # fenced: the newer producer may be a copy of this task that wrote B
            producer, check = None, True
    if producer is None:
        producer = _new_producer(params, tid)
    t_init = time.monotonic() - t0
    parts = commit_partitions(params, producer)
    partition = unit.slot % parts

    if check:
        if task in old_sink_wrote:
            _log(f"batch {batch_id} task {task} ({unit.marker_key}) attempt {attempt}: replay, written by the "
                 "task-index sink before the upgrade, skipped")
            _keep(params, tid, producer)
            return
        marker = read_marker(params, unit.marker_key, partition)
        if marker is not None and marker.query == query:
            _check_not_rewound(params, unit.marker_key, marker, batch_id)
            if marker.batch == batch_id:
                _log(f"batch {batch_id} task {task} ({unit.marker_key}) attempt {attempt}: replay, "
                     "marker holds this batch, skipped")
                _keep(params, tid, producer)
                return

    try:
        n = 1 if sent else 0
        if not sent:
            producer.begin_transaction()
        for key, value in it if sent else chain([first], it):
            while True:
                try:
                    producer.produce(params.topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
            if n % 10000 == 0:
                producer.poll(0)
        # A one-task unit writes each covered unit's own marker (their rows are not counted apart).
        for u in unit.covers or (unit,):
            producer.produce(params.commit_topic, key=u.marker_key.encode(), partition=u.slot % parts,
                             value=Marker(u.task, batch_id, query).encode(u, attempt, None if unit.covers else n))
        delay = float(os.environ.get(COMMIT_DELAY_ENV) or 0)
        if delay:
            producer.flush(TIMEOUT_S)
            time.sleep(delay)
        _commit(producer)
        _keep(params, tid, producer)
        if _DEBUG:
            how = "kept producer, first row" if sent else "init"
            _log(f"batch {batch_id} task {task} ({unit.marker_key}) attempt {attempt}: {n} rows committed in "
                 f"{(time.monotonic() - t0) * 1000:.0f} ms ({how} {t_init * 1000:.0f} ms)")
    except BaseException:
        # The transaction's state is unknown. The task fails, Spark retries it (attempt + 1),
        # the retry's init_transactions() aborts anything still open and its marker read tells
        # whether this attempt's commit went through.
        try:
            producer.abort_transaction(5)
        except Exception:
            pass
        raise


def _commit(producer: Producer) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            producer.commit_transaction(max(1.0, deadline - time.monotonic()))
            return
        except KafkaException as e:
            err = e.args[0]
            # Retriable (e.g. a timeout while the broker restarts): the commit may be in
            # flight; calling it again is the documented way to learn the outcome.
            if err.retriable() and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise


# ------------------------------------------------------------------------------ driver side

def fence_and_read(params: SinkParams, units: list[Unit]) -> list[Marker | None]:
    """On the driver, for the first batch it runs (maybe a replay): fences the task producers
    of the last driver, under every naming (the units', the task-index sink's, the one-task
    unit's), so their open transactions are aborted and the markers read after it are final;
    then each unit's last marker. Fenced at once, not one after another: each is a coordinator
    round trip or more, at start-up."""
    ids = [params.transactional_id(u) for u in units]
    ids += [params.legacy_transactional_id(u) for u in units if u.legacy_key]
    ids.append(f"{params.transactional_id_prefix}.{ONE_TASK_SUFFIX}")
    with ThreadPoolExecutor(max_workers=8) as pool:
        for p in pool.map(lambda tid: _new_producer(params, tid), ids):
            p.flush(0)
    n = commit_partitions(params)
    return [read_marker(params, u.marker_key, u.slot % n) for u in units]


def legacy_done(params: SinkParams, units: list[Unit], batch_id: int, query: str,
                counts: Callable[[], list[int]], mine: list[Marker | None]) -> frozenset[int]:
    """On the driver, for the first batch it runs (maybe a replay), after fence_and_read (`mine`):
    the tasks the task-index sink, which ran before an upgrade, wrote already
    (sink_units.legacy_written); `counts` runs a job for each task's rows, needed only when that
    sink wrote part of this batch. Its markers are read only when this sink's do not rule it out
    (sink_units.legacy_may_hold)."""
    if not legacy_may_hold([(m.query, m.batch) if m else None for m in mine], query, batch_id):
        return frozenset()
    n = commit_partitions(params)
    old = [read_marker(params, u.legacy_key, u.task % n) for u in units if u.legacy_key]
    old = [m for m in old if m is not None and m.query == query]
    for m in old:
        _check_not_rewound(params, f"task-{m.task}", m, batch_id)
    written = [m.rows for m in old if m.batch == batch_id]
    if not written:
        return frozenset()
    try:
        done = legacy_written(counts(), written)
    except UnknownLegacyWrites as e:
        raise InconsistentCheckpoint(
            f"{CHECKPOINT_REFUSED} batch {batch_id} is a replay the sink before the upgrade (units named "
            f"by task index) wrote in part: {e}; nothing of it was written again. Restart from a known "
            "point: spec.processing.upgradeMode reprocess with reprocessFrom (docs/upgrades.md)") from None
    _log(f"batch {batch_id}: replay after an upgrade from the task-index sink, which wrote tasks "
         f"{sorted(done)} of {len(units)} (told apart by their rows); they are skipped")
    return done


def settle_first_batch(params: SinkParams, units: list[Unit], one: Unit | None, batch_id: int, query: str,
                       counts: Callable[[], list[int]]) -> tuple[frozenset[int], Unit | None]:
    """On the driver, for the first batch of a run (maybe a replay) of a plan with source units:
    fences the last driver's writers and reads the units' markers (fence_and_read), refuses a
    rewound checkpoint, and returns the tasks the task-index sink wrote (legacy_done) and `one`,
    the one-task unit, if the batch may still be written in one task, else None
    (sink_units.one_task_may_write)."""
    mine = fence_and_read(params, units)
    for u, m in zip(units, mine):
        if m is not None and m.query == query:
            _check_not_rewound(params, u.marker_key, m, batch_id)
    done = legacy_done(params, units, batch_id, query, counts, mine)
    if one is not None and (done or not one_task_may_write(
            [(m.query, m.batch) if m else None for u, m in zip(units, mine) if u in one.covers], query, batch_id)):
        _log(f"batch {batch_id}: a previous run wrote part of it task by task: its tasks run apart")
        one = None
    return done, one


class KafkaSinkBatchWriter:
    """The foreachBatch function (runs on the driver, once per micro-batch) of a query whose
    rows are to_kafka_records' (key, value)."""

    def __init__(self, params: SinkParams, spark, query_name: str):
        # The session the query was started in: foreachBatch hands each batch a session of its
        # own, whose query manager does not list the query.
        self.params, self.spark, self.query_name = params, spark, query_name
        self.first_batch_of_run: int | None = None

    def __call__(self, df, batch_id: int) -> None:
        from functools import partial

        if self.first_batch_of_run is None:
            # Spark replays at most the last batch that has offsets but no commit, and it is
            # the first one this driver runs; later batches are new.
            self.first_batch_of_run = batch_id
        t0 = time.monotonic()
        rdd = df.rdd  # once: its partitions are the tasks the units are read from
        t1 = time.monotonic()
        query = self._query()
        facts = observe(rdd, query._jsq.streamingQuery().lastExecution().executedPlan())
        units = decide(facts)
        one = one_task_unit(facts, units) if self.params.one_task else None
        t2 = time.monotonic()
        done = frozenset()
        if batch_id == self.first_batch_of_run and any(u.legacy_key for u in units):
            done, one = settle_first_batch(self.params, units, one, batch_id, str(query.id),
                                           lambda: rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect())
        if one is not None:
            rdd, units = rdd.coalesce(1), [one]
        rdd.foreachPartition(partial(write_partition, self.params, batch_id,
                                     self.first_batch_of_run, units, old_sink_wrote=done))
        if _DEBUG:
            t3 = time.monotonic()
            _log(f"batch {batch_id}: rdd {(t1 - t0) * 1000:.0f} ms, units {(t2 - t1) * 1000:.0f} ms, "
                 f"write job {(t3 - t2) * 1000:.0f} ms")

    def _query(self):
        """The running query: its id, and its executed plan for the batch being written (`df`
        only scans the batch's result)."""
        for q in self.spark.streams.active:
            if q.name == self.query_name:
                return q
        raise RuntimeError(f"streaming query {self.query_name!r} is not active")


def to_kafka_records(df):
    """(key, value) of the output records: projected once, on the streaming query the writer
    is given, not on each batch (building it again cost a batch 0.1-0.3 s of the driver's time).

    A result with a `value` column is taken as is (with `key` if present), like Spark's own
    Kafka sink; otherwise the value is the JSON of all columns except the Kafka metadata
    columns (key, partition, offset, timestamp), and `key` (if present) stays the key. So a
    pass-through `SELECT * FROM events` reproduces the input's keys and JSON fields."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    from spark_app.config import META_COLUMNS, ConfigError

    cols = df.columns

    def as_bytes_or_str(name: str):
        c = F.col(f"`{name}`")
        return c if isinstance(df.schema[name].dataType, BinaryType) else c.cast("string")

    key = as_bytes_or_str("key") if "key" in cols else F.lit(None).cast("string")
    if "value" in cols:
        value = as_bytes_or_str("value")
    else:
        payload = [F.col(f"`{c}`") for c in cols if c not in META_COLUMNS]
        if not payload:
            raise ConfigError(["sql: the result has no columns besides Kafka metadata (key, partition, offset, "
                               "timestamp)"])
        value = F.to_json(F.struct(*payload))
    return df.select(key.alias("key"), value.alias("value"))
