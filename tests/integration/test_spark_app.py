"""The Spark stage (spark_app): config validation, the exactly-once Kafka sink, the file sink,
fault tests with real Spark and a real broker, and a SparkApplication run on the control plane.

Spark is heavy on a 2-core machine: every test here runs at most one driver at a time.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from eopipe.control.status import spark_lag, spark_processing
from eopipe.core.keys import KeySpec
from eopipe.core.sparkprogress import read_progress
from eopipe.tools.loadgen import run_load
from eopipe.tools.verify import TopicReader, verify
from spark_app import progress, sink_kafka, sink_units
from tests.helpers.sparkfiles import latest_batch
from tests.helpers.sparktopics import Topics
from tests.helpers.workers import open_transaction

REPO = Path(__file__).resolve().parents[2]
ID = KeySpec.parse("json:id")


# ------------------------------------------------------------------------------ helpers

def _stable_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition the last stable offset, as the operator reads it for status.processing."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_committed"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts}
    finally:
        c.close()


def _progress_url(d) -> str:
    """The driver's /progress, on the port it printed (EOPIPE_PROGRESS_PORT=0: a free one)."""
    deadline = time.monotonic() + 30
    while not (m := re.search(re.escape(progress.PORT_LINE) + r" port=(\d+)", d.log_text())):
        assert time.monotonic() < deadline, d.tail(40)
        time.sleep(0.2)
    return f"http://127.0.0.1:{m.group(1)}{progress.PATH}"


