"""Handoff of one partition's dedup state: snapshot transfer vs rebuild from the source topic.

One partition holding `keys` unique keys (default 1,000,000) is deduplicated by worker A.
Then, in one run, side by side:
  snapshot  A hands the partition to B: A commits and stops it, checkpoints and packs its
            RocksDB state, serves it; B downloads it (size + sha256 checked), installs it,
            fences A with init_transactions and resumes;
  rebuild   B hands it to C without a snapshot: C rebuilds the state from the source topic
            over the dedup window (what happens when the old owner is gone).
The pause is measured from the moment the new assignment is written until the new owner
reports the partition running (both include the workers' reading of the assignment file, every
0.1 s; on a cluster the ConfigMap watch wakes them); the worker's own pause (old owner stopped
-> new owner running) is shown for both. MB/s is the state's size over the transfer: the
download (size and sha256 checked) and its install as the partition's store, as the new owner
timed them; for the rebuild, over the rebuild.

    python -m bench.migration [--keys N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.common import Setup, Worker, say, standalone, wait, write_json


def bench(bootstrap: str, workdir: Path, keys: int = 1_000_000, progress=print) -> list[dict]:
    from eopipe.tools.loadgen import run_load

    run = Setup(bootstrap, workdir, "migration", "mig")
    topics, work = run.topics, run.work
    progress(f"preloading {keys} unique keys into one partition of {topics[0]}")
    run_load(bootstrap, topics[0], keys, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=5)
    path = work / "assignment.json"
    write_json(path, {"generation": 1, "assignments": {"a": [0]}, "partitionCount": 1})
    workers = {n: Worker(n, bootstrap, topics, path, work, run.pipeline) for n in ("a", "b", "c")}
    rows = []
    try:
        t0 = time.monotonic()
        wait(lambda: (s := workers["a"].running(0, 1)) and s.get("lag") == 0 and
             (s.get("store") or {}).get("applied_offset", 0) >= keys and s, 1800, "A deduplicated the partition")
        progress(f"A deduplicated {keys} keys in {time.monotonic() - t0:.1f}s")
        wait(lambda: all(w.status().get("generation") == 1 for w in workers.values()), 120, "workers up")

        # 1. snapshot: a -> b
        t = time.monotonic()
        write_json(path, {"generation": 2, "assignments": {"b": [0]}, "partitionCount": 1,
                          "handoffs": {"0": {"from": "a", "url": workers["a"].url}}})
        part = wait(lambda: workers["b"].running(0, 2), 600, "B running")
        pause = time.monotonic() - t
        mig = part["migration"]
        size = mig["bytes"]
        rows.append({"method": "snapshot", "keys": part["store"]["keys"], "state_mb": size / 1e6,
                     "pause_s": pause, "worker_pause_s": mig["pause_ms"] / 1000,
                     "transfer_s": mig["transfer_ms"] / 1000, "mb_per_s": size / 1e6 / max(mig["transfer_ms"], 1) * 1000})
        progress(f"snapshot: {rows[-1]}")

        # 2. rebuild: b -> c, no snapshot offered
        t = time.monotonic()
        write_json(path, {"generation": 3, "assignments": {"c": [0]}, "partitionCount": 1})
        part = wait(lambda: workers["c"].running(0, 3), 1800, "C running")
        pause = time.monotonic() - t
        rebuilt = part["store"]["bytes"]
        rows.append({"method": "rebuild", "keys": part["store"]["keys"], "state_mb": rebuilt / 1e6,
                     "pause_s": pause, "worker_pause_s": part["recovery"]["recovery_seconds"],
                     "transfer_s": 0.0, "mb_per_s": rebuilt / 1e6 / part["recovery"]["recovery_seconds"],
                     "records_replayed": part["recovery"]["replayed"]})
        progress(f"rebuild: {rows[-1]}")
    finally:
        for w in workers.values():
            w.stop()
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'handoff of 1 partition':<24}{'keys':>11}{'state MB':>10}{'pause s':>9}{'worker s':>10}"
            f"{'transfer s':>12}{'MB/s':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['method']:<24}{r['keys']:>11,}{r['state_mb']:>10.1f}{r['pause_s']:>9.2f}"
                     f"{r['worker_pause_s']:>10.2f}{r['transfer_s']:>12.2f}{r['mb_per_s']:>8.1f}")
    if len(rows) == 2 and rows[0]["pause_s"] > 0:
        lines.append(f"snapshot is {rows[1]['pause_s'] / rows[0]['pause_s']:.1f}x faster than rebuild")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--keys", type=int, default=1_000_000, help="unique keys in the partition (default 1000000)")
    return standalone("bench.migration", __doc__, options, table, argv,
                      lambda bootstrap, work, a: bench(bootstrap, work, keys=a.keys, progress=say))


if __name__ == "__main__":
    sys.exit(main())
