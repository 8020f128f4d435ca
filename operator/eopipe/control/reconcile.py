"""One level-based reconcile of a pipeline: desired state from spec, applied, facts observed.

Called by the Kopf handlers on create/update/resume and by the periodic resync, so a child
object or topic deleted by hand is recreated on the next pass. Returns the outcome; the
handler writes status and events.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from kubernetes import client
from pydantic import ValidationError

from eopipe.control import autoscale, policy, sparkstage, sparkstatus, tokens
from eopipe.control import rebalance as rebalance_sm
from eopipe.control.builders import checkpoint
from eopipe.control.builders.pipeline import dedup_objects, processing_objects
from eopipe.control.builders.topics import desired_topics
from eopipe.control.conflicts import Claim, claim, conflicts
from eopipe.control.kube import Applier, ApplyError
from eopipe.control.observe import Observer
from eopipe.control.ownership import CONFLICT, ObjectConflict, decide
from eopipe.control.settings import Settings
from eopipe.control.sparkstage import SPARK_API, SPARK_GROUP, SPARK_PLURAL, SPARK_VERSION
from eopipe.control.status import (
    Condition,
    dedup_lag,
    dedup_stats,
    effective_window_seconds,
    lag_alert,
    merge_patch,
    open_transactions,
    rebalance_patch,
)
from eopipe.control.topics import ensure_topics
from eopipe.core.durations import duration_ms, format_duration
from eopipe.core.kafkaconf import NotAllowed
from eopipe.core.names import Names
from eopipe.core.spec import RESOURCE, PipelineSpec

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    stages: list[Condition] = field(default_factory=list)
    stalled: Condition | None = None
    fields: dict = field(default_factory=dict)  # extra status fields
    retry: bool = False  # something failed that is worth retrying soon
    retry_reason: str = "Kafka not reachable yet"
    rebalancing: str | None = None  # the running rebalance's message (phase Rebalancing)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)


def _object_conflict(e: ObjectConflict, out: Outcome, stage: str) -> None:
    """Stalled (the pass goes no further, and the handler posts a Warning event with it) until
    the object is gone; reason Conflict, as for two pipelines writing one topic."""
    out.stalled = Condition("Stalled", True, "Conflict", str(e))
    out.stages.append(Condition(stage, False, "Conflict", str(e)))


def _first_error(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        return f"spec.{loc}: {e['msg']}" if loc else e["msg"]
    return str(exc)


class Reconciler:
    def __init__(self, api: client.ApiClient, settings: Settings, kafka_timeout: float = 15.0):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.applier = Applier(api)
        self.observer = Observer(self.core, self.applier, kafka_timeout, settings.tenant_policy)
        self.settings = settings
        self.kafka_timeout = kafka_timeout
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def lock(self, namespace: str, name: str) -> threading.Lock:
        """One pass at a time per pipeline (Kopf runs timers beside change handlers)."""
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconcile(self, body: dict) -> Outcome:
        meta = body["metadata"]
        out = Outcome()
        try:
            spec = PipelineSpec.model_validate(body.get("spec") or {})
        except ValidationError as e:
            out.stalled = Condition("Stalled", True, "InvalidSpec", _first_error(e))
            return out
        names = Names(meta["namespace"], meta["name"], spec)
        out.fields["topics"] = {t.role: t.name for t in desired_topics(names)}

        refused = self._refusals(names)
        if refused:
            # Nothing is applied: what runs now (if anything) stays until the spec is fixed.
            why = "; ".join(refused)
            out.stalled = Condition("Stalled", True, "PolicyDenied", why)
            out.stages += [Condition(t, False, "PolicyDenied", why) for t in ("DedupReady", "ProcessingReady")]
            return out
        found = conflicts(Claim(names.namespace, names.pipeline, meta.get("creationTimestamp") or "",
                                names.written_topics), self._claims())
        if found:
            # The newer of two pipelines that would write one topic does nothing: no topic
            # created or altered, no worker started.
            why = "; ".join(c.message() for c in found)
            out.stalled = Condition("Stalled", True, "Conflict", why)
            out.stages += [Condition(t, False, "Conflict", why) for t in ("TopicsReady", "DedupReady", "ProcessingReady")]
            return out

        self._dedup_and_topics(names, body, out)
        if out.stalled is not None:
            return out
        self._transactions(names, body, out)
        self._lag_threshold(names, body, out)
        try:
            self._processing(names, body, out)
        except ObjectConflict as e:
            _object_conflict(e, out, "ProcessingReady")
        except ApplyError as e:
            out.stages.append(Condition("ProcessingReady", False, "ApplyFailed", str(e)))
        return out

    def _refusals(self, names: Names) -> list[str]:
        """What the admin's tenant policy refuses in the spec, the Secrets it names included."""
        refs = policy.secret_refs(names.spec)
        return (policy.refusals(names.spec, self.settings.tenant_policy, self.settings.allowed_registries)
                + policy.secret_refusals(refs, self.observer.secret_annotations(names, refs), names.pipeline))

    # -- the dedup stage and its rebalances ------------------------------------------------------
    def _dedup_and_topics(self, names: Names, body: dict, out: Outcome) -> None:
        """Steps the rebalance state machine (eopipe.control.rebalance) from the facts, persisting its
        status before acting; keeps stepping for a few seconds while a rebalance runs."""
        meta = body["metadata"]
        status = body.get("status") or {}
        rb = status.get("rebalance") or None
        last = status.get("lastRebalance")
        auto = status.get("autoscale")
        deadline = time.monotonic() + self.settings.rebalance_poll_seconds
        while True:
            stages_before = len(out.stages)
            try:
                facts = self.observer.facts(names, rb)
            except (KafkaException, KeyError, NotAllowed, client.ApiException) as e:
                out.stages.append(Condition("TopicsReady", False, "KafkaUnavailable", _first_error(e)))
                out.stages.append(Condition("DedupReady", False, "KafkaUnavailable",
                                            "cannot observe the source topic; nothing changed"))
                out.retry = True
                break
            auto = self._autoscale(names, meta, facts, rb, auto, out)
            plan = rebalance_sm.step(facts, rb)
            if plan.rebalance != rb or plan.last is not None:
                # Write-ahead: the step is recorded before any of its actions happen, replacing
                # the recorded one whole (a restarted operator reads back only what it wrote).
                patch = rebalance_patch({"rebalance": rb, "lastRebalance": last}, plan.rebalance, plan.last)
                if plan.rebalance is None:  # done: never "settled" beside the old pod count
                    patch["replicas"] = plan.replicas
                self._persist(meta, patch)
                if plan.last is not None:
                    last = plan.last
                rb = plan.rebalance
            out.events.extend(plan.events)
            spec_now = names.spec.model_copy(update={"source": names.spec.source.model_copy(
                update={"partitions": plan.partitions})})
            topics_ok = self._topics(Names(names.namespace, names.pipeline, spec_now), out, meta,
                                     status.get("ownedTopics"))
            if out.stalled is not None:
                break
            try:
                self._apply_dedup(names, body, plan, out, topics_ok, facts)
            except ObjectConflict as e:
                _object_conflict(e, out, "DedupReady")
                break
            except ApplyError as e:
                out.stages.append(Condition("DedupReady", False, "ApplyFailed", str(e)))
                break
            if rb is None or time.monotonic() >= deadline or not topics_ok:
                break
            time.sleep(1)
            del out.stages[stages_before:]
        out.fields["rebalance"] = rb
        out.fields["autoscale"] = auto
        if last is not None:
            out.fields["lastRebalance"] = last
        out.rebalancing = (f"{rb['phase']}: {rb.get('message', '')}" if rb else None)

    def _claims(self) -> list[Claim]:
        """Every pipeline the operator can see (the namespaces it watches, else all): what they write."""
        group, version, plural = RESOURCE
        api = client.CustomObjectsApi(self.api)
        if self.settings.namespaces:
            items = [o for ns in self.settings.namespaces
                     for o in api.list_namespaced_custom_object(group, version, ns, plural)["items"]]
        else:
            items = api.list_cluster_custom_object(group, version, plural)["items"]
        return [c for c in map(claim, items) if c is not None]

    def _transactions(self, names: Names, body: dict, out: Outcome) -> None:
        """Open transactions on the output and on the source (the workers' reroutes, the
        producers' own): a hanging one holds every read_committed reader, the dedup stage included."""
        if not any(c.type == "TopicsReady" and c.status for c in out.stages):
            return
        status = body.get("status") or {}
        now_ms = int(time.time() * 1000)
        hung = []
        for key, topic in (("transactions", names.deduped_topic), ("sourceTransactions", names.source_topic)):
            try:
                offsets = self.observer.stable_offsets(names, topic)
            except KafkaException:
                return  # Kafka trouble is the topics stage's to report
            record, hanging = open_transactions(status.get(key), offsets, now_ms,
                                                int(self.settings.hanging_transaction_seconds * 1000))
            out.fields[key] = record
            hung += [(topic, p, record[str(p)]) for p in hanging]
        if not hung:
            return
        topic, p, txn = hung[0]
        lso, since = txn["lastStableOffset"], txn["sinceMs"]
        msg = (f"{topic} partition {p}{f' (and {len(hung) - 1} more)' if len(hung) > 1 else ''}: a "
               f"transaction open at offset {lso} for {(now_ms - since) // 1000}s holds every read_committed "
               f"reader; find it with `kafka-transactions.sh --bootstrap-server <kafka> find-hanging "
               f"--broker-id <leader of {topic}-{p}>` and abort it with `kafka-transactions.sh "
               f"--bootstrap-server <kafka> abort --topic {topic} --partition {p} --start-offset {lso}`")
        out.stages = [Condition("DedupReady", False, "HangingTransaction", msg) if c.type == "DedupReady" else c
                      for c in out.stages]

    def _autoscale(self, names: Names, meta: dict, facts, rb: dict | None, recorded: dict | None,
                   out: Outcome) -> dict | None:
        """spec.dedup.autoscale owns the replica count (eopipe.control.autoscale): its desired count
        replaces spec.dedup.replicas in the rebalance facts, and a change is recorded before the
        rebalance it starts. Returns the next status.autoscale (None: autoscaling is off)."""
        cfg = names.spec.dedup.autoscale
        if cfg is None or not cfg.enabled:
            return None
        decision = autoscale.observe(cfg, facts, rb, recorded)
        facts.replicas = decision.desired
        if decision.changed:
            self._persist(meta, {"autoscale": merge_patch(recorded, decision.record)})
        out.events.extend(decision.events)
        return decision.record

    def _lag_threshold(self, names: Names, body: dict, out: Outcome) -> None:
        """spec.dedup.lagThreshold: lag above it for lagThresholdWindow is Degraded (LagGrowing)."""
        dedup, lag = names.spec.dedup, out.fields.get("lag")
        was = (body.get("status") or {}).get("lag") or {}
        since, degraded = lag_alert(was.get("aboveThresholdSinceMs"), (lag or {}).get("dedup"), int(time.time() * 1000),
                                    dedup.lag_threshold, duration_ms(dedup.lag_threshold_window))
        if lag is not None and since is not None:
            lag["aboveThresholdSinceMs"] = since
        if degraded and any(c.type == "DedupReady" and c.status for c in out.stages):
            msg = (f"the dedup lag has stayed above spec.dedup.lagThreshold ({dedup.lag_threshold} records) for "
                   f"{format_duration((int(time.time() * 1000) - since) / 1000)}: the dedup pods do not keep up "
                   "(add replicas or spec.dedup.autoscale) or cannot commit (see their logs)")
            out.stages = [Condition("DedupReady", False, "LagGrowing", msg) if c.type == "DedupReady" else c
                          for c in out.stages]

    def _persist(self, meta: dict, status_patch: dict) -> None:
        group, version, plural = RESOURCE
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
            group, version, meta["namespace"], plural, meta["name"], {"status": status_patch})

    def _apply_dedup(self, names: Names, owner: dict, plan, out: Outcome, topics_ok: bool, facts) -> None:
        spec = names.spec
        current = plan.assignment
        out.fields["assignment"] = {"generation": current.generation, **current.to_json()["assignments"]}
        replicas = plan.replicas
        tokens.ensure_token_secret(self.core, names, owner)  # before the pods that read it
        *manifests, statefulset = dedup_objects(names, self.settings.image, current, replicas,
                                                self.settings.network_policy)
        for manifest in manifests:
            self.applier.apply(manifest, owner)
        sts = self.applier.apply(statefulset, owner)
        st = sts.get("status") or {}
        ready = st.get("readyReplicas") or 0
        updated = st.get("updatedReplicas") or 0
        out.fields.update({"replicas": replicas, "readyReplicas": ready,
                           "partitions": current.partition_count or spec.source.partitions,
                           # For the scale subresource: the pods an HPA's metrics select.
                           "selector": ",".join(f"{k}={v}" for k, v in names.selector("dedup").items())})
        window = effective_window_seconds(pf.status for pf in facts.pods.values() if pf.status is not None)
        if window is not None:  # else the last reported value stays
            out.fields["effectiveWindow"] = format_duration(window)
        lag = dedup_lag(pf.status for pf in facts.pods.values() if pf.status is not None)
        if lag is not None:
            out.fields["lag"] = {"dedup": lag}
        stats = dedup_stats({n: pf.status for n, pf in facts.pods.items() if pf.status is not None},
                            (owner.get("status") or {}).get("dedupStats"), int(time.time() * 1000))
        if stats is not None:  # else the last record stays
            out.fields["dedupStats"] = stats
        if spec.paused:
            out.stages.append(Condition("DedupReady", True, "Paused", "scaled to zero while paused"))
        elif plan.rebalance is not None:
            out.stages.append(Condition("DedupReady", True, "Rebalancing",
                                        f"{plan.rebalance['phase']}: {plan.rebalance.get('message', '')}"))
        elif ready >= replicas and updated >= replicas and topics_ok:
            out.stages.append(Condition("DedupReady", True, "PodsReady", f"{ready}/{replicas} pods ready"))
        else:
            out.stages.append(Condition("DedupReady", False, "PodsNotReady",
                                        f"{ready}/{replicas} pods ready"))

    def kafka_admin(self, names: Names) -> AdminClient:
        return self.observer.kafka_admin(names)

    def _topics(self, names: Names, out: Outcome, meta: dict, recorded) -> bool:
        """Ensures the topics; the ones the operator created are recorded in status.ownedTopics
        (control/topics.py: only those are ever altered or deleted)."""
        owned = out.fields.get("ownedTopics")
        if owned is None:  # first loop of the pass: what earlier passes recorded (else nothing)
            owned = [t for t in recorded if isinstance(t, str)] if isinstance(recorded, list) else []

        def record(now: list[str]) -> None:
            # Written at once, as the rebalance record is: a later failure in this pass must not
            # lose the fact that these topics are ours.
            out.fields["ownedTopics"] = now
            try:
                self._persist(meta, {"ownedTopics": now})
            except client.ApiException as e:
                log.warning("could not record owned topics %s yet (written with the status): %s", now, e)
        try:
            report = ensure_topics(self.kafka_admin(names), desired_topics(names), owned,
                                   window_ms=duration_ms(names.spec.dedup.window),
                                   bootstrap=names.spec.kafka.bootstrap_servers,
                                   timeout=self.kafka_timeout, record_owned=record)
        except (KafkaException, KeyError, NotAllowed, client.ApiException) as e:
            out.stages.append(Condition("TopicsReady", False, "KafkaUnavailable", _first_error(e)))
            out.retry = True
            return False
        out.fields["ownedTopics"] = report.owned
        if report.refused:
            name, why = next(iter(report.refused.items()))
            out.stalled = Condition("Stalled", True, "NotSupported", f"topic {name}: {why}")
            out.stages.append(Condition("TopicsReady", False, "NotSupported", why))
            return False
        changes = []
        if report.created:
            changes.append(f"created {', '.join(report.created)}")
        for t, (a, b) in report.partitions_added.items():
            changes.append(f"{t} partitions {a} -> {b}")
        for t, cfg in report.configs_set.items():
            changes.append(f"{t} config set {', '.join(sorted(cfg))}")
        for t in report.released:
            changes.append(f"released {t} (no longer used by the pipeline; kept in Kafka)")
        out.fields["topicChanges"] = changes
        if report.mismatches:
            # Adopted topics are the producers' (or Strimzi's): reported with the fix, never changed.
            out.stages.append(Condition("TopicsReady", False, "AdoptedTopicMismatch",
                                        "; ".join(m.message() for m in report.mismatches)))
            return not any(m.partitions for m in report.mismatches)
        adopted = f" (adopted, checked only: {', '.join(report.adopted)})" if report.adopted else ""
        out.stages.append(Condition("TopicsReady", True, "TopicsReconciled",
                                    ("; ".join(changes) or "all topics as specified") + adopted))
        return True

    def _processing(self, names: Names, owner: dict, out: Outcome) -> None:
        if names.spec.processing is None:
            out.stages.append(Condition("ProcessingReady", True, "NotConfigured",
                                        "dedup-only pipeline: no Spark stage"))
            return
        if not self.applier.kind_available(SPARK_API, "SparkApplication"):
            out.stages.append(Condition("ProcessingReady", False, "SparkOperatorMissing",
                                        f"the cluster has no {SPARK_API} SparkApplication kind; "
                                        "install the Kubeflow Spark Operator"))
            return
        # The checkpoint's claim stays while paused: the SparkApplication deleted then is not its owner.
        if (pvc := checkpoint.claim(names)) is not None:  # owned (deleted with the pipeline) only with Delete
            # retainable: kept after its pipeline under Retain, and the checkpoint of a pipeline
            # re-created under that name (ownership.decide tells it by the operator's labels).
            self.applier.apply(pvc, owner, owned=checkpoint.owned(names), retainable=True)
        *rbac, application = processing_objects(names, self.settings.spark_image,
                                                self.settings.spark_driver_cluster_role)
        for manifest in rbac:
            self.applier.apply(manifest, owner)
        name, ns = application["metadata"]["name"], names.namespace
        app = self.applier.get(SPARK_API, "SparkApplication", name, ns)
        if app is not None and decide(app["metadata"], owner["metadata"]["uid"]) == CONFLICT:
            raise ObjectConflict("SparkApplication", ns, name)  # before the plan may delete it
        drivers = self.core.list_namespaced_pod(ns, label_selector=sparkstage.driver_selector(name)).items
        claim = checkpoint.claim_name(names)
        where = names.spec.processing.checkpoint.location(names.pipeline) + (f" on claim {claim}" if claim else "")
        plan = sparkstage.plan(sparkstage.Facts(
            paused=bool(names.spec.paused), app=app,
            driver_phases=tuple((p.status.phase if p.status else None) or "Pending" for p in drivers),
            checkpoint=where))
        if plan.action == sparkstage.DELETE:
            self._delete_spark_application(name, ns)
        elif plan.action == sparkstage.WAIT:
            if not out.retry:  # Kafka's reason, if any, comes first
                out.retry_reason = "waiting for the stopped Spark driver to be gone"
            out.retry = True
        elif plan.action == sparkstage.APPLY:
            app = self.applier.apply(application, owner)
        if plan.condition is not None:
            out.fields["sparkApplicationState"] = None  # no application of this spec runs
            out.stages.append(plan.condition)
            return
        verdict = sparkstatus.judge(app, sparkstatus.driver_exits(drivers))
        out.fields["sparkApplicationState"] = verdict.state
        out.stages.append(verdict.condition)
        if verdict.stalled is not None:
            out.stalled = verdict.stalled
        if verdict.resubmit:
            self._delete_spark_application(name, ns)

    def _delete_spark_application(self, name: str, namespace: str) -> None:
        try:
            client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, name)
        except client.ApiException as e:
            if e.status != 404:  # gone already: what was wanted
                raise
