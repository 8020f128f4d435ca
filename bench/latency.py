"""End-to-end latency of the Spark stage: produce -> exactly-once Kafka sink, trigger 1 s.

One broker, one spark_app driver (`python -m spark_app.main`, local[2,4]) running the
pass-through SQL with the transactional sink. After a warm-up (the first micro-batch pays for
JVM and Python worker start-up), events are produced at each rate in turn; a read_committed
consumer on the sink topic takes, for every record, the time it became visible minus its
produce time (the event's `ts`, set when it was produced). Same machine, same clock.

What the numbers contain: waiting for the next trigger (0..1 s), the micro-batch (Kafka read,
the SQL, one transaction per task with its marker), and the transaction commit becoming
visible to read_committed readers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.common import percentile, say, standalone


class _SinkWatcher(threading.Thread):
    """Consumes the sink topic (read_committed) and records latency per event id."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-lat-{uuid.uuid4().hex}",
                           "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        self.c.subscribe([topic])
        self.latency_ms: dict[str, float] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                # consume(n, timeout) waits for n records OR the timeout: wake on the first
                # record, then take what is already there, so the clock stops on arrival.
                msgs = self.c.consume(1, timeout=0.1)
                msgs += self.c.consume(999, timeout=0) if msgs else []
                for m in msgs:
                    if m.error():
                        continue
                    now = time.time() * 1000
                    v = json.loads(m.value())
                    self.latency_ms.setdefault(v["id"], now - v["ts"])
        finally:
            self.c.close()


def bench(bootstrap: str, workdir: Path, rates: tuple[int, ...] = (100, 1000), seconds: float = 20,
          trigger: str = "1s", progress=print, driver_log: Path | None = None) -> list[dict]:
    from eopipe.tools.loadgen import run_load
    from localenv.fixtures_spark import ensure_spark_jars
    from localenv.sparkrunner import DriverProcess

    run_id = uuid.uuid4().hex[:6]
    src, out, commits = f"lat-{run_id}.deduped", f"lat-{run_id}-out", f"lat-{run_id}.commits"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics([NewTopic(src, 4, 1), NewTopic(out, 4, 1),
                                NewTopic(commits, 1, 1, config={"cleanup.policy": "compact"})])
    for f in futs.values():
        f.result(30)
    config = {"pipeline": f"lat-{run_id}", "namespace": "bench", "bootstrap": bootstrap,
              "source_topic": src, "trigger": trigger, "checkpoint_location": str(workdir / f"ck-{run_id}"),
              "sink": {"kind": "kafka", "topic": out, "commit_topic": commits}}
    env = {**os.environ, "EOPIPE_SPARK_JARS": str(ensure_spark_jars()), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    if driver_log:  # per-batch durations and per-task sink timings in the driver's log
        env.update(EOPIPE_SPARK_PROGRESS_LOG="1", EOPIPE_SPARK_SINK_DEBUG="1")
    driver = DriverProcess([sys.executable, "-m", "spark_app.main", "--config-json", json.dumps(config)],
                           env, workdir / f"latency-{run_id}.log")
    watcher = _SinkWatcher(bootstrap, out)
    watcher.start()
    rows = []
    try:
        driver.start()
        deadline = time.monotonic() + 180
        while not driver.query_running():
            if not driver.alive or time.monotonic() > deadline:
                raise RuntimeError(f"spark_app did not start:\n{driver.tail(30, meaningful=True)}")
            time.sleep(0.2)
        progress("warming up (first batches start the Python workers and producers)")
        warm = run_load(bootstrap, src, 200, dup_ratio=0.0, wrong_partition_ratio=0.0, rate=50, seed=1)
        while len(watcher.latency_ms) < warm["unique"] and time.monotonic() < deadline:
            time.sleep(0.2)
        for rate in rates:
            before = set(watcher.latency_ms)
            count = int(rate * seconds)
            progress(f"{count} events at {rate}/s")
            stats = run_load(bootstrap, src, count, dup_ratio=0.0, wrong_partition_ratio=0.0,
                             rate=rate, seed=rate)
            wait_until = time.monotonic() + 60
            while len(watcher.latency_ms) - len(before) < stats["unique"] and time.monotonic() < wait_until:
                time.sleep(0.2)
            lat = sorted(v for k, v in watcher.latency_ms.items() if k not in before)
            rows.append({"name": f"kafka sink (exactly-once), trigger {trigger}", "rate": rate,
                         "records": len(lat), "sent": stats["unique"],
                         "p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
                         "max_ms": lat[-1] if lat else float("nan")})
    finally:
        driver.stop()
        if driver_log:
            shutil.copyfile(driver.log_path, driver_log)
        watcher.halt.set()
        watcher.join(10)
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'benchmark':40} {'rate/s':>7} {'records':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['name']:40} {r['rate']:>7} {r['records']:>8} {r['p50_ms']:>8.0f} "
                     f"{r['p99_ms']:>8.0f} {r['max_ms']:>8.0f}")
        if r["records"] < r["sent"]:
            lines.append(f"  (only {r['records']} of {r['sent']} arrived in time)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--rates", default="100,1000", help="events/s, comma separated (default 100,1000)")
        ap.add_argument("--seconds", type=float, default=20, help="seconds per rate (default 20)")
        ap.add_argument("--driver-log", type=Path, help="log each micro-batch's durations and the "
                        "sink's per-task timings, and copy the driver's log here")
    return standalone("bench.latency", __doc__, options, table, argv, lambda bootstrap, work, a: bench(
        bootstrap, work, rates=tuple(int(r) for r in a.rates.split(",")), seconds=a.seconds, progress=say,
        driver_log=a.driver_log))


if __name__ == "__main__":
    sys.exit(main())
