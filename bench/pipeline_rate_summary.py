"""The pure half of bench.pipeline_rate: samples in, rows, verdicts and the table out. No I/O:
tests/unit/test_bench_pipeline_rate.py table-tests it.

A stage's progress is a list of points (t, done, input): wall-clock seconds, the records the
stage has consumed and the records its input holds, both as offset sums over its input's
partitions (so only their differences mean anything). Its lag is input - done.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from bench.common import percentile

Point = tuple[float, int, int]
# A stage kept up when its lag grew by at most this many seconds of its input over the window
# (the least-squares trend, not end minus start: Spark's lag is a sawtooth of one trigger).
GROWTH_S = 2.0
GOAL_X_TRIGGER = 1.5   # the goal: p99 under 1.5x the Spark trigger at GOAL_RATE
GOAL_RATE = 10_000
STAGES = ("dedup", "spark")


def dedup_points(samples: list) -> list[Point]:
    """bench.node_faults' sampler lines [t, committed, ends] (a committed -1 is none yet)."""
    return [(t, sum(max(c, 0) for c in committed), sum(ends)) for t, committed, ends in samples]


def spark_points(lines: list[dict]) -> list[Point]:
    """The watcher's lines: `read` (per deduped partition, the offset the sink's committed
    markers say the Spark stage read up to) and `ends` (the partitions' last stable offsets, read
    just before). A partition is never counted as read past its end (ends a moment older)."""
    out = []
    for d in lines:
        ends, read = d.get("ends") or {}, d.get("read") or {}
        if ends:
            out.append((d["t"], sum(min(read.get(p, 0), e) for p, e in ends.items()), sum(ends.values())))
    return out


