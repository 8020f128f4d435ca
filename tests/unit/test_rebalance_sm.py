"""The rebalance state machine (eopipe.control.rebalance), pure: facts in, next status and actions out.

A tiny simulated cluster follows the plans (the StatefulSet scales, pods read the published
assignment, run what they own, pause when told), and the operator may "crash" between any two
steps: it then only has what it persisted in status.
"""

import json
import random

import pytest

from eopipe.control.rebalance import Facts, PodFacts, pods, step
from eopipe.control.status import merge_patch, rebalance_patch
from eopipe.core.assignment import Assignment, Handoff, Reshard, ReshardEra, assign, era_count, grow
from eopipe.core.rebalancing import Rebalance
from eopipe.core.wire import Migration, PodStatus

PREFIX = "p-dedup"


class Cluster:
    def __init__(self, partitions=4, replicas=1):
        self.now = 1_000_000
        self.actual = partitions
        self.replicas = replicas
        self.assignment = Assignment(1, assign(partitions, [f"{PREFIX}-{i}" for i in range(replicas)]),
                                     partition_count=partitions)
        self.seen: dict[str, Assignment] = {}  # what each pod has read
        self.lag: set[str] = set()              # pods that have not read the latest yet
        self.committed = {p: 100 + p for p in range(partitions)}
        self.published: list[Assignment] = [self.assignment]

    def pod_status(self, name: str) -> PodStatus:
        a = self.seen.get(name) or self.assignment
        owned = a.partitions_of(name)
        parts = {} if a.paused else {
            str(p): {"state": "running",
                     "migration": ({"method": "snapshot", "bytes": 1000, "pause_ms": 50} if p in a.handoffs
                                   else {"method": "reshard-import", "keys": 7, "bytes": 70} if a.reshard else None)}
            for p in owned}
        return PodStatus.from_json({"generation": a.generation, "owned": owned, "paused": a.paused,
                                    "partitions": parts})

    def facts(self, replicas, partitions, **kw) -> Facts:
        pods = {}
        for i in range(self.replicas):
            n = f"{PREFIX}-{i}"
            pods[n] = PodFacts(n, f"127.0.1.{i}", True, None if n in self.lag else self.pod_status(n))
        return Facts(now_ms=self.now, pod_prefix=PREFIX, replicas=replicas, partitions=partitions,
                     actual_partitions=self.actual, assignment=self.assignment, sts_replicas=self.replicas,
                     pods=pods, committed=dict(self.committed), window_ms=3_600_000, **kw)

    def act(self, plan) -> None:
        if plan.assignment != self.assignment:
            assert plan.assignment.generation > self.assignment.generation
            self.published.append(plan.assignment)
        self.assignment = plan.assignment
        self.replicas = plan.replicas
        self.actual = max(self.actual, plan.partitions)
        self.now += 1000
        for i in range(self.replicas):
            n = f"{PREFIX}-{i}"
            if n not in self.lag:
                self.seen[n] = self.assignment


def stored(rb: Rebalance | None) -> Rebalance | None:
    """The record as a later pass reads it back: through status (JSON), parsed."""
    doc = json.loads(json.dumps(rb.to_dict())) if rb else None
    return Rebalance.parse(doc) if doc else None


def drive(c: Cluster, replicas, partitions, crash_rate=0.0, seed=0, max_steps=60, **facts):
    rng = random.Random(seed)
    rb, phases, events, last = None, [], [], None
    persisted = None
    for _ in range(max_steps):
        plan = step(c.facts(replicas, partitions, **facts), rb)
        persisted = stored(plan.rebalance)  # what status holds (JSON round trip)
        events += plan.events
        if plan.last:
            last = plan.last
        if plan.rebalance:
            phases.append(plan.rebalance.phase)
        if rng.random() < crash_rate:
            rb = persisted  # operator killed after persisting, before acting: re-read from status
            continue
        c.act(plan)
        rb = persisted
        if rb is None and last is not None:
            return phases, events, last
    raise AssertionError(f"no completion; phases {phases[-5:]}")


def _collapse(seq):
    return [x for i, x in enumerate(seq) if i == 0 or seq[i - 1] != x]