def _progress_until(url: str, t: Topics, done, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        p, err = read_progress(url)
        assert err is None, err
        lag = spark_lag(p, t.source, _stable_ends(t.bootstrap, t.source))
        if done(p, lag):
            return p
        assert time.monotonic() < deadline, f"{p} lag={lag}"
        time.sleep(0.5)


def _wait_for_output(bootstrap: str, topic: str, at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n = sum(1 for _ in TopicReader(bootstrap).read(topic, timeout=30))
        if n >= at_least:
            return n
        time.sleep(1)
    raise TimeoutError(f"{topic}: {n} records after {timeout:.0f}s, wanted {at_least}")


class Supervisor(threading.Thread):
    """restartPolicy OnFailure for a driver in a test: restarts it whenever it exits."""

    def __init__(self, driver, max_restarts: int = 5):
        super().__init__(daemon=True)
        self.driver, self.max_restarts = driver, max_restarts
        self.restarts, self.exit_codes = 0, []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            if not self.driver.alive and self.restarts < self.max_restarts:
                self.exit_codes.append(self.driver.returncode)
                self.restarts += 1
                self.driver.start()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def _background_load(bootstrap: str, topic: str, count: int, rate: float, seed: int,
                     stop: threading.Event | None = None) -> threading.Thread:
    result: dict = {}

    def go():
        try:
            result.update(run_load(bootstrap, topic, count, dup_ratio=0.0, wrong_partition_ratio=0.0,
                                   rate=rate, seed=seed, stop=stop))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            result["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.result = result
    t.start()
    return t


def _join_load(t: threading.Thread, timeout: float = 120) -> dict:
    t.join(timeout)
    assert not t.is_alive(), "load did not finish"
    assert "error" not in t.result, t.result.get("error")
    return t.result


# --------------------------------------------------------- the sink's protocol (Kafka only)

class _FakeTaskContext:
    def __init__(self, partition: int, attempt: int, query: str):
        self._p, self._a, self._q = partition, attempt, query

    def partitionId(self):
        return self._p

    def attemptNumber(self):
        return self._a

    def getLocalProperty(self, key):
        return self._q if key == "sql.streaming.queryId" else None


def _units(source: str, *partitions: int) -> list:
    """The units of a narrow plan whose task i reads `partitions[i]` of `source`."""
    return sink_units.decide(sink_units.PlanFacts(tuple(
        (sink_units.SourceRange(source, p, 0, 5),) for p in partitions)))


def _legacy_done(params, units, batch, query, counts):
    """What the driver settles for the first batch of a run: the tasks the task-index sink wrote."""
    return sink_kafka.settle_first_batch(params, units, None, batch, query, counts)[0]


@pytest.mark.kafka
def test_sink_protocol_skips_committed_batches_and_refuses_a_rewound_checkpoint(kafka_bootstrap, monkeypatch):
    """write_partition as Spark tasks call it, with a stand-in TaskContext."""
    import pyspark

    t = Topics(kafka_bootstrap, partitions=2)
    params = sink_kafka.SinkParams(t.sink, t.commits, f"eopipe.test.{t.pipeline}.spark",
                                   {"bootstrap.servers": kafka_bootstrap})
    ctx = {"c": _FakeTaskContext(0, 0, "q1")}
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: ctx["c"]))
    units = _units(t.source, 1, 0)  # task 0 reads source partition 1, task 1 partition 0

    def rows(batch, n=5):
        return [(f"k{batch}-{i}", json.dumps({"id": f"k{batch}-{i}"})) for i in range(n)]

    def out_keys():
        return Counter(m.key().decode() for m in TopicReader(kafka_bootstrap).read(t.sink))

    sink_kafka.write_partition(params, 0, 0, units, rows(0))
    sink_kafka.write_partition(params, 1, 0, units, rows(1))
    # A retry of batch 1 (attempt 1) after attempt 0 committed: the marker says so.
    ctx["c"] = _FakeTaskContext(0, 1, "q1")
    sink_kafka.write_partition(params, 1, 0, units, rows(1))
    # A new driver replays batch 1 (its first batch): skipped from the marker.
    ctx["c"] = _FakeTaskContext(0, 0, "q1")
    sink_kafka.write_partition(params, 1, 1, units, rows(1))
    # ...and goes on with batch 2, and task 1 (no marker yet) writes its first batch.
    sink_kafka.write_partition(params, 2, 1, units, rows(2))
    ctx["c"] = _FakeTaskContext(1, 0, "q1")
    sink_kafka.write_partition(params, 2, 1, units, [("t1", "{}")])
    keys = out_keys()
    assert sum(keys.values()) == 16 and max(keys.values()) == 1, keys
    # A replay of batch 2 whose plan lists the source partitions in the other order (Spark's
    # Kafka source does, for up to four partitions): each task finds its own rows' marker.
    swapped = _units(t.source, 0, 1)
    for task, batch_rows in ((0, [("t1", "{}")]), (1, rows(2))):
        ctx["c"] = _FakeTaskContext(task, 0, "q1")
        sink_kafka.write_partition(params, 2, 2, swapped, batch_rows)
    assert out_keys() == keys

    # The checkpoint went back to batch 1 while the marker holds 2: fail, never guess.
    ctx["c"] = _FakeTaskContext(0, 0, "q1")
    with pytest.raises(sink_kafka.InconsistentCheckpoint):
        sink_kafka.write_partition(params, 1, 1, units, rows(1))
    # A new checkpoint (another query id) starts over: its batch 0 is written.
    ctx["c"] = _FakeTaskContext(0, 0, "q2")
    sink_kafka.write_partition(params, 0, 0, units, [("fresh", "{}")])
    assert out_keys()["fresh"] == 1
    marker = sink_kafka.read_marker(params, units[0].marker_key, 0)
    assert (marker.batch, marker.query) == (0, "q2")
    assert not sink_kafka._IDLE  # keep_producers off: a producer per task run


@pytest.mark.kafka
def test_a_replay_after_an_upgrade_from_the_task_index_sink(kafka_bootstrap, monkeypatch):
    """The sink before units were named by their source wrote `task-<i>` markers and its driver
    died mid-batch: it wrote two of batch 5's three tasks, listing the partitions in another
    order than the upgraded driver's replay does. The driver tells which from the markers' row
    counts (after fencing the old task producers: a zombie's open transaction is aborted), and
    the replay writes only the third; where the counts cannot tell, it refuses and writes nothing."""
    import pyspark

    t = Topics(kafka_bootstrap, partitions=1)
    params = sink_kafka.SinkParams(t.sink, t.commits, f"eopipe.test.{t.pipeline}.spark",
                                   {"bootstrap.servers": kafka_bootstrap})
    units = _units(t.source, 7, 0, 4)  # the replay's order
    replay = {7: [("a1", "{}"), ("a2", "{}")], 0: [(f"b{i}", "{}") for i in range(5)],
              4: [("c1", "{}"), ("c2", "{}"), ("c3", "{}")]}

    def old_sink_writes(params, t, task: int, partition: int, commit: bool = True) -> Producer:
        p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{params.transactional_id_prefix}.{task}"})
        p.init_transactions(30)
        p.begin_transaction()
        for k, v in replay[partition]:
            p.produce(t.sink, key=k, value=v)
        p.produce(t.commits, key=f"task-{task}".encode(), partition=0,
                  value=json.dumps({"task": task, "batch": 5, "query": "q", "rows": len(replay[partition])}))
        if commit:
            p.commit_transaction(30)
        else:
            p.flush(30)
        return p

    # Its first run listed partitions 4, 7, 0: tasks 0 and 1 committed, task 2 (partition 0)
    # was still open when the driver died.
    old_sink_writes(params, t, 0, 4)
    old_sink_writes(params, t, 1, 7)
    zombie = old_sink_writes(params, t, 2, 0, commit=False)
    counts = [len(replay[p]) for p in (7, 0, 4)]
    done = _legacy_done(params, units, 5, "q", lambda: counts)
    assert done == {0, 2}
    with pytest.raises(Exception):
        zombie.commit_transaction(10)  # fenced by the upgraded driver
    for task, p in enumerate((7, 0, 4)):
        monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls, task=task: _FakeTaskContext(task, 0, "q")))
        sink_kafka.write_partition(params, 5, 5, units, replay[p], old_sink_wrote=done)
    out = Counter(m.key().decode() for m in TopicReader(kafka_bootstrap).read(t.sink))
    assert out == Counter(k for rows in replay.values() for k, _ in rows), out
    # Having written batch 5 under its own names, the sink never reads the old markers again.
    assert _legacy_done(params, units, 6, "q", lambda: pytest.fail("counted")) == frozenset()
    # Another query's markers (a new checkpoint) are not this query's past.
    assert _legacy_done(params, _units(t.source, 7, 0, 4), 5, "q2", lambda: pytest.fail("counted")) == frozenset()

    # Two tasks of the replay have the rows of the one the old sink wrote: refused, loudly.
    t2 = Topics(kafka_bootstrap, partitions=1)
    params2 = sink_kafka.SinkParams(t2.sink, t2.commits, f"eopipe.test.{t2.pipeline}.spark",
                                    {"bootstrap.servers": kafka_bootstrap})
    old_sink_writes(params2, t2, 0, 7)
    with pytest.raises(sink_kafka.InconsistentCheckpoint, match="checkpoint refused: batch 5 is a replay"):
        _legacy_done(params2, _units(t2.source, 7, 0, 4), 5, "q", lambda: [2, 2, 3])


