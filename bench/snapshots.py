"""Dedup snapshots in an object store (SeaweedFS's S3 gateway, a real process): what they cost
and what they buy, in one run on one broker.

  upload    a worker deduplicates a partition of `keys` unique keys with backups off and is
            restarted with them on: its first snapshot (every file new), and the next one after
            1% more keys (only new files); MB/s = bytes uploaded / the snapshot's seconds
            (checkpoint, hashing and upload), as the worker logs them ("snapshot uploaded");
  recovery  the volume is lost (state dir deleted) and the worker restarted: with backups on it
            restores the newest snapshot; without, it rebuilds the same partition from Kafka
            over the window. Time = the worker's own log, from reading its assignment to
            "partition running" (the interpreter's start is left out of both);
  cost      dedup throughput of the same source (`records`, 20% resends) with backups off and
            on (--interval, so several snapshots land inside the measurement), alternating
            for --rounds: the best steady records/s of each and its CPU µs/record, as
            bench.dedup_vs_copy measures them; with the snapshots' own thread CPU. The store
            runs at nice 19: a user's runs on other machines, so its CPU is not the worker's.
Every run's output is checked by eopipe verify (read_committed, the output topic). Goals
(issue 30): restore >= 10x faster than the rebuild at 10M keys; backups cost <= 5% throughput.

    python -m bench.snapshots [--keys N] [--records N] [--rounds N] [--interval 5s]
"""

from __future__ import annotations

import datetime
import shutil
import sys
import time
import uuid
from pathlib import Path

from bench.common import Setup, Worker, json_log as logs, say, single_owner, standalone, verified, wait

GOAL_RESTORE_X = 10.0
GOAL_COST_PCT = 5.0


# -- pure: the worker's log in, numbers out -------------------------------------------------------
def _ts(doc: dict) -> float:
    return datetime.datetime.fromisoformat(doc["ts"].replace("Z", "+00:00")).timestamp()


def recovery_seconds(docs: list[dict], p: int = 0) -> float:
    """From the last start's first 'assignment' to its 'partition running' of p (one process
    life: the log is appended to across restarts)."""
    starts = [i for i, d in enumerate(docs) if d.get("msg") == "dedup worker starting"]
    life = docs[starts[-1]:] if starts else docs
    begin = next(d for d in life if d.get("msg") == "assignment")
    end = next(d for d in life if d.get("msg") == "partition running" and d.get("partition") == p)
    return _ts(end) - _ts(begin)


def upload_row(doc: dict) -> dict:
    """A 'snapshot uploaded' event as a row: sizes in MB, MB/s of the bytes actually sent."""
    secs = max(float(doc["seconds"]), 1e-3)
    return {"applied_offset": doc["applied_offset"], "files": doc["files"], "state_mb": doc["bytes"] / 1e6,
            "uploaded_mb": doc["uploaded_bytes"] / 1e6, "seconds": secs,
            "mb_per_s": doc["uploaded_bytes"] / 1e6 / secs}


def derived(result: dict) -> dict:
    """The two verdicts: restore speed-up over the rebuild, and the throughput cost of backups."""
    rec, cost = result["recovery"], result["cost"]
    x = rec["rebuild_s"] / rec["restore_s"] if rec["restore_s"] > 0 else None
    off, on = cost["off"].get("steady_records_per_s"), cost["on"].get("steady_records_per_s")
    pct = (1 - on / off) * 100 if off and on else None
    return {"restore_x": x, "cost_pct": pct}