def test_scale_up_scales_first_then_hands_off_then_finalizes():
    c = Cluster(partitions=4, replicas=1)
    phases, events, last = drive(c, 3, 4)
    assert _collapse(phases) == ["ScalingUp", "HandingOff", "Finalizing"]
    handoff = next(a for a in c.published if a.handoffs)
    assert c.replicas == 3 and len(handoff.handoffs) == 2
    assert all(h == Handoff(f"{PREFIX}-0", "http://127.0.1.0:8080") for h in handoff.handoffs.values())
    # The StatefulSet had 3 pods before any partition was handed to them.
    assert last.partitions_moved == 2 and last.snapshot == 2 and last.bytes_moved == 2000
    assert c.assignment.handoffs == {} and sorted(c.assignment.owners) == [0, 1, 2, 3]
    assert {e[1] for e in events} >= {"RebalanceStarted", "Rebalancing", "RebalanceCompleted"}


def test_scale_down_hands_off_before_the_pods_go():
    c = Cluster(partitions=6, replicas=3)
    replicas_seen = []
    rb = None
    while True:
        plan = step(c.facts(2, 6), rb)
        rb = plan.rebalance
        # While any partition is still owned by the leaving pod, it is not scaled away.
        if any(o == f"{PREFIX}-2" for o in plan.assignment.owners.values()):
            assert plan.replicas == 3
        replicas_seen.append(plan.replicas)
        c.act(plan)
        if rb is None:
            break
    assert replicas_seen[-1] == 2 and set(c.assignment.owners.values()) == {f"{PREFIX}-0", f"{PREFIX}-1"}


def test_a_drained_pod_hands_its_partitions_over_and_gets_them_back_once_it_serves():
    """Its node cordoned: its partitions go to the other pods by snapshot (same replicas), it keeps
    running (control/nodeloss deletes it once it owns nothing); its replacement gains partitions
    back only once it serves."""
    c = Cluster(partitions=4, replicas=2)
    gone = f"{PREFIX}-1"
    had = set(c.assignment.partitions_of(gone))
    phases, events, last = drive(c, 2, 4, draining=frozenset({gone}))
    assert _collapse(phases) == ["HandingOff", "Finalizing"] and c.replicas == 2
    handoff = next(a for a in c.published if a.handoffs)
    assert len(had) == 2 and set(handoff.handoffs) == had
    assert {h.source for h in handoff.handoffs.values()} == {gone}
    assert set(c.assignment.owners.values()) == {f"{PREFIX}-0"} and last.snapshot == last.partitions_moved == 2
    assert "moving the partitions of p-dedup-1 off a cordoned node" in events[0][2]
    # Steady while it is cordoned.
    assert step(c.facts(2, 4, draining=frozenset({gone})), None).rebalance is None

    # The replacement, on another node, not serving yet: nothing moves to it.
    facts = c.facts(2, 4)
    facts.pods[gone] = PodFacts(gone, "127.0.1.9", False, None)
    plan = step(facts, None)
    assert plan.rebalance is None and plan.assignment == c.assignment
    assert plan.message == f"waiting for {gone} to serve before moving partitions to it"
    # Serving: two partitions back, by snapshot from p-dedup-0.
    phases, events, last = drive(c, 2, 4)
    assert set(c.assignment.owners.values()) == {f"{PREFIX}-0", gone} and last.snapshot == 2


def test_a_lost_pods_partitions_go_to_the_live_pods_at_once_without_a_handoff():
    """Nothing to fetch from a lost pod: the new owners restore or rebuild (the migration says
    which); its replacement gets partitions back by snapshot once it serves."""
    c = Cluster(partitions=4, replicas=2)
    gone = f"{PREFIX}-0"
    had = set(c.assignment.partitions_of(gone))
    plan = step(c.facts(2, 4, lost=frozenset({gone})), None)
    assert plan.rebalance.phase == "HandingOff" and plan.assignment.handoffs == {}
    assert set(plan.rebalance.moves) == had and {m.to for m in plan.rebalance.moves.values()} == {f"{PREFIX}-1"}
    assert "moving the partitions of p-dedup-0 off a lost node" in plan.events[0][2]
    phases, events, last = drive(c, 2, 4, lost=frozenset({gone}))
    assert set(c.assignment.owners.values()) == {f"{PREFIX}-1"}
    phases, events, last = drive(c, 2, 4)  # the replacement serves
    assert set(c.assignment.owners.values()) == {gone, f"{PREFIX}-1"} and last.snapshot == 2


