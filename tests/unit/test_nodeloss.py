"""control/nodeloss.decide: node and pod facts in, actions out (a table), and the PV affinity reading."""

from __future__ import annotations

import pytest

from eopipe.control.nodeloss import (
    HOSTNAME_LABEL,
    Claim,
    DeleteClaim,
    DeletePod,
    Facts,
    ForceDeletePod,
    Node,
    Pod,
    decide,
    draining,
    driver_on_lost_node,
    lost,
    pinned_node,
)

NOW = 1_000_000
T = 60_000  # the threshold


def ready(name):
    return Node(name, "True", NOW - 3_600_000)


def not_ready(name, for_ms, status="Unknown"):
    return Node(name, status, NOW - for_ms)


def pod(name, node, *, local=None, deleting=False, serving=False, partitions=(0,)):
    """A dedup pod with its claim state-<name> (pinned to `local`, else a network volume)."""
    return Pod(name, f"uid-{name}", node, (f"state-{name}",), deleting, serving, partitions), \
        Claim(f"state-{name}", f"cuid-{name}", local)


def cordoned(name):
    return Node(name, "True", NOW - 3_600_000, cordoned=True)


def facts(*pods_claims, nodes=(), claims=None, rebalancing=False):
    pods = tuple(p for p, _ in pods_claims)
    found = {c.name: c for _, c in pods_claims} if claims is None else claims
    return Facts(NOW, T, pods, found, {n.name: n for n in nodes}, rebalancing)


def kinds(plan):
    return [(type(a).__name__, getattr(a, "pod", None), getattr(a, "claim", None)) for a in plan.actions]


FD, DC, DP = ForceDeletePod.__name__, DeleteClaim.__name__, DeletePod.__name__

