"""Kopf handlers: thin. They call the reconciler, write status, post events, handle deletion."""

from __future__ import annotations

import logging
import os
import time

import kopf
from confluent_kafka import KafkaException
from kubernetes import client
from prometheus_client import Counter, Gauge, Histogram

from eopipe import spec as spec_mod
from eopipe.builders.names import Names
from eopipe.builders.topics import desired_topics
from eopipe.kube import load_config
from eopipe.reconcile import Reconciler
from eopipe.status import merge_conditions, merge_patch, summarize
from eopipe.topics import delete_topics

RESYNC_SECONDS = float(os.environ.get("EOPIPE_RESYNC_SECONDS", "15"))
DELETE_ATTEMPTS = int(os.environ.get("EOPIPE_DELETE_ATTEMPTS", "5"))
RESOURCE = (spec_mod.GROUP, spec_mod.VERSION, spec_mod.PLURAL)

RECONCILES = Counter("eopipe_operator_reconciles_total", "reconcile passes", ["result"])
RECONCILE_SECONDS = Histogram("eopipe_operator_reconcile_seconds", "duration of a reconcile pass")
PHASES = Gauge("eopipe_operator_pipeline_ready", "1 if the pipeline is Ready", ["namespace", "name"])

_state: dict = {}


def _reconciler() -> Reconciler:
    if "reconciler" not in _state:
        _state["reconciler"] = Reconciler(
            load_config(),
            image=os.environ.get("EOPIPE_IMAGE", "eopipe:latest"),
            spark_image=os.environ.get("EOPIPE_SPARK_IMAGE", "eopipe-spark:latest"))
    return _state["reconciler"]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.persistence.finalizer = f"{spec_mod.GROUP}/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 120
    settings.networking.request_timeout = 60


def _write_status(body, outcome, logger) -> dict:
    old = (body.get("status") or {}).get("conditions") or []
    conditions, phase = summarize(outcome.stages, stalled=outcome.stalled,
                                  rebalancing=outcome.rebalancing,
                                  paused=bool((body.get("spec") or {}).get("paused")))
    generation = body["metadata"].get("generation", 0)
    merged = merge_conditions(old, conditions, generation)
    # A merge patch keeps keys it does not mention: each field replaces what was there whole
    # (pods scaled away leave the assignment, a finished phase's keys leave the rebalance).
    was = body.get("status") or {}
    status = {"observedGeneration": generation, "phase": phase, "conditions": merged,
              **{k: merge_patch(was.get(k), v) for k, v in outcome.fields.items()}}
    client.CustomObjectsApi(_reconciler().api).patch_namespaced_custom_object_status(
        *RESOURCE[:2], body["metadata"]["namespace"], RESOURCE[2], body["metadata"]["name"],
        {"status": status})
    # Every rebalance step (start, handoff, re-shard, rebuild fallbacks, completion).
    for type_, reason, message in outcome.events:
        (kopf.warn if type_ == "Warning" else kopf.info)(body, reason=reason, message=message[:1000])
    # One event per condition that changed status, as kubectl describe users expect.
    before = {c["type"]: c.get("status") for c in old}
    for c in merged:
        if c["type"] == "Stalled" and c["status"] == "False" and "Stalled" not in before:
            continue  # a new pipeline that is not stalled: nothing to tell
        if before.get(c["type"]) != c["status"]:
            bad = (c["type"] == "Stalled") == (c["status"] == "True")
            (kopf.warn if bad and c["type"] != "Reconciling" else kopf.info)(
                body, reason=c["reason"], message=f"{c['type']}={c['status']}: {c['message']}"[:1000])
    PHASES.labels(body["metadata"]["namespace"], body["metadata"]["name"]).set(
        1 if merged[0]["status"] == "True" else 0)
    return status


def _reconcile(body, logger, **_):
    t0 = time.monotonic()
    rec = _reconciler()
    with rec.lock(body["metadata"]["namespace"], body["metadata"]["name"]):
        # Kopf runs timers beside change handlers and hands each a body of its moment: inside
        # the lock, work from the object as it is now (the spec and the rebalance recorded by a
        # pass that just finished), never from a stale copy.
        body = _fresh(body)
        if body is None:
            return
        try:
            outcome = rec.reconcile(body)
        except Exception:
            RECONCILES.labels("error").inc()
            raise
        finally:
            RECONCILE_SECONDS.observe(time.monotonic() - t0)
        status = _write_status(body, outcome, logger)
    RECONCILES.labels("retry" if outcome.retry else "ok").inc()
    logger.info(f"reconciled: phase={status['phase']}")
    if outcome.retry:
        raise kopf.TemporaryError("Kafka not reachable yet", delay=5)


def _fresh(body) -> dict | None:
    try:
        return client.CustomObjectsApi(_reconciler().api).get_namespaced_custom_object(
            *RESOURCE[:2], body["metadata"]["namespace"], RESOURCE[2], body["metadata"]["name"])
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
def on_change(body, logger, **kw):
    _reconcile(body, logger, **kw)


@kopf.timer(*RESOURCE, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body, logger, **kw):
    """Level-based repair: a child object or topic removed by hand comes back."""
    try:
        _reconcile(body, logger, **kw)
    except kopf.TemporaryError:
        pass  # already in status; the next tick tries again


@kopf.on.delete(*RESOURCE)
def on_delete(body, retry, logger, **_):
    """Kubernetes children go with the owner (garbage collector). Topics only if asked to.

    Kafka being unreachable must not wedge the namespace: after DELETE_ATTEMPTS tries the
    finalizer lets go and a Warning event names the topics left behind."""
    spec_body = body.get("spec") or {}
    if spec_body.get("deletionPolicy", "Retain") != "Delete":
        return
    try:
        names = Names(body["metadata"]["namespace"], body["metadata"]["name"],
                      spec_mod.PipelineSpec.model_validate(spec_body))
    except Exception as e:
        kopf.warn(body, reason="TopicsRetained", message=f"spec unreadable, topics kept: {e}")
        return
    wanted = [t.name for t in desired_topics(names)]
    try:
        gone = delete_topics(_reconciler().kafka_admin(names), wanted)
        kopf.info(body, reason="TopicsDeleted", message=", ".join(gone) or "none existed")
    except (KafkaException, KeyError, client.ApiException) as e:
        if retry + 1 < DELETE_ATTEMPTS:
            raise kopf.TemporaryError(f"deleting topics: {e}", delay=5)
        kopf.warn(body, reason="TopicsRetained",
                  message=f"gave up deleting topics after {DELETE_ATTEMPTS} attempts ({e}); "
                          f"left behind: {', '.join(wanted)}")
