"""Dedup worker (exactly-once) vs a plain at-least-once copier: same broker, same data, one run.

Both read the same preloaded source topic (with duplicates) from the start and run as their
own processes; each is timed from process start until its consumer group's committed offsets
reach the end of the source, and its CPU time is taken from the kernel (wait4 rusage).
Rounds alternate the two so drift on a shared machine hits both alike.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from eopipe.verify import wait_for_group

REPO = Path(__file__).resolve().parents[1]


def run_contestant(cmd: list[str], bootstrap: str, group: str, source: str,
                   log: Path, timeout: float = 600) -> dict:
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO)

    def alive():
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}; see {log}")
    try:
        seconds = wait_for_group(bootstrap, group, source, timeout, stop=alive)
    finally:
        proc.send_signal(signal.SIGTERM)
    _, status, ru = os.wait4(proc.pid, 0)
    return {"seconds": seconds, "cpu_seconds": ru.ru_utime + ru.ru_stime, "max_rss_mb": ru.ru_maxrss / 1024}


def bench(bootstrap: str, workdir: Path, records: int = 200_000, partitions: int = 4,
          rounds: int = 2, progress=print) -> list[dict]:
    from eopipe.loadgen import run_load

    admin = AdminClient({"bootstrap.servers": bootstrap})
    run_id = uuid.uuid4().hex[:6]
    source = f"bench-src-{run_id}"
    admin.create_topics([NewTopic(source, partitions, 1)])[source].result(30)
    progress(f"preloading {records} records (20% resends) into {source}")
    stats = run_load(bootstrap, source, records, dup_ratio=0.2, wrong_partition_ratio=0.0, seed=11)
    total = stats["records"]

    rows = {"plain copy (at-least-once)": [], "dedup worker (exactly-once)": []}
    py = str(REPO / ".venv" / "bin" / "python")
    for r in range(rounds):
        for name in rows:
            out = f"bench-out-{run_id}-{r}-{len(rows[name])}-{'copy' if 'copy' in name else 'dedup'}"
            dlq = out + ".dlq"
            admin.create_topics([NewTopic(t, partitions, 1) for t in (out, dlq)])[out].result(30)
            if "copy" in name:
                group = f"bench-copy-{out}"
                cmd = [py, "-m", "bench.copier", "--bootstrap", bootstrap, "--source", source,
                       "--output", out, "--group", group]
            else:
                pipeline = out
                group = f"bench.{pipeline}.dedup"
                cmd = [py, "-m", "eopipe.cli", "dedup", "--bootstrap", bootstrap,
                       "--source-topic", source, "--output-topic", out, "--dlq-topic", dlq,
                       "--pipeline", pipeline, "--namespace", "bench",
                       "--partitions", ",".join(str(p) for p in range(partitions)),
                       "--state-dir", str(workdir / out), "--http-port", "0"]
            progress(f"round {r + 1}/{rounds}: {name}")
            rows[name].append(run_contestant(cmd, bootstrap, group, source, workdir / f"{out}.log"))
    result = []
    for name, runs in rows.items():
        best = min(runs, key=lambda x: x["seconds"])
        result.append({"name": name, "records": total, "seconds": best["seconds"],
                       "records_per_s": total / best["seconds"],
                       "cpu_us_per_record": best["cpu_seconds"] / total * 1e6,
                       "max_rss_mb": best["max_rss_mb"], "unique": stats["unique"]})
    return result


def table(rows: list[dict]) -> str:
    head = f"{'benchmark':32} {'records':>9} {'seconds':>8} {'records/s':>10} {'CPU µs/rec':>11} {'RSS MB':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['name']:32} {r['records']:>9} {r['seconds']:>8.2f} {r['records_per_s']:>10,.0f} "
                     f"{r['cpu_us_per_record']:>11.1f} {r['max_rss_mb']:>7.0f}")
    copy, dedup = rows[0], rows[1]
    lines.append(f"ratio dedup/copy (records/s): {dedup['records_per_s'] / copy['records_per_s']:.2f}")
    return "\n".join(lines)
