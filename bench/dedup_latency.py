"""End-to-end latency of the dedup stage alone, per load and per commit interval: the table of
the latency/throughput knob, the worker's `--commit-interval-ms` (default 100).

Per (rate, commit interval), a fresh pipeline: a 1-partition source, output and DLQ topic
(bench.common.Setup) and one worker (`python -m eopipe.dedup --commit-interval-ms I`, as a
dedup pod runs it) owning partition 0. A paced producer (bench.common.Load: new events and
resends of recent ones) sends `rate` records/s for a warm-up (default 3 s, its records left
out), then `seconds` (default 15) measured. Per record that reaches the output (a resend never
does): the time it arrived at a read_committed consumer of the output minus its producer
timestamp (set as the record is made, just before produce(); the worker keeps it as the output
record's timestamp).
Same machine, same clock. p50, p99 and max of the records produced in the measured seconds,
all of them read (the stage drains before the numbers are taken).

What the numbers contain: the producer's linger (5 ms) and its request; the worker's fetch;
waiting for the open transaction to reach its commit interval (a transaction begins with its
first record and commits `I` ms later, so a record waits between 0 and I); the commit
(send_offsets_to_transaction + commit_transaction: the coordinator writes the markers) and the
RocksDB write after it, while newer records wait in the worker's consumer; then the output
consumer's fetch, which sees a record only once its transaction's marker is written. Between
transactions the worker waits for the next record, not for a full batch: a cycle is about
I + the commit, which the txn/s column shows.

The knob: a shorter interval is lower latency for more transactions per second, each a few
broker round trips, its markers and a RocksDB write batch: CPU that is not deduplicating, so
less throughput per core. A longer one puts more records in each transaction: latency about
the interval, a higher ceiling. `--max-batch` (default 20,000 records per transaction) also
ends a transaction; at 10,000 records/s and a 1 s interval (~10,000 records) it is not
reached, so the interval governs. Per row also the worker's own account over the measured seconds (its /metrics):
transactions per second, records per transaction and the mean commit time.

The producer, the measuring consumer (one Python process, one GIL), the worker and the broker
share the machine (the table says how many cores; 2 on the reference box): Python's producer
may not reach 10,000 records/s there, so the rate it achieved (records sent / seconds, resends
included) stands next to the target. A rate the worker cannot keep up with shows as a latency
that grows with the run's length. After each run the stage drains and `eopipe verify` reads
source and output: lost and duplicated must be 0, else the benchmark fails.

    python -m bench.dedup_latency [--rates 1000,10000] [--commit-intervals 100,250,1000] [--seconds 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.common import (
    LatencyReader,
    Load,
    Setup,
    Worker,
    percentile,
    positive_ints,
    say,
    single_owner,
    standalone,
    verified,
    wait,
)

COMMIT = "eopipe_dedup_commit_seconds"       # the worker's histograms (dedup/metrics.py)
BATCH = "eopipe_dedup_transaction_records"


# ------------------------------------------------------------------ pure: samples in, rows out

def rows(runs: list[dict]) -> list[dict]:
    """One row per run. A run: rate (the target), commit_interval_ms, window (start, end: seconds
    from the load's start), sent (records the load sent in it), latencies [(produced at t, ms)],
    worker (the /metrics counters' growth in the window: commit_seconds_sum, commits,
    batch_records_sum) and verify ({out, lost, duplicated, ...} or None)."""
    out = []
    for run in runs:
        start, end = run["window"]
        secs = end - start
        lat = sorted(ms for t, ms in run["latencies"] if start <= t < end)
        w = run.get("worker") or {}
        commits = w.get("commits") or 0
        out.append({
            "rate": run["rate"], "commit_interval_ms": run["commit_interval_ms"],
            "achieved": run["sent"] / secs if secs > 0 else None, "records": len(lat),
            "p50_ms": percentile(lat, 0.5) if lat else None, "p99_ms": percentile(lat, 0.99) if lat else None,
            "max_ms": lat[-1] if lat else None,
            "txn_per_s": commits / secs if commits and secs > 0 else None,
            "records_per_txn": w["batch_records_sum"] / commits if commits else None,
            "commit_ms": 1000 * w["commit_seconds_sum"] / commits if commits else None,
            "verify": run.get("verify")})
    return out


def _cell(v, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v) if isinstance(v, float) else str(v)


def table(result: dict) -> str:
    cols = (("rate", "target/s", "{:.0f}"), ("achieved", "sent/s", "{:.0f}"),
            ("commit_interval_ms", "interval_ms", "{:.0f}"), ("records", "records", "{:.0f}"),
            ("p50_ms", "p50_ms", "{:.0f}"), ("p99_ms", "p99_ms", "{:.0f}"), ("max_ms", "max_ms", "{:.0f}"),
            ("txn_per_s", "txn/s", "{:.1f}"), ("records_per_txn", "records/txn", "{:.0f}"),
            ("commit_ms", "commit_ms", "{:.1f}"))
    title = (f"dedup stage latency: producer timestamp -> visible to a read_committed consumer of the output; "
             f"{result['seconds']:g} s measured per row after {result['warmup_s']:g} s warm-up, "
             f"{result['cpus']} cores shared by producer, worker and broker")
    out = [title, "  ".join(f"{h:>11}" for _, h, _ in cols)]
    out += ["  ".join(f"{_cell(r[k], f):>11}" for k, _, f in cols) for r in result["rows"]]
    checked = [r["verify"] for r in result["rows"] if r.get("verify")]
    if checked:
        out.append(f"eopipe verify, {len(checked)} of {len(result['rows'])} runs: {sum(v['out'] for v in checked):,} "
                   f"records out, lost {sum(v['lost'] for v in checked)}, "
                   f"duplicated {sum(v['duplicated'] for v in checked)}")
    return "\n".join(out)


def counters(metrics: dict[str, float]) -> dict[str, float]:
    """The worker's commit counters out of its /metrics, summed over partitions."""
    def total(name: str) -> float:
        return sum(v for k, v in metrics.items() if k.partition("{")[0] == name)
    return {"commit_seconds_sum": total(f"{COMMIT}_sum"), "commits": total(f"{COMMIT}_count"),
            "batch_records_sum": total(f"{BATCH}_sum")}


# ------------------------------------------------------------------ the run

def _run(bootstrap: str, workdir: Path, rate: int, interval_ms: int, seconds: float, warmup: float) -> dict:
    setup = Setup(bootstrap, workdir, "dedup_latency", "dl")
    path = setup.work / "assignment.json"
    single_owner(path, "l")
    load = Load(bootstrap, setup.topics[0], rate)
    w = Worker("l", bootstrap, setup.topics, path, setup.work, setup.pipeline,
               extra=("--commit-interval-ms", str(interval_ms)))
    lat = None

    def alive() -> None:  # a dead worker would leave the group behind for good
        if w.proc.poll() is not None:
            raise RuntimeError(f"worker {w.name} exited with {w.proc.returncode}; see {w.log}")
    try:
        wait(lambda: w.running(0, 1), 120, "worker running")
        t0 = time.time()
        # From the output's beginning: its consumer's own start-up falls in the warm-up.
        lat = LatencyReader(bootstrap, setup.topics[1], t0)
        lat.start()
        load.start()
        time.sleep(warmup)
        start, sent0, m0 = time.time() - t0, load.sent, counters(w.metrics())
        time.sleep(seconds)
        end, sent1, m1 = time.time() - t0, load.sent, counters(w.metrics())
        load.stop()
        checked = verified(bootstrap, setup.topics[0], setup.topics[1], group=w.group, stop=alive)
        # Every record of the window read, however late: a slow tail is the measurement.
        wait(lambda: len(lat.seen) >= checked["out"], 120, "the latency consumer reading the whole output")
        return {"rate": rate, "commit_interval_ms": interval_ms, "window": (start, end), "sent": sent1 - sent0,
                "latencies": list(lat.seen), "worker": {k: m1[k] - m0[k] for k in m1}, "verify": checked}
    finally:
        if lat is not None:
            lat.halt.set()
            lat.join(10)
        try:
            if load.ident is not None and load.is_alive():
                load.stop()
        finally:
            w.stop()


def bench(bootstrap: str, workdir: Path, rates: tuple[int, ...] = (1000, 10000),
          intervals: tuple[int, ...] = (100, 250, 1000), seconds: float = 15, warmup: float = 3,
          progress=say) -> dict:
    result_rows = []
    for rate in rates:
        for interval in intervals:
            progress(f"dedup_latency: {rate} records/s, --commit-interval-ms {interval}: "
                     f"{warmup:g} s warm-up, {seconds:g} s measured")
            row = rows([_run(bootstrap, workdir, rate, interval, seconds, warmup)])[0]
            progress(f"dedup_latency: sent {_cell(row['achieved'])}/s, p50 {_cell(row['p50_ms'])} ms, "
                     f"p99 {_cell(row['p99_ms'])} ms, max {_cell(row['max_ms'])} ms")
            result_rows.append(row)
    return {"seconds": seconds, "warmup_s": warmup, "cpus": os.cpu_count(), "rows": result_rows}


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rates", type=positive_ints, default=(1000, 10000),
                    help="target records/s, comma separated (default 1000,10000)")
    ap.add_argument("--commit-intervals", type=positive_ints, default=(100, 250, 1000),
                    help="the worker's --commit-interval-ms values, comma separated (default 100,250,1000)")
    ap.add_argument("--seconds", type=float, default=15, help="measured seconds per row (default 15)")
    ap.add_argument("--warmup", type=float, default=3, help="seconds of load before measuring (default 3)")


def main(argv: list[str] | None = None) -> int:
    def run(bootstrap, work, a):
        return bench(bootstrap, work, rates=a.rates, intervals=a.commit_intervals, seconds=a.seconds,
                     warmup=a.warmup)
    return standalone("bench.dedup_latency", __doc__, _options, table, argv, run)


if __name__ == "__main__":
    sys.exit(main())
