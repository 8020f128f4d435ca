"""The dedup stage: the rebalance state machine (control/rebalance.py) stepped from the facts
(with the pods on cordoned or lost nodes, stage_nodes.leaving), each step recorded in status
before it acts; the autoscaler's count (control/autoscale.py); the
topics at the partition count the step wants (stage_topics); the dedup objects applied; the
DedupReady condition. While a rebalance runs the stage keeps stepping for a few seconds."""

from __future__ import annotations

import dataclasses
import time

from eopipe.control import autoscale, restores, stage_nodes, stage_topics, tokens
from eopipe.control import rebalance as rebalance_sm
from eopipe.control.builders.pipeline import dedup_objects
from eopipe.control.kube import ApplyError
from eopipe.control.ownership import ObjectConflict
from eopipe.control.passctx import Pass, first_error
from eopipe.control.status import (
    DEDUP,
    STALLED,
    Condition,
    dedup_lag,
    dedup_stats,
    effective_window_seconds,
    merge_patch,
    rebalance_patch,
)
from eopipe.core.durations import format_duration
from eopipe.core.names import Names
from eopipe.core.rebalancing import Facts, Rebalance


def object_conflict(e: ObjectConflict, p: Pass, stage: str) -> Condition:
    """Stalled (the pass goes no further, and the handler posts a Warning event with it) until
    the object is gone; reason Conflict, as for two pipelines writing one topic."""
    p.out.stalled = Condition(STALLED, True, "Conflict", str(e))
    return Condition(stage, False, "Conflict", str(e))


def run(p: Pass) -> list[Condition]:
    """Steps the dedup stage. Returns the conditions of its last step: the topics stage's
    (TopicsReady) and its own (DedupReady)."""
    names, out = p.names, p.out
    recorded = p.status.get("rebalance") or None
    rb = Rebalance.parse(recorded) if recorded else None
    last = p.status.get("lastRebalance")
    auto = p.status.get("autoscale")
    deadline = time.monotonic() + p.plane.settings.rebalance_poll_seconds
    leaving = None
    while True:
        conditions: list[Condition] = []
        try:
            facts = p.plane.observer.facts(names, rb, p.admin)
        except stage_topics.KAFKA_ERRORS as e:
            conditions = [stage_topics.kafka_unavailable(first_error(e)),
                          Condition(DEDUP, False, "KafkaUnavailable", "cannot observe the source topic; nothing changed")]
            out.retry = True
            break
        p.facts = facts
        if leaving is None:  # once a pass: the nodes are read once (stage_nodes.observe)
            leaving = stage_nodes.leaving(p)
        wanted, auto = _autoscale(p, facts, rb, auto)
        draining, lost = leaving
        plan = rebalance_sm.step(dataclasses.replace(facts, replicas=wanted, draining=draining, lost=lost), rb)
        if plan.rebalance != rb or plan.last is not None:
            # Write-ahead: the step is recorded before any of its actions happen, replacing
            # the recorded one whole (a restarted operator reads back only what it wrote).
            patch = rebalance_patch({"rebalance": recorded, "lastRebalance": last},
                                    plan.rebalance and plan.rebalance.to_dict(),
                                    plan.last and plan.last.to_dict())
            if plan.rebalance is None:  # done: never "settled" beside the old pod count
                patch["replicas"] = plan.replicas
            p.record(patch)
            if plan.last is not None:
                last = plan.last.to_dict()
            rb = plan.rebalance
            recorded = rb and rb.to_dict()
        out.events.extend(plan.events)
        spec_now = names.spec.model_copy(update={"source": names.spec.source.model_copy(
            update={"partitions": plan.partitions})})
        topics_ok, conditions = stage_topics.run(p, Names(names.namespace, names.pipeline, spec_now))
        if out.stalled is not None:
            break
        try:
            conditions.append(_apply(p, plan, topics_ok, facts))
        except ObjectConflict as e:
            conditions.append(object_conflict(e, p, DEDUP))
            break
        except ApplyError as e:
            conditions.append(Condition(DEDUP, False, "ApplyFailed", str(e)))
            break
        if rb is None or time.monotonic() >= deadline or not topics_ok:
            break
        time.sleep(1)  # the next step; this one's conditions are superseded
    out.fields["rebalance"] = recorded
    out.fields["autoscale"] = auto
    if last is not None:
        out.fields["lastRebalance"] = last
    out.rebalancing = f"{rb.phase}: {rb.message or ''}" if rb else None
    return conditions


def _autoscale(p: Pass, facts: Facts, rb: Rebalance | None, recorded: dict | None) -> tuple[int, dict | None]:
    """spec.dedup.autoscale owns the replica count (control/autoscale.py): its desired count is
    the one the rebalance wants instead of spec.dedup.replicas, and a change is recorded before
    the rebalance it starts. Returns the wanted count and the next status.autoscale (None:
    autoscaling is off). The facts stay as observed."""
    cfg = p.names.spec.dedup.autoscale
    if cfg is None or not cfg.enabled:
        return facts.replicas, None
    decision = autoscale.observe(cfg, facts, rb, recorded)
    if decision.changed:
        p.record({"autoscale": merge_patch(recorded, decision.record)})
    p.out.events.extend(decision.events)
    return decision.desired, decision.record


def _apply(p: Pass, plan: rebalance_sm.Plan, topics_ok: bool, facts: Facts) -> Condition:
    """Applies the dedup objects for the step's assignment and replicas; the DedupReady condition."""
    names, out, plane, owner = p.names, p.out, p.plane, p.body
    current = plan.assignment
    out.fields["assignment"] = {"generation": current.generation, **current.to_json()["assignments"]}
    replicas = plan.replicas
    tokens.ensure_token_secret(plane.core, names, owner)  # before the pods that read it
    *manifests, statefulset = dedup_objects(names, plane.settings.image, current, replicas,
                                            plane.settings.network_policy, plane.settings.node_lost_seconds > 0)
    for manifest in manifests:
        plane.applier.apply(manifest, owner)
    sts = plane.applier.apply(statefulset, owner)
    st = sts.get("status") or {}
    ready = st.get("readyReplicas") or 0
    updated = st.get("updatedReplicas") or 0
    out.fields.update({"replicas": replicas, "readyReplicas": ready,
                       "partitions": current.partition_count or names.spec.source.partitions,
                       # For the scale subresource: the pods an HPA's metrics select.
                       "selector": names.label_selector("dedup")})
    reports = {n: pf.status for n, pf in facts.pods.items() if pf.status is not None}
    window = effective_window_seconds(reports.values())
    if window is not None:  # else the last reported value stays
        out.fields["effectiveWindow"] = format_duration(window)
    lag = dedup_lag(reports.values())
    if lag is not None:
        out.fields["lag"] = {"dedup": lag}
    restored = restores.told(reports, p.status.get("restores"))
    out.events.extend(restored.events)
    if restored.changed:  # else the record stays as it was
        out.fields["restores"] = restored.record
    stats = dedup_stats(reports, p.status.get("dedupStats"), int(time.time() * 1000))
    if stats is not None:  # else the last record stays
        out.fields["dedupStats"] = stats
    if names.spec.paused:
        return Condition(DEDUP, True, "Paused", "scaled to zero while paused")
    if plan.rebalance is not None:
        return Condition(DEDUP, True, "Rebalancing", f"{plan.rebalance.phase}: {plan.rebalance.message or ''}")
    if ready >= replicas and updated >= replicas and topics_ok:
        return Condition(DEDUP, True, "PodsReady", f"{ready}/{replicas} pods ready")
    return Condition(DEDUP, False, "PodsNotReady", f"{ready}/{replicas} pods ready")
