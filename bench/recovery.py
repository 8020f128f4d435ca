"""Recovery time of a dedup worker after SIGKILL, under steady load, holding `keys` keys.

Setup: a 1-partition source topic; the worker (`python -m eopipe.dedup`, as a dedup pod runs
it) owns partition 0 and starts on a store pre-built with `keys` keys (default 1,000,000)
through eopipe.dedup.store's API (bench.common.prebuild_store; the worker trusts it: its
recovery must say "none", checked). A paced producer sends `rate` records/s (default 2000)
for the whole run: new events, 10% resends of recent ones, 10% re-sends of pre-built keys.

Each round: `steady` seconds of processing, sampling the group's lag (source high watermark
minus the dedup group's committed offset, both read from Kafka every 50 ms); then SIGKILL
of the worker at t0, and at once (when the kernel reaped it) the same command again, same
state directory (a pod restart without the kubelet's back-off). Then, polling Kafka every
20 ms:
  first commit  t - t0 where t is the first sample whose committed offset is above the one
                committed before the kill (read 0.25 s after t0, before the new process can
                have committed: it needs ~0.7 s to import alone). The worker commits source
                offsets inside the transaction that writes its output, so this is the first
                new exactly-once output becoming visible.
  caught up     t - t0 where t is the first sample after that with lag at or below the p95
                of the lag during the steady phase: back to what it was.
The worker's own recovery (init_transactions fencing the killed producer, store open, replay
of the offsets committed in Kafka but not yet applied to RocksDB) is read from its /status.
Rounds are repeated `kills` times; the medians are reported.

    python -m bench.recovery [--keys N] [--rate R] [--kills K] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.common import GroupLag, Load, Setup, Worker, percentile, prebuild_store, say, single_owner, standalone, wait


def check_trusted(part: dict, keys: int) -> None:
    """Raises unless the worker took the pre-built store as it is (no rebuild, no reset)."""
    rec = (part.get("recovery") or {}).get("recovery")
    found = (part.get("store") or {}).get("keys", 0)
    if rec != "none" or found < 0.9 * keys:
        raise RuntimeError(f"the worker did not trust the pre-built store: recovery {rec!r}, "
                           f"{found} keys of {keys}")


def _round(w: Worker, lag: GroupLag, steady: float, timeout: float = 300) -> dict:
    samples = []
    end = time.monotonic() + steady
    while time.monotonic() < end:
        samples.append(lag.lag()[1])
        time.sleep(0.05)
    threshold = max(1.0, percentile(sorted(samples), 0.95))
    t0 = time.monotonic()
    w.kill()
    w.start()
    time.sleep(0.25)
    base = lag.committed()
    first = caught = None
    peak = 0
    while caught is None:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"not caught up {timeout:.0f}s after the kill; see {w.log}")
        if w.proc.poll() is not None:
            raise RuntimeError(f"restarted worker exited with {w.proc.returncode}; see {w.log}")
        committed, behind = lag.lag()
        now = time.monotonic() - t0
        peak = max(peak, behind)
        if first is None and committed > base:
            first = now
        if first is not None and behind <= threshold:
            caught = now
        time.sleep(0.02)
    part = wait(lambda: w.running(0, 1), 60, "restarted worker running")
    rec = part.get("recovery") or {}
    return {"first_commit_s": first, "caught_up_s": caught, "steady_lag_p95": threshold, "peak_lag": peak,
            "worker_recovery_s": rec.get("recovery_seconds"), "action": rec.get("recovery"),
            "replayed": rec.get("replayed", 0)}


def bench(bootstrap: str, workdir: Path, keys: int = 1_000_000, rate: float = 2000, kills: int = 3,
          steady: float = 8, progress=say) -> dict:
    run = Setup(bootstrap, workdir, "recovery", "rec")
    topics, work = run.topics, run.work
    progress(f"recovery: pre-building a store with {keys:,} keys")
    build_s = prebuild_store(work / "state-r", keys, progress)
    path = work / "assignment.json"
    single_owner(path, "r")
    load = Load(bootstrap, topics[0], rate, old_keys=keys)
    w = Worker("r", bootstrap, topics, path, work, run.pipeline)
    lag = GroupLag(bootstrap, w.group, topics[0])
    rounds = []
    try:
        check_trusted(wait(lambda: w.running(0, 1), 300, "worker running"), keys)
        load.start()
        time.sleep(1)
        wait(lambda: lag.lag()[1] <= rate / 2, 120, "worker keeping up with the load")
        for k in range(kills):
            progress(f"recovery: round {k + 1}/{kills}: {steady:.0f}s steady at {rate:.0f} records/s, then SIGKILL")
            rounds.append(_round(w, lag, steady))
            progress(f"recovery: {rounds[-1]}")
    finally:
        lag.close()
        try:
            if load.ident is not None:  # started
                load.stop()
        finally:
            w.stop()
            shutil.rmtree(work / "state-r", ignore_errors=True)

    def med(k):
        return statistics.median(r[k] for r in rounds)
    return {"keys": keys, "rate": rate, "kills": kills, "store_build_s": build_s,
            "first_commit_s": med("first_commit_s"), "caught_up_s": med("caught_up_s"),
            "worker_recovery_s": med("worker_recovery_s"),
            "first_commit_max_s": max(r["first_commit_s"] for r in rounds),
            "caught_up_max_s": max(r["caught_up_s"] for r in rounds), "rounds": rounds}


def table(res: dict) -> str:
    head = (f"{'SIGKILL, ' + format(res['keys'], ',') + ' keys':<28}{'first commit s':>15}{'caught up s':>12}"
            f"{'worker s':>10}{'peak lag':>10}  recovery")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(res["rounds"], 1):
        lines.append(f"{'kill ' + str(i):<28}{r['first_commit_s']:>15.2f}{r['caught_up_s']:>12.2f}"
                     f"{r['worker_recovery_s']:>10.2f}{r['peak_lag']:>10,}  {r['action']} ({r['replayed']} replayed)")
    lines.append(f"{'median':<28}{res['first_commit_s']:>15.2f}{res['caught_up_s']:>12.2f}"
                 f"{res['worker_recovery_s']:>10.2f}")
    lines.append(f"load {res['rate']:.0f} records/s; worker s = its own recovery (fence, open store, replay)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--keys", type=int, default=1_000_000, help="keys in the worker's store (default 1000000)")
        ap.add_argument("--rate", type=float, default=2000, help="steady load, records/s (default 2000)")
        ap.add_argument("--kills", type=int, default=3, help="SIGKILL rounds (default 3)")
    return standalone("bench.recovery", __doc__, options, table, argv, lambda bootstrap, work, a: bench(
        bootstrap, work, keys=a.keys, rate=a.rate, kills=a.kills))


if __name__ == "__main__":
    sys.exit(main())
