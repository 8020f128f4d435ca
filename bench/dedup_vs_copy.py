"""Dedup worker (exactly-once) vs a plain at-least-once copier, and the peers: same broker, same
records, one run, one table with ratios against eopipe.

Contestants (bench/contestants.py says how each is started and timed): the Python plain copier
(bench/copier.py), the same copier in C on the same librdkafka (bench/peers/ccopy.c: what the
client library alone costs) and eopipe's dedup worker always; with peers, also a Java plain copier and a
Java transactional copier (the at-least-once and exactly-once ceilings without dedup), Kafka
Streams dedup with exactly_once_v2 (bench/peers/, a windowed store per the tutorial) and Spark's
dropDuplicatesWithinWatermark with the RocksDB state store and the Kafka sink.

All read the same preloaded source topic (with 20% resends) from the start, each as its own
process writing its own output topic; each is timed from process start until its consumer group
has committed the end of the source (Spark: until its availableNow query ended), with CPU time
from the kernel (wait4 rusage) and peak RSS from /proc (bench/contestants.py). Steady state,
apart from process start and the last commit: while a contestant with a consumer group runs, a
sampler reads its group's committed offsets and its process's CPU time (/proc) every 20 ms;
records/s and CPU per record are the slope between the samples where 10% and 90% of the source
were first committed. Rounds alternate the contestants so drift on a shared machine hits all
alike; the best round counts (by steady records/s where there is one). The best round's output
of each contestant is then read back by eopipe verify (keys = the JSON field `id`): the dedup
contestants must hold each key once, the copiers every record. With peers, Spark's duplicates
after a driver SIGKILL follow (bench/spark_kill.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench import contestants as cs
from bench.common import say, standalone
from eopipe.core.kafkaconf import OFFSETS_NOW
from eopipe.core.keys import KeySpec
from eopipe.tools.verify import verify

REPO = Path(__file__).resolve().parents[1]
# Issue goals for the dedup loop, steady state, keyed by record key and by a JSON field.
GOAL_RATIO = 0.85    # of the plain copier's records/s in the same run
GOAL_CPU_US = 4.0    # CPU per record


def bench(bootstrap: str, workdir: Path, records: int = 200_000, partitions: int = 4,
          rounds: int = 2, progress=print, peers: bool = False, spark_kill: bool = True) -> dict:
    """{"rows": one per contestant (the Python copier first, eopipe second), "spark_kill": ...}."""
    from eopipe.tools.loadgen import run_load

    chosen = [c for c in cs.ALL if peers or not c.peer]
    tools = cs.tools_for(chosen)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    run_id = uuid.uuid4().hex[:6]
    source = f"bench-src-{run_id}"
    admin.create_topics([NewTopic(source, partitions, 1)])[source].result(30)
    progress(f"preloading {records} records (20% resends) into {source}")
    # The id at the top level for the peers and verify, and nested for the JSON-keyed dedup row.
    stats = run_load(bootstrap, source, records, dup_ratio=0.2, wrong_partition_ratio=0.0, seed=11,
                     id_at=("id", "user.id"))
    total = stats["records"]

    runs: dict[str, list[dict]] = {c.id: [] for c in chosen}
    for r in range(rounds):
        for c in chosen:
            out = f"bench-out-{run_id}-{r}-{c.id}"
            futs = admin.create_topics([NewTopic(t, partitions, 1) for t in (out, out + ".dlq")])
            for f in futs.values():
                f.result(30)
            progress(f"round {r + 1}/{rounds}: {c.name}")
            _, group = cs.command(c, bootstrap, source, out, workdir, partitions, tools)
            sampler = Sampler(bootstrap, group, source, partitions, out) if group else None
            try:
                run = cs.run(c, bootstrap, source, out, workdir, partitions, tools)
            finally:
                samples = sampler.finish() if sampler else []
            runs[c.id].append(dict(run, output=out, **steady(samples, sampler.end if sampler else 0, total)))

    rows = []
    for c in chosen:
        best = min(runs[c.id], key=lambda x: (-(x["steady_records_per_s"] or 0), x["seconds"]))
        progress(f"verifying the output of {c.name}")
        rep = verify(bootstrap, source, best["output"], key_spec=KeySpec.parse("json:id"), settle=2,
                     timeout=300, count_aborted=False)
        rows.append({"id": c.id, "name": c.name, "guarantee": c.guarantee, "dedups": c.dedups, "peer": c.peer,
                     "records": total, "unique": stats["unique"], "seconds": best["seconds"],
                     "records_per_s": total / best["seconds"],
                     "cpu_us_per_record": best["cpu_seconds"] / total * 1e6, "max_rss_mb": best["max_rss_mb"],
                     "steady_records_per_s": best["steady_records_per_s"],
                     "steady_cpu_us_per_record": best["steady_cpu_us_per_record"],
                     "steady_by_round": [x["steady_records_per_s"] for x in runs[c.id]],
                     "out": rep.out, "duplicated": rep.duplicated, "lost": rep.lost,
                     "config": cs.config_lines(best["log"])})
    eo = rows[1]
    for row in rows:
        row["vs_eopipe"] = row["records_per_s"] / eo["records_per_s"]
        row["cpu_vs_eopipe"] = row["cpu_us_per_record"] / eo["cpu_us_per_record"]
    result = {"source": source, "records": total, "unique": stats["unique"], "partitions": partitions, "rounds": rounds,
              "rows": rows, "spark_kill": None}
    if peers and spark_kill:
        from bench import spark_kill as sk

        out = f"bench-out-{run_id}-spark-kill"
        admin.create_topics([NewTopic(out, partitions, 1)])[out].result(30)
        result["spark_kill"] = sk.bench(bootstrap, workdir, source, out, partitions, stats["unique"],
                                        progress=progress)
    return result


def bench_sizes(bootstrap: str, workdir: Path, records: int, sizes: list[int], progress=print,
                **kw) -> dict:
    """bench() at `records` (with the peers if asked), then again alone at each other size of
    `sizes`; the result of the first, with `sizes`: each size's rows by its record count."""
    result = bench(bootstrap, workdir, records=records, progress=progress, **kw)
    result["sizes"] = {str(records): result["rows"]}
    result["others"] = []
    for n in sizes:
        if str(n) not in result["sizes"]:
            progress(f"the dedup loop against the copier at {n:,} records")
            more = bench(bootstrap, workdir, records=n, progress=progress, **{**kw, "peers": False})
            result["sizes"][str(n)] = more["rows"]
            result["others"].append(more)
    return result


