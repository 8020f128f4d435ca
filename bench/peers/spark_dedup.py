"""Spark's own dedup, the thing a Spark user tries first: Kafka source -> JSON field `id` ->
dropDuplicatesWithinWatermark on the record timestamp (RocksDB state store provider) -> Kafka
sink. A peer of `make bench` (bench/vs_peers.py), run as a script with pyspark installed:

    python bench/peers/spark_dedup.py --bootstrap HOST:PORT --source T --output T
        --checkpoint DIR --jars DIR [--trigger available-now|"1 second"] [--max-offsets N]

Prints its configuration (lines "config k=v") first, then one line "progress {json}" per
micro-batch and "done {json}" when the query ends (trigger available-now: all that was in the
source at start). Spark's Kafka sink is at-least-once: a micro-batch that is re-run after a
driver failure writes its records again (bench/vs_peers.py counts them with eopipe verify).

At the end it shuts the JVM down and waits for it, so the parent's wait4 rusage of this
process covers the JVM's CPU too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--jars", required=True, help="folder of the spark-sql-kafka jars (hack/fetch-spark-jars.sh)")
    ap.add_argument("--trigger", default="available-now", help='available-now, or a processing interval ("1 second")')
    ap.add_argument("--max-offsets", type=int, help="maxOffsetsPerTrigger (default: none, Spark's default)")
    ap.add_argument("--partitions", type=int, default=4, help="spark.sql.shuffle.partitions (the state's)")
    ap.add_argument("--watermark", default="24 hours", help="event-time delay: the dedup window")
    args = ap.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    conf = {
        "spark.master": "local[2]",
        "spark.driver.memory": "1g",
        "spark.jars": ",".join(str(p) for p in sorted(Path(args.jars).glob("*.jar"))),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # One state partition per source partition (Spark's default, 200, is for clusters).
        "spark.sql.shuffle.partitions": str(args.partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    }
    source_opts = {"kafka.bootstrap.servers": args.bootstrap, "subscribe": args.source,
                   "startingOffsets": "earliest", "failOnDataLoss": "true"}
    if args.max_offsets:
        source_opts["maxOffsetsPerTrigger"] = str(args.max_offsets)
    sink_opts = {"kafka.bootstrap.servers": args.bootstrap, "topic": args.output,
                 "checkpointLocation": args.checkpoint}
    shown = {**conf, "spark.jars": args.jars, "trigger": args.trigger, "watermark": args.watermark,
             "dedup": "dropDuplicatesWithinWatermark(id)",
             **{f"source.{k}": v for k, v in source_opts.items()}, **{f"sink.{k}": v for k, v in sink_opts.items()}}
    for k, v in sorted(shown.items()):
        print(f"config {k}={v}", flush=True)

    t0 = time.monotonic()
    b = SparkSession.builder.appName("bench-spark-dedup")
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    started_s = time.monotonic() - t0

    events = (spark.readStream.format("kafka").options(**source_opts).load()
              .withColumn("id", F.get_json_object(F.col("value").cast("string"), "$.id"))
              .withWatermark("timestamp", args.watermark)
              .dropDuplicatesWithinWatermark(["id"])
              .select("key", "value"))
    writer = events.writeStream.format("kafka").options(**sink_opts)
    writer = writer.trigger(availableNow=True) if args.trigger == "available-now" else \
        writer.trigger(processingTime=args.trigger)
    query = writer.start()
    rows = batches = 0
    first_batch_s = None
    batch_ms = 0
    seen = set()
    while True:
        ended = query.awaitTermination(0.2)
        for p in query.recentProgress:
            p = p if isinstance(p, dict) else json.loads(p.json)
            if p["batchId"] in seen or not p["numInputRows"]:
                continue  # seen already, or an idle trigger
            seen.add(p["batchId"])
            if first_batch_s is None:
                first_batch_s = time.monotonic() - t0
            ms = p["durationMs"].get("triggerExecution", 0)
            rows += p["numInputRows"]
            batches += 1
            batch_ms += ms
            print("progress " + json.dumps({"batch": p["batchId"], "rows": p["numInputRows"], "ms": ms}), flush=True)
        if ended:
            break
    print("ended", flush=True)  # the harness stops its clock here
    spark.stop()
    # The JVM (pyspark's gateway) exits when its stdin closes: wait for it, so its CPU time
    # lands in this process's children rusage.
    gw = SparkContext._gateway
    proc = getattr(gw, "proc", None)
    if proc is not None:
        proc.stdin.close()
        proc.wait(60)
    print("done " + json.dumps({"rows": rows, "batches": batches, "spark_start_s": round(started_s, 2),
                                "first_batch_s": first_batch_s, "batch_s": batch_ms / 1000,
                                "seconds": time.monotonic() - t0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
