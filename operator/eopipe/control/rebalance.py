"""The rebalance state machine (docs/design.md#rebalancing): pure, resumable, recorded in status.

`step(facts, rebalance) -> Plan`: observed facts in (spec, the source topic's partition count
in Kafka, the published assignment, the StatefulSet's replicas, each dedup pod's readiness and
/status), the current `status.rebalance` in; the next `status.rebalance`, the assignment to
publish, the StatefulSet replicas and the topic partition count to ensure, and events out.
The facts and both records are the typed ones of core/rebalancing.py (`Rebalance.parse` /
`to_dict` at the status boundary, in the reconciler); the records are frozen, so every phase
returns a new one made with `dataclasses.replace`.

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

from dataclasses import dataclass, field, replace

from eopipe.core.assignment import Assignment, Handoff, Reshard, ReshardEra, assign, grow, moves
from eopipe.core.durations import rfc3339
from eopipe.core.rebalancing import (
    CREATING_PARTITIONS,
    FINALIZING,
    HANDING_OFF,
    PARTITIONS,
    PAUSING,
    REPLICAS,
    RESHARDING,
    SCALING_UP,
    Facts,
    Move,
    PodFacts,
    Rebalance,
    RebalanceSummary,
)
from eopipe.core.wire import Migration, MigrationMethod

__all__ = ["Facts", "PodFacts", "Plan", "pods", "step", "summary", "describe", "PHASES"]

FINALIZE_GRACE_MS = 30_000


@dataclass
class Plan:
    rebalance: Rebalance | None
    assignment: Assignment
    replicas: int
    partitions: int
    last: RebalanceSummary | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, msg)
    message: str | None = None


def pods(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def _owners(f: Facts, n: int) -> list[str]:
    """The pods that may own partitions: the first n, but those on a cordoned or lost node while
    another remains (with none left, they keep theirs: a drain of every node is paced by
    control/nodeloss one pod at a time, and a lost pod's replacement restores them)."""
    every = pods(f.pod_prefix, max(1, n))
    return [p for p in every if p not in f.draining | f.lost] or every


def _unready(f: Facts, a: Assignment, target: dict[int, str]) -> list[str]:
    """The pods that would gain partitions but do not serve yet (not Ready, or no /status)."""
    gaining = {dst for _src, dst in moves(a.owners, target).values()}
    return sorted(n for n in gaining if not (n in f.pods and f.pods[n].ready and f.pods[n].status is not None))


def _ps(ps) -> str:
    ps = sorted(int(p) for p in ps)
    return ", ".join(map(str, ps)) if ps else "none"


def _or(v: int | None, default: int) -> int:
    return default if v is None else v


def step(f: Facts, rb: Rebalance | None) -> Plan:
    plan = _idle(f) if rb is None else PHASES[rb.phase](f, rb)
    if f.paused:
        plan.replicas = 0
    if plan.rebalance is not None and plan.message:
        plan.rebalance = replace(plan.rebalance, message=plan.message)
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
        paused = Assignment(a.generation + 1, dict(a.owners), partition_count=have, paused=True,
                            reshards=a.reshards)
        rb = Rebalance(id=a.generation + 1, type=PARTITIONS, phase=PAUSING,
                       from_replicas=current_replicas, to_replicas=current_replicas,
                       from_partitions=have, to_partitions=f.partitions,
                       started_at=rfc3339(f.now_ms), started_at_ms=f.now_ms,
                       target_generation=paused.generation, target=paused)
        msg = f"pausing the dedup stage to grow the source from {have} to {f.partitions} partitions"
        return Plan(rb, paused, R, have, events=[("Normal", "RebalanceStarted", f"{rb.label}: {msg}")],
                    message=msg)
    target = assign(n, _owners(f, f.replicas), a.owners)
    if current_replicas == f.replicas and target == a.owners:
        if a.handoffs or a.paused or a.reshard:
            # Left over (no rebalance records it): nothing moves and no count changes, so this is
            # no rebalance (no RebalanceStarted, lastRebalance kept): publish it without them.
            a = a.with_(generation=a.generation + 1, handoffs={}, reshard=None, paused=False)
        return Plan(None, a, f.replicas, n)
    if current_replicas == f.replicas and (unready := _unready(f, a, target)):
        # Same pods, new owners (a drain began or a drained pod came back): a partition moves
        # only to a pod that serves, so that its pause is the handoff's alone.
        return Plan(None, a, f.replicas, n, message=f"waiting for {', '.join(unready)} to serve before "
                    "moving partitions to it")
    rb = Rebalance(id=a.generation + 1, type=REPLICAS, phase=SCALING_UP,
                   from_replicas=current_replicas, to_replicas=f.replicas, from_partitions=n, to_partitions=n,
                   started_at=rfc3339(f.now_ms), started_at_ms=f.now_ms)
    drained, lost = (sorted(set(a.owners.values()) & pods) for pods in (f.draining, f.lost))
    ev = ("Normal", "RebalanceStarted", f"{rb.label}: started"
          + (f"; moving the partitions of {', '.join(drained)} off a cordoned node" if drained else "")
          + (f"; moving the partitions of {', '.join(lost)} off a lost node" if lost else ""))
    if f.replicas > current_replicas:
        plan = _scaling_up(f, rb)
    else:
        plan = _plan_handoff(f, rb)
    plan.events.insert(0, ev)
    return plan


def _prune(a: Assignment, f: Facts) -> Assignment:
    """Re-shard history is needed for rebuilds only while it lies within the dedup window."""
    keep = tuple(era for era in a.reshards if f.now_ms - _or(era.at, 0) <= 2 * f.window_ms + 600_000)
    if keep == a.reshards:
        return a
    return a.with_(generation=a.generation + 1, reshards=keep)


# -- replicas --------------------------------------------------------------------------------------
def _scaling_up(f: Facts, rb: Rebalance) -> Plan:
    want = pods(f.pod_prefix, rb.to_replicas)
    ready = [n for n in want if n in f.pods and f.pods[n].ready and f.pods[n].status is not None]
    if len(ready) == len(want):
        return _plan_handoff(f, rb)
    return Plan(replace(rb, phase=SCALING_UP), f.assignment, rb.to_replicas, rb.from_partitions,
                message=f"scaling up: {len(ready)}/{len(want)} dedup pods ready")


def _plan_handoff(f: Facts, rb: Rebalance) -> Plan:
    a = f.assignment
    n = a.partition_count or rb.from_partitions
    target = assign(n, _owners(f, rb.to_replicas), a.owners)
    mv = moves(a.owners, target)
    handoffs = {}
    for p, (src, _dst) in mv.items():
        pf = f.pods.get(src) if src and src not in f.lost else None  # a lost pod serves no snapshot
        if pf is not None and pf.url:
            handoffs[p] = Handoff(src, pf.url)
    new = Assignment(a.generation + 1, target, partition_count=n, handoffs=handoffs, reshards=a.reshards)
    rb = replace(rb, phase=HANDING_OFF, target_generation=new.generation, target=new,
                 moves={p: Move(to=dst, source=src) for p, (src, dst) in mv.items()},
                 handoff_started_at_ms=f.now_ms)
    ev = [("Normal", "Rebalancing", f"{rb.label}: handing off partitions {_ps(mv)}"
           + (f" ({', '.join(f'{p}: {s} -> {d}' for p, (s, d) in mv.items())})" if mv else ""))]
    if not mv:
        plan = _enter_finalizing(f, rb, new)
        plan.events[:0] = ev
        return plan
    return Plan(rb, new, max(rb.from_replicas, rb.to_replicas), n, events=ev,
                message=f"handing off partitions {_ps(mv)}: 0/{len(mv)} done")


def _handing_off(f: Facts, rb: Rebalance) -> Plan:
    target = rb.target

    def record(p: int, m: Move, mig: Migration):
        method = str(mig.method or (MigrationMethod.REBUILD if not m.source else MigrationMethod.LOCAL))
        m = replace(m, method=method, bytes=mig.bytes or 0, pause_ms=mig.pause_ms or 0)
        if method == MigrationMethod.SNAPSHOT:
            return m, None
        why = mig.reason or ("no previous owner" if not m.source else "state was already local")
        rebuilt = method == MigrationMethod.REBUILD
        return m, ("Warning" if rebuilt else "Normal", "StateRebuilt" if rebuilt else "StateLocal",
                   f"{rb.label}: partition {p} on {m.to}: {method} ({why})")

    rb, events = _follow_moves(f, rb, record)
    if rb.done_moves == len(rb.moves):
        plan = _enter_finalizing(f, rb, target)
        plan.events[:0] = events
        return plan
    return Plan(rb, target, max(rb.from_replicas, rb.to_replicas), target.partition_count or rb.to_partitions,
                events=events,
                message=f"handing off partitions {_ps(rb.moves)}: {rb.done_moves}/{len(rb.moves)} done")


def _follow_moves(f: Facts, rb: Rebalance, record) -> tuple[Rebalance, list]:
    """Marks done every move whose partition now runs at its new owner at the target generation;
    `record(p, move, the worker's migration report)` notes how it went (the move to keep) and
    may return an event. Returns the record with those moves and the events."""
    events, moved = [], dict(rb.moves)
    for p, m in rb.moves.items():
        if m.done:
            continue
        pf = f.pods.get(m.to)
        if pf is None or not pf.running(p, rb.target_generation):
            continue
        moved[p], ev = record(p, replace(m, done=True), pf.partition(p).migration or Migration())
        if ev:
            events.append(ev)
    return replace(rb, moves=moved), events


def _enter_finalizing(f: Facts, rb: Rebalance, target: Assignment) -> Plan:
    final = target.with_(generation=target.generation + 1, handoffs={}, reshard=None, paused=False)
    rb = replace(rb, phase=FINALIZING, target_generation=final.generation, target=final,
                 finalizing_since_ms=f.now_ms)
    if rb.type == PARTITIONS:
        rb = replace(rb, resumed_at_ms=_or(rb.resumed_at_ms, f.now_ms))
    msg = (f"scaling down to {rb.to_replicas} pods" if rb.to_replicas < rb.from_replicas
           else "publishing the final assignment")
    return Plan(rb, final, rb.to_replicas, final.partition_count or rb.to_partitions,
                events=[("Normal", "Rebalancing", f"{rb.label}: {msg}")], message=msg)


def _finalizing(f: Facts, rb: Rebalance) -> Plan:
    final = rb.target
    g = rb.target_generation
    keep = set(pods(f.pod_prefix, rb.to_replicas))
    leaving = [n for n in f.pods if n not in keep]
    behind = [n for n in keep if n in f.pods and f.pods[n].generation < g]
    waited = f.now_ms - _or(rb.finalizing_since_ms, f.now_ms)
    n = final.partition_count or rb.to_partitions
    # Done is recorded only once the final assignment is seen published: were it recorded first
    # (the operator killed before publishing), nothing in status would say to publish it.
    unpublished = f.assignment is None or f.assignment.generation < g
    if leaving or unpublished or (behind and waited < FINALIZE_GRACE_MS):
        what = f"waiting for {', '.join(sorted(leaving))} to go" if leaving else \
            f"publishing generation {g}" if unpublished else \
            f"waiting for {', '.join(sorted(behind))} to read generation {g}"
        return Plan(rb, final, rb.to_replicas, n, message=what)
    last = summary(rb, f.now_ms)
    return Plan(None, final, rb.to_replicas, n, last=last,
                events=[("Normal", "RebalanceCompleted", f"{rb.label}: {describe(last)}")])


# -- partitions ------------------------------------------------------------------------------------
def _pausing(f: Facts, rb: Rebalance) -> Plan:
    paused = rb.target
    g = rb.target_generation
    owners = sorted(set(paused.owners.values()))
    waiting = [n for n in owners if n not in f.pods or not (f.pods[n].generation >= g and f.pods[n].paused)]
    R = max(rb.from_replicas, 1)
    if waiting or f.committed is None:
        return Plan(rb, paused, R, rb.from_partitions,
                    message=f"pausing: waiting for {', '.join(waiting) or 'committed offsets'}")
    # Every owner committed and stopped: the committed offsets are where the old count ends.
    rb = replace(rb, offsets={p: max(0, int(f.committed.get(p, -1))) for p in range(rb.from_partitions)},
                 phase=CREATING_PARTITIONS, paused_at_ms=f.now_ms)
    return Plan(rb, paused, R, rb.to_partitions,
                events=[("Normal", "Rebalancing", f"{rb.label}: all partitions paused; creating partitions")],
                message=f"creating partitions {rb.from_partitions}..{rb.to_partitions - 1}")


def _creating(f: Facts, rb: Rebalance) -> Plan:
    paused = rb.target
    R = max(rb.from_replicas, 1)
    if (f.actual_partitions or 0) < rb.to_partitions:
        return Plan(rb, paused, R, rb.to_partitions,
                    message=f"creating partitions {rb.from_partitions}..{rb.to_partitions - 1}")
    if rb.offsets is None:
        raise ValueError(f"{rb.label}: phase {rb.phase} without the re-shard boundaries (rebalance.offsets)")
    owners = grow(rb.to_partitions, pods(f.pod_prefix, R), paused.owners)
    peers = {n: f.pods[n].url for n in sorted(set(owners.values())) if n in f.pods and f.pods[n].url}
    era = ReshardEra(rb.id, rb.from_partitions, rb.to_partitions, offsets=dict(rb.offsets), at=f.now_ms)
    new = Assignment(paused.generation + 1, owners, partition_count=rb.to_partitions,
                     reshard=Reshard(rb.id, rb.from_partitions, rb.to_partitions, peers),
                     reshards=paused.reshards + (era,))
    rb = replace(rb, phase=RESHARDING, target_generation=new.generation, target=new,
                 moves={p: Move(to=o) for p, o in sorted(owners.items())})
    return Plan(rb, new, R, rb.to_partitions,
                events=[("Normal", "Rebalancing", f"{rb.label}: re-sharding keys by the new partition count")],
                message="re-sharding: 0/%d partitions running" % len(owners))


def _resharding(f: Facts, rb: Rebalance) -> Plan:
    target = rb.target

    def record(p: int, m: Move, mig: Migration):
        method = str(mig.method or "none")
        m = replace(m, method=method, keys=mig.keys or 0, bytes=mig.bytes or 0)
        if method != MigrationMethod.REBUILD:
            return m, None
        why = mig.reason or "re-shard import unavailable"
        return m, ("Warning", "StateRebuilt",
                   f"{rb.label}: partition {p} on {m.to}: rebuilt from the source topic ({why})")

    rb, events = _follow_moves(f, rb, record)
    R = max(rb.from_replicas, 1)
    if rb.done_moves == len(rb.moves):
        plan = _enter_finalizing(f, replace(rb, resumed_at_ms=f.now_ms), target)
        plan.replicas = R
        plan.events[:0] = events
        return plan
    return Plan(rb, target, R, rb.to_partitions, events=events,
                message=f"re-sharding: {rb.done_moves}/{len(rb.moves)} partitions running")


# -- reporting ---------------------------------------------------------------------------------------
def summary(rb: Rebalance, now_ms: int) -> RebalanceSummary:
    ms = list(rb.moves.values())
    started = _or(rb.started_at_ms, now_ms)
    common = dict(id=rb.id, type=rb.type, from_replicas=rb.from_replicas, to_replicas=rb.to_replicas,
                  from_partitions=rb.from_partitions, to_partitions=rb.to_partitions,
                  started_at=rb.started_at, finished_at=rfc3339(now_ms),
                  duration_seconds=round((now_ms - started) / 1000, 1),
                  bytes_moved=sum(m.bytes or 0 for m in ms))
    if rb.type == PARTITIONS:
        return RebalanceSummary(**common, partitions_created=rb.to_partitions - rb.from_partitions,
                                keys_moved=sum(m.keys or 0 for m in ms),
                                pause_ms=max(0, _or(rb.resumed_at_ms, now_ms) - started),
                                rebuilt=tuple(sorted(p for p, m in rb.moves.items()
                                                     if m.method == MigrationMethod.REBUILD)))
    return RebalanceSummary(**common, partitions_moved=len(ms),
                            snapshot=sum(1 for m in ms if m.method == MigrationMethod.SNAPSHOT),
                            rebuild=sum(1 for m in ms if m.method == MigrationMethod.REBUILD),
                            max_pause_ms=max([m.pause_ms or 0 for m in ms], default=0))


def describe(last: RebalanceSummary) -> str:
    if last.type == PARTITIONS:
        s = (f"partitions {last.from_partitions} -> {last.to_partitions}: {last.keys_moved} keys "
             f"({last.bytes_moved} bytes) re-sharded, paused {last.pause_ms} ms")
        if last.rebuilt:
            s += f", rebuilt from the source: {_ps(last.rebuilt)}"
    else:
        s = (f"replicas {last.from_replicas} -> {last.to_replicas}: {last.partitions_moved} partitions moved "
             f"({last.snapshot} by snapshot, {last.rebuild} rebuilt), {last.bytes_moved} bytes, "
             f"max pause {last.max_pause_ms} ms")
    return s + f", took {last.duration_seconds} s"


PHASES = {SCALING_UP: _scaling_up, HANDING_OFF: _handing_off, FINALIZING: _finalizing,
          PAUSING: _pausing, CREATING_PARTITIONS: _creating, RESHARDING: _resharding}
