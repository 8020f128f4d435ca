"""Throughput of the dedup worker with 1, 2 and 4 dedup pods on 4 and 16 source partitions.

For each partition count P (--partitions, default 4,16), a source topic with P partitions is
preloaded with `records` records (default 200,000; eopipe.tools.loadgen, 20% resends, keys on
their home partition) and read by every pod count k (--pods, default 1,2,4) in turn. Each run
is a new pipeline (its own consumer group, transactional ids, output and DLQ topics with P
partitions, and empty state directories): k worker processes (`python -m eopipe.dedup`, as a
dedup pod runs it) follow an assignment file that spreads the P partitions over them as the
operator does (eopipe.core.assignment.assign: P/k each, round-robin). Measured per run:
  seconds        from the moment the first worker is started until the dedup group's committed
                 offsets (read from Kafka every 0.05 s) reach the end of every source partition;
                 records/s = records / seconds, start-up included
  start-up s     until every worker reports every partition of its own "running" (/status)
  steady rec/s   the records committed after that, over the time after that: start-up
                 (interpreter, clients, RocksDB, init_transactions) excluded. Partitions come up
                 one by one and the first ones work while the others start: when less than half
                 of the records were left at that point, it is "-": what is left is too little and
                 too unevenly spread to time (16 partitions took 2.7 to 3.5 s to come up on a busy
                 2-core machine, most of a 200,000-record run; a larger --records leaves more)
  CPU µs/rec     user + system CPU of the worker processes (/proc/<pid>/stat, read at the end,
                 before they are stopped) per record; the steady one counts only the CPU spent
                 after start-up, per record committed after it
  x 1 pod        records/s (and steady rec/s) over the 1-pod run's at the same partition count
The output is then read back by eopipe verify (keys = the record key, as the workers dedup by
default; loadgen's record key is the event id): lost, duplicated, unexpected and out of order
must be 0, else the run fails (--verify largest: only the most pods on the most partitions).

One local broker and all the pods share this machine: on 2 cores, 2 and 4 pods compete for the
same 2 cores with each other and with the broker (the source is preloaded: no producer runs
while a run is timed), so the table shows what one machine can do, the per-machine bound, not
how the pods of a cluster scale with a node each.

    python -m bench.scale [--pods 1,2,4] [--partitions 4,16] [--records N] [--verify all|largest]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bench.common import Worker, create_topics, positive_ints, say, standalone, verified, wait, write_json
from eopipe.core.kafkaconf import OFFSETS_NOW
from eopipe.core.names import consumer_group

POLL = 0.05  # seconds between samples of the group's offsets: the timing's resolution
MIN_STEADY_SHARE = 0.5  # of the records, left after start-up for a steady rate to be shown
TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ pure: runs in, rows out

def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def rows(results: list[dict]) -> list[dict]:
    """One row per run, by partitions then pods, with rates, CPU per record and the speed-up
    over the 1-pod run at the same partition count (None without one). A run: partitions,
    pods, records, seconds, startup_s, steady_records, cpu_s, steady_cpu_s (None: unknown).
    No steady rate when start-up overlapped most of the run (MIN_STEADY_SHARE)."""
    out = []
    for r in sorted(results, key=lambda r: (r["partitions"], r["pods"])):
        steady_s = r["seconds"] - r["startup_s"] if r.get("startup_s") is not None else None
        steady_n = r.get("steady_records")
        measured = bool(steady_s and steady_s > 0 and steady_n and steady_n >= MIN_STEADY_SHARE * r["records"])
        out.append({"partitions": r["partitions"], "pods": r["pods"], "records": r["records"],
                    "seconds": r["seconds"], "records_per_s": r["records"] / r["seconds"],
                    "startup_s": r.get("startup_s"),
                    "steady_records_per_s": steady_n / steady_s if measured else None,
                    "cpu_us_per_record": _ratio(r.get("cpu_s"), r["records"] / 1e6),
                    "steady_cpu_us_per_record": _ratio(r.get("steady_cpu_s"), steady_n / 1e6) if measured else None})
    one = {r["partitions"]: r for r in out if r["pods"] == 1}
    for r in out:
        base = one.get(r["partitions"])
        r["speedup"] = _ratio(r["records_per_s"], base and base["records_per_s"])
        r["steady_speedup"] = _ratio(r["steady_records_per_s"], base and base["steady_records_per_s"])
    return out


COLUMNS = (("partitions", "partitions", "{:d}"), ("pods", "pods", "{:d}"), ("seconds", "seconds", "{:.1f}"),
           ("records/s", "records_per_s", "{:,.0f}"), ("x 1 pod", "speedup", "{:.2f}"),
           ("start-up s", "startup_s", "{:.1f}"), ("steady rec/s", "steady_records_per_s", "{:,.0f}"),
           ("x 1 pod", "steady_speedup", "{:.2f}"), ("CPU µs/rec", "cpu_us_per_record", "{:.0f}"),
           ("steady CPU µs/rec", "steady_cpu_us_per_record", "{:.0f}"))


def rows_table(rows: list[dict]) -> str:
    head = "".join(f"{name:>{max(len(name) + 2, 10)}}" for name, _, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append("".join(f"{'-' if r.get(key) is None else fmt.format(r[key]):>{max(len(name) + 2, 10)}}"
                             for name, key, fmt in COLUMNS))
    return "\n".join(lines)


def table(result: dict) -> str:
    """The table with what it is of: what `python -m bench.scale` prints."""
    checked = [v for v in result["runs"] if v.get("verify")]
    head = (f"dedup throughput by pods, {result['records']:,} records ({result['unique']:,} unique ids) per run, "
            f"one local broker, {result['cores']} cores for everything")
    notes = ("seconds and records/s from the workers' start until the group committed the end of every "
             "partition; steady: after every partition runs (-: less than half of the records were left then)")
    checks = (f"eopipe verify: the output of {len(checked)} of {len(result['runs'])} runs read back: lost 0, "
              "duplicated 0, unexpected 0, out of order 0")
    return "\n".join([head, rows_table(result["rows"]), notes, checks])


# ------------------------------------------------------------------ the run

class Committed:
    """The dedup group's committed offsets on every partition of the source, read from Kafka
    (bench.common.GroupLag for P partitions)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int):
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                           **OFFSETS_NOW})

    def offsets(self, timeout: float = 5) -> list[int] | None:
        """Per partition (0 before the first commit); None while Kafka cannot answer (a
        coordinator loading)."""
        try:
            return [max(tp.offset, 0) for tp in self.c.committed(self.tps, timeout=timeout)]
        except KafkaException:
            return None

    def ends(self, timeout: float = 10) -> list[int]:
        # The source was written without transactions: its high watermarks are its ends.
        return [self.c.get_watermark_offsets(tp, timeout=timeout, cached=False)[1] for tp in self.tps]

    def close(self) -> None:
        self.c.close()


