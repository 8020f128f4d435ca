"""Spark's own dedup after a driver SIGKILL: are there duplicates in its output?

bench/peers/spark_dedup.py (dropDuplicatesWithinWatermark, RocksDB state, Kafka sink) reads the
benchmark's source in micro-batches of an eighth of it (maxOffsetsPerTrigger). While the sink is
writing (its output topic growing, a third of the way through), the whole driver (Python and
its JVM, one process group) is SIGKILLed, as a lost driver pod would be; then it is restarted
on the same checkpoint with trigger availableNow and runs to the end of the source. The output
is counted by eopipe verify (an independent reader, keys = the JSON field `id`): the micro-batch
that was in flight is run again from the checkpoint, its dedup state rolled back with it, so
the records it had already written arrive twice. Spark's Kafka sink is at-least-once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bench.contestants import REPO, spark_cmd, spark_jars
from eopipe.core.keys import KeySpec
from eopipe.tools.verify import verify


def _count(bootstrap: str, topic: str, partitions: int) -> int:
    """Records in a topic written without transactions: the sum of its high watermarks (0 while
    a new topic has no leader yet)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-spark-kill-count"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                   for p in range(partitions))
    except KafkaException:
        return 0
    finally:
        c.close()


def bench(bootstrap: str, work: Path, source: str, output: str, partitions: int, unique: int,
          progress=print, timeout: float = 600) -> dict:
    jars = spark_jars()
    ck = work / f"{output}.ck"
    batch = max(1, unique * 5 // 4 // 8)  # about 8 micro-batches over the source (20% resends)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    log = work / f"{output}.log"

    def start(trigger: str) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(spark_cmd(bootstrap, source, output, ck, jars, partitions=partitions,
                                              trigger=trigger, max_offsets=batch),
                                    stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)

    progress("spark dedup: run until a third of the output is written, then SIGKILL the driver")
    proc = start("1 second")
    t0 = time.monotonic()
    try:
        last = 0
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"spark dedup exited with {proc.returncode} before the kill; see {log}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"spark dedup wrote {last} of {unique} records in {timeout:.0f}s; see {log}")
            n = _count(bootstrap, output, partitions)
            if n > last and n >= unique // 3:  # growing: a micro-batch is being written
                break
            last = n
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    at_kill = _count(bootstrap, output, partitions)
    progress(f"spark dedup: killed with {at_kill} records written; restarting from the checkpoint")
    proc = start("available-now")
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise TimeoutError(f"spark dedup did not finish after its restart in {timeout:.0f}s; see {log}")
    if proc.returncode != 0:
        raise RuntimeError(f"spark dedup exited with {proc.returncode} after its restart; see {log}")
    rep = verify(bootstrap, source, output, key_spec=KeySpec.parse("json:id"), settle=2, timeout=300,
                 count_aborted=False, order=False)
    return {"name": "Spark dropDuplicatesWithinWatermark after a driver SIGKILL", "unique": rep.unique_in,
            "out": rep.out, "duplicated": rep.duplicated, "lost": rep.lost, "written_at_kill": at_kill,
            "batch_records": batch, "verify": rep.line(), "log": str(log)}


def table(r: dict) -> str:
    return (f"{r['name']}: {r['duplicated']:,} of {r['unique']:,} keys duplicated, {r['lost']} lost "
            f"(killed with {r['written_at_kill']:,} records written, batches of {r['batch_records']:,}; "
            f"{r['verify']})")