@pytest.mark.kafka
def test_one_task_batches_and_replays_that_ran_their_tasks_apart(kafka_bootstrap, monkeypatch):
    """Where the job has one slot a batch of a narrow plan is written by one task, under each
    source unit's own marker. A replay whose plan runs the tasks apart (the job got more slots)
    finds each of them written; a batch a previous run wrote in part, task by task, is
    replayed task by task; the one-task producer of a dead driver is fenced at start-up."""
    import pyspark

    t = Topics(kafka_bootstrap, partitions=3)
    params = sink_kafka.SinkParams(t.sink, t.commits, f"eopipe.test.{t.pipeline}.spark",
                                   {"bootstrap.servers": kafka_bootstrap}, one_task=True)
    facts = sink_units.PlanFacts(tuple((sink_units.SourceRange(t.source, p, 0, 5),) for p in (2, 0, 1)))
    units = sink_units.decide(facts)
    one = sink_units.one_task_unit(facts, units)
    ctx = {"c": _FakeTaskContext(0, 0, "q")}
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: ctx["c"]))

    def rows(batch, p):
        return [(f"b{batch}-p{p}-{i}", "{}") for i in range(3)]

    def apart(batch, first, tasks=(0, 1, 2)):
        for task in tasks:
            ctx["c"] = _FakeTaskContext(task, 0, "q")
            sink_kafka.write_partition(params, batch, first, units, rows(batch, (2, 0, 1)[task]))

    def marked():
        return [(m.query, m.batch) if m else None for m in sink_kafka.fence_and_read(params, units)]

    def one_task_for(batch):  # what the driver decides for the first batch of a run
        return sink_kafka.settle_first_batch(params, units, one, batch, "q", lambda: pytest.fail("counted"))[1]

    ctx["c"] = _FakeTaskContext(0, 0, "q")
    sink_kafka.write_partition(params, 1, 1, [one], [r for p in (2, 0, 1) for r in rows(1, p)])
    assert marked() == [("q", 1)] * 3  # every unit's marker, in the one transaction
    apart(1, 1)  # a replay with the tasks apart: each skips
    apart(2, 1, tasks=(0, 1))  # a run with the tasks apart dies after two of batch 2's three
    assert one_task_for(2) is None
    apart(2, 2)  # so the replay runs them apart: the third is written
    # A driver died with batch 3 open in its one-task transaction: the next driver's start fences it.
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": params.transactional_id(one)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(t.sink, key="zombie", value="{}")
    zombie.flush(10)
    assert one_task_for(3) == one
    with pytest.raises(Exception):
        zombie.commit_transaction(10)
    ctx["c"] = _FakeTaskContext(0, 0, "q")
    sink_kafka.write_partition(params, 3, 3, [one], [r for p in (2, 0, 1) for r in rows(3, p)])
    ctx["c"] = _FakeTaskContext(0, 1, "q")  # a retry of it after it committed: skipped
    sink_kafka.write_partition(params, 3, 3, [one], [r for p in (2, 0, 1) for r in rows(3, p)])
    out = Counter(m.key().decode() for m in TopicReader(kafka_bootstrap).read(t.sink))
    assert out == Counter(k for b in (1, 2, 3) for p in (2, 0, 1) for k, _ in rows(b, p)), out
    # The checkpoint went back to batch 2 while the one task's markers hold 3: refused on the driver.
    with pytest.raises(sink_kafka.InconsistentCheckpoint):
        one_task_for(2)