def cpu_seconds(w: Worker) -> float:
    """User + system CPU of the worker process so far, all its threads (/proc/<pid>/stat)."""
    stat = Path(f"/proc/{w.proc.pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": fields 3..
    return (int(fields[11]) + int(fields[12])) / TICK


def _alive(workers: list[Worker]) -> None:
    for w in workers:
        if w.proc.poll() is not None:
            raise RuntimeError(f"worker {w.name} exited with {w.proc.returncode}; see {w.log}")


def _timed(workers: list[Worker], owned: dict[str, list[int]], lag: Committed, ends: list[int], t0: float,
           timeout: float) -> dict:
    """Samples until the group committed every end: seconds, start-up and CPU (see the docstring)."""
    startup = base = cpu_ready = None
    while True:
        now = time.monotonic()
        if now - t0 > timeout:
            raise TimeoutError(f"not done after {timeout:.0f}s: committed {lag.offsets()} of {ends}")
        _alive(workers)
        if startup is None and all(w.running(p, 1) for w in workers for p in owned[w.name]):
            startup = now - t0
            cpu_ready = sum(cpu_seconds(w) for w in workers)
            base = sum(wait(lag.offsets, 60, "committed offsets at start-up"))
        offsets = lag.offsets(timeout=2)
        if offsets is not None and all(o >= e for o, e in zip(offsets, ends)):
            seconds = time.monotonic() - t0
            cpu = sum(cpu_seconds(w) for w in workers)  # before SIGTERM: shutdown not counted
            break
        time.sleep(POLL)
    return {"seconds": seconds, "startup_s": startup, "cpu_s": cpu,
            "steady_records": sum(ends) - base if base is not None else None,
            "steady_cpu_s": cpu - cpu_ready if cpu_ready is not None else None}


def run_once(bootstrap: str, workdir: Path, source: str, ends: list[int], pods: int, *,
             check: bool, timeout: float, progress=say) -> dict:
    """One pipeline of `pods` workers over the preloaded `source`, timed, then verified if `check`."""
    from eopipe.core.assignment import Assignment, assign

    partitions, run_id = len(ends), uuid.uuid4().hex[:6]
    pipeline, out, dlq = f"sc{run_id}", f"scale-out-{run_id}", f"scale-dlq-{run_id}"
    create_topics(bootstrap, (out, dlq), partitions=partitions)
    work = workdir / f"scale-{partitions}p-{pods}w-{run_id}"
    work.mkdir(parents=True)
    names = [f"w{i}" for i in range(pods)]
    a = Assignment(1, assign(partitions, names), partition_count=partitions)
    path = work / "assignment.json"
    write_json(path, a.to_json())
    owned = {n: a.partitions_of(n) for n in names}
    progress(f"scale: {partitions} partitions, {pods} pod{'s' * (pods > 1)}: {owned}")
    lag = Committed(bootstrap, consumer_group("bench", pipeline), source, partitions)  # Worker's group
    # The first offset fetch finds the group coordinator (~1 s): before the clock starts, not
    # inside the first sample after start-up.
    wait(lag.offsets, 60, "the group coordinator")
    workers: list[Worker] = []
    try:
        t0 = time.monotonic()
        for n in names:
            workers.append(Worker(n, bootstrap, (source, out, dlq), path, work, pipeline))
        timing = _timed(workers, owned, lag, ends, t0, timeout)
    finally:
        lag.close()
        for w in workers:  # every one, even when another one's stop fails
            try:
                w.stop()
            except Exception as e:  # noqa: BLE001 - the others must still be stopped
                progress(f"scale: stopping {w.name} failed: {e}")
    result = {"partitions": partitions, "pods": pods, "records": sum(ends), **timing, "output": out,
              "owned": owned, "verify": None}
    up = timing["startup_s"]  # None if the end came before every partition was seen running
    progress(f"scale: {partitions}x{pods}: {sum(ends) / timing['seconds']:,.0f} records/s in "
             f"{timing['seconds']:.1f}s (start-up {'-' if up is None else f'{up:.1f}'}s)")
    if check:
        progress(f"scale: verifying {out}")
        result["verify"] = verified(bootstrap, source, out, "key", dlq=dlq, count_aborted=False)
    for w in workers:  # the logs stay until the work directory goes
        shutil.rmtree(w.state, ignore_errors=True)
    return result


def bench(bootstrap: str, workdir: Path, pods: tuple[int, ...] = (1, 2, 4), partitions: tuple[int, ...] = (4, 16),
          records: int = 200_000, verify: str = "all", timeout: float = 1800, progress=say) -> dict:
    from eopipe.tools.loadgen import run_load

    runs, unique = [], 0
    largest = (max(partitions), max(pods))
    for p in partitions:
        source = f"scale-src-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, (source,), partitions=p)
        progress(f"scale: preloading {records:,} records (20% resends) into {p} partitions of {source}")
        stats = run_load(bootstrap, source, records, dup_ratio=0.2, wrong_partition_ratio=0.0, seed=11)
        unique = stats["unique"]
        ends = _ends(bootstrap, source, p)
        if sum(ends) != stats["records"]:
            raise RuntimeError(f"{source} holds {sum(ends)} records, {stats['records']} were sent")
        for k in pods:
            runs.append(run_once(bootstrap, workdir, source, ends, k, check=verify == "all" or (p, k) == largest,
                                 timeout=timeout, progress=progress))
    return {"records": records, "unique": unique, "cores": os.cpu_count(), "pods": list(pods),
            "partitions": list(partitions), "runs": runs, "rows": rows(runs)}


def _ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    reader = Committed(bootstrap, f"scale-ends-{uuid.uuid4().hex[:6]}", topic, partitions)
    try:
        return reader.ends()
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--pods", type=positive_ints, default=(1, 2, 4), help="dedup pods per run (default 1,2,4)")
        ap.add_argument("--partitions", type=positive_ints, default=(4, 16),
                        help="source partitions, one preloaded source each (default 4,16)")
        ap.add_argument("--records", type=int, default=200_000,
                        help="records per source, resends included (default 200000; 20000 for a quick run)")
        ap.add_argument("--verify", choices=("all", "largest"), default="all",
                        help="runs whose output eopipe verify reads back (default all)")
        ap.add_argument("--timeout", type=float, default=1800, help="seconds per run at most (default 1800)")
    return standalone("bench.scale", __doc__, options, table, argv, lambda bootstrap, work, a: bench(
        bootstrap, work, pods=a.pods, partitions=a.partitions, records=a.records, verify=a.verify,
        timeout=a.timeout))


if __name__ == "__main__":
    sys.exit(main())
