"""Kopf handlers: thin. They call the reconciler, write status, post events, handle deletion."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import kopf
from confluent_kafka import KafkaException
from kubernetes import client
from prometheus_client import Counter, Gauge, Histogram

from eopipe.control import sparkcrd, sparkwatch, stage_progress, teardown, transient
from eopipe.control.builders.topics import desired_topics
from eopipe.control.reconcile import Reconciler
from eopipe.control.settings import Settings
from eopipe.control.nodeloss import DRAINED_REASON, LOST_REASON, NOT_READY_REASON
from eopipe.control.status import DEDUP, RECONCILING, STALLED, merge_conditions, merge_patch, summarize
from eopipe.control.topics import delete_topics
from eopipe.core import spec as spec_mod
from eopipe.core.kafkaconf import NotAllowed
from eopipe.core.kubeclient import load_config
from eopipe.core.names import LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_PIPELINE, MANAGED_BY, SPARK_GROUP, \
    SPARK_PLURAL, SPARK_VERSION, Names

RESOURCE = spec_mod.RESOURCE
NODE_REASONS = (NOT_READY_REASON, LOST_REASON, DRAINED_REASON)
# The SparkApplication watch logs here, not to Kopf's logger of the object, which would post
# each line as an Event on the Spark Operator's object.
WATCH_LOG = logging.getLogger("eopipe.sparkwatch")

RECONCILES = Counter("eopipe_operator_reconciles_total", "reconcile passes", ["result"])
RECONCILE_SECONDS = Histogram("eopipe_operator_reconcile_seconds", "duration of a reconcile pass")
PHASES = Gauge("eopipe_operator_pipeline_ready", "1 if the pipeline is Ready", ["namespace", "name"])
OPEN_TXN = Gauge("eopipe_operator_open_transaction_seconds",
                 "how long the oldest open transaction has held the pipeline's output (its last stable "
                 "offset unmoved below the high watermark); 0 when none is open", ["namespace", "name"])
AUTOSCALE_DESIRED = Gauge("eopipe_operator_autoscale_desired_replicas",
                          "the dedup pods spec.dedup.autoscale wants (status.autoscale.desiredReplicas); "
                          "absent while autoscaling is off", ["namespace", "name"])


def _write_status(rec: Reconciler, body, outcome) -> dict:
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
    rec.recorder.record(body["metadata"]["namespace"], body["metadata"]["name"], status)
    # Every rebalance step (start, handoff, re-shard, rebuild fallbacks, completion).
    for type_, reason, message in outcome.events:
        (kopf.warn if type_ == "Warning" else kopf.info)(body, reason=reason, message=message[:1000])
    # One event per condition that changed status, as kubectl describe users expect.
    before = {c["type"]: c.get("status") for c in old}
    for c in merged:
        if c["type"] == STALLED and c["status"] == "False" and STALLED not in before:
            continue  # a new pipeline that is not stalled: nothing to tell
        if before.get(c["type"]) != c["status"]:
            bad = (c["type"] == STALLED) == (c["status"] == "True")
            (kopf.warn if bad and c["type"] != RECONCILING else kopf.info)(
                body, reason=c["reason"], message=f"{c['type']}={c['status']}: {c['message']}"[:1000])
    PHASES.labels(body["metadata"]["namespace"], body["metadata"]["name"]).set(
        1 if merged[0]["status"] == "True" else 0)
    since = [t["sinceMs"] for field in ("transactions", "sourceTransactions")
             for t in (outcome.fields.get(field) or {}).values()]
    OPEN_TXN.labels(body["metadata"]["namespace"], body["metadata"]["name"]).set(
        max(0.0, time.time() - min(since) / 1000) if since else 0)
    if "autoscale" in outcome.fields:  # else the pass stopped early: the series stays as it was
        auto = outcome.fields["autoscale"]
        if auto:
            AUTOSCALE_DESIRED.labels(body["metadata"]["namespace"], body["metadata"]["name"]).set(
                auto["desiredReplicas"])
        else:
            _forget(AUTOSCALE_DESIRED, body)
    return status


def _progressing(status, **_) -> bool:
    """Work under way: a rebalance, stages not ready yet (condition Reconciling, as when pods are
    starting), or a dedup pod's node NotReady, lost or drained (control/nodeloss.py: the
    threshold is counted in seconds, a resync is a minute). Such a pipeline is stepped every
    rebalance_poll_seconds, so that what follows comes within seconds, not at the next resync."""
    st = status or {}
    return bool(st.get("rebalance")) or any(
        (c.get("type") == RECONCILING and c.get("status") == "True")
        or (c.get("type") == DEDUP and c.get("status") == "False" and c.get("reason") in NODE_REASONS)
        for c in st.get("conditions") or [])


def _node_waiting(status, **_) -> bool:
    """A dedup pod's node NotReady, below the threshold (DedupReady NodeNotReady): the pass that
    acts comes within NODE_WAIT_POLL_SECONDS of the threshold, not up to a rebalance poll later."""
    return any(c.get("type") == DEDUP and c.get("status") == "False" and c.get("reason") == NOT_READY_REASON
               for c in (status or {}).get("conditions") or [])


NODE_WAIT_POLL_SECONDS = 2.0


def _spark_running(status, **_) -> bool:
    return (status or {}).get("sparkApplicationState") == "RUNNING"


def _autoscaling(spec, **_) -> bool:
    auto = ((spec or {}).get("dedup") or {}).get("autoscale")
    return isinstance(auto, dict) and auto.get("enabled", True) is not False


def _forget(gauge: Gauge, body) -> None:
    try:
        gauge.remove(body["metadata"]["namespace"], body["metadata"]["name"])
    except KeyError:
        pass  # never set by this process


def _forget_pipeline(lock: threading.Lock, body) -> None:
    """Drops a deleted pipeline's series, under its pass lock: a pass under way when the deletion
    came writes its series first, and none comes after (a pass sees the deletionTimestamp)."""
    meta = body["metadata"]
    with lock:
        for gauge in (PHASES, OPEN_TXN, AUTOSCALE_DESIRED):
            _forget(gauge, body)
        stage_progress.forget(meta["namespace"], meta["name"])


def _reconcile(rec: Reconciler, body, logger, retry: int = 0) -> None:
    t0 = time.monotonic()
    with rec.lock(body["metadata"]["namespace"], body["metadata"]["name"]):
        # Kopf runs timers beside change handlers and hands each a body of its moment: inside
        # the lock, work from the object as it is now (the spec and the rebalance recorded by a
        # pass that just finished), never from a stale copy.
        body = _fresh(rec, body)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return  # deleted, or being deleted: on_delete has scaled the dedup pods to zero
        try:
            outcome = rec.reconcile(body)
        except Exception as e:
            RECONCILES.labels("error").inc()
            if transient.is_passing(e):  # tried again soon, not after Kopf's 60 s
                why, delay = transient.describe(e), transient.delay(retry)
                kopf.warn(body, reason=transient.REASON, message=f"{why}; trying again in {delay:.0f}s"[:1000])
                raise kopf.TemporaryError(why, delay=delay) from e
            raise
        finally:
            RECONCILE_SECONDS.observe(time.monotonic() - t0)
        status = _write_status(rec, body, outcome)
    RECONCILES.labels("retry" if outcome.retry else "ok").inc()
    logger.info(f"reconciled: phase={status['phase']}")
    if outcome.retry:
        raise kopf.TemporaryError(outcome.retry_reason, delay=5)


def _fresh(rec: Reconciler, body) -> dict | None:
    try:
        return client.CustomObjectsApi(rec.api).get_namespaced_custom_object(
            *RESOURCE[:2], body["metadata"]["namespace"], RESOURCE[2], body["metadata"]["name"])
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def register(config: Settings, registry: kopf.OperatorRegistry) -> None:
    """Registers the handlers with their configuration. The reconciler (API credentials, Kafka
    admin clients) is made on first use, inside the operator's process."""
    made: list[Reconciler] = []

    def reconciler() -> Reconciler:
        if not made:
            made.append(Reconciler(load_config(), config))
        return made[0]

    # A registry of our own starts with no login handler: the kubernetes client's credentials
    # (in-cluster, else KUBECONFIG), as kopf's default registry would pick.
    kopf.on.login(registry=registry)(kopf.login_via_client)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.persistence.finalizer = f"{spec_mod.GROUP}/finalizer"
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 120
        settings.networking.request_timeout = 60

    @kopf.on.startup(registry=registry)
    def check_spark_operator(logger, **_):
        """Said once at start too, not only in the status of each pipeline with a Spark stage."""
        try:
            level, line = sparkcrd.startup_line(sparkcrd.check(reconciler().api))
        except Exception as e:  # noqa: BLE001 - a log line never stops the start; each pass says it again
            level, line = logging.WARNING, f"the Spark Operator's CRD could not be read: {e}"
        logger.log(level, line)

    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    def on_change(body, logger, retry, **kw):
        _reconcile(reconciler(), body, logger, retry)

    @kopf.timer(*RESOURCE, interval=config.resync_seconds, initial_delay=config.resync_seconds,
                registry=registry)
    def resync(body, logger, **kw):
        """Level-based repair: a child object or topic removed by hand comes back."""
        try:
            _reconcile(reconciler(), body, logger)
        except kopf.TemporaryError:
            pass  # already in status; the next tick tries again

    # While a rebalance runs or pods come up (Kopf stops the timer once that is over), the next
    # step does not wait for the resync, which is a minute or more apart.
    @kopf.timer(*RESOURCE, interval=config.rebalance_poll_seconds, initial_delay=config.rebalance_poll_seconds,
                when=_progressing, registry=registry)
    def progress_step(body, logger, **kw):
        resync(body=body, logger=logger, **kw)

    @kopf.timer(*RESOURCE, interval=NODE_WAIT_POLL_SECONDS, initial_delay=NODE_WAIT_POLL_SECONDS,
                when=_node_waiting, registry=registry)
    def node_wait_step(body, logger, **kw):
        resync(body=body, logger=logger, **kw)

    # A running Spark stage's checkpoint store, as its driver says, between resyncs.
    @kopf.timer(*RESOURCE, interval=stage_progress.LOOK_SECONDS, initial_delay=stage_progress.LOOK_SECONDS,
                when=_spark_running, registry=registry)
    def spark_look(body, logger, **kw):
        if stage_progress.look(reconciler().plane.core, body):
            resync(body=body, logger=logger, **kw)

    # The autoscaler's sync period (control/autoscale.py): lag and records/s observed and
    # decided on while spec.dedup.autoscale is on, not only at the resync.
    @kopf.timer(*RESOURCE, interval=config.autoscale_seconds, initial_delay=config.autoscale_seconds,
                when=_autoscaling, registry=registry)
    def autoscale_step(body, logger, **kw):
        resync(body=body, logger=logger, **kw)

    # A SparkApplication's state (a driver Failed, a refused checkpoint) and the dedup pods'
    # readiness reach the pipeline's status now, not at the resync (control/sparkwatch.py). Raw
    # event handlers: nothing is written to the watched objects (no finalizer, no handler progress).
    watch = sparkwatch.Watch()

    async def child_changed(event, body, state: str, what: str) -> None:
        meta = body.get("metadata") or {}
        pipeline = sparkwatch.owner(meta)
        if pipeline is None:
            return
        ns, deleted = meta.get("namespace", ""), event.get("type") == "DELETED"
        d = watch.observe((what, ns, meta.get("name", "")), (ns, pipeline), state, deleted, time.monotonic())
        if not d.trigger:
            return
        WATCH_LOG.info(f"{what} {ns}/{meta.get('name')}: state {state or 'none'}{', deleted' if deleted else ''}: "
                       f"reconciling pipeline {pipeline}" + (f" in {d.delay:.1f}s" if d.delay else ""))
        await reconcile_soon(ns, pipeline, d.delay)

    async def reconcile_soon(ns: str, pipeline: str, delay: float) -> None:
        await asyncio.sleep(delay)
        owner = {"metadata": {"namespace": ns, "name": pipeline}}
        for retry in range(sparkwatch.RETRIES):  # Kopf does not retry an event handler
            try:
                return await asyncio.to_thread(_reconcile, reconciler(), owner, WATCH_LOG, retry)
            except kopf.TemporaryError as e:  # e.g. a stopped driver not gone yet: in status already
                await asyncio.sleep(e.delay or sparkwatch.MIN_GAP_SECONDS)

    @kopf.on.event(SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL, registry=registry,
                   labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_PIPELINE: kopf.PRESENT})
    async def spark_state(event, body, **_):
        await child_changed(event, body, sparkwatch.state_of(body), "SparkApplication")

    # The dedup pods' readiness, as their StatefulSet counts it: a pod that turns NotReady (its
    # node stopped reporting, control/nodeloss.py) reconciles its pipeline now, not at the resync.
    @kopf.on.event("apps", "v1", "statefulsets", registry=registry,
                   labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: "dedup"})
    async def dedup_pods_ready(event, body, **_):
        await child_changed(event, body, sparkwatch.ready_of(body), "StatefulSet")

    if config.node_lost_seconds > 0:
        # A cordon (kubectl drain's first step): the dedup pods' budget (maxUnavailable 0) holds
        # the drain until a pass moves their partitions off the node, so that pass comes now.
        @kopf.on.event("", "v1", "nodes", registry=registry)
        async def node_cordoned(event, body, **_):
            node = (body.get("metadata") or {}).get("name", "")
            due = watch.cordon(node, bool((body.get("spec") or {}).get("unschedulable")),
                               event.get("type") == "DELETED", time.monotonic())
            for (ns, pipeline), delay in due:
                WATCH_LOG.info(f"node {node} cordoned: reconciling pipeline {ns}/{pipeline}")
            await asyncio.gather(*(reconcile_soon(ns, pipeline, delay) for (ns, pipeline), delay in due))

    @kopf.on.delete(*RESOURCE, registry=registry, optional=True)
    def forget_metrics(body, **_):
        """A deleted pipeline's series leave /metrics; they would report it forever."""
        meta = body["metadata"]
        _forget_pipeline(reconciler().lock(meta["namespace"], meta["name"]), body)
        watch.passes.pop((meta["namespace"], meta["name"]), None)

    @kopf.on.delete(*RESOURCE, registry=registry)
    def on_delete(body, retry, logger, **_):
        """Kubernetes children go with the owner (garbage collector). Topics only if asked to, and
        only the ones the operator created (status.ownedTopics): an adopted topic (the producers'
        source topic, one Strimzi manages) is never deleted, and without a readable record of what
        the operator created nothing is deleted.

        Kafka being unreachable must not wedge the namespace: after config.delete_attempts tries
        the finalizer lets go and a Warning event names the topics left behind.

        First, whatever the policy, the dedup StatefulSet and its state claims (control/teardown.py)."""
        meta, rec = body["metadata"], reconciler()
        try:
            with rec.lock(meta["namespace"], meta["name"]):  # after a pass under way, none after it
                claims = teardown.delete_dedup_state(rec.api, meta["namespace"], meta["name"], meta["uid"])
        except client.ApiException as e:
            if retry + 1 < config.delete_attempts:
                raise kopf.TemporaryError(f"deleting the dedup state claims: {e.status} {e.reason}", delay=5)
            kopf.warn(body, reason="ClaimsRetained", message=f"gave up deleting the dedup state claims after "
                      f"{config.delete_attempts} attempts ({e.status} {e.reason})")
        else:
            if claims:
                kopf.info(body, reason="ClaimsDeleted", message=", ".join(claims))
        spec_body = body.get("spec") or {}
        if spec_body.get("deletionPolicy", "Retain") != "Delete":
            return
        try:
            names = Names(body["metadata"]["namespace"], body["metadata"]["name"],
                          spec_mod.PipelineSpec.model_validate(spec_body))
        except Exception as e:
            kopf.warn(body, reason="TopicsRetained", message=f"spec unreadable, topics kept: {e}")
            return
        wanted: list[str] = []
        try:
            # A pass may be creating a topic right now: wait for it, then read what it recorded.
            with rec.lock(names.namespace, names.pipeline):
                owned = ((_fresh(rec, body) or body).get("status") or {}).get("ownedTopics")
            if not isinstance(owned, list) or not all(isinstance(t, str) for t in owned):
                kopf.warn(body, reason="TopicsRetained",
                          message="no readable record of the topics the operator created (status.ownedTopics), "
                                  "so none is deleted; kept: " + ", ".join(t.name for t in desired_topics(names)))
                return
            wanted = sorted(owned)
            gone = delete_topics(rec.kafka_admin(names), wanted, timeout=rec.kafka_timeout)
            kopf.info(body, reason="TopicsDeleted",
                      message=(", ".join(gone) or "none: the operator created no topic that still exists")
                      + "; topics it did not create are kept")
        except NotAllowed as e:  # retrying cannot help: the Secret or address is not the pipeline's
            kopf.warn(body, reason="TopicsRetained", message=f"{e}; left behind: {', '.join(wanted)}")
        except (KafkaException, KeyError, client.ApiException) as e:
            if retry + 1 < config.delete_attempts:
                raise kopf.TemporaryError(f"deleting topics: {e}", delay=5)
            kopf.warn(body, reason="TopicsRetained",
                      message=f"gave up deleting topics after {config.delete_attempts} attempts "
                              f"({e}); left behind: {', '.join(wanted)}")