@pytest.mark.kafka
def test_a_kept_producer_is_reused_and_a_fenced_one_reads_the_marker(kafka_bootstrap, monkeypatch):
    """Where an executor runs one task at a time its Python worker keeps each unit's producer
    between batches, and the next batch's first row proves it is still the newest (no init).
    One fenced meanwhile (the unit ran on another worker, or a retry of this very batch
    committed it elsewhere) is replaced and the marker read, as a retry does: nothing twice."""
    import pyspark

    t = Topics(kafka_bootstrap, partitions=1)
    params = sink_kafka.SinkParams(t.sink, t.commits, f"eopipe.test.{t.pipeline}.spark",
                                   {"bootstrap.servers": kafka_bootstrap}, keep_producers=True)
    units = _units(t.source, 0)
    tid = params.transactional_id(units[0])
    made, new_producer = [], sink_kafka._new_producer
    monkeypatch.setattr(sink_kafka, "_new_producer", lambda *a: made.append(a[1]) or new_producer(*a))
    monkeypatch.setattr(sink_kafka, "_IDLE", {})
    ctx = {"c": _FakeTaskContext(0, 0, "q")}
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: ctx["c"]))

    def rows(batch):
        return [(f"b{batch}-{i}", "{}") for i in range(3)]

    for batch in (1, 2, 3):  # batches after the run's first: no earlier writer to look for
        sink_kafka.write_partition(params, batch, 0, units, rows(batch))
    assert len(made) == 1
    kept = sink_kafka._IDLE.pop(tid)
    sink_kafka.write_partition(params, 4, 0, units, rows(4))  # another worker: fences `kept`
    ctx["c"] = _FakeTaskContext(0, 1, "q")  # a retry of batch 5 commits it on another executor
    sink_kafka._IDLE.clear()
    sink_kafka.write_partition(params, 5, 0, units, rows(5))
    ctx["c"] = _FakeTaskContext(0, 0, "q")  # then attempt 0 runs here, with the fenced producer
    sink_kafka._IDLE[tid] = kept
    sink_kafka.write_partition(params, 5, 0, units, rows(5))
    sink_kafka.write_partition(params, 6, 0, units, rows(6))
    assert len(made) == 4  # batch 1, the other worker, the retry, attempt 0's replacement
    for producer in sink_kafka._IDLE.values():  # else they retry the broker after the session
        producer.close()
    with pytest.warns(RuntimeWarning, match="fenced"):  # close() aborts its transaction: refused
        kept.close()
    out = Counter(m.key().decode() for m in TopicReader(kafka_bootstrap).read(t.sink))
    assert out == Counter(k for batch in range(1, 7) for k, _ in rows(batch)), out


