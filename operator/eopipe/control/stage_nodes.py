"""Node loss and drains, the I/O around control/nodeloss: the facts read once a pass
(observe.py), the pods on cordoned or lost nodes given to the rebalance (leaving), the plan's deletes
made, each a Warning event NodeLost (or NodeDrained), the last one recorded in
status.lastNodeLoss, and the DedupReady condition that replaces the stage's own while a node is
lost or NotReady. A lost pod's partitions are restored by their new owner's own recovery
(docs/design.md#node-loss)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from kubernetes import client

from eopipe.control import nodeloss, stage_progress
from eopipe.control.kube import delete_by_uid
from eopipe.control.passctx import Pass
from eopipe.control.status import DEDUP, Condition
from eopipe.core.durations import rfc3339

log = logging.getLogger(__name__)


def observe(p: Pass) -> nodeloss.Facts | None:
    """The node facts of the pass, read once: the dedup stage asks first (leaving), the node
    stage after it (run). None while node handling is off. Raises ApiException."""
    threshold = p.plane.settings.node_lost_seconds
    if threshold <= 0:
        return None
    if p.nodes is None:
        facts = p.facts
        serving = {n for n, pf in facts.pods.items() if pf.status is not None and pf.status.ready} if facts else set()
        owners = ({pod: tuple(facts.assignment.partitions_of(pod)) for pod in facts.pods}
                  if facts and facts.assignment else {})
        now_ms = int(time.time() * 1000)
        p.nodes = p.plane.observer.node_loss(p.names, now_ms, int(threshold * 1000), serving, owners)
    return p.nodes


def leaving(p: Pass) -> tuple[frozenset[str], frozenset[str]]:
    """The dedup pods whose partitions the rebalance gives to the others: on a cordoned node
    (handed over by snapshot), on a lost node (restored or rebuilt at the new owner)."""
    try:
        facts = observe(p)
    except client.ApiException as e:
        _not_checked(p, e)
        facts = None
    if facts is None:
        return frozenset(), frozenset()
    return nodeloss.draining(facts), nodeloss.lost(facts)


def _not_checked(p: Pass, e: client.ApiException) -> None:
    # e.g. a hand-made role without nodes: the pipeline is not at fault
    log.warning(f"{p.names.namespace}/{p.names.pipeline}: nodes not checked: {e.status} {e.reason}")


def run(p: Pass) -> Condition | None:
    """None while every node of the pipeline's dedup pods is Ready and none is cordoned (or node
    handling is off)."""
    try:
        facts_now = observe(p)
    except client.ApiException as e:
        _not_checked(p, e)
        return None
    if facts_now is None:
        return None
    facts_now = replace(facts_now, rebalancing=p.out.rebalancing is not None)
    now_ms = facts_now.now_ms
    plan = nodeloss.decide(facts_now)
    done, failed = [], []
    for action in plan.actions:
        try:
            _perform(p.plane.core, p.names.namespace, action)
        except client.ApiException as e:  # the next pass decides again from what it finds
            what = f"claim {action.claim}" if isinstance(action, nodeloss.DeleteClaim) else f"pod {action.pod}"
            failed.append(f"could not delete {what} ({e.status} {e.reason}); trying again")
            continue
        done.append(action)
        p.out.events.append(("Warning", action.reason, action.why))
    if done:
        p.out.fields["lastNodeLoss"] = {
            "at": rfc3339(now_ms), "nodes": sorted({a.node for a in done}),
            "pods": sorted({a.pod for a in done if not isinstance(a, nodeloss.DeleteClaim)}),
            "claims": sorted({a.claim for a in done if isinstance(a, nodeloss.DeleteClaim)})}
    if failed:
        return Condition(DEDUP, False, plan.condition().reason, "; ".join([a.why for a in done] + failed))
    return plan.condition()


def driver(p: Pass, drivers) -> Condition | None:
    """ProcessingReady=False/DriverNodeLost while the running Spark driver pod (as the API last
    heard of it) is on a lost node (nodeloss.driver_on_lost_node); None otherwise, or while node
    handling is off."""
    pod = stage_progress.running_driver(drivers)
    if pod is None or pod.spec is None or not pod.spec.node_name:
        return None
    name = pod.spec.node_name
    try:
        facts = observe(p)
        if facts is None:
            return None
        if name not in facts.nodes and (node := p.plane.observer.node(name)) is not None:
            facts = replace(facts, nodes={**facts.nodes, name: node})
    except client.ApiException as e:
        _not_checked(p, e)
        return None
    return nodeloss.driver_on_lost_node(facts, pod.metadata.name, name)


def _perform(core: client.CoreV1Api, namespace: str, action) -> None:
    """One delete, of the object observed only (a uid precondition: never its replacement of
    the same name). Already gone or already replaced is done."""
    uid = client.V1Preconditions(uid=action.uid)
    if isinstance(action, nodeloss.DeletePod):
        delete_by_uid(lambda: core.delete_namespaced_pod(
            action.pod, namespace, body=client.V1DeleteOptions(preconditions=uid)))
    elif isinstance(action, nodeloss.ForceDeletePod):
        delete_by_uid(lambda: core.delete_namespaced_pod(
            action.pod, namespace, grace_period_seconds=0,
            body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=uid)))
    else:
        delete_by_uid(lambda: core.delete_namespaced_persistent_volume_claim(
            action.claim, namespace, body=client.V1DeleteOptions(preconditions=uid)))
