"""Memory of one dedup pod: RSS of the worker process whose partition store holds 1,000,000
and 10,000,000 keys, while it processes a small load.

For each size, a 1-partition source topic and a store pre-built with that many keys directly
through eopipe.dedup.store's API (bench.common.prebuild_store: StateStore.apply(), as the
worker writes it; feeding 10M records through Kafka would take most of an hour here), keys
spread over 20 h of event time. The worker (`python -m eopipe.dedup`, --memory-mb 256 unless
given: the budget for RocksDB's block cache + memtables; the operator derives it from the dedup
container's memory limit, 409 for the default 1Gi) opens it and must trust it: its
recovery says "none" and its /status counts the keys (checked). Then `load` records
(default 20,000, at 5,000/s) go through it, 10% of them re-sends of pre-built keys: each of
those must be dropped as a duplicate (checked against /metrics), which proves the lookups
went to the big store.

Reported: peak RSS (VmHWM of /proc/<pid>/status: the whole life of the process, store open
included), RSS at the end, RocksDB's block cache usage (/status), and the store's size on
disk. The state is deleted after each size.

    python -m bench.memory [--sizes 1000000,10000000] [--load N] [--memory-mb MB] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from bench.common import Load, Setup, Worker, dir_bytes, prebuild_store, say, single_owner, standalone, wait
from bench.recovery import check_trusted


def _one(bootstrap: str, workdir: Path, keys: int, load: int, rate: float, progress, memory_mb: int = 256) -> dict:
    from eopipe.tools.verify import wait_for_group

    run = Setup(bootstrap, workdir, "memory", "mem")
    topics, work = run.topics, run.work
    try:
        progress(f"memory: pre-building a store with {keys:,} keys")
        build_s = prebuild_store(work / "state-m", keys, progress)
        disk = dir_bytes(work / "state-m")
        path = work / "assignment.json"
        single_owner(path, "m")
        w = Worker("m", bootstrap, topics, path, work, run.pipeline, memory_mb=memory_mb)
        try:
            t0 = time.monotonic()
            check_trusted(wait(lambda: w.running(0, 1), 600, "worker running"), keys)
            open_s = time.monotonic() - t0
            idle = w.proc_status()
            progress(f"memory: worker up in {open_s:.1f}s with {keys:,} keys, RSS {idle.get('VmRSS', 0) / 1024:.0f} MB;"
                     f" sending {load:,} records")
            gen = Load(bootstrap, topics[0], rate, count=load, old_keys=keys, seed=keys)
            t0 = time.monotonic()
            gen.start()
            gen.join()
            gen.stop()

            def alive():
                if w.proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {w.proc.returncode}; see {w.log}")
            wait_for_group(bootstrap, w.group, topics[0], 600, stop=alive)
            load_s = time.monotonic() - t0
            vm = w.proc_status()
            dups = w.metrics().get('eopipe_dedup_duplicates_total{partition="0"}', 0)
            if dups < gen.old:
                raise RuntimeError(f"only {dups:.0f} duplicates dropped, but {gen.old} records re-sent "
                                   "pre-built keys: the store was not used")
            mem = w.status().get("memory") or {}
        finally:
            w.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"keys": keys, "peak_rss_mb": vm["VmHWM"] / 1024, "rss_mb": vm["VmRSS"] / 1024,
            "idle_rss_mb": idle.get("VmRSS", 0) / 1024,
            "cache_mb": mem.get("cache_usage_bytes", 0) / 2**20, "budget_mb": mem.get("budget_bytes", 0) / 2**20,
            "disk_mb": disk / 1e6, "load_records": gen.sent, "load_s": load_s, "old_key_dups": gen.old,
            "duplicates": dups, "open_s": open_s, "store_build_s": build_s}


def bench(bootstrap: str, workdir: Path, sizes=(1_000_000, 10_000_000), load: int = 20_000, rate: float = 5000,
          progress=say, memory_mb: int = 256) -> list[dict]:
    rows = []
    for keys in sizes:
        rows.append(_one(bootstrap, workdir, keys, load, rate, progress, memory_mb))
        progress(f"memory: {rows[-1]}")
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'dedup pod memory':<20}{'keys':>12}{'peak RSS MB':>12}{'RSS MB':>8}{'cache MB':>9}"
            f"{'disk MB':>9}{'open s':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{'':<20}{r['keys']:>12,}{r['peak_rss_mb']:>12.0f}{r['rss_mb']:>8.0f}{r['cache_mb']:>9.0f}"
                     f"{r['disk_mb']:>9.0f}{r['open_s']:>8.1f}")
    if rows:
        lines.append(f"RocksDB budget {rows[0]['budget_mb']:.0f} MB (--memory-mb); "
                     f"load {rows[0]['load_records']:,} records, 10% of them re-sent pre-built keys")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--sizes", default="1000000,10000000", help="keys per run, comma separated")
        ap.add_argument("--load", type=int, default=20_000, help="records processed per size (default 20000)")
        ap.add_argument("--memory-mb", type=int, default=256, help="the worker's RocksDB budget (default 256)")
    return standalone("bench.memory", __doc__, options, table, argv, lambda bootstrap, work, a: bench(
        bootstrap, work, sizes=[int(s) for s in a.sizes.split(",")], load=a.load, memory_mb=a.memory_mb))


if __name__ == "__main__":
    sys.exit(main())