@pytest.mark.kafka
def test_sink_aborts_when_killed_before_commit_and_a_retry_fences_the_zombie(kafka_bootstrap, monkeypatch):
    """A first attempt that wrote rows but never committed (its process hangs or died): the
    retry's init_transactions() fences it, its rows stay invisible, the retry writes once."""
    import pyspark

    t = Topics(kafka_bootstrap, partitions=1)
    params = sink_kafka.SinkParams(t.sink, t.commits, f"eopipe.test.{t.pipeline}.spark",
                                   {"bootstrap.servers": kafka_bootstrap})
    units = _units(t.source, 0)
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": params.transactional_id(units[0])})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for i in range(10):
        zombie.produce(t.sink, key=f"z{i}", value="{}")
    zombie.flush(10)
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: _FakeTaskContext(0, 1, "q")))
    sink_kafka.write_partition(params, 0, 0, units, [(f"z{i}", "{}") for i in range(10)])
    with pytest.raises(Exception):
        zombie.commit_transaction(10)  # fenced
    committed = Counter(m.key() for m in TopicReader(kafka_bootstrap).read(t.sink))
    assert len(committed) == 10 and set(committed.values()) == {1}
    seen = sum(1 for _ in TopicReader(kafka_bootstrap, "read_uncommitted").read(t.sink))
    assert seen == 20  # the zombie's aborted records are there, invisible to read_committed


# ------------------------------------------------------------ real Spark, real Kafka



@pytest.mark.kafka
@pytest.mark.spark
def test_sql_and_python_transform_to_kafka_exactly_once(kafka_bootstrap, spark_driver, spark_cds, tmp_path):
    t = Topics(kafka_bootstrap)
    stats = run_load(kafka_bootstrap, t.source, 1500, dup_ratio=0.0, poison=4, seed=21)
    sql = ("SELECT key, id, seq, account, upper(currency) AS currency, amount_cents, "
           "partition AS src_partition FROM events WHERE id IS NOT NULL")
    d = spark_driver(t.config(tmp_path, sql=sql, transform="spark_app.examples:amount_in_major_units"),
                     EOPIPE_PROGRESS_PORT="0")
    d.wait_running()
    # Its JVM maps the class data sharing archive, as the Spark image's drivers do.
    assert d.maps(str(spark_cds)), d.tail(20)
    assert "Unable to use shared archive" not in d.log_text()
    _wait_for_output(kafka_bootstrap, t.sink, stats["unique"], timeout=120)
    rep = verify(kafka_bootstrap, t.source, t.sink, key_spec=ID, order=False, settle=3, timeout=120)
    assert rep.ok and rep.lost == 0 and rep.duplicated == 0, rep.line()
    assert rep.unique_in == 1500 and rep.malformed_in == 4  # poison filtered by the SQL
    for m in TopicReader(kafka_bootstrap).read(t.sink):
        v = json.loads(m.value())
        assert m.key().decode() == v["id"]
        assert v["currency"] in ("EUR", "USD", "GBP") and v["amount"] == round(v["amount_cents"] / 100, 2)
        assert set(v) == {"id", "seq", "account", "currency", "amount_cents", "src_partition", "amount"}
    # The driver's GET /progress, as the operator reads it into status.processing: caught up,
    # then a later batch for more records, caught up again.
    url = _progress_url(d)
    first = _progress_until(url, t, lambda p, lag: p.batch_id is not None and lag == 0)
    run_load(kafka_bootstrap, t.source, 200, dup_ratio=0.0, seed=22)
    later = _progress_until(url, t, lambda p, lag: p.batch_id > first.batch_id and lag == 0)
    record, stuck = spark_processing(later, None, t.source, _stable_ends(kafka_bootstrap, t.source), 1000,
                                     int(time.time() * 1000), None)
    assert record["lastBatchId"] > first.batch_id and record["lagRecords"] == 0 and stuck is None, record
    assert record["batchDurationMs"] >= 0 and record["processedRowsPerSecond"] >= 0
    assert set(later.end_offsets) == {t.source} and sum(later.end_offsets[t.source].values()) >= 1704
    assert d.alive


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("sql, says", [
    ("SELECT no_such_column FROM events", "no_such_column"),
    # The Kafka sink's (key, value) projection is part of the query: found at its start.
    ("SELECT key, partition FROM events", "no columns besides Kafka metadata")])
