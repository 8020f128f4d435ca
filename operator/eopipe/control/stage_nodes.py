"""Node loss, the I/O around control/nodeloss.decide: the facts read (observe.py), the plan's
deletes made, each a Warning event NodeLost (or NodeDrained), the last one recorded in status.lastNodeLoss,
and the DedupReady condition that replaces the stage's own while a node is lost or NotReady.
The partitions come back through the worker's own recovery (docs/design.md#node-loss)."""

from __future__ import annotations

import logging
import time

from kubernetes import client

from eopipe.control import nodeloss
from eopipe.control.kube import delete_by_uid
from eopipe.control.passctx import Pass
from eopipe.control.status import DEDUP, Condition
from eopipe.core.durations import rfc3339

log = logging.getLogger(__name__)


def run(p: Pass) -> Condition | None:
    """None while every node of the pipeline's dedup pods is Ready (or node loss is off)."""
    threshold = p.plane.settings.node_lost_seconds
    if threshold <= 0:
        return None
    facts = p.facts
    if facts is not None and facts.pods and all(pf.ready for pf in facts.pods.values()):
        # Every dedup pod Ready: none is on a lost node (the node controller turns a pod NotReady
        # when its node stops reporting), so the pass reads no nodes and no claims.
        return None
    serving = {n for n, pf in facts.pods.items() if pf.status is not None and pf.status.ready} if facts else set()
    owners = ({pod: tuple(facts.assignment.partitions_of(pod)) for pod in facts.pods}
              if facts and facts.assignment else {})
    now_ms = int(time.time() * 1000)
    try:
        facts_now = p.plane.observer.node_loss(p.names, now_ms, int(threshold * 1000), serving, owners)
    except client.ApiException as e:  # e.g. a hand-made role without nodes: the pipeline is not at fault
        log.warning(f"{p.names.namespace}/{p.names.pipeline}: node loss not checked: {e.status} {e.reason}")
        return None
    plan = nodeloss.decide(facts_now)
    done, failed = [], []
    for action in plan.actions:
        try:
            _perform(p.plane.core, p.names.namespace, action)
        except client.ApiException as e:  # the next pass decides again from what it finds
            what = f"pod {action.pod}" if isinstance(action, nodeloss.ForceDeletePod) else f"claim {action.claim}"
            failed.append(f"could not delete {what} ({e.status} {e.reason}); trying again")
            continue
        done.append(action)
        p.out.events.append(("Warning", action.reason, action.why))
    if done:
        p.out.fields["lastNodeLoss"] = {
            "at": rfc3339(now_ms), "nodes": sorted({a.node for a in done}),
            "pods": sorted({a.pod for a in done if isinstance(a, nodeloss.ForceDeletePod)}),
            "claims": sorted({a.claim for a in done if isinstance(a, nodeloss.DeleteClaim)})}
    if failed:
        return Condition(DEDUP, False, plan.condition().reason, "; ".join([a.why for a in done] + failed))
    return plan.condition()


def _perform(core: client.CoreV1Api, namespace: str, action) -> None:
    """One delete, of the object observed only (a uid precondition: never its replacement of
    the same name). Already gone or already replaced is done."""
    uid = client.V1Preconditions(uid=action.uid)
    if isinstance(action, nodeloss.ForceDeletePod):
        delete_by_uid(lambda: core.delete_namespaced_pod(
            action.pod, namespace, grace_period_seconds=0,
            body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=uid)))
    else:
        delete_by_uid(lambda: core.delete_namespaced_persistent_volume_claim(
            action.claim, namespace, body=client.V1DeleteOptions(preconditions=uid)))