def test_every_pod_lost_nothing_moves():
    c = Cluster(partitions=4, replicas=2)
    plan = step(c.facts(2, 4, lost=frozenset({f"{PREFIX}-0", f"{PREFIX}-1"})), None)
    assert plan.rebalance is None and plan.assignment == c.assignment


def test_with_every_pod_draining_nothing_moves():
    c = Cluster(partitions=4, replicas=2)
    before = c.assignment
    plan = step(c.facts(2, 4, draining=frozenset({f"{PREFIX}-0", f"{PREFIX}-1"})), None)
    assert plan.rebalance is None and plan.assignment == before


def test_a_scale_up_during_a_drain_gives_the_drained_pod_nothing():
    c = Cluster(partitions=6, replicas=2)
    drive(c, 3, 6, draining=frozenset({f"{PREFIX}-0"}))
    assert set(c.assignment.owners.values()) == {f"{PREFIX}-1", f"{PREFIX}-2"}


def test_partition_increase_pauses_creates_reshards_resumes():
    c = Cluster(partitions=4, replicas=2)
    seen_partitions = []
    rb = None
    phases = []
    while True:
        plan = step(c.facts(2, 8), rb)
        rb = plan.rebalance
        if rb:
            phases.append(rb.phase)
            # Partitions are only created once every pod reported paused.
            if rb.phase == "Pausing":
                assert plan.partitions == 4 and plan.assignment.paused
        seen_partitions.append(plan.partitions)
        c.act(plan)
        if rb is None:
            break
    assert _collapse(phases) == ["Pausing", "CreatingPartitions", "Resharding", "Finalizing"]
    reshard = next(a for a in c.published if a.reshard)
    assert reshard.partition_count == 8 and reshard.reshard.source == 4 and reshard.reshard.target == 8
    assert set(reshard.reshard.peers) == {f"{PREFIX}-0", f"{PREFIX}-1"}
    # Old partitions keep their owners (their state stays), the new ones are balanced.
    before = c.published[0].owners
    assert all(reshard.owners[p] == before[p] for p in range(4))
    assert sorted(len(reshard.partitions_of(f"{PREFIX}-{i}")) for i in range(2)) == [4, 4]
    hist = c.assignment.reshards[-1]
    assert hist.offsets == {p: 100 + p for p in range(4)} and hist.source == 4
    assert c.assignment.reshard is None and c.assignment.partition_count == 8


@pytest.mark.parametrize("seed", range(8))
def test_operator_crashes_anywhere_never_restart_or_skip(seed):
    c = Cluster(partitions=4, replicas=1)
    phases, _, last = drive(c, 3, 4, crash_rate=0.4, seed=seed)
    assert _collapse(phases) == ["ScalingUp", "HandingOff", "Finalizing"]
    assert last.partitions_moved == 2
    c2 = Cluster(partitions=4, replicas=2)
    phases, _, last = drive(c2, 2, 8, crash_rate=0.4, seed=seed)
    assert _collapse(phases) == ["Pausing", "CreatingPartitions", "Resharding", "Finalizing"]
    # Generations only grow, and exactly one re-shard was published.
    gens = [a.generation for a in c2.published]
    assert gens == sorted(gens) and len({a.reshard.id for a in c2.published if a.reshard}) == 1


def test_pausing_waits_for_every_pod():
    c = Cluster(partitions=4, replicas=2)
    plan = step(c.facts(2, 8), None)
    c.act(plan)
    c.lag.add(f"{PREFIX}-1")  # has not read the paused assignment (or is unreachable)
    rb = plan.rebalance
    for _ in range(3):
        plan = step(c.facts(2, 8), rb)
        assert plan.rebalance.phase == "Pausing" and plan.partitions == 4
        c.act(plan)
    assert "p-dedup-1" in plan.rebalance.message


def test_decrease_is_not_a_rebalance_and_changes_nothing():
    c = Cluster(partitions=8, replicas=2)
    plan = step(c.facts(2, 4), None)
    assert plan.rebalance is None and plan.assignment == c.assignment and plan.replicas == 2
    assert plan.partitions == 4  # the topic reconcile refuses this: Stalled/NotSupported