def test_sql_that_does_not_analyse_exits_2(kafka_bootstrap, spark_driver, tmp_path, sql, says):
    t = Topics(kafka_bootstrap)
    d = spark_driver(t.config(tmp_path, sql=sql))
    assert d.wait(120) == 2, d.tail(30, meaningful=True)
    assert "invalid spark_app config" in d.log_text() and says in d.log_text()


@pytest.mark.kafka
@pytest.mark.spark
def test_markers_past_the_end_of_a_remade_source_exit_2_before_writing(kafka_bootstrap, spark_driver, tmp_path):
    """The sink's markers say partition 0 is written up to offset 500, but the source (the
    deduped topic) was deleted and made again: it holds 30 records. A query without a
    checkpoint that started at 500 would read nothing for a long while and then skip records;
    the driver stops with the reason instead (exit 2), writing nothing."""
    t = Topics(kafka_bootstrap)
    marker = {"task": 0, "batch": 9, "query": "an-old-query", "attempt": 0, "rows": 500, "unit": "src-0",
              "source": [{"topic": t.source, "partition": 0, "from": 0, "until": 500}], "parts": 0}
    prod = Producer({"bootstrap.servers": kafka_bootstrap})
    prod.produce(t.commits, json.dumps(marker).encode(), b"src-0")
    assert prod.flush(30) == 0
    run_load(kafka_bootstrap, t.source, 30, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=27)
    d = spark_driver(t.config(tmp_path))
    assert d.wait(180) == 2, d.tail(30, meaningful=True)
    assert f"the sink holds its records up to offset 500, but {t.source} ends at offset" in d.log_text()
    assert sum(1 for _ in TopicReader(kafka_bootstrap, "read_uncommitted").read(t.sink)) == 0


