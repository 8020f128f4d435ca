"""Recovery time of a dedup worker per fault class, under steady load, holding `keys` keys.

Setup: a broker of the step's own, which it kills, with the worker reaching it through
toxiproxy (bench/faults.py says how, and what each fault does), or with --brokers 3 a
three-node cluster of its own (replication 3; broker_kill kills the node coordinating the
worker's transactions); a 1-partition source topic;
the worker (`python -m eopipe.dedup`, as a dedup pod runs it, `--transaction-timeout` 8 s)
owns partition 0 and starts on a store pre-built with `keys` keys (default 1,000,000) through
eopipe.dedup.store's API (bench.common.prebuild_store; the worker trusts it: its recovery
must say "none", checked). A paced producer sends `rate` records/s (default 2000) for the
whole run: new events and 10% resends of recent ones (no re-sends of pre-built keys: they
never reach the output, and the run ends in an exact count of it).

Fault classes (--faults, default all), each `kills` rounds (default 3):
  worker_kill   worker SIGKILL, restarted at once               target: recovered in < 10 s
  broker_kill   broker SIGKILL, restarted once fenced            target: < 30 s
  partition     worker <-> broker blackholed past the worker's
                transaction timeout, then healed                 target: < 30 s
  worker_pause  worker SIGSTOP past its transaction timeout,
                then SIGCONT                                     no target
Each round: `steady` seconds (default 5) of processing, sampling the group's lag (source high watermark
minus the dedup group's committed offset, both read from Kafka every 50 ms); the source's end
is read, then the fault runs from its start to its end (the restart done, the heal). Then,
polling Kafka every 20 ms, from the fault's end:
  first commit  the first sample whose committed offset is past the source's end at the
                fault's start: the worker committed records produced after the fault began
                (not a transaction in flight at the fault that the broker completed). The
                worker commits source offsets inside the transaction that writes its output,
                so this is the first new exactly-once output becoming visible.
  caught up     the first sample after that with lag at or below the p95 of the lag during
                the steady phase: back to what it was. The verdict is on this, from the
                fault's end: the slowest round of a class must be under its target.
  no commit     the longest time the committed offset stood still from the fault's start
                (sampled during the fault too): with three brokers the worker goes on
                committing while one is down, so its first commit after the return says little.
Both are also shown from the fault's start (plus the time the fault was held). Under the
table, per class, the worker's own warnings during its recoveries (from its log), with the
times its watchdog had to end a transactional call counted apart, and the librdkafka lines
it logged at warning or above (dedup/logs.py: summarized, a restart's lines at info). After the last round the
load stops, the worker drains, and `eopipe verify` (an independent reader) counts the output:
lost and duplicated must be 0, else the step fails.

    python -m bench.recovery [--keys N] [--rate R] [--kills K] [--steady S] [--faults a,b] [--brokers 1|3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import KafkaException

from bench import recovery_summary as summary
from bench.common import (
    GroupLag,
    Load,
    Setup,
    Worker,
    percentile,
    prebuild_store,
    say,
    single_owner,
    standalone,
    verified,
    wait,
)
from bench.faults import ACTIONS, Env, FaultBroker, FaultCluster
from bench.recovery_summary import Stood

TRANSACTION_TIMEOUT = 8.0   # the worker's; a partition or a pause lasts 2 s longer
ROUND_TIMEOUT = 120.0       # seconds after a fault's end without recovering: the step fails


def check_trusted(part: dict, keys: int) -> None:
    """Raises unless the worker took the pre-built store as it is (no rebuild, no reset)."""
    rec = (part.get("recovery") or {}).get("recovery")
    found = (part.get("store") or {}).get("keys", 0)
    if rec != "none" or found < 0.9 * keys:
        raise RuntimeError(f"the worker did not trust the pre-built store: recovery {rec!r}, "
                           f"{found} keys of {keys}")


class FreshLag:
    """GroupLag that starts over with a new consumer once its calls have failed for STALE_S: a
    consumer whose group coordinator was dropped from the metadata while it was down waits on it
    for good (librdkafka #5511, seen with three brokers), and the samples would stop with it."""

    STALE_S = 3.0

    def __init__(self, make):
        self.make, self.g, self.ok = make, make(), time.monotonic()

    def _call(self, fn):
        try:
            out = fn(self.g)
        except KafkaException:
            if time.monotonic() - self.ok > self.STALE_S:
                threading.Thread(target=self.g.close, daemon=True).start()  # may block: not here
                self.g, self.ok = self.make(), time.monotonic()
            raise
        self.ok = time.monotonic()
        return out

    def lag(self, timeout: float = 10) -> tuple[int, int]:
        return self._call(lambda g: g.lag(timeout))

    def high(self, timeout: float = 10) -> int:
        return self._call(lambda g: g.high(timeout))

    def committed(self, timeout: float = 10) -> int:
        return self._call(lambda g: g.committed(timeout))

    def close(self) -> None:
        self.g.close()


def _sample(lag: FreshLag) -> tuple[int, int] | None:
    """(committed, lag), or None while the broker cannot answer (restarting, coordinator loading)."""
    try:
        return lag.lag(timeout=2)
    except KafkaException:
        return None


def _steady(lag: FreshLag, seconds: float) -> float:
    """The p95 of the lag over `seconds` of undisturbed processing (at least 1)."""
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s = _sample(lag)
        if s is not None:
            samples.append(s[1])
        time.sleep(0.05)
    return max(1.0, percentile(sorted(samples), 0.95))


def _during(action, lag: FreshLag, stood: Stood) -> None:
    """Runs the fault's action, sampling the committed offset meanwhile (on this thread's
    GroupLag: the caller does not use it until the action is over)."""
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            s = _sample(lag)
            if s is not None:
                stood.see(time.monotonic(), s[0])
            done.wait(0.05)

    t = threading.Thread(target=sample, name="stood", daemon=True)
    t.start()
    try:
        action()
    finally:
        done.set()
        t.join()


def _round(env: Env, w: Worker, lag: FreshLag, fault: str, steady: float, hold: float) -> dict:
    threshold = _steady(lag, steady)
    start_end = lag.high()  # the source's end at the fault's start
    before = lag.committed()
    mark = w.log.stat().st_size
    t0 = time.monotonic()
    stood = Stood(t0)
    stood.see(t0, before)
    _during(lambda: ACTIONS[fault](env, w, hold), lag, stood)
    t1 = time.monotonic()
    first = caught = None
    peak = 0
    while caught is None:
        if time.monotonic() - t1 > ROUND_TIMEOUT:
            raise TimeoutError(f"{fault}: not caught up {ROUND_TIMEOUT:.0f}s after the fault's end; see {w.log}")
        if w.proc.poll() is not None:
            raise RuntimeError(f"{fault}: the worker exited with {w.proc.returncode}; see {w.log}")
        s = _sample(lag)
        now = time.monotonic() - t1
        if s is not None:
            committed, behind = s
            stood.see(time.monotonic(), committed)
            peak = max(peak, behind)
            if first is None and committed > start_end:
                first = now
            if first is not None and behind <= threshold:
                caught = now
        time.sleep(0.02)
    said, client_lines = _worker_said(w.log, mark)
    r = {"fault": fault, "held_s": t1 - t0, "first_commit_s": first, "caught_up_s": caught,
         "no_commit_s": stood.longest,
         "steady_lag_p95": threshold, "peak_lag": peak, "worker_said": said, "client_lines": client_lines}
    if fault == "worker_kill":  # the new process's own account of its recovery
        rec = wait(lambda: w.running(0, 1), 60, "restarted worker running").get("recovery") or {}
        r.update(worker_recovery_s=rec.get("recovery_seconds"), action=rec.get("recovery"),
                 replayed=rec.get("replayed", 0))
    return r


def _worker_said(log: Path, since: int) -> tuple[dict[str, int], int]:
    """The worker's own warnings and errors since byte `since` of its log, counted by message:
    how it recovered (e.g. a stalled transaction replaced after a timeout or a fencing error,
    or after the watchdog gave up on a call: counted apart); and how many lines librdkafka
    logged meanwhile at warning or above."""
    said: Counter[str] = Counter()
    client = 0
    with open(log, "rb") as f:
        f.seek(since)
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("logger") == "rdkafka":
                client += d.get("level") in ("warning", "error", "critical")
            elif str(d.get("logger", "")).startswith("eopipe") and d.get("level") in ("warning", "error", "critical"):
                said[str(d.get("msg"))] += 1
                if b"did not return within" in line:  # the watchdog's words (dedup/txn.py)
                    said["the watchdog ended a call"] += 1
                elif b"stale coordinator" in line:  # given up when the coordinator answered (dedup/txn.py)
                    said["a call on a stale coordinator given up"] += 1
    return dict(said), client


def bench(workdir: Path, keys: int = 1_000_000, rate: float = 2000, kills: int = 3, steady: float = 5,
          faults: list[str] | None = None, transaction_timeout: float = TRANSACTION_TIMEOUT,
          brokers: int = 1, progress=say) -> dict:
    faults = faults or list(summary.FAULTS)
    hold = transaction_timeout + 2
    env: Env = FaultCluster(workdir / "fault-cluster") if brokers == 3 else FaultBroker(workdir / "fault-broker")
    rounds: list[dict] = []
    try:
        progress(f"recovery: starting {'a broker' if brokers == 1 else f'{brokers} brokers'} of its own behind toxiproxy")
        env.start()
        run = Setup(env.bootstrap, workdir, "recovery", "rec", replication=env.replication)
        topics, work = run.topics, run.work
        progress(f"recovery: pre-building a store with {keys:,} keys")
        build_s = prebuild_store(work / "state-r", keys, progress)
        path = work / "assignment.json"
        single_owner(path, "r")
        load = Load(env.bootstrap, topics[0], rate)
        w = Worker("r", env.worker_bootstrap, topics, path, work, run.pipeline,
                   extra=("--transaction-timeout", f"{transaction_timeout:g}"))
        lag = FreshLag(lambda: GroupLag(env.bootstrap, w.group, topics[0]))
        try:
            check_trusted(wait(lambda: w.running(0, 1), 300, "worker running"), keys)
            load.start()
            time.sleep(1)
            wait(lambda: lag.lag()[1] <= rate / 2, 120, "worker keeping up with the load")
            for fault in faults:
                for k in range(kills):
                    progress(f"recovery: {fault} {k + 1}/{kills}: {steady:.0f}s steady at {rate:.0f} records/s, "
                             "then the fault")
                    rounds.append(_round(env, w, lag, fault, steady, hold))
                    progress(f"recovery: {rounds[-1]}")
            load.stop()
            progress("recovery: load stopped; draining, then eopipe verify")
            checked = verified(env.bootstrap, topics[0], topics[1], group=w.group)
        finally:
            lag.close()
            try:
                if load.ident is not None and load.is_alive():
                    load.stop()
            finally:
                w.stop()
                shutil.rmtree(work / "state-r", ignore_errors=True)
    finally:
        env.stop()
    rows = summary.summarize(rounds)
    kills_r = [r for r in rounds if r["fault"] == "worker_kill"]
    return {"keys": keys, "rate": rate, "kills": kills, "steady_s": steady, "faults": faults, "brokers": brokers,
            "transaction_timeout_s": transaction_timeout, "hold_s": hold, "store_build_s": build_s,
            "worker_recovery_s": statistics.median(r["worker_recovery_s"] for r in kills_r) if kills_r else None,
            "rows": rows, "passed": summary.passed(rows), "verify": checked, "sent": load.sent, "rounds": rounds}


def table(res: dict) -> str:
    v = res["verify"]
    lines = [f"recovery per fault class, {res.get('brokers', 1)} broker(s), {res['keys']:,} keys, {res['rate']:.0f} records/s "
             f"(seconds from the fault's end unless 'from start')", summary.table(res["rows"])]
    lines.append(f"transaction timeout {res['transaction_timeout_s']:g} s; partition and pause held "
                 f"{res['hold_s']:g} s; caught up = lag back to the steady p95")
    if res.get("worker_recovery_s") is not None:
        lines.append(f"worker SIGKILL: the worker's own recovery (fence, open store, replay) median "
                     f"{res['worker_recovery_s']:.2f} s")
    for row in res["rows"]:
        said: Counter[str] = Counter()
        for r in res["rounds"]:
            if r["fault"] == row["fault"]:
                said.update(r.get("worker_said") or {})
        told = "; ".join(f"{m[:48]} ({n})" for m, n in said.most_common(3)) or "nothing"
        mine = [r for r in res["rounds"] if r["fault"] == row["fault"]]
        stood = [r.get("no_commit_s", 0.0) for r in mine]
        lines.append(f"{row['label']}: longest time without a commit, median {statistics.median(stood):.1f} / "
                     f"max {max(stood):.1f} s; librdkafka lines at warning or above per round, max "
                     f"{max(r.get('client_lines', 0) for r in mine)}; the worker warned {told}")
    lines.append(f"eopipe verify after the last round: {v['out']:,} keys out of {v['unique_in']:,}, "
                 f"lost {v['lost']}, duplicated {v['duplicated']}, unexpected {v['unexpected']}"
                 + ("" if v.get("out_of_order") is None else f", out of order {v['out_of_order']}"))
    return "\n".join(lines)


def fault_list(text: str) -> list[str]:
    """argparse type of --faults: a wrong name is a usage error, not a traceback."""
    try:
        return summary.parse_faults(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--keys", type=int, default=1_000_000, help="keys in the worker's store (default 1000000)")
        ap.add_argument("--rate", type=float, default=2000, help="steady load, records/s (default 2000)")
        ap.add_argument("--kills", type=int, default=3, help="rounds per fault class (default 3)")
        ap.add_argument("--steady", type=float, default=5, help="seconds of steady load before each fault (default 5)")
        ap.add_argument("--faults", type=fault_list, default=list(summary.FAULTS),
                        help=f"fault classes, comma separated (default {','.join(summary.FAULTS)})")
        ap.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                        help="a broker of its own, or a three-node cluster of its own (default 1)")
        ap.add_argument("--transaction-timeout", type=float, default=TRANSACTION_TIMEOUT,
                        help=f"the worker's transaction timeout, s (default {TRANSACTION_TIMEOUT:g})")

    def run(_bootstrap, work, a):
        return bench(work, keys=a.keys, rate=a.rate, kills=a.kills, steady=a.steady,
                     faults=a.faults, transaction_timeout=a.transaction_timeout, brokers=a.brokers)
    return standalone("bench.recovery", __doc__, options, table, argv, run, needs_broker=False)


if __name__ == "__main__":
    sys.exit(main())