def test_steady_state_is_a_fixed_point_and_a_new_pipeline_gets_generation_1():
    c = Cluster(partitions=4, replicas=2)
    plan = step(c.facts(2, 4), None)
    assert plan.rebalance is None and plan.assignment == c.assignment and plan.events == []
    fresh = step(Facts(now_ms=1, pod_prefix=PREFIX, replicas=2, partitions=4), None)
    assert fresh.assignment.generation == 1 and fresh.replicas == 2 and fresh.partitions == 4


def test_rebuild_fallback_is_reported_as_a_warning():
    c = Cluster(partitions=2, replicas=1)
    rb = None
    events = []
    while True:
        f = c.facts(2, 2)
        for pf in f.pods.values():
            for part in (pf.status.partitions.values() if pf.status else ()):
                if part.migration:
                    part.migration = Migration(method="rebuild", reason="connection refused")
        plan = step(f, rb)
        events += plan.events
        rb = plan.rebalance
        c.act(plan)
        if rb is None:
            break
    assert any(t == "Warning" and r == "StateRebuilt" and "connection refused" in m for t, r, m in events)
    assert plan.last.rebuild == 1 and plan.last.snapshot == 0


def test_assignment_json_is_backward_compatible_and_round_trips():
    old = {"generation": 3, "assignments": {"a": [0, 1]}}
    a = Assignment.from_json(old)
    assert a.to_json() == old and a.partition_count is None and not a.paused
    full = Assignment(5, {0: "a", 1: "b"}, partition_count=2, paused=True,
                      handoffs={1: Handoff("a", "http://x:8080")}, reshard=Reshard(5, 1, 2, {"a": "u"}),
                      reshards=(ReshardEra(5, 1, 2, {0: 10}, at=1),))
    assert Assignment.from_json(json.loads(json.dumps(full.to_json()))) == full


def test_era_count_and_grow():
    hist = (ReshardEra(3, 4, 8, {0: 10, 1: 0}), ReshardEra(9, 8, 12, {0: 50, 5: 7}))
    assert era_count(hist, 0, 9, 12) == 4 and era_count(hist, 0, 10, 12) == 8
    assert era_count(hist, 0, 50, 12) == 12 and era_count(hist, 1, 0, 12) == 12
    assert era_count(hist, 5, 6, 12) == 8 and era_count(hist, 9, 0, 12) == 12
    g = grow(8, ["a", "b", "c"], assign(4, ["a", "b", "c"]))
    assert all(g[p] == assign(4, ["a", "b", "c"])[p] for p in range(4))
    assert sorted(len([p for p in g if g[p] == x]) for x in "abc") == [2, 3, 3]