class Sampler(threading.Thread):
    """(seconds, committed offsets of `group` on `topic`, CPU seconds of the contestant's process)
    every 20 ms while the contestant runs. The process is the child of this one whose command
    line names `output` (each contestant writes a topic of its own)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int, output: str):
        super().__init__(daemon=True)
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                  **OFFSETS_NOW})
        self.end = sum(self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in self.tps)
        self.output = output.encode()
        self.samples: list[tuple[float, int, float]] = []
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        pid = None
        while not self.done.wait(0.02):
            pid = pid or _child_naming(self.output)
            if pid is None:
                continue
            try:
                committed = sum(max(0, tp.offset) for tp in self.consumer.committed(self.tps, timeout=5))
                cpu = _cpu_seconds(pid)
            except Exception:  # noqa: BLE001 - the process ended or the broker was slow: no sample
                continue
            self.samples.append((time.monotonic(), committed, cpu))
            if committed >= self.end:
                break

    def finish(self) -> list[tuple[float, int, float]]:
        self.done.set()
        self.join()
        self.consumer.close()
        return self.samples


def _child_naming(marker: bytes) -> int | None:
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid == me and marker in Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0"):
                return int(d)
        except (OSError, ValueError, IndexError):
            continue
    return None


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all its threads)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def steady(samples: list[tuple[float, int, float]], end: int, records: int,
           lo: float = 0.1, hi: float = 0.9) -> dict:
    """Records/s and CPU µs/record between the first samples at or past `lo` and `hi` of the
    source's `end` offsets (holding `records` records) committed; None where the run was too
    short to tell."""
    none = {"steady_records_per_s": None, "steady_cpu_us_per_record": None}
    if not samples or end <= 0:
        return none
    a = next((s for s in samples if s[1] >= lo * end), None)
    b = next((s for s in samples if s[1] >= hi * end), None)
    if a is None or b is None or b[1] <= a[1] or b[0] <= a[0]:
        return none
    records = (b[1] - a[1]) * records / end
    return {"steady_records_per_s": records / (b[0] - a[0]),
            "steady_cpu_us_per_record": (b[2] - a[2]) / records * 1e6}


def table(result: dict) -> str:
    head = (f"{'contestant':40} {'guarantee':18} {'records/s':>10} {'x eopipe':>8} {'CPU µs/rec':>10} "
            f"{'x eopipe':>8} {'steady/s':>9} {'µs/rec':>6} {'RSS MB':>7} {'out':>8} {'dup keys':>8}")
    lines = [head, "-" * len(head)]

    def opt(v, fmt):
        return format(v, fmt) if v is not None else "-"
    for r in result["rows"]:
        lines.append(f"{r['name']:40} {r['guarantee']:18} {r['records_per_s']:>10,.0f} {r['vs_eopipe']:>8.2f} "
                     f"{r['cpu_us_per_record']:>10.1f} {r['cpu_vs_eopipe']:>8.2f} "
                     f"{opt(r.get('steady_records_per_s'), '>9,.0f'):>9} "
                     f"{opt(r.get('steady_cpu_us_per_record'), '>6.1f'):>6} {r['max_rss_mb']:>7.0f} "
                     f"{r['out']:>8,} {r['duplicated']:>8,}")
    rows = result["rows"]
    lines.append(f"{result['records']:,} records ({result['unique']:,} unique ids), {result['partitions']} "
                 f"partitions, best of {result['rounds']}; out/dup keys: the best run's output read back by "
                 f"eopipe verify (a copier copies the resends, so its dup keys are the source's)")
    lines.append("steady/s, µs/rec: from 10% to 90% of the source committed (process start and the last "
                 "commit left out)")
    lines.append(f"ratio dedup/copy (records/s): {rows[1]['records_per_s'] / rows[0]['records_per_s']:.2f}")
    for r in rows[1:]:
        if r["dedups"] and not r["peer"] and r.get("steady_records_per_s") and rows[0].get("steady_records_per_s"):
            lines.append(f"steady ratio {r['id']}/copy: {r['steady_records_per_s'] / rows[0]['steady_records_per_s']:.2f}"
                         f" (goal >= {GOAL_RATIO}), CPU {r['steady_cpu_us_per_record']:.1f} vs "
                         f"{rows[0]['steady_cpu_us_per_record']:.1f} µs/record (goal <= {GOAL_CPU_US})")
    c = next((r for r in rows if r["id"] == "c_copy" and r.get("steady_cpu_us_per_record")), None)
    if c:
        lines.append(f"the client library alone (the copier's loop in C, the same librdkafka): CPU "
                     f"{c['steady_cpu_us_per_record']:.1f} µs/record steady")
    if result.get("spark_kill"):
        from bench import spark_kill

        lines.append(spark_kill.table(result["spark_kill"]))
    for more in result.get("others") or []:
        lines += ["", table(more)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--records", type=int, default=200_000, help="records in the source (default 200000)")
        ap.add_argument("--rounds", type=int, default=2, help="rounds per contestant (default 2)")
        ap.add_argument("--peers", action="store_true", help="also the Java, Kafka Streams and Spark peers")
        ap.add_argument("--no-spark-kill", action="store_true", help="with --peers: skip the Spark SIGKILL run")
    return standalone("bench.dedup_vs_copy", __doc__, options, table, argv, lambda bootstrap, work, a: bench(
        bootstrap, work, records=a.records, rounds=a.rounds, progress=say, peers=a.peers,
        spark_kill=not a.no_spark_kill))


if __name__ == "__main__":
    sys.exit(main())