def table(result: dict) -> str:
    d = derived(result)
    keys = result["keys"]
    lines = [f"dedup snapshots, 1 partition, {keys:,} keys ({result['state_mb']:.0f} MB store), "
             f"backup interval {result['interval']}",
             f"{'':<34}{'value':>10}  {'unit':<10}notes", "-" * 96]

    def add(name, value, unit, notes=""):
        v = "n/a" if value is None else (f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}")
        lines.append(f"{name:<34}{v:>10}  {unit:<10}{notes}")
    for kind in ("full", "incremental"):
        u = result["upload"][kind]
        add(f"upload, {kind} snapshot", u["mb_per_s"], "MB/s",
            f"{u['uploaded_mb']:.1f} of {u['state_mb']:.1f} MB sent in {u['seconds']:.2f} s, {u['files']} files")
    rec = result["recovery"]
    add("volume lost: restore from snapshot", rec["restore_s"], "s",
        f"download {rec['download_s']:.2f} s, replayed {rec['restore_replayed']:,} records")
    add("volume lost: rebuild from Kafka", rec["rebuild_s"], "s", f"replayed {rec['rebuild_replayed']:,} records")
    add("restore speed-up over rebuild", d["restore_x"], "x",
        f"goal >= {GOAL_RESTORE_X:.0f}x at 10M keys")
    for state in ("off", "on"):
        c = result["cost"][state]
        snaps = (f", {c['snapshots']} snapshots during the run ({c['snapshot_uploaded_mb']:.0f} MB sent, "
                 f"{c['snapshot_cpu_s']:.2f} s of the worker's CPU)") if state == "on" else ""
        add(f"dedup throughput, backups {state}", c.get("steady_records_per_s"), "records/s",
            f"CPU {c['steady_cpu_us_per_record'] or 0:.1f} µs/record{snaps}; best of "
            + ", ".join("n/a" if v is None else f"{v:,.0f}" for v in c.get("steady_by_round", [])))
    add("throughput cost of backups", d["cost_pct"], "%", f"goal <= {GOAL_COST_PCT:.0f}%, "
        f"{result['records']:,} records (20% resends)")
    lines.append("every run verified by eopipe verify: " + ", ".join(
        f"{k} lost {v['lost']} dup {v['duplicated']}" for k, v in result["verify"].items()))
    return "\n".join(lines)


# -- the runs ---------------------------------------------------------------------------------------
def _snapshot_at(w: Worker, offset: int) -> dict | None:
    return next((d for d in reversed(logs(w.log)) if d.get("msg") == "snapshot uploaded"
                 and d.get("applied_offset") == offset), None)


def _committed(w: Worker, end: int, generation: int = 1) -> dict | None:
    part = w.running(0, generation)
    return part if part and part.get("committed", -1) >= end else None


def _last(w: Worker, msg: str) -> dict:
    return next(d for d in reversed(logs(w.log)) if d.get("msg") == msg)


def bench(bootstrap: str, workdir: Path, keys: int = 1_000_000, records: int = 5_000_000, interval: str = "5s",
          rounds: int = 2, progress=print) -> dict:
    from localenv.objectstore import ObjectStore

    store = ObjectStore(workdir / "s3", nice=19)  # a user's store runs elsewhere: its CPU is not the worker's
    store.start()
    try:
        bucket = f"bench-{uuid.uuid4().hex[:6]}"
        store.client().create_bucket(bucket)
        # Credentials in the workers' env, as the pod's Secret gives them.
        creds = store.creds.env()
        backups = ("--backup-uri", f"s3://{bucket}/dedup", "--backup-endpoint", store.endpoint,
                   "--backup-interval", interval, "--backup-retention", "2")
        result = {"keys": keys, "records": records, "interval": interval, "rounds": rounds, "verify": {}}
        _upload_and_recovery(bootstrap, workdir, keys, backups, creds, result, progress)
        result["cost"] = _throughput(bootstrap, workdir, records, backups, creds, rounds, result, progress)
    finally:
        store.stop()
    return result