def _trend(xy: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(xy)
    mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
    var = sum((x - mx) ** 2 for x, _ in xy)
    return sum((x - mx) * (y - my) for x, y in xy) / var if var else 0.0


def stage(points: list[Point], start: float, end: float) -> dict | None:
    """What a stage did in [start, end]: its input's rate, the rate it consumed at, its lag and
    the lag's growth over the window; None with fewer than two points there."""
    w = [p for p in points if start <= p[0] <= end]
    if len(w) < 2 or w[-1][0] <= w[0][0]:
        return None
    span = w[-1][0] - w[0][0]
    lags = [(t, i - d) for t, d, i in w]
    input_rate = (w[-1][2] - w[0][2]) / span
    growth = _trend(lags) * span
    return {"input_per_s": input_rate, "done_per_s": (w[-1][1] - w[0][1]) / span, "records": w[-1][1] - w[0][1],
            "lag_max": max(lag for _, lag in lags), "lag_end": lags[-1][1], "lag_growth": growth,
            "kept_up": growth <= max(GROWTH_S * input_rate, 1.0)}


def latency(pairs: list, unmatched: list, start: float, end: float) -> dict:
    """pairs: (produced ms, seen in the sink ms) per unique record; unmatched: produced ms of the
    records never seen in the sink. Those produced in [start, end) count."""
    lo, hi = start * 1000, end * 1000
    lat = sorted(seen - produced for produced, seen in pairs if lo <= produced < hi)
    missing = sum(1 for produced in unmatched if lo <= produced < hi)
    return {"records": len(lat), "missing": missing, "p50_ms": percentile(lat, 0.5) if lat else None,
            "p99_ms": percentile(lat, 0.99) if lat else None, "max_ms": lat[-1] if lat else None}


def row(run: dict) -> dict:
    """One rate's row. A run: rate (the target), window (start, end), dedup and spark (points),
    pairs and unmatched (the watcher's), cpu_ns {stage: ns} of its pods in the window,
    machine_cores / harness_cores (busy cores of the machine, of the load and the watcher) and
    sent_per_s (the load's own count; the source's offsets also hold reroutes and markers),
    cpu_by (cpu_shares' rows), requests_by (request_rates' rows)."""
    start, end = run["window"]
    out = {"rate": run["rate"], "seconds": end - start, "sent_per_s": run.get("sent_per_s"),
           "latency": latency(run["pairs"], run["unmatched"], start, end),
           "machine_cores": run.get("machine_cores"), "harness_cores": run.get("harness_cores"),
           "cpu_by": run.get("cpu_by"), "requests_by": run.get("requests_by")}
    for name in STAGES:
        st = stage(run[name], start, end)
        ns = (run.get("cpu_ns") or {}).get(name)
        if st is not None and ns is not None:
            st["cores"] = ns / 1e9 / (end - start)
            st["cpu_us_per_record"] = ns / 1000 / st["records"] if st["records"] else None
        out[name] = st
    return out


def sustained(rows: list[dict], name: str) -> dict:
    """The highest input rate the stage kept up with, and the first rate it did not (with the rate
    it reached there)."""
    kept = [r[name]["input_per_s"] for r in rows if r[name] and r[name]["kept_up"]]
    behind = next((r for r in sorted(rows, key=lambda r: r["rate"]) if r[name] and not r[name]["kept_up"]), None)
    return {"kept_up_per_s": max(kept) if kept else None,
            "behind_at": behind["rate"] if behind else None,
            "reached_per_s": behind[name]["done_per_s"] if behind else None,
            "input_there_per_s": behind[name]["input_per_s"] if behind else None}


def goal(rows: list[dict], trigger_s: float) -> dict:
    """p99 under GOAL_X_TRIGGER x the trigger at GOAL_RATE: met only with every record of the
    window seen in the sink. None when that rate was not run."""
    bound = GOAL_X_TRIGGER * trigger_s * 1000
    r = next((r for r in rows if r["rate"] == GOAL_RATE), None)
    if r is None:
        return {"bound_ms": bound, "met": None, "p99_ms": None}
    lat = r["latency"]
    met = lat["p99_ms"] is not None and lat["missing"] == 0 and lat["p99_ms"] < bound
    return {"bound_ms": bound, "met": met, "p99_ms": lat["p99_ms"]}


# ------------------------------------------------------------------ where the cores went

# (who, its own CPU seconds, the CPU seconds of the children it reaped, its parent's pid), per
# (pid, start time)
Proc = tuple[str, float, float, int]
TOP = 12
_CLASS = re.compile(r"^[a-z]\w*(\.\w+)*\.[A-Z]\w*$")  # java's main class: kafka.Kafka
_WORD = re.compile(r"^[a-z][a-z-]*$")                    # a subcommand: load, watch


def program(comm: str, argv: list[str]) -> str:
    """A host process's name in the table: java's main class, python's module or script with its
    subcommand, else the kernel's name for it without a per-CPU suffix (kworker/1:2)."""
    args = [a for a in argv if a]
    if comm == "java":
        return next((a for a in args[1:] if _CLASS.match(a)), "java")
    # a console script's comm is its own name; its argv[0] is still the interpreter
    if len(args) > 1 and (comm.startswith("python") or PurePath(args[0]).name.startswith("python")):
        rest = args[1:]
        if "-c" in rest:
            return f"{PurePath(args[0]).name} -c"
        if "-m" in rest and rest.index("-m") + 1 < len(rest):
            rest = rest[rest.index("-m") + 1:]
        else:
            rest = [a for a in rest if not a.startswith("-")]
        if rest:
            name = PurePath(rest[0]).name
            return f"{name} {rest[1]}" if len(rest) > 1 and _WORD.match(rest[1]) else name
    return comm.split("/", 1)[0]


def cpu_shares(before: dict, after: dict, seconds: float, busy_cores: float | None = None,
               steal_cores: float | None = None, top: int = TOP) -> list[tuple[str, float]]:
    """Cores per consumer over a window of `seconds`, most first, from two snapshots of every
    process ({(pid, start time): Proc}): a process present at both ends its CPU's growth, one
    started in the window all of it; the children a process reaped meanwhile under
    "who (exited children)", less what a child that was there at the start had used by then.
    Past the `top` rows, "others"; then the hypervisor's steal and what no process accounts for
    (busy minus the rest: processes that came and went unreaped by one counted, interrupts)."""
    by: dict[str, float] = {}
    for key, (who, own, kids, _) in after.items():
        own0, kids0 = before[key][1:3] if key in before else (0.0, 0.0)
        by[who] = by.get(who, 0.0) + own - own0
        if kids > kids0:
            by[f"{who} (exited children)"] = by.get(f"{who} (exited children)", 0.0) + kids - kids0
    alive = {pid: who for (pid, _), (who, *_) in after.items()}
    for key, (_, own0, kids0, ppid) in before.items():
        if key not in after and ppid in alive and f"{alive[ppid]} (exited children)" in by:
            by[f"{alive[ppid]} (exited children)"] -= own0 + kids0
    ranked = sorted(((w, s / seconds) for w, s in by.items() if s > 0), key=lambda x: (-x[1], x[0]))
    rows = ranked[:top]
    if ranked[top:]:
        rows.append((f"{len(ranked) - top} others", sum(c for _, c in ranked[top:])))
    if steal_cores is not None:
        rows.append(("hypervisor steal", steal_cores))
    if busy_cores is not None:
        rows.append(("no process (unreaped exits, interrupts)",
                     busy_cores - (steal_cores or 0.0) - sum(c for _, c in ranked)))
    return rows


# ------------------------------------------------------------------ the broker's requests

_FETCH_PARTS = {"FetchConsumer", "FetchFollower"}  # subsets of the Fetch meter's count


def request_counts(text: str) -> dict[str, int]:
    """bench/BrokerRequests.java's "<type> <count>" lines summed over versions, without the
    meters that count a part of Fetch again."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        kind, count = line.split()
        if kind not in _FETCH_PARTS:
            out[kind] = out.get(kind, 0) + int(count)
    return out


def request_rates(before: tuple[float, str], after: tuple[float, str], top: int = 6) -> list[tuple[str, float]]:
    """Requests/s by type between two reads (when, text), most first; past `top`, "N others"."""
    (t0, a), (t1, b) = before, after
    c0, c1 = request_counts(a), request_counts(b)
    ranked = sorted(((k, (n - c0.get(k, 0)) / (t1 - t0)) for k, n in c1.items() if n > c0.get(k, 0)),
                    key=lambda x: (-x[1], x[0]))
    rows = ranked[:top]
    if ranked[top:]:
        rows.append((f"{len(ranked) - top} others", sum(r for _, r in ranked[top:])))
    return rows


def _n(v, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _sustained_text(s: dict, unit: str) -> str:
    if s["behind_at"] is None:
        return f"{_n(s['kept_up_per_s'])} {unit}/s (kept up at every rate run)"
    got = f"at {s['behind_at']:,}/s it fell behind, reaching {_n(s['reached_per_s'])} of {_n(s['input_there_per_s'])}/s"
    return (f"{_n(s['kept_up_per_s'])} {unit}/s; {got}" if s["kept_up_per_s"] is not None
            else f"below every rate run: {got}")


def table(result: dict) -> str:
    rows, trig = result["rows"], result["trigger_s"]
    cpu = f", Spark pods' coreRequest {result['spark_cpu']}" if result.get("spark_cpu") else ""
    if result.get("executor_cores", 1) != 1:
        cpu += f", executor cores {result['executor_cores']}"
    out = [f"pipeline at rate: {result['example']} on the node tier ({result['nodes']} node"
           f"{'s' * (result['nodes'] > 1)}), Spark trigger {trig:g} s{cpu}, {result['dup_ratio']:.0%} resends; "
           f"{result['seconds']:g} s measured per rate after {result['warmup_s']:g} s; {result['cpus']} cores",
           f"{'rate/s':>7} {'sent/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'records':>9} {'unseen':>6} "
           f"{'busy cores':>10} {'load+reader':>11}"]
    for r in rows:
        lat = r["latency"]
        sent = r.get("sent_per_s")
        out.append(f"{r['rate']:>7,} {_n(sent):>7} {_n(lat['p50_ms']):>7} {_n(lat['p99_ms']):>7} "
                   f"{_n(lat['max_ms']):>7} {lat['records']:>9,} {lat['missing']:>6,} "
                   f"{_n(r['machine_cores'], '{:.2f}'):>10} {_n(r['harness_cores'], '{:.2f}'):>11}")
    out.append(f"{'rate/s':>7} {'stage':<6} {'in/s':>7} {'done/s':>7} {'lag max':>8} {'lag +/-':>8} "
               f"{'kept up':>8} {'CPU µs/rec':>10} {'cores':>6}")
    for r in rows:
        for name in STAGES:
            st = r[name]
            if st is None:
                out.append(f"{r['rate']:>7,} {name:<6} (no samples in the window)")
                continue
            out.append(f"{r['rate']:>7,} {name:<6} {_n(st['input_per_s']):>7} {_n(st['done_per_s']):>7} "
                       f"{_n(st['lag_max']):>8} {_n(st['lag_growth'], '{:+,.0f}'):>8} "
                       f"{'yes' if st['kept_up'] else 'NO':>8} {_n(st.get('cpu_us_per_record'), '{:.1f}'):>10} "
                       f"{_n(st.get('cores'), '{:.2f}'):>6}")
    out.append(f"highest rate kept up: dedup {_sustained_text(sustained(rows, 'dedup'), 'source records')}; "
               f"Spark {_sustained_text(sustained(rows, 'spark'), 'deduped records')}")
    for r in rows:
        if r.get("cpu_by"):
            out.append(f"where the {_n(r['machine_cores'], '{:.2f}')} busy cores went at {r['rate']:,}/s "
                       "(pods by namespace/name, host processes by program):")
            out += [f"  {c:>5.2f}  {who}" for who, c in r["cpu_by"]]
        if r.get("requests_by"):
            out.append(f"the broker's {sum(x for _, x in r['requests_by']):,.0f} requests/s at {r['rate']:,}/s: "
                       + ", ".join(f"{kind} {x:,.0f}" for kind, x in r["requests_by"]))
    g = goal(rows, trig)
    verdict = "not run" if g["met"] is None else "met" if g["met"] else "NOT MET"
    out.append(f"goal: p99 under {GOAL_X_TRIGGER:g} x trigger ({g['bound_ms']:,.0f} ms) at {GOAL_RATE:,} records/s: "
               f"{verdict}" + ("" if g["met"] is None else f" (p99 {_n(g['p99_ms'])} ms)"))
    for what, rep in (result.get("verify") or {}).items():
        out.append(f"eopipe verify, {what}: {_n(rep.get('unique_in'))} unique in, {_n(rep.get('out'))} out, "
                   f"lost {rep['lost']}, duplicated {rep['duplicated']}")
    return "\n".join(out)
