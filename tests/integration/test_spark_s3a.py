"""The Spark stage with its checkpoint on s3a:// in a real S3 service (SeaweedFS's gateway,
localenv/objectstore.py), through hadoop-aws and the AWS SDK (hack/fetch-hadoop-aws.sh):
exactly-once holds across a driver SIGKILL and an object-store outage under load."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eopipe.core.keys import KeySpec
from eopipe.tools.loadgen import run_load
from eopipe.tools.verify import TopicReader, verify
from localenv import REPO_ROOT, daemon
from tests.helpers.sparktopics import Topics

OUTAGE_S = 30
RATE = 40  # records/s: the load (4000, 100 s) outlasts the first driver, its kill and the outage's start


def _sink_count(bootstrap: str, topic: str) -> int:
    return sum(1 for _ in TopicReader(bootstrap).read(topic, timeout=30))


def _keep_running(d) -> int:
    """restartPolicy OnFailure: a driver that exited is started again (1 when it was)."""
    if d.alive:
        return 0
    d.start()
    return 1


def _until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_kafka_sink_with_s3a_checkpoint_is_exact_across_a_driver_kill_and_an_object_store_outage(
        kafka_bootstrap, spark_driver, spark_jars, object_store, tmp_path):
    t = Topics(kafka_bootstrap)
    source, sink, bucket = t.source, t.sink, f"ckpt-{t.pipeline}"
    object_store.client().create_bucket(bucket)  # as a user would, with the S3 API
    aws_jars = daemon.script_output(REPO_ROOT / "hack" / "fetch-hadoop-aws.sh")[-1]
    # The operator's hadoopConf becomes spark.hadoop.*; the credentials come as env (from a Secret).
    config = t.config(tmp_path, checkpoint_location=f"s3a://{bucket}/checkpoint",
                      spark_conf={f"spark.hadoop.{k}": v for k, v in object_store.hadoop_conf().items()})
    jars = ",".join(str(p) for d in (spark_jars, aws_jars) for p in sorted(Path(d).glob("*.jar")))
    d = spark_driver(config, EOPIPE_SPARK_JARS=jars, **object_store.creds.env())

    load: dict = {}
    loader = threading.Thread(target=lambda: load.update(run_load(
        kafka_bootstrap, source, 4000, dup_ratio=0.0, wrong_partition_ratio=0.0, rate=RATE, seed=31)), daemon=True)
    loader.start()
    t_start = time.monotonic()
    d.wait_running()
    _until(lambda: _sink_count(kafka_bootstrap, sink) > 0, 60, "no batch reached the sink")
    keys = object_store.client().keys(bucket, "checkpoint/commits/")
    assert keys, "the checkpoint's commit log is not in the object store"

    print(f"first batches in the sink after {time.monotonic() - t_start:.0f}s")
    d.kill()  # SIGKILL mid-load
    d.start()
    d.wait_running()
    before = _sink_count(kafka_bootstrap, sink)

    # The outage, mid-load: the query stalls (or fails, and is restarted as OnFailure would).
    print(f"outage from {time.monotonic() - t_start:.0f}s, load still running: {loader.is_alive()}")
    object_store.stop()
    t0, restarts = time.monotonic(), 0
    while time.monotonic() - t0 < OUTAGE_S:
        restarts += _keep_running(d)
        time.sleep(1)
    stalled = _sink_count(kafka_bootstrap, sink)
    object_store.start()

    print(f"store back at {time.monotonic() - t_start:.0f}s; sink {before} -> {stalled} while down, {restarts} restarts")
    loader.join(120)
    assert load.get("unique") == 4000, load
    _until(lambda: _keep_running(d) >= 0 and _sink_count(kafka_bootstrap, sink) >= 4000, 150,
           f"the sink did not catch up after the outage: {d.tail(30, meaningful=True)}")
    print(f"caught up at {time.monotonic() - t_start:.0f}s")
    rep = verify(kafka_bootstrap, source, sink, key_spec=KeySpec.parse("json:id"), order=False, settle=3,
                 timeout=120)
    assert rep.ok and rep.lost == 0 and rep.duplicated == 0 and rep.unique_in == 4000, rep.line()
    # The outage was real: the store held progress back while it was down (a few batches may
    # finish from what was read before), and the checkpoint went on in the store afterwards.
    assert stalled - before < RATE * OUTAGE_S / 2, (before, stalled, restarts)
    assert len(object_store.client().keys(bucket, "checkpoint/commits/")) > len(keys)