CASES = {
    "all ready: nothing at all": (
        facts(pod("d-0", "n1"), pod("d-1", "n2", local="n2"), nodes=[ready("n1"), ready("n2")]),
        [], None),
    "NotReady below the threshold: wait, said in the condition": (
        facts(pod("d-0", "n1", local="n1"), nodes=[not_ready("n1", T - 1)]),
        [], "NodeNotReady"),
    "NotReady at the threshold, network volume: force delete only": (
        facts(pod("d-0", "n1"), nodes=[not_ready("n1", T, "False")]),
        [(FD, "d-0", None)], "NodeLost"),
    "node object gone, local volume on it: claim deleted, then the pod force-deleted": (
        facts(pod("d-0", "n1", local="n1"), pod("d-1", "n2"), nodes=[ready("n2")]),
        [(DC, "d-0", "state-d-0"), (FD, "d-0", None)], "NodeLost"),
    "the replacement pending on a claim pinned to a gone node: claim deleted, then the pod": (
        facts(pod("d-0", "", local="n1"), nodes=[ready("n2")]),
        [(DC, "d-0", "state-d-0"), (FD, "d-0", None)], "NodeLost"),
    "the replacement pending on a network claim: nothing (it is being scheduled)": (
        facts(pod("d-0", ""), nodes=[not_ready("n1", 10 * T)]), [], None),
    "the replacement pending on a claim pinned to a node NotReady below the threshold: wait": (
        facts(pod("d-0", "", local="n1"), nodes=[not_ready("n1", T // 2)]),
        [], "NodeNotReady"),
    "node back Ready (after the threshold had passed): nothing, its local claim kept": (
        facts(pod("d-0", "n1", local="n1", deleting=True), nodes=[Node("n1", "True", NOW - 1_000)]),
        [], None),
    "a node without a Ready condition yet: nothing is known, nothing done": (
        facts(pod("d-0", "n1", local="n1"), nodes=[Node("n1", "", None)]),
        [], None),
    "pod already recreated on a live node: nothing": (
        facts(pod("d-0", "n2"), nodes=[ready("n2")]), [], None),
    "the replacement pending on a claim already being deleted: the pod only, so both are made again": (
        facts(pod("d-0", ""), nodes=[ready("n2")],
              claims={"state-d-0": Claim("state-d-0", "c", "n1", deleting=True)}),
        [(FD, "d-0", None)], "NodeLost"),
    "pod Terminating on the lost node: force delete (it would wait for ever)": (
        facts(pod("d-0", "n1", deleting=True), nodes=[not_ready("n1", 10 * T)]),
        [(FD, "d-0", None)], "NodeLost"),
    "several pods on one lost node: every claim first, then every pod": (
        facts(pod("d-0", "n1", local="n1"), pod("d-1", "n1", local="n1"), pod("d-2", "n2", local="n2"),
              nodes=[not_ready("n1", T + 1), ready("n2")]),
        [(DC, "d-0", "state-d-0"), (DC, "d-1", "state-d-1"), (FD, "d-0", None), (FD, "d-1", None)], "NodeLost"),
    "a pod still serving on a NotReady node (the kubelet lost the API server): left alone": (
        facts(pod("d-0", "n1", local="n1", serving=True), nodes=[not_ready("n1", 10 * T)]),
        [], "NodeNotReady"),
    "drained: the replacement pending on a claim pinned to the cordoned node: claim, then pod": (
        facts(pod("d-0", "", local="n1"), nodes=[cordoned("n1"), ready("n2")]),
        [(DC, "d-0", "state-d-0"), (FD, "d-0", None)], "NodeDrained"),
    "cordoned, the pod still running there with partitions (the rebalance moves them first): nothing": (
        facts(pod("d-0", "n1", local="n1"), pod("d-1", "n2"), nodes=[cordoned("n1"), ready("n2")]), [], None),
    "cordoned, the pod there owns nothing and no rebalance runs: deleted": (
        facts(pod("d-0", "n1", local="n1", partitions=()), pod("d-1", "n2"), nodes=[cordoned("n1"), ready("n2")]),
        [(DP, "d-0", None)], "NodeDrained"),
    "cordoned, the pod there owns nothing but a rebalance runs: nothing yet": (
        facts(pod("d-0", "n1", partitions=()), pod("d-1", "n2"), nodes=[cordoned("n1"), ready("n2")],
              rebalancing=True), [], None),
    "every pod on a cordoned node (nothing can take their partitions): the first deleted": (
        facts(pod("d-0", "n1", local="n1"), pod("d-1", "n2", local="n2"), nodes=[cordoned("n1"), cordoned("n2")]),
        [(DP, "d-0", None)], "NodeDrained"),
    "every pod on a cordoned node, one already away (pending there): its claim and it only": (
        facts(pod("d-0", "", local="n1"), pod("d-1", "n1", local="n1"), nodes=[cordoned("n1")]),
        [(DC, "d-0", "state-d-0"), (FD, "d-0", None)], "NodeDrained"),
    "the only pod on a cordoned node: deleted (its budget lets the drain evict it too)": (
        facts(pod("d-0", "n1"), nodes=[cordoned("n1")]), [(DP, "d-0", None)], "NodeDrained"),
    "the replacement pending on a claim pinned to a Ready node that takes pods: nothing": (
        facts(pod("d-0", "", local="n1"), nodes=[ready("n1")]), [], None),
    "cordoned and lost: lost wins the reason": (
        facts(pod("d-0", "", local="n1"), pod("d-1", "n2", local="n2"),
              nodes=[cordoned("n1"), not_ready("n2", T)]),
        [(DC, "d-0", "state-d-0"), (DC, "d-1", "state-d-1"), (FD, "d-0", None), (FD, "d-1", None)], "NodeLost"),
    "a claim not read (unknown binding): the pod only": (
        facts(pod("d-0", "n1", local="n1"), nodes=[], claims={}),
        [(FD, "d-0", None)], "NodeLost"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_decide(case):
    f, want, reason = CASES[case]
    plan = decide(f)
    assert kinds(plan) == want
    cond = plan.condition()
    assert (cond and cond.reason) == reason
    if cond is not None:
        assert cond.type == "DedupReady" and cond.status is False


def test_actions_carry_the_uids_and_say_what_and_why():
    plan = decide(facts(pod("d-0", "n1", local="n1", partitions=(0, 3)), nodes=[not_ready("n1", 75_000)]))
    claim, force = plan.actions
    assert (claim.uid, force.uid, force.node, claim.node) == ("cuid-d-0", "uid-d-0", "n1", "n1")
    assert force.why == ("force-deleted pod d-0 (partitions 0, 3): node n1 NotReady (Unknown) for 1m15s; "
                         "the StatefulSet recreates it on a live node, and Kafka fences the old one")
    assert "claim state-d-0" in claim.why and "snapshot" in claim.why
    message = plan.condition().message
    assert message.startswith(claim.why) and message.endswith(force.why)


def test_a_drained_pod_says_so():
    plan = decide(facts(pod("d-0", "", local="n1", partitions=(1,)), nodes=[cordoned("n1")]))
    assert [a.reason for a in plan.actions] == ["NodeDrained", "NodeDrained"]
    claim, pending = plan.actions
    assert "its volume is on node n1, cordoned (kubectl drain)" in claim.why
    assert pending.why == ("deleted pod d-0 (partitions 1), pending on a claim whose volume is on node n1, "
                           "cordoned (kubectl drain): the StatefulSet makes both again")


def test_waiting_says_when_it_acts():
    plan = decide(facts(pod("d-0", "n1"), nodes=[not_ready("n1", 20_000)]))
    assert plan.condition().message == "pod d-0 (partitions 0): node n1 NotReady (Unknown) for 20s; acting at 1m"


H = HOSTNAME_LABEL


LVM = "topology.topolvm.io/node"
# Node name -> labels: n1's hostname label is its name, n2's is not (a cloud's short hostname).
NODES = {"n1": {H: "n1", LVM: "n1", "topology.kubernetes.io/zone": "a"},
         "n2.internal": {H: "n2", LVM: "n2", "topology.kubernetes.io/zone": "a"}}


@pytest.mark.parametrize("terms, want", [
    ([[(H, "In", ("n1",))]], "n1"),  # a local volume (local-path, local PV)
    ([[(H, "In", ("n1",))], [(H, "In", ("n1",))]], "n1"),
    ([[(H, "In", ("n1", "n2"))]], None),  # reachable from two nodes
    ([[(H, "In", ("n1",))], [(H, "In", ("n2",))]], None),
    ([[("topology.kubernetes.io/zone", "In", ("a",))]], None),  # a network volume in a zone
    ([[(H, "In", ("n1",)), ("topology.kubernetes.io/zone", "In", ("a",))]], "n1"),
    ([[(H, "NotIn", ("n1",))]], None),
    ([], None),  # no affinity: any node
    ([[(H, "In", ("n2",))]], "n2.internal"),  # the Node whose hostname label it is, by its name
    ([[(H, "In", ("n9",))]], "n9"),  # no Node carries it: a node that is gone
    ([[(LVM, "In", ("n2",))]], "n2.internal"),  # TopoLVM's and LVMS's own node label
    ([[("openebs.io/nodename", "In", ("n9",))]], "n9"),
    ([[(LVM, "In", ("n1",)), (H, "In", ("n2",))]], None),  # no node is both
])
def test_pinned_node(terms, want):
    assert pinned_node(terms, NODES) == want


def test_lost_is_the_pods_on_a_node_lost_past_the_threshold_that_no_longer_answer():
    f = facts(pod("d-0", "n1"), pod("d-1", "n1", deleting=True), pod("d-2", "n1", serving=True), pod("d-3", "n2"),
              pod("d-4", "n3"), pod("d-5", "n4"), pod("d-6", ""),
              nodes=[not_ready("n1", T), not_ready("n2", T - 1), ready("n3")])  # n4: gone
    assert lost(f) == {"d-0", "d-1", "d-5"}


def test_draining_is_the_pods_running_on_a_ready_cordoned_node():
    f = facts(pod("d-0", "n1"), pod("d-1", "n1", deleting=True), pod("d-2", "n2"), pod("d-3", ""), pod("d-4", "n3"),
              nodes=[cordoned("n1"), ready("n2"), Node("n3", "Unknown", NOW - 10 * T, cordoned=True)])
    assert draining(f) == {"d-0"}


# (case, the driver's node as the facts have it, a condition)
DRIVER_CASES = [
    ("ready", ready("n1"), False),
    ("NotReady below the threshold", not_ready("n1", T - 1), False),
    ("NotReady past it", not_ready("n1", T), True),
    ("NotReady (False) past it", not_ready("n1", 2 * T, "False"), True),
    ("gone from the API", None, True),
    ("cordoned (a drain): Spark's own business", cordoned("n1"), False),
    ("no Ready condition yet", Node("n1", ""), False),
]


@pytest.mark.parametrize("case, node, says", DRIVER_CASES, ids=[c[0] for c in DRIVER_CASES])
def test_a_driver_on_a_lost_node_is_reported_never_deleted(case, node, says):
    cond = driver_on_lost_node(facts(nodes=[node] if node else []), "p-spark-driver", "n1")
    assert (cond is not None) == says
    if says:
        assert (cond.type, cond.status, cond.reason) == ("ProcessingReady", False, "DriverNodeLost")
        assert "p-spark-driver" in cond.message and "kubectl taint node n1 node.kubernetes.io/out-of-service" \
            in cond.message


@pytest.mark.parametrize("threshold, reads", [(60, 1), (0, 0)])
def test_the_pass_reads_the_nodes_once(threshold, reads):
    """The dedup stage asks for the draining pods first, the node stage decides after it: one read
    of the nodes a pass, none with node handling off."""
    from types import SimpleNamespace

    from eopipe.control import stage_nodes
    from eopipe.core.rebalancing import PodFacts

    class Observer:
        calls = 0

        def node_loss(self, *a, **kw):
            Observer.calls += 1
            return facts(pod("d-0", "n1", partitions=()), pod("d-1", "n2"), nodes=[cordoned("n1"), ready("n2")])

    p = SimpleNamespace(plane=SimpleNamespace(settings=SimpleNamespace(node_lost_seconds=threshold),
                                              observer=Observer(), core=None),
                        facts=SimpleNamespace(pods={"d-0": PodFacts("d-0", ready=True)}, assignment=None),
                        names=None, nodes=None, out=SimpleNamespace(events=[], fields={}, rebalancing="HandingOff"))
    assert stage_nodes.leaving(p) == (({"d-0"} if threshold else set()), set())
    assert stage_nodes.run(p) is None  # a rebalance runs: the emptied pod is not deleted yet
    assert Observer.calls == reads
