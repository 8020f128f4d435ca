"""Dedup worker (exactly-once) vs a plain at-least-once copier, and the peers: same broker, same
records, one run, one table with ratios against eopipe.

Contestants (bench/contestants.py says how each is started and timed): the Python plain copier
(bench/copier.py) and eopipe's dedup worker always; with peers, also a Java plain copier and a
Java transactional copier (the at-least-once and exactly-once ceilings without dedup), Kafka
Streams dedup with exactly_once_v2 (bench/peers/, a windowed store per the tutorial) and Spark's
dropDuplicatesWithinWatermark with the RocksDB state store and the Kafka sink.

All read the same preloaded source topic (with 20% resends) from the start, each as its own
process writing its own output topic; each is timed from process start until its consumer group
has committed the end of the source (Spark: until its availableNow query ended), with CPU time
and peak RSS from the kernel (wait4 rusage). Rounds alternate the contestants so drift on a
shared machine hits all alike; the best round counts. The best round's output of each
contestant is then read back by eopipe verify (keys = the JSON field `id`): the dedup
contestants must hold each key once, the copiers every record. With peers, Spark's duplicates
after a driver SIGKILL follow (bench/spark_kill.py).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from bench import contestants as cs
from bench.common import say, standalone
from eopipe.core.keys import KeySpec
from eopipe.tools.verify import verify

REPO = Path(__file__).resolve().parents[1]


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
            runs[c.id].append(dict(cs.run(c, bootstrap, source, out, workdir, partitions, tools), output=out))

    rows = []
    for c in chosen:
        best = min(runs[c.id], key=lambda x: x["seconds"])
        progress(f"verifying the output of {c.name}")
        rep = verify(bootstrap, source, best["output"], key_spec=KeySpec.parse("json:id"), settle=2,
                     timeout=300, count_aborted=False)
        rows.append({"id": c.id, "name": c.name, "guarantee": c.guarantee, "dedups": c.dedups, "peer": c.peer,
                     "records": total, "unique": stats["unique"], "seconds": best["seconds"],
                     "records_per_s": total / best["seconds"],
                     "cpu_us_per_record": best["cpu_seconds"] / total * 1e6, "max_rss_mb": best["max_rss_mb"],
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


def table(result: dict) -> str:
    head = (f"{'contestant':40} {'guarantee':18} {'records/s':>10} {'x eopipe':>8} {'CPU µs/rec':>10} "
            f"{'x eopipe':>8} {'RSS MB':>7} {'out':>8} {'dup keys':>8}")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(f"{r['name']:40} {r['guarantee']:18} {r['records_per_s']:>10,.0f} {r['vs_eopipe']:>8.2f} "
                     f"{r['cpu_us_per_record']:>10.1f} {r['cpu_vs_eopipe']:>8.2f} {r['max_rss_mb']:>7.0f} "
                     f"{r['out']:>8,} {r['duplicated']:>8,}")
    rows = result["rows"]
    lines.append(f"{result['records']:,} records ({result['unique']:,} unique ids), {result['partitions']} "
                 f"partitions, best of {result['rounds']}; out/dup keys: the best run's output read back by "
                 f"eopipe verify (a copier copies the resends, so its dup keys are the source's)")
    lines.append(f"ratio dedup/copy (records/s): {rows[1]['records_per_s'] / rows[0]['records_per_s']:.2f}")
    if result.get("spark_kill"):
        from bench import spark_kill

        lines.append(spark_kill.table(result["spark_kill"]))
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
