"""`make bench`: the benchmarks side by side on one broker (the recovery step starts one of its
own, which it kills), in one run, as one table.

Steps (each module's docstring says exactly what it measures):
  dedup_vs_copy  dedup worker (exactly-once) vs a plain at-least-once copier: records/s, ratio;
                 with the peers (bench/peers/: Java copiers, Kafka Streams exactly_once_v2 dedup,
                 Spark dropDuplicatesWithinWatermark, its duplicates after a driver SIGKILL) as
                 ratios against eopipe. --peers runs this table alone; --quick leaves the peers out.
                 Then alone at 1M records: the steady state at 200k and 1M against the goals
                 (at least 0.85 of the copier, at most 4 µs CPU per record), and the same copier
                 in C on the same librdkafka (bench/peers/ccopy.c): the client library's own CPU
  scale          dedup throughput with 1, 2 and 4 pods on 4 and 16 partitions (one machine: the
                 pods share its cores), speed-up over 1 pod, output verified
  latency        Spark stage end to end, produce -> exactly-once Kafka sink: p50/p99
  spark_sink     the Spark stage's sinks over the payments SQL: eopipe's exactly-once Kafka sink,
                 Spark's own Kafka sink and Parquet; records/s, CPU per record, and the keys each
                 duplicates after a driver SIGKILL mid-batch and a restart from the checkpoint
  dedup_latency  the dedup stage alone, produce -> visible read_committed, at 1k and 10k
                 records/s, per commit interval (the latency/throughput knob), output verified
  recovery       dedup worker (1M keys) under steady load, on a broker of its own behind toxiproxy:
                 time until the lag is back to steady after a worker SIGKILL, a broker SIGKILL, a
                 network partition past the transaction timeout (healed) and a worker SIGSTOP;
                 median and max of 3 rounds each, against targets (10, 30, 30 s); output verified
  migration      handoff of a 1M-key partition: snapshot vs rebuild pause, MB/s
  memory         RSS of one dedup worker with 1M and 10M keys in its store
  snapshots      dedup snapshots in a real object store (SeaweedFS): upload MB/s (full, incremental),
                 a lost volume restored from the snapshot vs rebuilt from Kafka (1M keys), and the
                 throughput with backups on vs off; output verified (left out by --quick: ~5 min)
  autoscale      the operator's autoscaler under a 1x, 4x, 1x load step on the local control
                 plane: replicas over time, pause per move, latency per phase, verified output
                 (left out by --quick: it starts a control plane and runs about 4 minutes)
  node_faults    a node lost and a node drained on a 3-node tier of its own (payments, both
                 stages): time to NotReady, to the pods Ready elsewhere, back to full rate, and the
                 longest partition pause in the drain; both stages verified (left out by --quick
                 and when not root: it starts the node tier, about 10 minutes)
  pipeline_rate  both stages of payments together on a 1-node tier of its own at 1,000 and 10,000
                 records/s (20% resends), 3 minutes each: end-to-end p50/p99 (produce -> the sink's
                 read_committed consumer), CPU per record per stage, whether each kept up; both
                 stages verified (left out by --quick and when not root: about 11 minutes)

Prints the detail table of each step, then one combined table (stdout; progress goes to
stderr); writes the combined table and the details as JSON and a plot as PNG and SVG. Absolute
numbers drift on a shared 2-core machine; compare the rows of one run. The full run takes
10 to 18 minutes on 2 cores (0.5 to 2 of them pre-building the 10M-key store, 5 to 8 the
recovery faults, 2 to 4 the dedup loop at 1M records; the disk peaks near 0.5 GB under
.work/bench, removed after), about 11 more
for snapshots (1M keys, 5M records per throughput run), plus about 5 for the peers (--peers alone: 5.4 min); --quick is a smoke run with small sizes, no peers and
one round of two fault classes, worker kill and partition (~2.5 min, ~6 on a busy machine).

    python -m bench [--quick] [--peers | --no-peers] [--skip latency,...] [--bootstrap HOST:PORT] [--json FILE] [--png FILE]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from bench.common import REPO, broker, positive_ints, say
from bench.recovery_summary import FAULTS, parse_faults

STEPS = ("dedup_vs_copy", "scale", "latency", "spark_sink", "dedup_latency", "recovery", "migration", "memory", "snapshots",
         "autoscale", "node_faults", "pipeline_rate")
FULL = {"records": 200_000, "steady_sizes": "200000,1000000", "rounds": 2, "latency_seconds": 20.0, "rates": "100,1000",
        "recovery_keys": 1_000_000, "recovery_rate": 2000.0, "kills": 3, "recovery_steady": 5.0,
        "recovery_faults": "worker_kill,broker_kill,partition,worker_pause", "keys": 1_000_000,
        "memory_sizes": "1000000,10000000", "memory_load": 20_000,
        "scale_records": 400_000, "scale_pods": "1,2,4", "scale_partitions": "4,16",
        "dedup_rates": "1000,10000", "commit_intervals": "100,1000", "dedup_latency_seconds": 15.0,
        "sink_records": 1_000_000, "snapshot_keys": 1_000_000, "snapshot_records": 5_000_000}
QUICK = {"records": 20_000, "steady_sizes": "", "rounds": 1, "latency_seconds": 4.0, "rates": "100,1000",
         "recovery_keys": 50_000, "recovery_rate": 1000.0, "kills": 1, "recovery_steady": 2.0,
         # the broker kill is left out of the smoke run: it costs a broker restart (20-35 s on a
         # busy 2-core machine) on top of the fault broker's start; --recovery-faults adds it
         "recovery_faults": "worker_kill,partition", "keys": 20_000,
         "memory_sizes": "20000,100000", "memory_load": 5_000,
         "scale_records": 20_000, "scale_pods": "1,2", "scale_partitions": "4",
         "dedup_rates": "1000", "commit_intervals": "100", "dedup_latency_seconds": 4.0,
         "sink_records": 5_000, "snapshot_keys": 20_000, "snapshot_records": 20_000}


def _count(n: int) -> str:
    """1000000 -> 1M, 20000 -> 20k (for metric ids and labels)."""
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def run_steps(bootstrap: str, work: Path, opts: argparse.Namespace, skip: set[str]) -> tuple[dict, dict]:
    """Runs the steps in order; returns (results, errors) by step name. A failing step is
    reported and the others still run."""
    from bench import (autoscale, dedup_latency, dedup_vs_copy, latency, memory, migration, node_faults,
                       pipeline_rate, recovery, scale, snapshots, spark_sink)

    rates = tuple(int(r) for r in opts.rates.split(","))
    calls = {
        "dedup_vs_copy": lambda: dedup_vs_copy.bench_sizes(bootstrap, work / "dedup_vs_copy", opts.records,
                                                           sizes_of(opts.steady_sizes), rounds=opts.rounds,
                                                           progress=say, peers=opts.peers),
        "scale": lambda: scale.bench(bootstrap, work / "scale", pods=positive_ints(opts.scale_pods),
                                     partitions=positive_ints(opts.scale_partitions), records=opts.scale_records,
                                     verify="all", progress=say),
        "dedup_latency": lambda: dedup_latency.bench(bootstrap, work / "dedup_latency",
                                                     rates=positive_ints(opts.dedup_rates),
                                                     intervals=positive_ints(opts.commit_intervals),
                                                     seconds=opts.dedup_latency_seconds, progress=say),
        "latency": lambda: latency.bench(bootstrap, work / "latency", rates=rates, seconds=opts.latency_seconds,
                                         progress=say),
        "spark_sink": lambda: spark_sink.bench(bootstrap, work / "spark_sink", records=opts.sink_records,
                                               progress=say),
        "recovery": lambda: recovery.bench(work / "recovery", keys=opts.recovery_keys, rate=opts.recovery_rate,
                                           kills=opts.kills, steady=opts.recovery_steady,
                                           faults=parse_faults(opts.recovery_faults), progress=say),
        "migration": lambda: migration.bench(bootstrap, work / "migration", keys=opts.keys, progress=say),
        "memory": lambda: memory.bench(bootstrap, work, sizes=[int(s) for s in opts.memory_sizes.split(",")],
                                       load=opts.memory_load, progress=say),
        "snapshots": lambda: snapshots.bench(bootstrap, work / "snapshots", keys=opts.snapshot_keys,
                                             records=opts.snapshot_records, progress=say),
        "autoscale": lambda: autoscale.bench(bootstrap, work / "autoscale", progress=say),
        "node_faults": lambda: node_faults.bench(work / "node_faults", progress=say),
        "pipeline_rate": lambda: pipeline_rate.bench(work / "pipeline_rate", progress=say),
    }
    results, errors = {}, {}
    todo = [s for s in STEPS if s not in skip]
    for i, name in enumerate(todo, 1):
        (work / name).mkdir(parents=True, exist_ok=True)
        say(f"step {i}/{len(todo)}: {name}")
        t0 = time.monotonic()
        try:
            results[name] = calls[name]()
        except Exception as e:  # noqa: BLE001 - one failing step must not lose the others
            traceback.print_exc()
            errors[name] = f"{type(e).__name__}: {e}"
        say(f"step {i}/{len(todo)}: {name} {'failed' if name in errors else 'done'} "
            f"in {time.monotonic() - t0:.0f}s")
    return results, errors


def summary(results: dict, opts: argparse.Namespace, skip: set[str]) -> list[dict]:
    """The combined table: one row per metric, every expected metric present (value None when
    its step failed)."""
    rows: list[dict] = []

    def row(step, mid, metric, unit, notes, get):
        if step in skip:
            return
        try:
            value = float(get(results[step]))
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
            value = None
        rows.append({"id": mid, "metric": metric, "value": value, "unit": unit, "notes": notes})

    copy_notes = f"{opts.records:,} records (20% resends), 4 partitions, best of {opts.rounds}"
    row("dedup_vs_copy", "copy_records_per_s", "plain copy (at-least-once)", "records/s", copy_notes,
        lambda r: r["rows"][0]["records_per_s"])
    row("dedup_vs_copy", "dedup_records_per_s", "dedup worker (exactly-once)", "records/s", copy_notes,
        lambda r: r["rows"][1]["records_per_s"])
    row("dedup_vs_copy", "dedup_json_records_per_s", "dedup worker, key = JSON field user.id", "records/s", copy_notes,
        lambda r: next((x for x in r["rows"] if x["id"] == "dedup_json"), None)["records_per_s"])
    row("dedup_vs_copy", "dedup_vs_copy_ratio", "dedup / copy throughput", "ratio", "records/s over records/s",
        lambda r: r["rows"][1]["records_per_s"] / r["rows"][0]["records_per_s"])
    copy_goal_rows(row, opts)
    if opts.peers:
        from bench.contestants import ALL

        def peer_row(r, cid):
            return next(x for x in r["rows"] if x["id"] == cid)

        for c in (c for c in ALL if c.peer):
            def notes(c=c):
                try:
                    p = peer_row(results["dedup_vs_copy"], c.id)
                except (KeyError, StopIteration):
                    return c.guarantee
                return (f"{c.name}: CPU {p['cpu_us_per_record']:.1f} µs/record ({p['cpu_vs_eopipe']:.1f}x "
                        f"eopipe), RSS {p['max_rss_mb']:.0f} MB")
            row("dedup_vs_copy", f"{c.id}_records_per_s", f"peer: {c.short}", "records/s", notes(),
                lambda r, c=c: peer_row(r, c.id)["records_per_s"])
            row("dedup_vs_copy", f"{c.id}_vs_eopipe", f"peer: {c.short} / eopipe", "ratio",
                f"records/s over eopipe's, {c.guarantee}", lambda r, c=c: peer_row(r, c.id)["vs_eopipe"])
        kill = (results.get("dedup_vs_copy") or {}).get("spark_kill") or {}
        row("dedup_vs_copy", "spark_dedup_duplicated_after_kill", "peer: Spark dedup, dup keys after SIGKILL",
            "keys", f"of {kill.get('unique', 0):,} unique, {kill.get('lost', '?')} lost; "
            "restart from checkpoint, counted by eopipe verify", lambda r: r["spark_kill"]["duplicated"])
    for r in (results.get("scale") or {}).get("rows") or []:
        def scale_notes(r=r):
            x = "" if r["speedup"] is None else f"{r['speedup']:.2f}x 1 pod"
            steady = "" if r["steady_records_per_s"] is None else f", steady {r['steady_records_per_s']:,.0f}/s"
            cpu = "" if r["cpu_us_per_record"] is None else f", CPU {r['cpu_us_per_record']:.1f} µs/record"
            return f"{x}{steady}{cpu}; {opts.scale_records:,} records, pods share the machine's cores"
        row("scale", f"scale_{r['partitions']}p_{r['pods']}pods_records_per_s",
            f"dedup, {r['partitions']} partitions, {r['pods']} pod{'s' * (r['pods'] > 1)}", "records/s",
            scale_notes(), lambda res, r=r: r["records_per_s"])
    if "scale" in skip or not results.get("scale"):
        row("scale", "scale_records_per_s", "dedup by pods and partitions", "records/s", "step failed",
            lambda res: res["rows"][0]["records_per_s"])
    for rate in positive_ints(opts.dedup_rates):
        for interval in positive_ints(opts.commit_intervals):
            def lat_row(res, rate=rate, interval=interval):
                return next(x for x in res["rows"] if x["rate"] == rate and x["commit_interval_ms"] == interval)
            notes = f"dedup stage, produce -> visible read_committed, commit interval {interval} ms"
            for q in ("p50", "p99"):
                row("dedup_latency", f"dedup_latency_{q}_ms_{rate}_{interval}",
                    f"dedup latency {q} at {rate}/s, {interval} ms", "ms", notes,
                    lambda res, q=q, f=lat_row: f(res)[f"{q}_ms"])
    for i, rate in enumerate(int(r) for r in opts.rates.split(",")):
        notes = f"Spark, exactly-once Kafka sink, trigger 1s, {rate}/s for {opts.latency_seconds:.0f}s"
        row("latency", f"latency_p50_ms_{rate}", f"end-to-end latency p50 at {rate}/s", "ms", notes,
            lambda r, i=i: r[i]["p50_ms"])
        row("latency", f"latency_p99_ms_{rate}", f"end-to-end latency p99 at {rate}/s", "ms", notes,
            lambda r, i=i: r[i]["p99_ms"])
    from bench.spark_sink import SINKS

    sink = results.get("spark_sink") or {}
    sink_notes = (f"{opts.sink_records:,} records, payments SQL, local[2]"
                  + (f", load {sink['load'][0]:.1f}" if sink.get("load") else ""))

    def sink_row(r, sid):
        return next((x for x in r["rows"] if x["id"] == sid), None)
    for s in SINKS:
        row("spark_sink", f"spark_sink_{s.id}_records_per_s", f"Spark stage, {s.short}", "records/s",
            f"{s.guarantee}; steady batches before the kill; {sink_notes}",
            lambda r, s=s: sink_row(r, s.id)["records_per_s"])
        row("spark_sink", f"spark_sink_{s.id}_cpu_us_per_record", f"Spark stage CPU, {s.short}", "µs/record",
            "user + system CPU of the driver's process tree (driver, JVM, Python workers)",
            lambda r, s=s: sink_row(r, s.id)["cpu_us_per_record"])
        row("spark_sink", f"spark_sink_{s.id}_duplicated_after_kill", f"Spark stage dup keys, {s.short}", "keys",
            "after a driver SIGKILL mid-batch and a restart; "
            + ("eopipe verify, read_committed" if s.id != "parquet" else "read by Spark in another process"),
            lambda r, s=s: sink_row(r, s.id)["duplicated"])
    row("spark_sink", "spark_sink_eopipe_vs_spark_kafka", "Spark stage: eopipe sink / Spark Kafka sink",
        "ratio", "records/s over records/s, same SQL, records and executors (goal >= 0.8)",
        lambda r: r["eopipe_vs_spark_kafka"])
    rec_notes = (f"lag back to steady after the fault ends; {_count(opts.recovery_keys)} keys, "
                 f"{opts.recovery_rate:.0f}/s, {opts.kills} round{'s' if opts.kills > 1 else ''}")
    for name in parse_faults(opts.recovery_faults):
        fault = FAULTS[name]

        def rec_row(r, name=name):
            return next((x for x in r["rows"] if x["fault"] == name), None)
        max_notes = "no target" if fault.target_s is None else f"target < {fault.target_s:.0f} s"
        try:
            got = rec_row(results["recovery"])
            max_notes += (("" if fault.target_s is None else f": {got['verdict']}")
                          + f"; from the fault's start {got['caught_up_from_start_max_s']:.1f} s")
        except (KeyError, TypeError):
            pass
        row("recovery", f"recovery_{name}_s", f"recovery after {fault.label}, median", "s", rec_notes,
            lambda r, f=rec_row: f(r)["caught_up_median_s"])
        row("recovery", f"recovery_{name}_max_s", f"recovery after {fault.label}, max", "s", max_notes,
            lambda r, f=rec_row: f(r)["caught_up_max_s"])
    mig_notes = f"1 partition, {_count(opts.keys)} keys"
    row("migration", "handoff_pause_snapshot_s", "handoff pause, snapshot transfer", "s", mig_notes,
        lambda r: r[0]["pause_s"])
    row("migration", "handoff_pause_rebuild_s", "handoff pause, rebuild from source", "s", mig_notes,
        lambda r: r[1]["pause_s"])
    row("migration", "migration_mb_per_s", "state migration (snapshot)", "MB/s",
        mig_notes + (f", {results['migration'][0]['state_mb']:.0f} MB state" if results.get("migration") else ""),
        lambda r: r[0]["mb_per_s"])
    budget = f", RocksDB budget {results['memory'][0]['budget_mb']:.0f} MB" if results.get("memory") else ""
    for i, keys in enumerate(int(s) for s in opts.memory_sizes.split(",")):
        row("memory", f"memory_peak_rss_mb_{_count(keys)}", f"memory per dedup pod, {keys:,} keys", "MB",
            "peak RSS (VmHWM) of the worker process" + budget, lambda r, i=i: r[i]["peak_rss_mb"])
    snap_rows(row, results, opts)
    auto = results.get("autoscale") or {}
    auto_notes = ("1x = 300/s, one pod's target; " + (f"lost {auto['verify']['lost']}, duplicated "
                  f"{auto['verify']['duplicated']} (eopipe verify)" if auto else "output verified"))
    row("autoscale", "autoscale_replicas_4x", "autoscale: pods at the end of 4x", "pods", auto_notes,
        lambda r: r["phases"][1]["replicas_end"])
    row("autoscale", "autoscale_replicas_after", "autoscale: pods at the end of 1x after", "pods", auto_notes,
        lambda r: r["phases"][2]["replicas_end"])
    row("autoscale", "autoscale_max_pause_ms", "autoscale: longest pause of a move", "ms",
        f"{len(auto.get('moves', []))} moves, live snapshot handoff",
        lambda r: max(m["max_pause_ms"] for m in r["moves"]))
    row("autoscale", "autoscale_p99_ms_4x", "autoscale: latency p99 during 4x", "ms",
        "dedup stage, produce -> read_committed output", lambda r: r["phases"][1]["p99_ms"])
    faults = results.get("node_faults") or {}
    loss_notes = (f"3 nodes, {faults.get('rate')} records/s; NotReady after {faults['not_ready_s']:.0f} s, partitions "
                  f"to a live pod after {faults['moved_s']:.0f} s (operator threshold {faults['threshold_s']} s)"
                  if faults else "")
    row("node_faults", "node_loss_full_rate_s", "node lost: back to full rate", "s",
        f"lag back to steady; goal 60 s; {loss_notes}", lambda r: r["full_rate_s"])
    row("node_faults", "drain_pause_s", "node drained: longest partition pause", "s",
        "committed offset still while records wait; goal 1 s" + (f"; drain done in {faults['drain_s']:.0f} s"
                                                                 if faults else ""), lambda r: r["drain_pause_s"])
    pipeline_rows(row, results)
    return rows


def copy_goal_rows(row, opts: argparse.Namespace) -> None:
    """The dedup loop against the plain copier at each of --steady-sizes, steady state (issue
    goals: at least 0.85 of the copier's records/s, at most 4 µs CPU per record)."""
    from bench.dedup_vs_copy import GOAL_CPU_US, GOAL_RATIO

    for n in sizes_of(opts.steady_sizes):
        for cid, label in (("dedup", "dedup"), ("dedup_json", "dedup by user.id")):
            def steady(r, n=n, cid=cid):
                rows = {x["id"]: x for x in r["sizes"][str(n)]}
                return rows[cid], rows["copy"]
            notes = f"{n:,} records, 10% to 90% committed, best of {opts.rounds}"
            row("dedup_vs_copy", f"{cid}_steady_ratio_{_count(n)}", f"{label} / copy, steady, {_count(n)} records",
                "ratio", f"{notes}; goal >= {GOAL_RATIO}",
                lambda r, f=steady: f(r)[0]["steady_records_per_s"] / f(r)[1]["steady_records_per_s"])
            row("dedup_vs_copy", f"{cid}_steady_cpu_us_{_count(n)}", f"{label} CPU, steady, {_count(n)} records",
                "µs/record", f"{notes}; goal <= {GOAL_CPU_US}; the copier's in the detail table",
                lambda r, f=steady: f(r)[0]["steady_cpu_us_per_record"])
        def c_copy(r, n=n):
            return next((x for x in r["sizes"][str(n)] if x["id"] == "c_copy"), None)["steady_cpu_us_per_record"]
        row("dedup_vs_copy", f"c_copy_steady_cpu_us_{_count(n)}", f"C copier CPU, steady, {_count(n)} records",
            "µs/record", f"{n:,} records; the copier's loop in C on its librdkafka: the client's floor under "
            f"goal <= {GOAL_CPU_US}", c_copy)


def sizes_of(text: str) -> list[int]:
    return positive_ints(text) if text else []


def pipeline_rows(row, results: dict) -> None:
    """bench.pipeline_rate's rows of the combined table."""
    from bench.pipeline_rate_summary import GOAL_RATE, STAGES, goal, sustained

    res = results.get("pipeline_rate") or {}
    for r in res.get("rows") or [{"rate": GOAL_RATE}]:
        def rate_row(x, rate=r["rate"]):
            return next(y for y in x["rows"] if y["rate"] == rate)
        lat = r.get("latency") or {}
        row("pipeline_rate", f"pipeline_p99_ms_{r['rate']}", f"pipeline end to end p99 at {r['rate']:,}/s", "ms",
            "payments, both stages on the node tier" + (f"; p50 {lat['p50_ms']:,.0f} ms, max {lat['max_ms']:,.0f} ms"
                                                         if lat.get("p50_ms") is not None else ""),
            lambda x, f=rate_row: f(x)["latency"]["p99_ms"])
        for name in STAGES:
            row("pipeline_rate", f"pipeline_{name}_cpu_us_{r['rate']}", f"pipeline {name} CPU at {r['rate']:,}/s",
                "µs/record", "its pods' cgroup CPU over the records it consumed",
                lambda x, f=rate_row, n=name: f(x)[n]["cpu_us_per_record"])
    for name in STAGES:
        s = sustained(res["rows"], name) if res else {"behind_at": None}
        behind = f"; behind at {s['behind_at']:,}/s, reaching {s['reached_per_s']:,.0f}/s" if s["behind_at"] else ""
        row("pipeline_rate", f"pipeline_{name}_kept_up_per_s", f"pipeline {name}: highest rate kept up", "records/s",
            "its input's rate, of the rates run" + behind, lambda x, n=name: sustained(x["rows"], n)["kept_up_per_s"])
    g = goal(res["rows"], res["trigger_s"]) if res else None
    row("pipeline_rate", "pipeline_goal_met", f"pipeline p99 goal at {GOAL_RATE:,}/s met", "1 = yes",
        "p99 under 1.5x the Spark trigger" + (f" ({g['bound_ms']:,.0f} ms)" if g else ""),
        lambda x: float(goal(x["rows"], x["trigger_s"])["met"]))


def snap_rows(row, results: dict, opts: argparse.Namespace) -> None:
    """bench.snapshots' rows of the combined table."""
    from bench.snapshots import GOAL_COST_PCT, GOAL_RESTORE_X, derived

    notes = f"1 partition, {_count(opts.snapshot_keys)} keys, SeaweedFS S3 gateway"
    for kind in ("full", "incremental"):
        row("snapshots", f"snapshot_upload_{kind}_mb_per_s", f"snapshot upload, {kind}", "MB/s", notes,
            lambda r, kind=kind: r["upload"][kind]["mb_per_s"])
    row("snapshots", "snapshot_restore_s", "lost volume: restore from snapshot", "s",
        notes + "; assignment read -> partition running", lambda r: r["recovery"]["restore_s"])
    row("snapshots", "snapshot_rebuild_s", "lost volume: rebuild from Kafka", "s", notes,
        lambda r: r["recovery"]["rebuild_s"])
    row("snapshots", "snapshot_restore_vs_rebuild", "restore speed-up over rebuild", "x",
        f"goal >= {GOAL_RESTORE_X:.0f}x at 10M keys", lambda r: derived(r)["restore_x"])
    row("snapshots", "snapshot_cost_pct", "throughput cost of backups", "%",
        f"steady records/s, backups on vs off, {opts.snapshot_records:,} records; goal <= {GOAL_COST_PCT:.0f}%",
        lambda r: derived(r)["cost_pct"])


def table(rows: list[dict]) -> str:
    def fmt(v):
        if v is None:
            return "FAILED"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
    head = f"{'metric':<44}{'value':>10}  {'unit':<10}notes"
    lines = [head, "-" * (len(head) + 50)]
    lines += [f"{r['metric']:<44}{fmt(r['value']):>10}  {r['unit']:<10}{r['notes']}" for r in rows]
    return "\n".join(lines)


def plot(results: dict, rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    val = {r["id"]: r["value"] for r in rows}
    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5))
    fig.suptitle(title)

    def bars(ax, labels, values, ylabel, subtitle, colors=None, fmt="{:,.0f}"):
        vs = [v if v is not None and math.isfinite(v) else 0 for v in values]
        b = ax.bar(labels, vs, color=colors)
        for rect, v in zip(b, values):
            text = "failed" if v is None else fmt.format(v)
            ax.annotate(text, (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center",
                        va="bottom", fontsize=9)
        ax.set_ylabel(ylabel)
        ax.set_title(subtitle, fontsize=11)
        ax.margins(y=0.15)

    ax = axes[0][0]
    peers = [r for r in rows if r["id"].endswith("_records_per_s") and r["metric"].startswith("peer: ")]
    bars(ax, ["plain copy\n(at-least-once)", "dedup worker\n(exactly-once)", "dedup worker,\nJSON key"]
         + [r["metric"][6:] for r in peers],
         [val.get("copy_records_per_s"), val.get("dedup_records_per_s"), val.get("dedup_json_records_per_s")]
         + [r["value"] for r in peers], "records/s",
         "throughput" + (f" (dedup/copy {val['dedup_vs_copy_ratio']:.2f})"
                         if val.get("dedup_vs_copy_ratio") is not None else ""),
         ["#999999", "#1f77b4", "#1f77b4"] + ["#ff7f0e"] * len(peers))
    if peers:
        plt.setp(ax.get_xticklabels(), fontsize=7, rotation=35, ha="right", rotation_mode="anchor")

    def p50_p99(ax, runs, labels, subtitle):
        if runs:
            xs = range(len(runs))
            w = 0.38
            for off, q in ((-w / 2, "p50"), (w / 2, "p99")):
                vals = [r[f"{q}_ms"] or 0 for r in runs]
                ax.bar([x + off for x in xs], vals, w, label=q)
                for x, v in zip(xs, vals):
                    ax.annotate(f"{v:,.0f}", (x + off, v), ha="center", va="bottom", fontsize=9)
            ax.set_xticks(list(xs), labels)
            ax.legend()
            ax.margins(y=0.15)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylabel("ms")
        ax.set_title(subtitle, fontsize=11)

    lat = results.get("latency") or []
    p50_p99(axes[0][1], lat, [f"{r['rate']}/s" for r in lat],
            "end-to-end latency, Spark exactly-once sink (trigger 1s)")
    dl = (results.get("dedup_latency") or {}).get("rows") or []
    p50_p99(axes[0][3], dl, [f"{r['rate']:,}/s\n{r['commit_interval_ms']} ms" for r in dl],
            "dedup stage latency by rate and commit interval")

    ax = axes[0][2]
    rec = [(f, val.get(f"recovery_{f.name}_s"), val.get(f"recovery_{f.name}_max_s")) for f in FAULTS.values()
           if f"recovery_{f.name}_s" in val]
    bars(ax, [f.label.replace(" ", "\n", 1) for f, _, _ in rec], [m for _, m, _ in rec],
         "seconds after the fault's end", "recovery: median, max (x), target (-)"
         + (f", {_count(results['recovery']['keys'])} keys" if results.get("recovery") else ""),
         ["#d62728"] * len(rec), "{:.1f} s")
    for i, (f, _, top) in enumerate(rec):
        if top is not None:
            ax.plot([i], [top], "kx")
        if f.target_s is not None:
            ax.plot([i - 0.4, i + 0.4], [f.target_s] * 2, color="#555555", linestyle="--", linewidth=1)
    if not rec:
        ax.text(0.5, 0.5, "not in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])

    ax = axes[1][0]
    bars(ax, ["snapshot transfer", "rebuild from source"],
         [val.get("handoff_pause_snapshot_s"), val.get("handoff_pause_rebuild_s")], "pause, s",
         "partition handoff pause" + (f" (snapshot {val['migration_mb_per_s']:.0f} MB/s)"
                                      if val.get("migration_mb_per_s") is not None else ""),
         ["#2ca02c", "#98df8a"], "{:.2f} s")

    ax = axes[1][1]
    mem = [r for r in rows if r["id"].startswith("memory_peak_rss_mb_")]
    bars(ax, [r["id"].rsplit("_", 1)[1] + " keys" for r in mem], [r["value"] for r in mem], "peak RSS, MB",
         "memory per dedup pod", ["#9467bd"] * len(mem), "{:,.0f} MB")
    if results.get("memory"):
        budget = results["memory"][0]["budget_mb"]
        ax.axhline(budget, color="#555555", linestyle="--", linewidth=1)
        ax.annotate(f"RocksDB budget {budget:.0f} MB", (0, budget), xytext=(0, 3), textcoords="offset points",
                    fontsize=8)

    ax = axes[1][2]
    sc = (results.get("scale") or {}).get("rows") or []
    for parts in sorted({r["partitions"] for r in sc}):
        pts = [r for r in sc if r["partitions"] == parts]
        ax.plot([r["pods"] for r in pts], [r["records_per_s"] for r in pts], marker="o", label=f"{parts} partitions")
        for r in pts:
            ax.annotate(f"{r['records_per_s']:,.0f}", (r["pods"], r["records_per_s"]), xytext=(0, 4),
                        textcoords="offset points", ha="center", fontsize=8)
    if sc:
        ax.set_xticks(sorted({r["pods"] for r in sc}))
        ax.legend()
        ax.set_ylim(bottom=0)
        ax.margins(y=0.15)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("dedup pods (one machine: they share its cores)")
    ax.set_ylabel("records/s")
    ax.set_title("dedup throughput by pods", fontsize=11)

    ax = axes[1][3]
    ax.axis("off")
    ax.text(0, 1, "\n".join(f"{r['metric'][:44]}: " + ("FAILED" if r["value"] is None else f"{r['value']:,.2f}")
                            + f" {r['unit']}" for r in rows), va="top", fontsize=7.5, family="monospace",
            transform=ax.transAxes)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    fig.savefig(path.with_suffix(".svg"))  # text: the README's copy (docs/bench.svg) diffs as one
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run with small sizes (defaults: %s)" % QUICK)
    ap.add_argument("--skip", default="", help=f"steps to leave out, comma separated, of {','.join(STEPS)}")
    ap.add_argument("--peers", action="store_true", default=None,
                    help="only the throughput table, with the peers (make bench-peers)")
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="leave the peers out")
    ap.add_argument("--bootstrap", help="an existing broker (default: start the local test broker)")
    ap.add_argument("--records", type=int, help=f"dedup_vs_copy: records in the source ({FULL['records']})")
    ap.add_argument("--steady-sizes", help="dedup_vs_copy: source sizes whose steady state is held to the goals, "
                    f"comma separated, peers at --records only ({FULL['steady_sizes']})")
    ap.add_argument("--rounds", type=int, help=f"dedup_vs_copy: rounds per contestant ({FULL['rounds']})")
    ap.add_argument("--scale-records", type=int, help=f"scale: records per source ({FULL['scale_records']})")
    ap.add_argument("--scale-pods", help=f"scale: pod counts, comma separated ({FULL['scale_pods']})")
    ap.add_argument("--scale-partitions", help=f"scale: partition counts, comma separated ({FULL['scale_partitions']})")
    ap.add_argument("--rates", help=f"latency: events/s, comma separated ({FULL['rates']})")
    ap.add_argument("--dedup-rates", help=f"dedup_latency: records/s, comma separated ({FULL['dedup_rates']})")
    ap.add_argument("--commit-intervals",
                    help=f"dedup_latency: commit intervals, ms, comma separated ({FULL['commit_intervals']})")
    ap.add_argument("--dedup-latency-seconds", type=float,
                    help=f"dedup_latency: measured seconds per row ({FULL['dedup_latency_seconds']})")
    ap.add_argument("--latency-seconds", type=float, help=f"latency: seconds per rate ({FULL['latency_seconds']})")
    ap.add_argument("--sink-records", type=int,
                    help=f"spark_sink: deduped records through each sink ({FULL['sink_records']})")
    ap.add_argument("--recovery-keys", type=int, help=f"recovery: keys in the store ({FULL['recovery_keys']})")
    ap.add_argument("--recovery-rate", type=float, help=f"recovery: load, records/s ({FULL['recovery_rate']})")
    ap.add_argument("--kills", type=int, help=f"recovery: rounds per fault class ({FULL['kills']})")
    ap.add_argument("--recovery-steady", type=float,
                    help=f"recovery: seconds of steady load before each fault ({FULL['recovery_steady']})")
    ap.add_argument("--recovery-faults", help=f"recovery: fault classes, comma separated ({FULL['recovery_faults']})")
    ap.add_argument("--keys", type=int, help=f"migration: keys in the handed-off partition ({FULL['keys']})")
    ap.add_argument("--memory-sizes", help=f"memory: keys per run, comma separated ({FULL['memory_sizes']})")
    ap.add_argument("--snapshot-keys", type=int,
                    help=f"snapshots: keys in the restored partition ({FULL['snapshot_keys']})")
    ap.add_argument("--snapshot-records", type=int,
                    help=f"snapshots: records per throughput run, backups off and on ({FULL['snapshot_records']})")
    ap.add_argument("--memory-load", type=int, help=f"memory: records processed per size ({FULL['memory_load']})")
    ap.add_argument("--json", type=Path, default=REPO / ".work" / "bench" / "bench.json",
                    help="write the table and the details as JSON here (default .work/bench/bench.json)")
    ap.add_argument("--png", type=Path, default=REPO / ".work" / "bench" / "bench.png",
                    help="write the plot here, and as SVG beside it (default .work/bench/bench.png)")
    args = ap.parse_args(argv)
    for k, v in (QUICK if args.quick else FULL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    try:
        parse_faults(args.recovery_faults)
    except ValueError as e:
        ap.error(f"--recovery-faults: {e}")
    for opt in ("scale_pods", "scale_partitions", "dedup_rates", "commit_intervals") + (
            ("steady_sizes",) if args.steady_sizes else ()):
        try:
            positive_ints(getattr(args, opt))
        except argparse.ArgumentTypeError as e:
            ap.error(f"--{opt.replace('_', '-')}: {e}")
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(STEPS):
        ap.error(f"unknown steps in --skip: {','.join(sorted(skip - set(STEPS)))}")
    if args.quick:
        # Each runs alone (python -m bench.autoscale, python -m bench.spark_sink): autoscale
        # starts a control plane; spark_sink starts seven Spark JVMs, minutes on two cores.
        # snapshots starts an object store and restarts workers on a pre-loaded partition: over
        # a minute even at tiny sizes (python -m bench.snapshots runs it alone)
        skip.update(("autoscale", "spark_sink", "snapshots", "node_faults", "pipeline_rate"))
    for step in ("node_faults", "pipeline_rate"):
        if os.geteuid() != 0 and step not in skip:
            say(f"{step} left out: the node tier needs root")
            skip.add(step)
    if args.peers:
        skip = set(STEPS) - {"dedup_vs_copy"}
    elif args.peers is None:
        args.peers = not args.quick
        if args.quick:
            say("peers left out in --quick: JVM and Spark start-up would be most of a small run (--peers runs "
                "them; tests/integration/test_bench.py runs each at a tiny count)")

    sys.path.insert(0, str(REPO))
    started = datetime.datetime.now().astimezone()
    t0 = time.monotonic()
    work = REPO / ".work" / "bench" / f"run-{started:%Y%m%d-%H%M%S}-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    with broker(work / "kafka", args.bootstrap) as bootstrap:
        results, errors = run_steps(bootstrap, work, args, skip)
    seconds = time.monotonic() - t0
    rows = summary(results, args, skip)

    for name in STEPS:
        if name in results:
            print(importlib.import_module(f"bench.{name}").table(results[name]))
            print()
    mode = "quick" if args.quick else "full"
    title = (f"eopipe make bench ({mode}), {started:%Y-%m-%d %H:%M %Z}, {seconds / 60:.1f} min, "
             f"{os.cpu_count()} cores")
    print(title)
    print(table(rows))
    for name, err in errors.items():
        print(f"FAILED {name}: {err}")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"started": started.isoformat(timespec="seconds"), "seconds": seconds,
                                     "mode": mode, "cpus": os.cpu_count(), "summary": rows,
                                     "details": results, "errors": errors}, indent=2, default=str))
    plot(results, rows, args.png, title)
    say(f"wrote {args.json}, {args.png} and {args.png.with_suffix('.svg')}")
    if errors:
        say(f"work files kept for the failed steps in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
