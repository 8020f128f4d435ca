"""The built-in autoscaler under a 4x load step, through the real operator
(docs/design.md#autoscaling).

The local control plane, its node agent (dedup pods as processes) and the operator run
examples/minimal.yaml with `spec.dedup.autoscale`: one pod per 1.25 x `rate` records/s
(targetRecordsPerSecondPerReplica), at most 4 and at most 2 more or fewer per move, scale down
after 30 s of less. The load steps
1x, 4x, 1x of `rate`, `seconds` each, 20% of sends resends. Measured, side by side per phase:
  replicas       the pods the operator ran (status.replicas), sampled every second: the
                 count at the phase's end and the range within it; the autoscaler's wish
  lag            the dedup stage's lag (status.lag.dedup), the largest sample
  latency        end to end per record: its arrival at a read_committed consumer of the
                 output minus the source record's timestamp (the dedup stage keeps it); p50,
                 p99 and max of the records produced in the phase
and per move (status.lastRebalance): when, from -> to, how long, the longest pause of a
moved partition, and how its state moved (snapshot or rebuilt). After the load the stage
drains and `eopipe verify` reads source and output: lost and duplicated must be 0.

    python -m bench.autoscale [--rate 300] [--seconds 30,60,60]
"""

from __future__ import annotations

import datetime
import json
import sys
import threading
import time
import uuid
from pathlib import Path

from bench.common import REPO, LatencyReader, percentile, say, standalone, wait

PHASES = ((1, "1x"), (4, "4x"), (1, "1x"))


def autoscale_spec(rate: float) -> dict:
    # A pod's target a quarter above 1x: at exactly 1x a measured 1x and a bit would keep two.
    return {"minReplicas": 1, "maxReplicas": 4, "targetRecordsPerSecondPerReplica": int(rate * 1.25),
            "targetLagPerReplica": int(rate * 5), "scaleUpStabilization": "0s",
            "scaleDownStabilization": "30s", "maxStep": 2}


# ------------------------------------------------------------------ pure: samples in, rows out

def phase_rows(phases: list[dict], samples: list[dict], latencies: list[tuple[float, float]]) -> list[dict]:
    """One row per phase. `phases`: {name, rate, start, end} (seconds from the run's start);
    `samples`: {t, replicas, desired, lag}; `latencies`: (produced at t, latency ms)."""
    rows = []
    for ph in phases:
        inside = [s for s in samples if ph["start"] <= s["t"] < ph["end"]]
        lat = sorted(ms for t, ms in latencies if ph["start"] <= t < ph["end"])
        reps = [s["replicas"] for s in inside if s.get("replicas") is not None]
        rows.append({
            "phase": ph["name"], "rate": ph["rate"], "seconds": round(ph["end"] - ph["start"], 1),
            "replicas_end": reps[-1] if reps else None,
            "replicas_range": f"{min(reps)}-{max(reps)}" if reps else "-",
            "desired_max": max((s["desired"] for s in inside if s.get("desired") is not None), default=None),
            "lag_max": max((s["lag"] for s in inside if s.get("lag") is not None), default=None),
            "records": len(lat),
            "p50_ms": percentile(lat, 0.5) if lat else None, "p99_ms": percentile(lat, 0.99) if lat else None,
            "max_ms": lat[-1] if lat else None})
    return rows


def move_rows(moves: list[dict], t0_epoch: float) -> list[dict]:
    """status.lastRebalance records (replicas type), oldest first, as rows."""
    rows = []
    for m in sorted(moves, key=lambda m: m["id"]):
        if m.get("type") != "replicas":
            continue
        started = datetime.datetime.fromisoformat(m["startedAt"]).timestamp()
        rows.append({"at_s": round(started - t0_epoch, 1),
                     "move": f"{m['fromReplicas']} -> {m['toReplicas']}",
                     "took_s": m["durationSeconds"], "max_pause_ms": m["maxPauseMs"],
                     "partitions": m["partitionsMoved"], "snapshot": m["snapshot"], "rebuilt": m["rebuild"]})
    return rows


def timeline(samples: list[dict], step: float = 10.0) -> str:
    """The pods at each `step` seconds (the last sample at or before it), e.g. `1 1 1 2 4 4`."""
    out, t = [], 0.0
    while samples and t <= samples[-1]["t"]:
        before = [s["replicas"] for s in samples if s["t"] <= t and s.get("replicas") is not None]
        out.append(str(before[-1]) if before else "-")
        t += step
    return " ".join(out)


def _cell(v) -> str:
    return "-" if v is None else f"{v:.0f}" if isinstance(v, float) else str(v)


def table(result: dict) -> str:
    cols = ("phase", "rate", "seconds", "replicas_end", "replicas_range", "desired_max", "lag_max", "records",
            "p50_ms", "p99_ms", "max_ms")
    out = ["  ".join(f"{c:>14}" for c in cols)]
    out += ["  ".join(f"{_cell(r[c]):>14}" for c in cols) for r in result["phases"]]
    mcols = ("at_s", "move", "took_s", "max_pause_ms", "partitions", "snapshot", "rebuilt")
    out += ["", "  ".join(f"{c:>12}" for c in mcols)]
    out += ["  ".join(f"{_cell(r[c]):>12}" for c in mcols) for r in result["moves"]] or ["  (no move)"]
    out += ["", "pods over time (every 10 s): " + timeline(result["samples"])]
    v = result["verify"]
    out += ["", f"eopipe verify: {v['unique_in']} keys, {v['out']} out, lost {v['lost']}, "
                f"duplicated {v['duplicated']}, out of order {v['out_of_order']}"]
    return "\n".join(out)


