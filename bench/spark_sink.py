"""The Spark stage's sinks side by side: eopipe's exactly-once Kafka sink, Spark's own Kafka sink
(at-least-once) and Spark's file sink (Parquet).

One source topic (4 partitions) holds N deduped records of the payments example's schema
(eopipe load's events, no resends); each sink runs the payments example's SQL over all of it
with the same local Spark (local[2], batches of N/10 by maxOffsetsPerTrigger, trigger 1s, so
the batches run back to back):
  eopipe       `python -m spark_app.main`, sink kind kafka (as the operator configures it)
  spark_kafka  this module's --driver: spark_app's session and query frame, the same records
               (spark_app.sink_kafka.to_kafka_records), written by writeStream.format("kafka")
  parquet      `python -m spark_app.main`, sink kind files, format parquet
Each driver runs until batch 6 of 10 is half done (by the previous batch's duration), then the
whole driver tree is SIGKILLed, as a lost driver pod; it is restarted on its checkpoint with
the same settings and runs until its last batch holds the end of the source.

Measured, per sink:
  records/s    over the steady part before the kill: the records of batches 1..5 (the first
               pays for JVM and Python worker start-up) over the time between batch 0's and
               batch 5's commits, both read from the checkpoint (offsets/ and commits/)
  CPU µs/rec   user + system CPU of the driver's process tree (the Python driver, its JVM, the
               Python workers; /proc/<pid>/stat) over the same batches, sampled every 0.1 s
  duplicates   keys written more than once after the kill and the restart, counted by an
               independent reader: eopipe verify (read_committed) for Kafka, a separate Spark
               process reading the Parquet directory (through its _spark_metadata log, as
               Spark's own readers do) for the file sink
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, process_tree, python, say, standalone
from bench.dedup_vs_copy import _cpu_seconds

PARTITIONS = 4
BATCHES = 10          # micro-batches over the source (maxOffsetsPerTrigger = N / BATCHES)
KILL_BATCH = 6        # the batch in flight when the driver is killed
SQL = ("SELECT id, account, amount_cents, currency, amount_cents >= 1000000 AS large FROM events")
SCHEMA = "id STRING, seq BIGINT, account STRING, amount_cents BIGINT, currency STRING, ts BIGINT"


@dataclass(frozen=True)
class Sink:
    id: str
    name: str
    guarantee: str
    short: str  # the label in the combined table of `make bench`


EOPIPE = Sink("eopipe", "eopipe exactly-once Kafka sink", "exactly-once", "eopipe sink")
SPARK_KAFKA = Sink("spark_kafka", "Spark's Kafka sink", "at-least-once", "Spark Kafka sink")
PARQUET = Sink("parquet", "Spark's file sink (Parquet)", "exactly-once via _spark_metadata", "Parquet sink")
SINKS = (EOPIPE, SPARK_KAFKA, PARQUET)


@dataclass(frozen=True)
class Batch:
    id: int
    end: int                        # source records up to the end of this batch (all partitions)
    started: float                  # offsets/<id> written (epoch seconds)
    committed: float | None         # commits/<id> written; None: in flight


# -- pure decisions ---------------------------------------------------------------------------
def read_batches(checkpoint: Path) -> list[Batch]:
    """The query's batches from its checkpoint: offsets/<id> (3rd line: the source's end offsets
    per topic and partition) and commits/<id>. A file being written is skipped."""
    out = []
    offsets = checkpoint / "offsets"
    for f in sorted((p for p in offsets.glob("[0-9]*") if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            lines = f.read_text().splitlines()
            ends = json.loads(lines[2])
            started = f.stat().st_mtime
        except (OSError, IndexError, ValueError):
            continue
        c = checkpoint / "commits" / f.name
        try:
            committed = c.stat().st_mtime
        except OSError:
            committed = None
        out.append(Batch(int(f.name), sum(int(o) for parts in ends.values() for o in parts.values()),
                         started, committed))
    return out


def kill_due(batches: list[Batch], now: float, kill_batch: int = KILL_BATCH) -> bool:
    """True once batch `kill_batch` (or a later one) is in flight for half the previous batch's
    duration: mid-batch, its sink writing."""
    by_id = {b.id: b for b in batches}
    flight = [b for b in batches if b.committed is None and b.id >= kill_batch]
    if not flight:
        return False
    b, prev = flight[0], by_id.get(flight[0].id - 1)
    if prev is None or prev.committed is None:
        return False
    return now - b.started >= (prev.committed - prev.started) / 2


def finished(batches: list[Batch], records: int) -> bool:
    """Every record of the source is in a committed batch."""
    return bool(batches) and batches[-1].committed is not None and batches[-1].end >= records


def steady(batches: list[Batch], samples: list[tuple[float, int, float]]) -> dict:
    """Records/s and CPU between batch 0's commit and the last commit seen: records from the
    batches' end offsets, time from the commit files, CPU from the first sample (time, commits
    seen, CPU seconds) that saw each commit. None where fewer than two batches committed."""
    done = [b for b in batches if b.committed is not None]
    if len(done) < 2 or done[0].id != 0:
        return {"steady_records": None, "steady_seconds": None, "records_per_s": None,
                "cpu_seconds": None, "cpu_us_per_record": None, "steady_batches": None}
    first, last = done[0], done[-1]
    records, seconds = last.end - first.end, last.committed - first.committed

    def cpu_at(n: int) -> float | None:
        return next((cpu for _, seen, cpu in samples if seen >= n), None)

    c0, c1 = cpu_at(1), cpu_at(len(done))
    cpu = c1 - c0 if c0 is not None and c1 is not None and c1 > c0 else None
    return {"steady_records": records, "steady_seconds": seconds,
            "records_per_s": records / seconds if seconds > 0 else None,
            "cpu_seconds": cpu, "cpu_us_per_record": cpu / records * 1e6 if cpu and records else None,
            "steady_batches": f"{first.id + 1}..{last.id}"}


# -- the driver process tree ------------------------------------------------------------------
def tree_cpu_seconds(root: int) -> float:
    total = 0.0
    for pid in process_tree(root):
        try:
            total += _cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            pass  # ended between the listing and the read
    return total


# -- one sink ---------------------------------------------------------------------------------
def _config(sink: Sink, bootstrap: str, source: str, name: str, work: Path, trigger: str, batch: int) -> dict:
    out = {"kind": "files", "path": str(work / f"{name}.parquet"), "format": "parquet"} if sink is PARQUET \
        else {"kind": "kafka", "topic": name, "commit_topic": f"{name}.commits"}
    return {"pipeline": name, "namespace": "bench", "bootstrap": bootstrap, "source_topic": source,
            "sql": SQL, "schema": SCHEMA, "trigger": trigger, "checkpoint_location": str(work / f"{name}.ck"),
            "sink": out, "max_offsets_per_trigger": batch, "spark_conf": {"spark.master": "local[2]"}}


def _start(sink: Sink, config: dict, log: Path) -> subprocess.Popen:
    from localenv.fixtures_spark import ensure_spark_jars

    module = "bench.spark_sink" if sink is SPARK_KAFKA else "spark_app.main"
    extra = ["--driver"] if sink is SPARK_KAFKA else []
    env = {**os.environ, "EOPIPE_SPARK_JARS": str(ensure_spark_jars()), "PYSPARK_PYTHON": python(),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    with open(log, "ab") as out:  # own session: the kill takes the JVM and the workers too
        return subprocess.Popen([python(), "-m", module, *extra, "--config-json", json.dumps(config)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def run_sink(sink: Sink, bootstrap: str, work: Path, source: str, unique: int, progress=say,
             timeout: float = 900) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"sink-{sink.id.replace('_', '-')}-{os.getpid()}-{int(time.time())}"
    if sink is not PARQUET:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(name, PARTITIONS, 1), NewTopic(
                f"{name}.commits", 1, 1, config={"cleanup.policy": "compact"})]).values():
            f.result(30)
    batch = max(1, -(-unique // BATCHES))
    ck, log = work / f"{name}.ck", work / f"{name}.log"
    progress(f"{sink.name}: batches of {batch:,}, SIGKILL in batch {KILL_BATCH}")
    proc = _start(sink, _config(sink, bootstrap, source, name, work, "1s", batch), log)
    samples: list[tuple[float, int, float]] = []
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{sink.name}: driver exited with {proc.returncode} before the kill; see {log}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{sink.name}: batch {KILL_BATCH} not reached in {timeout:.0f}s; see {log}")
            batches = read_batches(ck)
            samples.append((time.time(), sum(b.committed is not None for b in batches),
                            tree_cpu_seconds(proc.pid)))
            if kill_due(batches, time.time()):
                break
            time.sleep(0.1)
    finally:
        _kill(proc)
    at_kill = read_batches(ck)
    in_flight = [b.id for b in at_kill if b.committed is None]
    result = {"id": sink.id, "name": sink.name, "guarantee": sink.guarantee, "batch_records": batch,
              "killed_in_batch": in_flight[0] if in_flight else None, "log": str(log),
              **steady(at_kill, samples)}
    progress(f"{sink.name}: killed in batch {result['killed_in_batch']}, "
             f"{result['records_per_s'] or 0:,.0f} records/s before; restarting from the checkpoint")
    # The same settings as before, as a replaced driver pod restarts.
    proc = _start(sink, _config(sink, bootstrap, source, name, work, "1s", batch), log)
    t0 = time.monotonic()
    try:
        while not finished(read_batches(ck), unique):
            if proc.poll() is not None:
                raise RuntimeError(f"{sink.name}: exited with {proc.returncode} after its restart; see {log}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{sink.name}: did not finish after its restart in {timeout:.0f}s; see {log}")
            time.sleep(0.2)
    finally:
        _kill(proc)
    result.update(count_parquet(work / f"{name}.parquet", unique) if sink is PARQUET
                  else count_kafka(bootstrap, source, name))
    return result


def count_kafka(bootstrap: str, source: str, output: str) -> dict:
    from eopipe.core.keys import KeySpec
    from eopipe.tools.verify import verify

    rep = verify(bootstrap, source, output, key_spec=KeySpec.parse("json:id"), settle=2, timeout=300,
                 count_aborted=False, order=False)
    return {"unique": rep.unique_in, "out": rep.out, "duplicated": rep.duplicated, "lost": rep.lost,
            "reader": "eopipe verify, read_committed"}


def count_parquet(path: Path, unique: int) -> dict:
    """Keys in the Parquet output, read by Spark in a process of its own."""
    out = subprocess.run([python(), "-m", "bench.spark_sink", "--count-parquet", str(path)], cwd=REPO,
                         env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, capture_output=True, text=True,
                         timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"parquet count failed: {out.stderr.strip()[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {"unique": unique, "out": got["rows"], "duplicated": got["duplicated"],
            "lost": unique - got["keys"], "reader": "Spark, read.parquet (through _spark_metadata)"}


def bench(bootstrap: str, work: Path, records: int = 1_000_000, progress=say) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    from eopipe.tools.loadgen import run_load

    work.mkdir(parents=True, exist_ok=True)
    source = f"sink-src-{os.getpid()}-{int(time.time())}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: the future needs its handle
    admin.create_topics([NewTopic(source, PARTITIONS, 1)])[source].result(30)
    progress(f"preloading {records:,} deduped records into {source}")
    stats = run_load(bootstrap, source, records, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=28)
    rows = [run_sink(s, bootstrap, work, source, stats["unique"], progress) for s in SINKS]
    eo, sk = rows[0], rows[1]
    ratio = (eo["records_per_s"] / sk["records_per_s"]) if eo["records_per_s"] and sk["records_per_s"] else None
    return {"records": records, "unique": stats["unique"], "partitions": PARTITIONS, "master": "local[2]",
            "load": os.getloadavg(), "rows": rows, "eopipe_vs_spark_kafka": ratio}


def table(r: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)
    head = (f"{'sink':34} {'records/s':>10} {'CPU µs/rec':>11} {'dup keys':>9} {'lost':>5} {'out':>10}  "
            f"killed in batch")
    lines = [f"Spark stage sinks: {r['unique']:,} records, payments SQL, local[2], batches of "
             f"{r['rows'][0]['batch_records']:,}" if r["rows"] else "Spark stage sinks", head, "-" * len(head)]
    for x in r["rows"]:
        lines.append(f"{x['name']:34} {f(x['records_per_s'], ',.0f'):>10} {f(x['cpu_us_per_record'], '.1f'):>11} "
                     f"{x['duplicated']:>9,} {x['lost']:>5} {x['out']:>10,}  {x['killed_in_batch']}")
    lines.append(f"eopipe sink / Spark's Kafka sink throughput: {f(r['eopipe_vs_spark_kafka'], '.2f')}")
    return "\n".join(lines)


# -- subprocess entries -----------------------------------------------------------------------
def driver(config_json: str) -> int:
    """Spark's own Kafka sink over spark_app's query: the same session, frame and records."""
    from spark_app.config import load
    from spark_app.main import RUNNING_LINE, build_query_frame, build_session
    from spark_app.sink_kafka import to_kafka_records

    cfg = load(config_json)
    spark = build_session(cfg)
    w = (to_kafka_records(build_query_frame(spark, cfg)).writeStream.format("kafka")
         .option("kafka.bootstrap.servers", cfg.bootstrap).option("topic", cfg.sink.topic)
         .option("checkpointLocation", cfg.checkpoint_location))
    w = w.trigger(availableNow=True) if cfg.trigger_ms is None else w.trigger(
        processingTime=f"{cfg.trigger_ms} milliseconds")
    query = w.start()
    print(f"{RUNNING_LINE} id={query.id} sink=spark-kafka", flush=True)
    query.awaitTermination()
    return 0 if query.exception() is None else 1


def count_parquet_main(path: str) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    counts = spark.read.parquet(path).groupBy("id").count()
    row = counts.agg(F.count("*").alias("keys"), F.sum("count").alias("rows"),
                     F.sum(F.when(F.col("count") > 1, 1).otherwise(0)).alias("dups")).first()
    print(json.dumps({"keys": row["keys"], "rows": row["rows"] or 0, "duplicated": row["dups"] or 0}))
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--driver"] and len(argv) == 3 and argv[1] == "--config-json":
        return driver(argv[2])
    if argv[:1] == ["--count-parquet"] and len(argv) == 2:
        return count_parquet_main(argv[1])

    def options(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--records", type=int, default=1_000_000, help="deduped records (default 1000000)")
    return standalone("bench.spark_sink", __doc__, options, table, argv,
                      lambda bootstrap, work, a: bench(bootstrap, work, records=a.records))


if __name__ == "__main__":
    sys.exit(main())
