"""Node loss: what to do about dedup pods whose node is gone, NotReady or drained (pure: facts in,
plan out).

A pod on a node that stopped reporting stays `Terminating` for ever (its kubelet cannot confirm
the stop), so the StatefulSet never makes its replacement; a claim whose local volume is pinned
to that node keeps the replacement `Pending`. Once the node has been NotReady for the threshold
(or its Node object is gone), the plan:

- force-deletes the pod (grace 0, as `kubectl delete pod --force --grace-period=0`): the
  StatefulSet then recreates it, on a live node. Its partitions do not wait for that: the pod
  is `lost`, and the rebalance gives them to the live pods in the same pass;
- deletes each claim of that pod whose volume is pinned to a lost node (a local volume): the
  StatefulSet makes a new, empty one and the worker's lost-volume path restores the
  partitions (a snapshot with spec.dedup.backup, else a rebuild from Kafka). A network volume
  (not pinned to one node) is kept: it follows the pod. A replacement already pending on such
  a claim is deleted with it (never started, nothing to fence): the StatefulSet makes a
  missing claim only when it makes the pod, and makes neither while the claim is terminating.

Why that is safe: fencing is Kafka's, not Kubernetes' (docs/design.md#fencing). The
replacement's `init_transactions()` fences whatever still runs on the lost node, so a zombie
that comes back can neither commit output nor move offsets. It never loses or duplicates a
record; what it costs is throughput while it lives, which is why a pod that still answers
/status with every partition running (its kubelet lost the API server, the pod did not lose
its work) is left alone however long its node is NotReady.

A drained node (`kubectl drain`: cordoned, then its pods evicted) is Ready but takes no pod.
With two or more dedup pods the budget allows no eviction (maxUnavailable 0): a pod running on
a cordoned node is `draining`, the rebalance hands its partitions to the other pods by snapshot
(control/rebalance.py), and once it owns none and no rebalance runs, this plan deletes it
(NodeDrained), which ends the drain's wait for it. When every pod is on a cordoned node nothing
can take their partitions: one at a time is deleted as it is (its partitions pause until it
is back). The replacement stays `Pending` on a claim pinned to the cordoned node: a pod not
scheduled whose claim is pinned to a cordoned node has that claim and itself deleted at once,
as for a lost node (NodeDrained), and the StatefulSet makes both again on a node that takes
pods, where the rebalance gives it partitions back once it serves.

A Spark driver on a lost node is never deleted by eopipe: cut off but running, it would go on
writing its checkpoint beside its replacement's, and nothing fences a checkpoint. While its
node is lost the plan only says so (ProcessingReady, DriverNodeLost) and how the admin declares
the node down: Kubernetes' out-of-service taint (non-graceful node shutdown), on which
Kubernetes deletes the node's pods itself and the Spark Operator runs the driver again on a live
node, from its checkpoint when that is not on the lost node (an object store, a network volume).

Never for a Ready node otherwise: a node that came back Ready, before or after the threshold,
gets no action at all, nor do the claims pinned to it; nor does a node without a Ready
condition yet (nothing is known of it). Below the threshold the plan only says what it waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eopipe.control.status import DEDUP, PROCESSING, Condition
from eopipe.core.durations import format_duration

HOSTNAME_LABEL = "kubernetes.io/hostname"
# The node labels by which local volumes pin their PersistentVolume to one node (a required
# nodeAffinity, operator In): local-path-provisioner and local PVs by hostname, OpenEBS LocalPV,
# TopoLVM and LVMS (OpenShift) by their own.
LOCAL_VOLUME_KEYS = (HOSTNAME_LABEL, "openebs.io/nodename", "topology.topolvm.io/node", "topology.lvms.io/node")
SELECTED_NODE = "volume.kubernetes.io/selected-node"  # the scheduler's pick for a claim not yet bound
# Kubernetes marks a node NotReady only after node-monitor-grace-period (40 s; 50 s from 1.32)
# without a heartbeat; this is counted from then. See docs/design.md#node-loss.
DEFAULT_THRESHOLD_SECONDS = 60.0

READY, WAITING, LOST = "ready", "waiting", "lost"
NOT_READY_REASON, LOST_REASON, DRAINED_REASON = "NodeNotReady", "NodeLost", "NodeDrained"
DRIVER_LOST_REASON = "DriverNodeLost"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


@dataclass(frozen=True)
class Node:
    name: str
    ready: str  # the Ready condition's status: "True", "False", "Unknown"; "" without one
    since_ms: int | None = None  # its lastTransitionTime
    cordoned: bool = False  # spec.unschedulable (kubectl cordon, drain)


@dataclass(frozen=True)
class Claim:
    name: str
    uid: str
    node: str | None  # the one node its volume is pinned to (pinned_node), else None
    deleting: bool = False


@dataclass(frozen=True)
class Pod:
    name: str
    uid: str
    node: str  # spec.nodeName; "" while unscheduled
    claims: tuple[str, ...] = ()
    deleting: bool = False  # deletionTimestamp set (e.g. evicted, stuck Terminating)
    serving: bool = False  # answers /status with every partition it runs running
    partitions: tuple[int, ...] = ()  # what the published assignment gives it


@dataclass(frozen=True)
class Facts:
    now_ms: int
    threshold_ms: int
    pods: tuple[Pod, ...]
    claims: dict[str, Claim]  # by name; a claim not read (or gone) is absent
    nodes: dict[str, Node]  # by name; a node absent here does not exist
    rebalancing: bool = False  # a rebalance runs (status.rebalance)


@dataclass(frozen=True)
class ForceDeletePod:
    pod: str
    uid: str  # a precondition: never the replacement of the same name
    node: str
    why: str
    reason: str = LOST_REASON  # of its event, and of the condition


@dataclass(frozen=True)
class DeletePod:
    """A graceful delete of a pod on a cordoned node (it commits and stops as on any stop)."""
    pod: str
    uid: str
    node: str
    why: str
    reason: str = DRAINED_REASON


@dataclass(frozen=True)
class DeleteClaim:
    claim: str
    uid: str
    pod: str
    node: str
    why: str
    reason: str = LOST_REASON


@dataclass(frozen=True)
class Plan:
    actions: tuple[ForceDeletePod | DeletePod | DeleteClaim, ...] = ()
    waiting: tuple[str, ...] = ()  # what is not acted on yet, one line each

    def condition(self) -> Condition | None:
        """DedupReady while a node is lost (NodeLost: acted on) or NotReady (NodeNotReady:
        waiting); None when every node of the pipeline is Ready."""
        if self.actions:
            reason = LOST_REASON if any(a.reason == LOST_REASON for a in self.actions) else DRAINED_REASON
            return Condition(DEDUP, False, reason, "; ".join(a.why for a in self.actions))
        if self.waiting:
            return Condition(DEDUP, False, NOT_READY_REASON, "; ".join(self.waiting))
        return None


def pinned_node(terms: list[list[tuple[str, str, tuple[str, ...]]]],
                node_labels: Mapping[str, Mapping[str, str]]) -> str | None:
    """The name of the one node a PersistentVolume's required nodeAffinity admits by a local
    volume's node label (LOCAL_VOLUME_KEYS), else None (a network volume, or one a zone or
    several nodes can reach). A value names the Node that carries it (a hostname label need not
    be the Node's name), or, where no Node does, a node that is gone (the value itself).
    `terms`: the nodeSelectorTerms (ORed), each its matchExpressions (ANDed) as (key, operator,
    values); `node_labels`: every Node's labels by its name."""
    names: set[str] = set()
    for term in terms:
        admitted: set[str] | None = None
        for key, op, values in term:
            if key not in LOCAL_VOLUME_KEYS or op != "In":
                continue
            carried = {n: labels[key] for n, labels in node_labels.items() if labels.get(key) in values}
            these = set(carried) | (set(values) - set(carried.values()))
            admitted = these if admitted is None else admitted & these
        if admitted is None:
            return None  # this term admits nodes by something else
        names |= admitted
    return next(iter(names)) if len(names) == 1 else None


def state(facts: Facts, name: str) -> tuple[str, str]:
    """(READY | WAITING | LOST, why) of the node called `name`."""
    node = facts.nodes.get(name)
    if node is None:
        return LOST, f"node {name} is gone"
    if node.ready == "True" or node.ready not in ("False", "Unknown") or node.since_ms is None:
        return READY, ""
    age = max(0, facts.now_ms - node.since_ms)
    why = f"node {name} NotReady ({node.ready}) for {format_duration(age / 1000)}"
    return (LOST if age >= facts.threshold_ms else WAITING), why


def draining(facts: Facts) -> frozenset[str]:
    """The pods running on a Ready, cordoned node (kubectl cordon or drain)."""
    return frozenset(p.name for p in facts.pods if p.node and not p.deleting and state(facts, p.node)[0] == READY
                     and facts.nodes[p.node].cordoned)


def lost(facts: Facts) -> frozenset[str]:
    """The pods on a node lost past the threshold (or gone) that no longer answer: their
    partitions go to the live pods at once, while the pod itself is force-deleted below."""
    return frozenset(p.name for p in facts.pods if p.node and not p.serving and state(facts, p.node)[0] == LOST)


def _drained(facts: Facts) -> list[DeletePod]:
    """The pods to delete off cordoned nodes: each that owns no partition once no rebalance
    runs; with every pod on one, the first of them, one at a time."""
    if facts.rebalancing:
        return []
    on = draining(facts)
    if on and on == {p.name for p in facts.pods} and all(p.node and not p.deleting for p in facts.pods):
        pod = min((p for p in facts.pods if p.name in on), key=lambda p: p.name)
        return [DeletePod(pod.name, pod.uid, pod.node, f"deleted pod {pod.name}: every dedup pod is on a cordoned "
                          f"node (kubectl drain), so its partitions pause until it is back elsewhere")]
    return [DeletePod(p.name, p.uid, p.node, f"deleted pod {p.name}: node {p.node} is cordoned (kubectl drain) "
                      "and its partitions were handed to the other pods")
            for p in sorted(facts.pods, key=lambda p: p.name) if p.name in on and not p.partitions]


def driver_on_lost_node(facts: Facts, pod: str, node: str) -> Condition | None:
    """ProcessingReady while the Spark driver pod `pod` is on a node lost past the threshold (or
    gone); None otherwise (module docstring: eopipe does not delete it)."""
    node_state, why = state(facts, node)
    if node_state != LOST:
        return None
    return Condition(PROCESSING, False, DRIVER_LOST_REASON,
                     f"Spark driver pod {pod}: {why}. Once the node is known to be down, declare it so: "
                     f"`kubectl taint node {node} {OUT_OF_SERVICE_TAINT}`; Kubernetes then deletes its pods and "
                     "the Spark Operator runs the driver again on a live node, from its checkpoint (which must "
                     "not be on that node). eopipe does not delete a driver that may still run")


def decide(facts: Facts) -> Plan:
    actions: list[ForceDeletePod | DeletePod | DeleteClaim] = list(_drained(facts))
    waiting: list[str] = []
    limit = format_duration(facts.threshold_ms / 1000)
    for pod in sorted(facts.pods, key=lambda p: p.name):
        owns = f" (partitions {', '.join(map(str, pod.partitions))})" if pod.partitions else ""
        node_state, node_why = state(facts, pod.node) if pod.node else (None, "")
        if node_state == READY:
            continue  # running, or already recreated on a live node
        if node_state == WAITING:
            waiting.append(f"pod {pod.name}{owns}: {node_why}; acting at {limit}")
            continue
        if node_state == LOST and pod.serving:
            waiting.append(f"pod {pod.name}{owns}: {node_why}, but the pod still answers with every "
                           "partition running: left alone")
            continue
        # On a lost node, or not scheduled yet (a replacement): a claim pinned to a lost node
        # keeps the pod from starting anywhere else.
        pinned_away, reason = None, LOST_REASON
        for name in pod.claims:
            claim = facts.claims.get(name)
            if claim is None or claim.node is None:
                continue
            claim_state, claim_why = state(facts, claim.node)
            if claim_state == READY and not pod.node and facts.nodes[claim.node].cordoned:
                # Drained: the pod cannot come back there while the node is cordoned.
                claim_state, claim_why = LOST, f"node {claim.node}, cordoned (kubectl drain)"
                reason = DRAINED_REASON if pinned_away is None else reason
            if claim_state == LOST:
                pinned_away = pinned_away or claim_why
                if not claim.deleting:
                    actions.append(DeleteClaim(claim.name, claim.uid, pod.name, claim.node,
                                               f"deleted claim {claim.name} of pod {pod.name}{owns}: its volume is "
                                               f"on {claim_why}; a new volume is restored from the last snapshot "
                                               "(spec.dedup.backup) or rebuilt from Kafka", reason))
            elif claim_state == WAITING and not claim.deleting:
                waiting.append(f"claim {claim.name} of pod {pod.name}{owns}: {claim_why}; acting at {limit}")
        if node_state == LOST:
            actions.append(ForceDeletePod(pod.name, pod.uid, pod.node,
                                          f"force-deleted pod {pod.name}{owns}: {node_why}; the StatefulSet "
                                          "recreates it on a live node, and Kafka fences the old one"))
        elif pinned_away:
            # The StatefulSet makes a missing claim only with a new pod: a pending one would wait
            # for its deleted claim for ever. It never ran, so nothing is fenced.
            actions.append(ForceDeletePod(pod.name, pod.uid, "",
                                          f"deleted pod {pod.name}{owns}, pending on a claim whose volume is on "
                                          f"{pinned_away}: the StatefulSet makes both again", reason))
    # Claims first: the replacement must not be made on the claim that pins it to the lost node.
    actions.sort(key=lambda a: not isinstance(a, DeleteClaim))
    return Plan(tuple(actions), tuple(waiting))