# ------------------------------------------------------------------ the run

class _Sampler(threading.Thread):
    def __init__(self, get, t0_epoch: float):
        super().__init__(daemon=True)
        self.get, self.t0, self.halt = get, t0_epoch, threading.Event()
        self.samples, self.moves = [], {}

    def run(self) -> None:
        while not self.halt.wait(1.0):
            try:
                st = self.get().get("status") or {}
            except Exception:  # noqa: BLE001 - a missed sample; the next one comes in a second
                continue
            self.samples.append({"t": time.time() - self.t0, "replicas": st.get("replicas"),
                                 "desired": (st.get("autoscale") or {}).get("desiredReplicas"),
                                 "lag": (st.get("lag") or {}).get("dedup")})
            if (lr := st.get("lastRebalance")) and lr.get("finishedAt"):
                self.moves[lr["id"]] = lr


def bench(bootstrap: str, workdir: Path, rate: float = 300, seconds: tuple[float, ...] = (30, 60, 60),
          progress=say) -> dict:
    sys.path.insert(0, str(REPO))
    import yaml

    from eopipe.core.keys import KeySpec
    from eopipe.core.names import deduped_topic, dlq_topic
    from eopipe.tools.loadgen import run_load
    from eopipe.tools.verify import verify
    from localenv.controlplane import ControlPlane
    from localenv.fixtures_operator import CRDS, OperatorProcess, kubectl, wait_established
    from localenv.nodeagent import NodeAgent

    ns, name, topic = "bench", "minimal", f"autoscale-{uuid.uuid4().hex[:6]}"
    cp = ControlPlane(workdir / "k8s")
    agent = op = None
    try:
        progress("autoscale: starting the control plane, the node agent and the operator")
        cp.start()
        agent = NodeAgent(cp.kubeconfig, workdir / "node")
        agent.start()
        for path in CRDS:
            kubectl(cp, "apply", "--server-side", "-f", str(path))
            wait_established(cp, "-f", str(path))
        kubectl(cp, "create", "namespace", ns)
        op = OperatorProcess(cp, ns, workdir)
        op.start()
        doc = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
        doc["spec"]["kafka"]["bootstrapServers"] = bootstrap
        doc["spec"]["source"]["topic"] = topic
        doc["spec"].setdefault("dedup", {}).update(replicas=1, autoscale=autoscale_spec(rate))
        kubectl(cp, "apply", "-n", ns, "-f", "-", input=json.dumps(doc))

        def get() -> dict:
            return json.loads(kubectl(cp, "get", "-n", ns, "exactlyoncepipeline", name, "-o", "json").stdout)

        def ready() -> bool:
            conds = (get().get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        wait(ready, 240, "the pipeline Ready", interval=1)
        progress("autoscale: pipeline Ready with 1 pod")

        t0 = time.time()
        lat, sampler = LatencyReader(bootstrap, deduped_topic(ns, name), t0), _Sampler(get, t0)
        lat.start()
        sampler.start()
        phases = []
        for (factor, label), secs in zip(PHASES, seconds):
            start = time.time() - t0
            progress(f"autoscale: {label} = {rate * factor:.0f} records/s for {secs:.0f}s")
            run_load(bootstrap, topic, int(rate * factor * secs), dup_ratio=0.2, rate=rate * factor,
                             seed=len(phases) + 1)
            phases.append({"name": label, "rate": rate * factor, "start": start, "end": time.time() - t0})
        # The last phase runs on until the pods are back to one (the down window) or 120 s pass.
        end = time.time() + 120
        while time.time() < end and (get().get("status") or {}).get("replicas") != 1:
            run_load(bootstrap, topic, int(rate * 5), dup_ratio=0.2, rate=rate, seed=len(phases) + 100 + int(end))
        phases[-1]["end"] = time.time() - t0
        progress("autoscale: load done; verifying")
        rep = verify(bootstrap, topic, deduped_topic(ns, name), key_spec=KeySpec(), dlq_topic=dlq_topic(ns, name),
                     settle=10, timeout=300)
        sampler.halt.set()
        lat.halt.set()
        sampler.join(10)
        lat.join(10)
        return {"phases": phase_rows(phases, sampler.samples, lat.seen),
                "moves": move_rows(list(sampler.moves.values()), t0),
                "samples": sampler.samples,
                "verify": {"unique_in": rep.unique_in, "out": rep.out, "lost": rep.lost,
                           "duplicated": rep.duplicated, "out_of_order": rep.out_of_order}}
    finally:
        for part in (op, agent):
            if part is not None:
                part.stop()
        cp.stop()


def _options(ap) -> None:
    ap.add_argument("--rate", type=float, default=300, help="records/s of 1x (default 300; one pod's target)")
    ap.add_argument("--seconds", default="30,60,60", help="seconds of the 1x, 4x and 1x phases (default 30,60,60)")


def main(argv: list[str] | None = None) -> int:
    def run(bootstrap, work, args):
        secs = tuple(float(s) for s in args.seconds.split(","))
        if len(secs) != 3:
            raise SystemExit("python -m bench.autoscale: --seconds takes three numbers: 1x,4x,1x")
        return bench(bootstrap, work, rate=args.rate, seconds=secs)
    return standalone("bench.autoscale", __doc__, _options, table, argv, run)


if __name__ == "__main__":
    sys.exit(main())