@pytest.mark.kafka
@pytest.mark.spark
def test_sql_whose_tasks_follow_the_scan_order_exits_2_before_writing(kafka_bootstrap, spark_driver, tmp_path):
    """REPARTITION(n) without columns deals records round robin in the scan's order, which a
    replayed batch does not keep: the exactly-once sink refuses it at the first batch."""
    t = Topics(kafka_bootstrap)
    run_load(kafka_bootstrap, t.source, 30, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=26)
    d = spark_driver(t.config(tmp_path, sql="SELECT /*+ REPARTITION(3) */ * FROM events"))
    assert d.wait(180) == 2, d.tail(30, meaningful=True)
    assert "sql: the query's plan spreads the source's records over tasks by their order" in d.log_text()
    assert sum(1 for _ in TopicReader(kafka_bootstrap, "read_uncommitted").read(t.sink)) == 0


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_driver_sigkills_mid_batch_a_lost_checkpoint_and_a_replayed_committed_batch(
        kafka_bootstrap, spark_driver, tmp_path):
    # Four source partitions: Spark's Kafka source lists up to four in an order that differs
    # between a batch's first run and its replay, so a sink that named its units by task index
    # lost and duplicated rows here (sink_units.py).
    t = Topics(kafka_bootstrap, partitions=4)
    # A load that outlasts the kills and restarts however slow they are: stopped once the run on
    # the lost checkpoint has planned a batch, so the last window below has one to drop.
    stop = threading.Event()
    load = _background_load(kafka_bootstrap, t.source, 30000, rate=150, seed=23, stop=stop)
    # Each task sleeps before its commit, so the kills below land inside open transactions.
    d = spark_driver(t.config(tmp_path), EOPIPE_SPARK_TEST_COMMIT_DELAY="0.7")
    d.wait_running()
    ck = tmp_path / "checkpoint"

    def kill_in_a_transaction() -> bool:
        """SIGKILL once a transaction is open; whether it still was just before the kill."""
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not open_transaction(kafka_bootstrap, t.sink):
            time.sleep(0.05)
        hit = open_transaction(kafka_bootstrap, t.sink)
        d.kill()
        return hit

    # A kill inside an open transaction, its replay planned from the checkpoint's offset log (a
    # second try if the transaction committed just before the kill: one kill that lands is the proof).
    # The first run has two task slots and writes a batch's tasks apart; the next ones have one and
    # write a batch in one task (sink_units.one_task_unit), so the replay meets a batch the tasks
    # apart wrote in part.
    one_slot = {**t.config(tmp_path), "spark_conf": {"spark.master": "local[1,4]"}}
    for _ in range(2):
        hit = kill_in_a_transaction()
        d.config_path.write_text(json.dumps(one_slot))
        d.start()
        d.wait_running()
        if hit:
            break
    assert hit, "the kills did not land inside open transactions"
    # Then the checkpoint lost too (a deleted claim), but for what a driver stopped while planning
    # a first batch there leaves: batch 0's offsets in a temp file never renamed, and the Kafka
    # source's first offsets (here the first run's, the earliest: used, they would write
    # everything again). The new run clears them and starts where the sink's markers say each
    # source partition's output ends.
    _wait_for_output(kafka_bootstrap, t.sink, 1, timeout=120)  # markers to start from
    kill_in_a_transaction()
    lost = tmp_path / "lost"
    ck.rename(lost)
    (ck / "offsets").mkdir(parents=True)
    shutil.copy(lost / "offsets" / str(min(int(p.name) for p in (lost / "offsets").glob("[0-9]*"))),
                ck / "offsets" / ".0.7f3e9c1a-0b4d-4e8a-9a51-2d6c0e1f5b37.tmp")
    shutil.copytree(lost / "sources", ck / "sources")
    d.start()
    d.wait_running()
    assert "has no batch planned: removed what a driver stopped while planning its first batch left there: " \
        "offsets/.0.7f3e9c1a-0b4d-4e8a-9a51-2d6c0e1f5b37.tmp, sources/0" in d.log_text(), d.tail(30)
    assert "starting where the sink's markers say its output ends" in d.log_text(), d.tail(30)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and latest_batch(ck, "offsets") is None and load.is_alive():
        time.sleep(0.2)
    stop.set()
    stats = _join_load(load)
    assert latest_batch(ck, "offsets") is not None, "the run on the lost checkpoint planned no batch"
    _wait_for_output(kafka_bootstrap, t.sink, stats["unique"], timeout=120)

    # The other window of a crash: tasks committed, the driver died before Spark's commit log
    # entry. Simulated exactly: stop, drop the last commit entry, restart: Spark re-runs that
    # batch and every task must find its marker and write nothing.
    # The kill must come after the last planned batch is in the commit log: killed between the
    # offset-log and commit-log entries, Spark re-runs the newer batch, not the one dropped here.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and latest_batch(ck, "offsets") != latest_batch(ck, "commits"):
        time.sleep(0.2)
    d.kill()
    last = latest_batch(ck, "offsets")
    assert last == latest_batch(ck, "commits"), "the last planned batch never committed"
    (ck / "commits" / str(last)).unlink()
    (ck / "commits" / f".{last}.crc").unlink(missing_ok=True)
    d.start()
    d.wait_running()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (ck / "commits" / str(last)).exists():
        time.sleep(0.5)
    assert (ck / "commits" / str(last)).exists(), "the replayed batch did not complete"
    assert f"batch {last} task" in d.log_text() and "replay, marker holds this batch, skipped" in d.log_text()
    assert "the sink writes a batch of a narrow plan in one task" in d.log_text()

    rep = verify(kafka_bootstrap, t.source, t.sink, key_spec=ID, order=False, settle=5, timeout=180)
    assert rep.ok and rep.lost == 0 and rep.duplicated == 0, rep.line()
    assert rep.unique_in == stats["unique"]
    assert rep.aborted_reads > 0  # the killed transactions were really there, and aborted


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_broker_restart_during_a_run(kafka, kafka_bootstrap, spark_driver, tmp_path):
    t = Topics(kafka_bootstrap)
    load = _background_load(kafka_bootstrap, t.source, 5000, rate=250, seed=24)
    d = spark_driver(t.config(tmp_path))
    d.wait_running()
    sup = Supervisor(d)
    sup.start()
    try:
        _wait_for_output(kafka_bootstrap, t.sink, 500, timeout=90)
        kafka.restart(kill=True, down_seconds=5)
        stats = _join_load(load, timeout=180)
        rep = verify(kafka_bootstrap, t.source, t.sink, key_spec=ID, order=False, settle=30, timeout=240)
    finally:
        sup.stop()
    assert rep.ok and rep.lost == 0 and rep.duplicated == 0, f"{rep.line()} restarts={sup.exit_codes}"
    assert rep.unique_in == stats["unique"] == 5000


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_windowed_count_with_rocksdb_state_is_exact_after_a_kill(kafka_bootstrap, spark_driver, tmp_path):
    t = Topics(kafka_bootstrap)
    sql = ("SELECT unix_millis(window.start) AS window_start_ms, count(*) AS n FROM events "
           "GROUP BY window(timestamp, '2 seconds')")
    load = _background_load(kafka_bootstrap, t.source, 4000, rate=300, seed=25)
    d = spark_driver(t.config(tmp_path, sql=sql, watermark={"column": "timestamp", "delay": "3 seconds"}))
    d.wait_running()
    _wait_for_output(kafka_bootstrap, t.sink, 2, timeout=90)  # windows are being closed
    time.sleep(1.0)
    d.kill()
    d.start()
    d.wait_running()
    _join_load(load)
    # Move the watermark past the last real window: one event far in the future.
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(t.source, key=b"flush", value=json.dumps({"id": "flush"}).encode(),
              timestamp=int(time.time() * 1000) + 600_000, partition=0)
    p.flush(10)

    expected = Counter()
    for m in TopicReader(kafka_bootstrap).read(t.source):
        if m.key() != b"flush":
            expected[m.timestamp()[1] // 2000 * 2000] += 1
    assert sum(expected.values()) == 4000

    def got():
        return [json.loads(m.value()) for m in TopicReader(kafka_bootstrap).read(t.sink)]

    deadline = time.monotonic() + 120
    rows = got()
    while time.monotonic() < deadline and {r["window_start_ms"] for r in rows} != set(expected):
        time.sleep(2)
        rows = got()
    windows = Counter(r["window_start_ms"] for r in rows)
    assert max(windows.values()) == 1, "a window was emitted twice"
    assert {r["window_start_ms"]: r["n"] for r in rows} == dict(expected)
    state = list((tmp_path / "checkpoint" / "state").rglob("*.zip")) + \
        list((tmp_path / "checkpoint" / "state").rglob("*.changelog"))
    assert state, "no RocksDB state store files in the checkpoint"

    # The checkpoint lost (a deleted claim) under upgradeMode keepCheckpoint: the markers are the
    # stateful query's (no source ranges), so where its output ends is unknown. The driver refuses
    # (exit 2, the reason the operator shows as Stalled/CheckpointIncompatible) instead of a new
    # run from startingOffsets that would write every window again; nothing is written.
    def written():
        return sum(1 for _ in TopicReader(kafka_bootstrap, "read_uncommitted").read(t.sink))
    before = written()
    d.kill()
    shutil.rmtree(tmp_path / "checkpoint")
    d.env["EOPIPE_TERMINATION_LOG"] = str(tmp_path / "termination-log")
    d.start()
    assert d.wait(180) == 2, d.tail(30, meaningful=True)
    reason = (tmp_path / "termination-log").read_text()
    assert reason.startswith("checkpoint refused: the checkpoint is empty") and "upgradeMode reprocess" in reason
    assert written() == before
