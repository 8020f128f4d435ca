"""The Spark stage's place in a reconcile pass: a thin caller of control/sparkstage.py (the plan)
and control/sparkstatus.py (the verdict) with the objects of control/builders; this module only
reads and writes the cluster. Returns the ProcessingReady condition."""

from __future__ import annotations

from datetime import datetime, timezone

from kubernetes import client

from eopipe.control import sparkcrd, sparkstage, sparkstatus, sparkwrites, stage_nodes, stage_progress
from eopipe.control.builders import checkpoint, spark
from eopipe.control.builders.pipeline import processing_objects
from eopipe.control.kube import delete_by_uid
from eopipe.control.ownership import CONFLICT, ObjectConflict, decide
from eopipe.control.passctx import Pass
from eopipe.control.status import PROCESSING, Condition
from eopipe.core.names import LABEL_SPARK_SPEC, SPARK_API, SPARK_GROUP, SPARK_PLURAL, SPARK_VERSION


def run(p: Pass) -> Condition:
    names, out, plane, owner = p.names, p.out, p.plane, p.body
    if names.spec.processing is None:
        return Condition(PROCESSING, True, "NotConfigured", "dedup-only pipeline: no Spark stage")
    if (missing := sparkcrd.check(plane.api)) is not None:
        return missing
    # The checkpoint's claim stays while paused: the SparkApplication deleted then is not its owner.
    if (pvc := checkpoint.claim(names)) is not None:  # owned (deleted with the pipeline) only with Delete
        # retainable: kept after its pipeline under Retain, and the checkpoint of a pipeline
        # re-created under that name (ownership.decide tells it by the operator's labels).
        plane.applier.apply(pvc, owner, owned=checkpoint.owned(names), retainable=True)
    proc = names.spec.processing
    # Which checkpoint (upgradeMode): recorded before the application is written, so a pass
    # that fails later still starts the same generation next time.
    record = sparkstage.checkpoint_record(proc.upgrade_mode, proc.query_key(),
                                          (owner.get("status") or {}).get("sparkCheckpoint"))
    out.fields["sparkCheckpoint"] = record
    *rbac, application = processing_objects(names, plane.settings.spark_image,
                                            plane.settings.spark_driver_cluster_role, record["generation"])
    for manifest in rbac:
        plane.applier.apply(manifest, owner)
    name, ns = application["metadata"]["name"], names.namespace
    app = plane.applier.get(SPARK_API, "SparkApplication", name, ns)
    if app is not None and decide(app["metadata"], owner["metadata"]["uid"]) == CONFLICT:
        raise ObjectConflict("SparkApplication", ns, name)  # before the plan may delete it
    pods = plane.core.list_namespaced_pod(ns, label_selector=sparkstage.app_pods_selector(name)).items
    drivers = [pod for pod in pods if (pod.metadata.labels or {}).get("spark-role") == "driver"]
    if app is not None:
        _remove_left_behind(p, [pod for pod in pods if (pod.metadata.labels or {}).get("spark-role") == "executor"],
                            app["metadata"]["uid"])
    claim = checkpoint.claim_name(names)
    where = spark.checkpoint_location(proc.checkpoint.location(names.pipeline), record["generation"]) + (
        f" on claim {claim}" if claim else "")
    plan = sparkstage.plan(sparkstage.Facts(
        paused=bool(names.spec.paused), app=app,
        driver_phases=tuple((d.status.phase if d.status else None) or "Pending" for d in drivers),
        checkpoint=where))
    if plan.action == sparkstage.DELETE:
        _delete(plane.api, name, ns)
    elif plan.action == sparkstage.WAIT:
        if not out.retry:  # Kafka's reason, if any, comes first
            out.retry_reason = "waiting for the stopped Spark driver to be gone"
        out.retry = True
    elif plan.action == sparkstage.APPLY and sparkwrites.write_now(app, application):
        app = plane.applier.apply(application, owner, create_only=app is None)
    if plan.condition is not None:
        out.fields["sparkApplicationState"] = None  # no application of this spec runs
        stage_progress.forget(ns, p.meta["name"])  # paused: no stale figures for the alerts
        return plan.condition
    digest = application["spec"]["driver"]["labels"][LABEL_SPARK_SPEC]
    key = sparkstatus.stall_key(((app or {}).get("metadata") or {}).get("uid") or "", digest)
    kept = sparkstatus.kept_stall((owner.get("status") or {}).get("sparkStall"), key)
    verdict = sparkstatus.judge(app, sparkstatus.driver_exits(drivers), kept, digest,
                                sparkstatus.driver_waiting(drivers, digest))
    out.fields["sparkApplicationState"] = verdict.state
    out.fields["sparkStall"] = sparkstatus.stall_record(verdict.stalled if verdict.recorded else None, key)
    if verdict.stalled is not None:
        out.stalled = verdict.stalled
    # A FAILED application is submitted again after a wait that grows while it keeps failing; an
    # evicted one (COMPLETED) at once.
    failed = verdict.resubmit and verdict.state == "FAILED"
    again = sparkstage.resubmission((owner.get("status") or {}).get("sparkResubmits"), failed,
                                    datetime.now(timezone.utc), verdict.state,
                                    (((app or {}).get("status") or {}).get("lastSubmissionAttemptTime")), digest)
    out.fields["sparkResubmits"] = again.record
    if again.now:
        out.events.append(("Warning", "SparkResubmitted", sparkstage.resubmitted(again.record)))
    if again.now or (verdict.resubmit and not failed):
        _delete(plane.api, name, ns)
    elif again.wait_s:
        return sparkstage.resubmit_later(verdict.condition, again)
    if verdict.state == "RUNNING" and verdict.stalled is None:  # what the driver says of its query
        return stage_nodes.driver(p, drivers) or stage_progress.observe(p, drivers, verdict.condition, digest)
    return verdict.condition


def _remove_left_behind(p: Pass, pods: list, app_uid: str) -> None:
    """Deletes the executor pods whose driver pod is gone (sparkstage.left_behind), each by its
    uid, with a Normal event."""
    ns = p.names.namespace
    for e in sparkstage.left_behind(tuple(sparkstage.Executor(
            name=pod.metadata.name, uid=pod.metadata.uid, phase=(pod.status.phase if pod.status else None) or "Pending",
            controlled=any(r.controller for r in pod.metadata.owner_references or ()),
            of_app=any(r.uid == app_uid for r in pod.metadata.owner_references or ()),
            deleting=pod.metadata.deletion_timestamp is not None) for pod in pods)):
        uid = client.V1Preconditions(uid=e.uid)
        delete_by_uid(lambda e=e, uid=uid: p.plane.core.delete_namespaced_pod(
            e.name, ns, body=client.V1DeleteOptions(preconditions=uid)))
        p.out.events.append(("Normal", "SparkExecutorRemoved",
                             f"deleted executor pod {e.name}: its driver pod is gone (no controller left)"))


def _delete(api: client.ApiClient, name: str, namespace: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, name)
    except client.ApiException as e:
        if e.status != 404:  # gone already: what was wanted
            raise