def _upload_and_recovery(bootstrap, workdir, keys, backups, creds, result, progress) -> None:
    from eopipe.tools.loadgen import run_load

    run = Setup(bootstrap, workdir, "snapshots", "snap")
    src, out, dlq = run.topics
    progress(f"preloading {keys:,} unique keys into {src}")
    run_load(bootstrap, src, keys, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=5)
    path = run.work / "assignment.json"
    single_owner(path, "a")
    w = Worker("a", bootstrap, run.topics, path, run.work, run.pipeline, env=creds)  # backups off: the first is full
    plain = list(w.cmd)
    try:
        t0 = time.monotonic()
        wait(lambda: _committed(w, keys), 3600, "the partition deduplicated")
        progress(f"deduplicated {keys:,} keys in {time.monotonic() - t0:.0f}s; restarting with backups on")
        w.stop()
        w.cmd = plain + list(backups)
        w.start()
        full = wait(lambda: _snapshot_at(w, keys), 600, "the first snapshot")
        extra = max(1000, keys // 100)
        run_load(bootstrap, src, extra, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=6)
        end = keys + extra
        wait(lambda: _committed(w, end), 600, "the added keys deduplicated")
        inc = wait(lambda: _snapshot_at(w, end), 600, "the incremental snapshot")
        result["upload"] = {"full": upload_row(full), "incremental": upload_row(inc)}
        result["state_mb"] = inc["bytes"] / 1e6
        progress(f"snapshots: {result['upload']}")
        w.stop()

        rec = {}
        for how in ("restore", "rebuild"):
            shutil.rmtree(w.state, ignore_errors=True)  # the volume is lost
            w.cmd = plain + list(backups) if how == "restore" else plain
            w.start()
            wait(lambda: _committed(w, end), 3600, f"the partition running after a {how}")
            rec[f"{how}_s"] = recovery_seconds(logs(w.log))
            running = _last(w, "partition running")
            rec[f"{how}_replayed"] = running.get("replayed", 0)
            if how == "restore":
                restored = _last(w, "restored from snapshot")
                if restored["snapshot_offset"] != end:
                    raise RuntimeError(f"restored the wrong snapshot: {restored}")
                rec["download_s"] = restored["seconds"]
            elif running.get("recovery") != "rebuild":
                raise RuntimeError(f"not a rebuild: {running}")
            progress(f"{how}: {rec[f'{how}_s']:.2f}s")
            w.stop()
        result["recovery"] = rec
        result["verify"]["recovery"] = verified(bootstrap, src, out, group=w.group, dlq=dlq,
                                                timeout=_verify_s(end))
    finally:
        w.stop()


def _throughput(bootstrap, workdir, records, backups, creds, rounds, result, progress) -> dict:
    """Backups off and on over one source, alternating for `rounds`; the best steady round of each."""
    from bench.dedup_vs_copy import Sampler, steady
    from eopipe.tools.loadgen import run_load

    src = Setup(bootstrap, workdir, "cost", "snc").topics[0]
    progress(f"throughput: preloading {records:,} records (20% resends) into {src}")
    run_load(bootstrap, src, records, dup_ratio=0.2, wrong_partition_ratio=0.0, seed=11)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(rounds):
        for state in ("off", "on"):
            run = Setup(bootstrap, workdir, f"cost-{state}", f"snc{state}")
            topics = (src, *run.topics[1:])
            path = run.work / "assignment.json"
            single_owner(path, "t")
            sampler = Sampler(bootstrap, _group(run.pipeline), src, 1, topics[1])
            w = None
            try:
                w = Worker("t", bootstrap, topics, path, run.work, run.pipeline,
                           extra=backups if state == "on" else (), env=creds)
                wait(lambda: _committed(w, sampler.end), 3600, f"backups {state}: the source deduplicated")
            finally:
                samples = sampler.finish()
                if w is not None:
                    w.stop()
            row = steady(samples, sampler.end, records)
            snaps = [d for d in logs(w.log) if d.get("msg") == "snapshot uploaded"]
            row["snapshots"] = len(snaps)
            row["snapshot_cpu_s"] = sum(d.get("cpu_seconds", 0) for d in snaps)
            row["snapshot_uploaded_mb"] = sum(d["uploaded_bytes"] for d in snaps) / 1e6
            runs[state].append(row)
            progress(f"round {r + 1}/{rounds}, backups {state}: {row}")
            result["verify"][f"backups {state} {r + 1}"] = verified(bootstrap, src, topics[1], group=w.group,
                                                                    dlq=topics[2], timeout=_verify_s(records))
    return {state: dict(max(rs, key=lambda x: x["steady_records_per_s"] or 0),
                        steady_by_round=[x["steady_records_per_s"] for x in rs]) for state, rs in runs.items()}


def _verify_s(records: int) -> float:
    """Reading 10M records twice takes over 5 minutes on a busy 2-core machine."""
    return 300 + records / 10_000


def _group(pipeline: str) -> str:
    from eopipe.core.names import consumer_group

    return consumer_group("bench", pipeline)


def main(argv: list[str] | None = None) -> int:
    def options(ap):
        ap.add_argument("--keys", type=int, default=1_000_000,
                        help="unique keys in the restored partition (default 1000000; the goal is at 10000000)")
        ap.add_argument("--records", type=int, default=1_000_000,
                        help="records per throughput run, backups off and on (default 5000000)")
        ap.add_argument("--rounds", type=int, default=2, help="throughput rounds, off and on alternating (default 2)")
        ap.add_argument("--interval", default="5s", help="backup interval in the runs with backups on (default 5s)")
    return standalone("bench.snapshots", __doc__, options, table, argv,
                      lambda bootstrap, work, a: bench(bootstrap, work, keys=a.keys, records=a.records,
                                                       interval=a.interval, rounds=a.rounds, progress=say))


if __name__ == "__main__":
    sys.exit(main())
