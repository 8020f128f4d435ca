"""The rebalance state machine (docs/design.md#rebalancing): pure, resumable, recorded in status.

`step(facts, rebalance) -> Plan`: observed facts in (spec, the source topic's partition count
in Kafka, the published assignment, the StatefulSet's replicas, each dedup pod's readiness and
/status), the current `status.rebalance` in; the next `status.rebalance`, the assignment to
publish, the StatefulSet replicas and the topic partition count to ensure, and events out.

The reconciler persists `plan.rebalance` in the CR status BEFORE it acts (publishes the
assignment, scales, creates partitions), replacing the recorded one whole (a status merge patch
would keep the keys a later phase drops: control.status.rebalance_patch); every action is an
idempotent "make it so" derived from the recorded phase. So an operator killed at any point
continues from status on its next pass: it re-applies the recorded phase's actions and
re-checks its exit condition. It never starts over and never skips a step. Target assignments are computed once, stored in status
(`rebalance.target`), and only read back afterwards.

Replicas R -> R2:
    ScalingUp (only if R2 > R): StatefulSet to R2; wait until the new pods are Ready.
    HandingOff: publish generation g+1 = the sticky balanced assignment for R2 pods, with a
        handoff (old owner, its pod IP URL) for every moved partition; wait until every moved
        partition runs at its new owner (its /status at generation >= g+1). Record per move:
        method (snapshot | rebuild | local), bytes, pause ms.
    Finalizing: publish g+2 without handoffs; StatefulSet to R2 (the leaving pods own nothing
        since g+1); wait until g+2 is seen published, the leaving pods are gone and the rest
        report g+2. Only then is the rebalance recorded done (lastRebalance).
Partitions N -> N2:
    Pausing: publish g+1 = same owners, paused, partitionCount N; wait until every pod
        reports paused (all its partitions committed and stopped); then read the group's
        committed offsets: the re-shard boundaries.
    CreatingPartitions: create the partitions (source and deduped topics); wait for Kafka.
    Resharding: publish g+2 = old owners kept, new partitions to the least loaded pods,
        partitionCount N2, reshard {id, from, to, peers}, history += {offsets}; the workers
        export the keys whose home changed, import theirs, and resume partition by partition.
        Wait until every partition runs at generation >= g+2.
    Finalizing: publish g+3 without the reshard block.
A decrease is not a rebalance: the topic reconcile refuses it (Stalled/NotSupported). Nor is a
left-over handoff, pause or reshard block with nothing to move and no count to change: it is
published away (g+1) without a rebalance record or event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eopipe.core.assignment import Assignment, assign, grow, moves
from eopipe.core.durations import rfc3339
from eopipe.core.wire import Migration, MigrationMethod, PartitionState, PartitionStatus, PodStatus

FINALIZE_GRACE_MS = 30_000


@dataclass
class PodFacts:
    name: str
    ip: str | None = None
    ready: bool = False
    status: PodStatus | None = None  # the worker's /status; None if unreachable
    port: int = 8080

    @property
    def url(self) -> str | None:
        return f"http://{self.ip}:{self.port}" if self.ip else None

    @property
    def generation(self) -> int:
        g = self.status.generation if self.status else None
        return -1 if g is None else g

    @property
    def paused(self) -> bool:
        return bool(self.status and self.status.paused)

    def partition(self, p: int) -> PartitionStatus | None:
        return self.status.partitions.get(p) if self.status else None

    def running(self, p: int, generation: int) -> bool:
        ps = self.partition(p)
        return self.generation >= generation and ps is not None and ps.state is PartitionState.RUNNING


@dataclass
class Facts:
    now_ms: int
    pod_prefix: str                   # "<pipeline>-dedup": pods are <prefix>-<ordinal>
    replicas: int                     # spec.dedup.replicas
    partitions: int                   # spec.source.partitions
    paused: bool = False              # spec.paused
    actual_partitions: int | None = None  # the source topic in Kafka; None: missing/unknown
    assignment: Assignment | None = None  # the published one; None: none yet
    sts_replicas: int | None = None   # the StatefulSet's spec.replicas; None: no StatefulSet
    pods: dict[str, PodFacts] = field(default_factory=dict)
    committed: dict[int, int] | None = None  # the group's committed offsets (while Pausing)
    window_ms: int = 24 * 3600 * 1000


@dataclass
class Plan:
    rebalance: dict | None
    assignment: Assignment
    replicas: int
    partitions: int
    last: dict | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, msg)
    message: str | None = None


def pods(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def _label(rb: dict) -> str:
    if rb["type"] == "partitions":
        return f"rebalance {rb['id']} (partitions {rb['fromPartitions']} -> {rb['toPartitions']})"
    return f"rebalance {rb['id']} (replicas {rb['fromReplicas']} -> {rb['toReplicas']})"


def _ps(ps) -> str:
    ps = sorted(int(p) for p in ps)
    return ", ".join(map(str, ps)) if ps else "none"


def step(f: Facts, rb: dict | None) -> Plan:
    if rb is None:
        plan = _idle(f)
    else:
        rb = {**rb, "moves": {k: dict(v) for k, v in (rb.get("moves") or {}).items()}}
        plan = PHASES[rb["phase"]](f, rb)
    if f.paused:
        plan.replicas = 0
    if plan.rebalance is not None and plan.message:
        plan.rebalance["message"] = plan.message
    return plan


# -- no rebalance running ------------------------------------------------------------------------
def _idle(f: Facts) -> Plan:
    a = f.assignment
    have = f.actual_partitions
    if a is None or not a.owners or have is None:
        # A new pipeline (or its source topic is missing): nothing to migrate.
        n = max(f.partitions, have or 0)
        owners = assign(n, pods(f.pod_prefix, max(1, f.replicas)))
        gen = 1 if a is None else (a.generation if (owners == a.owners and a.partition_count == n)
                                   else a.generation + 1)
        return Plan(None, Assignment(gen, owners, partition_count=n), f.replicas, n)
    n = a.partition_count or have
    a = _prune(a.with_(partition_count=n) if a.partition_count is None else a, f)
    if f.paused:
        return Plan(None, a, 0, have)
    if f.partitions < have:
        # Kafka cannot remove partitions: the topic reconcile refuses (Stalled/NotSupported)
        # and the pipeline keeps running as it is.
        return Plan(None, a, f.sts_replicas or f.replicas, f.partitions)
    current_replicas = f.sts_replicas if f.sts_replicas is not None else 0
    if f.partitions > have:
        R = max(current_replicas, 1)
        rb = {"id": a.generation + 1, "type": "partitions", "phase": "Pausing",
              "fromPartitions": have, "toPartitions": f.partitions,
              "fromReplicas": current_replicas, "toReplicas": current_replicas,
              "startedAt": rfc3339(f.now_ms), "startedAtMs": f.now_ms, "moves": {}}
        paused = Assignment(a.generation + 1, dict(a.owners), partition_count=have, paused=True,
                            reshards=a.reshards)
        rb["targetGeneration"] = paused.generation
        rb["target"] = paused.to_json()
        msg = f"pausing the dedup stage to grow the source from {have} to {f.partitions} partitions"
        return Plan(rb, paused, R, have, events=[("Normal", "RebalanceStarted", f"{_label(rb)}: {msg}")],
                    message=msg)
    target = assign(n, pods(f.pod_prefix, max(1, f.replicas)), a.owners)
    if current_replicas == f.replicas and target == a.owners:
        if a.handoffs or a.paused or a.reshard:
            # Left over (no rebalance records it): nothing moves and no count changes, so this is
            # no rebalance (no RebalanceStarted, lastRebalance kept): publish it without them.
            a = a.with_(generation=a.generation + 1, handoffs={}, reshard=None, paused=False)
        return Plan(None, a, f.replicas, n)
    rb = {"id": a.generation + 1, "type": "replicas", "phase": "ScalingUp",
          "fromReplicas": current_replicas, "toReplicas": f.replicas,
          "fromPartitions": n, "toPartitions": n,
          "startedAt": rfc3339(f.now_ms), "startedAtMs": f.now_ms, "moves": {}}
    ev = ("Normal", "RebalanceStarted", f"{_label(rb)}: started")
    if f.replicas > current_replicas:
        plan = _scaling_up(f, rb)
    else:
        plan = _plan_handoff(f, rb)
    plan.events.insert(0, ev)
    return plan


def _prune(a: Assignment, f: Facts) -> Assignment:
    """Re-shard history is needed for rebuilds only while it lies within the dedup window."""
    keep = tuple(r for r in a.reshards if f.now_ms - int(r.get("at", 0)) <= 2 * f.window_ms + 600_000)
    if keep == a.reshards:
        return a
    return a.with_(generation=a.generation + 1, reshards=keep)


# -- replicas --------------------------------------------------------------------------------------
def _scaling_up(f: Facts, rb: dict) -> Plan:
    want = pods(f.pod_prefix, rb["toReplicas"])
    ready = [n for n in want if n in f.pods and f.pods[n].ready and f.pods[n].status is not None]
    if len(ready) == len(want):
        return _plan_handoff(f, rb)
    rb["phase"] = "ScalingUp"
    a = f.assignment
    return Plan(rb, a, rb["toReplicas"], rb["fromPartitions"],
                message=f"scaling up: {len(ready)}/{len(want)} dedup pods ready")


def _plan_handoff(f: Facts, rb: dict) -> Plan:
    a = f.assignment
    n = a.partition_count or rb["fromPartitions"]
    target = assign(n, pods(f.pod_prefix, max(1, rb["toReplicas"])), a.owners)
    mv = moves(a.owners, target)
    handoffs = {}
    for p, (src, _dst) in mv.items():
        pf = f.pods.get(src) if src else None
        if pf is not None and pf.url:
            handoffs[p] = {"from": src, "url": pf.url}
    new = Assignment(a.generation + 1, target, partition_count=n, handoffs=handoffs, reshards=a.reshards)
    rb.update(phase="HandingOff", targetGeneration=new.generation, target=new.to_json(),
              moves={str(p): {"from": src, "to": dst} for p, (src, dst) in mv.items()},
              handoffStartedAtMs=f.now_ms)
    ev = [("Normal", "Rebalancing", f"{_label(rb)}: handing off partitions {_ps(mv)}"
           + (f" ({', '.join(f'{p}: {s} -> {d}' for p, (s, d) in mv.items())})" if mv else ""))]
    if not mv:
        plan = _enter_finalizing(f, rb, new)
        plan.events[:0] = ev
        return plan
    return Plan(rb, new, max(rb["fromReplicas"], rb["toReplicas"]), n, events=ev,
                message=f"handing off partitions {_ps(mv)}: 0/{len(mv)} done")


def _handing_off(f: Facts, rb: dict) -> Plan:
    target = Assignment.from_json(rb["target"])

    def record(p: str, m: dict, mig: Migration):
        method = str(mig.method or (MigrationMethod.REBUILD if not m.get("from") else MigrationMethod.LOCAL))
        m.update(method=method, bytes=mig.bytes or 0, pauseMs=mig.pause_ms or 0)
        if method != "snapshot":
            why = mig.reason or ("no previous owner" if not m.get("from") else "state was already local")
            rebuilt = method == "rebuild"
            return ("Warning" if rebuilt else "Normal", "StateRebuilt" if rebuilt else "StateLocal",
                    f"{_label(rb)}: partition {p} on {m['to']}: {method} ({why})")

    events, done = _follow_moves(f, rb, record)
    if done == len(rb["moves"]):
        plan = _enter_finalizing(f, rb, target)
        plan.events[:0] = events
        return plan
    return Plan(rb, target, max(rb["fromReplicas"], rb["toReplicas"]), target.partition_count or rb["toPartitions"],
                events=events,
                message=f"handing off partitions {_ps(rb['moves'])}: {done}/{len(rb['moves'])} done")


def _follow_moves(f: Facts, rb: dict, record) -> tuple[list, int]:
    """Marks done every move whose partition now runs at its new owner at the target generation;
    `record(p, move, the worker's migration report)` notes how it went and may return an event.
    Returns those events and how many moves are done."""
    events = []
    for p, m in rb["moves"].items():
        if m.get("done"):
            continue
        pf = f.pods.get(m["to"])
        if pf is None or not pf.running(int(p), rb["targetGeneration"]):
            continue
        m["done"] = True
        ev = record(p, m, pf.partition(int(p)).migration or Migration())
        if ev:
            events.append(ev)
    return events, sum(1 for m in rb["moves"].values() if m.get("done"))


def _enter_finalizing(f: Facts, rb: dict, target: Assignment) -> Plan:
    final = target.with_(generation=target.generation + 1, handoffs={}, reshard=None, paused=False)
    rb.update(phase="Finalizing", targetGeneration=final.generation, target=final.to_json(),
              finalizingSinceMs=f.now_ms)
    if rb["type"] == "partitions":
        rb.setdefault("resumedAtMs", f.now_ms)
    msg = (f"scaling down to {rb['toReplicas']} pods" if rb["toReplicas"] < rb["fromReplicas"]
           else "publishing the final assignment")
    return Plan(rb, final, rb["toReplicas"], final.partition_count or rb["toPartitions"],
                events=[("Normal", "Rebalancing", f"{_label(rb)}: {msg}")], message=msg)


def _finalizing(f: Facts, rb: dict) -> Plan:
    final = Assignment.from_json(rb["target"])
    g = rb["targetGeneration"]
    keep = set(pods(f.pod_prefix, rb["toReplicas"]))
    leaving = [n for n in f.pods if n not in keep]
    behind = [n for n in keep if n in f.pods and f.pods[n].generation < g]
    waited = f.now_ms - rb.get("finalizingSinceMs", f.now_ms)
    n = final.partition_count or rb["toPartitions"]
    # Done is recorded only once the final assignment is seen published: were it recorded first
    # (the operator killed before publishing), nothing in status would say to publish it.
    unpublished = f.assignment is None or f.assignment.generation < g
    if leaving or unpublished or (behind and waited < FINALIZE_GRACE_MS):
        what = f"waiting for {', '.join(sorted(leaving))} to go" if leaving else \
            f"publishing generation {g}" if unpublished else \
            f"waiting for {', '.join(sorted(behind))} to read generation {g}"
        return Plan(rb, final, rb["toReplicas"], n, message=what)
    last = summary(rb, f.now_ms)
    return Plan(None, final, rb["toReplicas"], n, last=last,
                events=[("Normal", "RebalanceCompleted", f"{_label(rb)}: {describe(last)}")])


# -- partitions ------------------------------------------------------------------------------------
def _pausing(f: Facts, rb: dict) -> Plan:
    paused = Assignment.from_json(rb["target"])
    g = rb["targetGeneration"]
    owners = sorted(set(paused.owners.values()))
    waiting = [n for n in owners if n not in f.pods or not (f.pods[n].generation >= g and f.pods[n].paused)]
    R = max(rb["fromReplicas"], 1)
    if waiting or f.committed is None:
        return Plan(rb, paused, R, rb["fromPartitions"],
                    message=f"pausing: waiting for {', '.join(waiting) or 'committed offsets'}")
    # Every owner committed and stopped: the committed offsets are where the old count ends.
    rb["offsets"] = {str(p): max(0, int(f.committed.get(p, -1))) for p in range(rb["fromPartitions"])}
    rb["phase"] = "CreatingPartitions"
    rb["pausedAtMs"] = f.now_ms
    return Plan(rb, paused, R, rb["toPartitions"],
                events=[("Normal", "Rebalancing", f"{_label(rb)}: all partitions paused; creating partitions")],
                message=f"creating partitions {rb['fromPartitions']}..{rb['toPartitions'] - 1}")


def _creating(f: Facts, rb: dict) -> Plan:
    paused = Assignment.from_json(rb["target"])
    R = max(rb["fromReplicas"], 1)
    if (f.actual_partitions or 0) < rb["toPartitions"]:
        return Plan(rb, paused, R, rb["toPartitions"],
                    message=f"creating partitions {rb['fromPartitions']}..{rb['toPartitions'] - 1}")
    owners = grow(rb["toPartitions"], pods(f.pod_prefix, R), paused.owners)
    peers = {n: f.pods[n].url for n in sorted(set(owners.values())) if n in f.pods and f.pods[n].url}
    history = tuple(paused.reshards) + ({"id": rb["id"], "from": rb["fromPartitions"], "to": rb["toPartitions"],
                                         "at": f.now_ms, "offsets": rb["offsets"]},)
    new = Assignment(paused.generation + 1, owners, partition_count=rb["toPartitions"],
                     reshard={"id": rb["id"], "from": rb["fromPartitions"], "to": rb["toPartitions"],
                              "peers": peers},
                     reshards=history)
    rb.update(phase="Resharding", targetGeneration=new.generation, target=new.to_json(),
              moves={str(p): {"from": None, "to": o} for p, o in sorted(owners.items())})
    return Plan(rb, new, R, rb["toPartitions"],
                events=[("Normal", "Rebalancing", f"{_label(rb)}: re-sharding keys by the new partition count")],
                message="re-sharding: 0/%d partitions running" % len(owners))


def _resharding(f: Facts, rb: dict) -> Plan:
    target = Assignment.from_json(rb["target"])

    def record(p: str, m: dict, mig: Migration):
        method = str(mig.method or "none")
        m.update(method=method, keys=mig.keys or 0, bytes=mig.bytes or 0)
        if method == "rebuild":
            why = mig.reason or "re-shard import unavailable"
            return ("Warning", "StateRebuilt",
                    f"{_label(rb)}: partition {p} on {m['to']}: rebuilt from the source topic ({why})")

    events, done = _follow_moves(f, rb, record)
    R = max(rb["fromReplicas"], 1)
    if done == len(rb["moves"]):
        rb["resumedAtMs"] = f.now_ms
        plan = _enter_finalizing(f, rb, target)
        plan.replicas = R
        plan.events[:0] = events
        return plan
    return Plan(rb, target, R, rb["toPartitions"], events=events,
                message=f"re-sharding: {done}/{len(rb['moves'])} partitions running")


# -- reporting ---------------------------------------------------------------------------------------
def summary(rb: dict, now_ms: int) -> dict:
    ms = list(rb.get("moves", {}).values())
    out = {"id": rb["id"], "type": rb["type"],
           "fromReplicas": rb["fromReplicas"], "toReplicas": rb["toReplicas"],
           "fromPartitions": rb["fromPartitions"], "toPartitions": rb["toPartitions"],
           "startedAt": rb.get("startedAt"), "finishedAt": rfc3339(now_ms),
           "durationSeconds": round((now_ms - rb.get("startedAtMs", now_ms)) / 1000, 1),
           "bytesMoved": sum(int(m.get("bytes") or 0) for m in ms)}
    if rb["type"] == "partitions":
        out["partitionsCreated"] = rb["toPartitions"] - rb["fromPartitions"]
        out["keysMoved"] = sum(int(m.get("keys") or 0) for m in ms)
        out["pauseMs"] = max(0, rb.get("resumedAtMs", now_ms) - rb.get("startedAtMs", now_ms))
        out["rebuilt"] = sorted(int(p) for p, m in rb.get("moves", {}).items() if m.get("method") == "rebuild")
    else:
        out["partitionsMoved"] = len(ms)
        out["snapshot"] = sum(1 for m in ms if m.get("method") == "snapshot")
        out["rebuild"] = sum(1 for m in ms if m.get("method") == "rebuild")
        out["maxPauseMs"] = max([int(m.get("pauseMs") or 0) for m in ms], default=0)
    return out


def describe(last: dict) -> str:
    if last["type"] == "partitions":
        s = (f"partitions {last['fromPartitions']} -> {last['toPartitions']}: {last['keysMoved']} keys "
             f"({last['bytesMoved']} bytes) re-sharded, paused {last['pauseMs']} ms")
        if last.get("rebuilt"):
            s += f", rebuilt from the source: {_ps(last['rebuilt'])}"
    else:
        s = (f"replicas {last['fromReplicas']} -> {last['toReplicas']}: {last['partitionsMoved']} partitions moved "
             f"({last['snapshot']} by snapshot, {last['rebuild']} rebuilt), {last['bytesMoved']} bytes, "
             f"max pause {last['maxPauseMs']} ms")
    return s + f", took {last['durationSeconds']} s"


PHASES = {"ScalingUp": _scaling_up, "HandingOff": _handing_off, "Finalizing": _finalizing,
          "Pausing": _pausing, "CreatingPartitions": _creating, "Resharding": _resharding}