# -- status as the API server keeps it -------------------------------------------------------------
def apply_merge_patch(doc, patch):
    """RFC 7386, as the API server applies the operator's status patches (merge-patch+json):
    null removes a key, an object merges into an object, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


def run_operator(c, replicas, partitions, crashes=(), restart_ms=60_000, max_steps=80, settle=4, record=None):
    """The reconciler's loop: every step is taken from status as stored (a new pass or a
    restarted operator has nothing else), written ahead through the reconciler's patch, then
    acted on. At the steps in `crashes` the operator is killed after the write, before acting,
    and comes back `restart_ms` later. Runs until no rebalance is recorded, then `settle`
    steps more. Returns the stored status, the rebalance ids ever recorded and the posted events."""
    status, ids, events, idle = {}, [], [], 0
    for i in range(max_steps):
        rb = Rebalance.parse(status["rebalance"]) if status.get("rebalance") else None
        plan = step(c.facts(replicas, partitions), rb)
        if plan.rebalance != rb or plan.last is not None:
            status = apply_merge_patch(status, json.loads(json.dumps(
                rebalance_patch(status, plan.rebalance and plan.rebalance.to_dict(),
                                plan.last and plan.last.to_dict()))))
        if record is not None and status.get("rebalance"):
            record(status["rebalance"])  # each record as status holds it
        if status.get("rebalance") and status["rebalance"]["id"] not in ids:
            ids.append(status["rebalance"]["id"])
        if i in crashes:
            c.now += restart_ms
            continue
        events += plan.events
        c.act(plan)
        idle = idle + 1 if status.get("rebalance") is None and plan.rebalance is None else 0
        if idle > settle:
            return status, ids, events
    raise AssertionError(f"no completion; status {status.get('rebalance')}")


SCENARIOS = {"partitions 4 -> 8": ({"partitions": 4, "replicas": 3}, 3, 8),
             "replicas 1 -> 3": ({"partitions": 4, "replicas": 1}, 3, 4),
             "replicas 3 -> 2": ({"partitions": 6, "replicas": 3}, 2, 6)}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_killed_at_any_two_points_one_rebalance_recorded_as_last(name):
    """Killed after any step's status write and before its actions (once, or twice), the
    operator finishes the same rebalance from status, and nothing follows it: no second
    (empty) rebalance, lastRebalance is the one that ran, the assignment is clean and stays."""
    cluster, replicas, partitions = SCENARIOS[name]
    _, _, base_events = run_operator(Cluster(**cluster), replicas, partitions)
    n = len(base_events) + 8  # comfortably more steps than the rebalance takes
    points = [()] + [(i,) for i in range(n)] + [(i, j) for i in range(n) for j in range(i + 1, n)]
    for crashes in points:
        c = Cluster(**cluster)
        status, ids, events = run_operator(c, replicas, partitions, crashes=crashes)
        last = status.get("lastRebalance")
        assert len(ids) == 1 and last and last["id"] == ids[0], (crashes, ids, last)
        kind = "partitions" if partitions != cluster["partitions"] else "replicas"
        assert last["type"] == kind and last["toPartitions"] == partitions, (crashes, last)
        assert last["toReplicas"] == replicas, (crashes, last)
        if kind == "partitions":
            assert set(last) >= {"keysMoved", "pauseMs"} and "partitionsMoved" not in last, (crashes, last)
        started = [m for _, r, m in events if r == "RebalanceStarted"]
        assert all(m.startswith(f"rebalance {ids[0]} ") for m in started), (crashes, started)
        a = c.assignment
        assert not (a.reshard or a.paused or a.handoffs) and a.partition_count == partitions, (crashes, a)
        assert sorted(set(a.owners.values())) == pods(PREFIX, replicas)
        still = step(c.facts(replicas, partitions), stored_status(status))
        assert still.rebalance is None and still.assignment == a and still.events == [], crashes


def stored_status(status: dict) -> Rebalance | None:
    return Rebalance.parse(status["rebalance"]) if status.get("rebalance") else None


def test_status_patch_replaces_the_recorded_rebalance_whole():
    pausing = {"id": 2, "phase": "Pausing", "target": {"generation": 2, "paused": True, "assignments": {"a": [0]}},
               "moves": {}}
    resharding = {"id": 2, "phase": "Resharding", "moves": {"1": {"from": None, "to": "a"}},
                  "target": {"generation": 3, "assignments": {"a": [0, 1]}, "reshard": {"id": 2}}}
    final = {"id": 2, "phase": "Finalizing", "moves": {"1": {"to": "a", "done": True}},
             "target": {"generation": 4, "assignments": {"a": [0, 1]}}}
    status = {"lastRebalance": {"id": 1, "type": "replicas", "partitionsMoved": 2}}
    for rb in (pausing, resharding, final):
        status = apply_merge_patch(status, rebalance_patch(status, rb))
        assert status["rebalance"] == json.loads(json.dumps(rb).replace('"from": null, ', ""))
    last = {"id": 2, "type": "partitions", "keysMoved": 5}
    status = apply_merge_patch(status, rebalance_patch(status, None, last))
    assert status == {"lastRebalance": last}
    assert merge_patch({"a": 1, "b": {"c": 1, "d": 2}}, {"b": {"c": 3}}) == {"b": {"c": 3, "d": None}, "a": None}


@pytest.mark.parametrize("leftover", [{"reshard": Reshard(2, 4, 8)},
                                      {"paused": True}, {"handoffs": {1: Handoff("x", "http://x")}}])
def test_a_leftover_with_nothing_to_move_is_cleaned_without_a_rebalance(leftover):
    """No partition moves, no replica or partition change: not a rebalance (no RebalanceStarted,
    lastRebalance kept), only the assignment published again without the leftover."""
    c = Cluster(partitions=8, replicas=3)
    c.assignment = c.assignment.with_(**leftover)
    plan = step(c.facts(3, 8), None)
    assert plan.rebalance is None and plan.last is None and plan.events == []
    assert plan.assignment == c.assignment.with_(generation=c.assignment.generation + 1, reshard=None,
                                                 paused=False, handoffs={})
    c.act(plan)
    again = step(c.facts(3, 8), None)
    assert again.rebalance is None and again.assignment == c.assignment and again.events == []
