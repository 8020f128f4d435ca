"""One level-based reconcile of a pipeline: desired state from spec, applied, facts observed.

Called by the Kopf handlers on create/update/resume and by the periodic resync, so a child
object or topic deleted by hand is recreated on the next pass. Returns the outcome; the
handler writes status and events.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kubernetes import client
from pydantic import ValidationError

from eopipe import kafkaconf
from eopipe import rebalance as rebalance_sm
from eopipe.assignment import Assignment
from eopipe.builders import dedup as dedup_builders
from eopipe.builders.names import Names
from eopipe.builders.spark import driver_rbac, spark_application
from eopipe.builders.topics import desired_topics
from eopipe.kube import Applier
from eopipe.spec import PipelineSpec, parse_duration
from eopipe.status import Condition, rebalance_patch
from eopipe.topics import ensure_topics

log = logging.getLogger(__name__)

SPARK_API = "sparkoperator.k8s.io/v1beta2"
# While a rebalance runs, one reconcile pass keeps stepping it for up to this long (then the
# periodic resync continues it), so a handoff does not wait a whole resync interval per step.
REBALANCE_POLL_SECONDS = float(os.environ.get("EOPIPE_REBALANCE_POLL_SECONDS", "10"))
POD_STATUS_TIMEOUT = 2.0


@dataclass
class Outcome:
    stages: list[Condition] = field(default_factory=list)
    stalled: Condition | None = None
    fields: dict = field(default_factory=dict)  # extra status fields
    retry: bool = False  # something failed that is worth retrying soon
    rebalancing: str | None = None  # the running rebalance's message (phase Rebalancing)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)


def _first_error(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        return f"spec.{loc}: {e['msg']}" if loc else e["msg"]
    return str(exc)


class Reconciler:
    def __init__(self, api: client.ApiClient, image: str, spark_image: str,
                 kafka_timeout: float = 15.0):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.applier = Applier(api)
        self.image, self.spark_image = image, spark_image
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

        self._dedup_and_topics(names, body, out)
        if out.stalled is not None:
            return out
        self._processing(names, body, out)
        return out

    # -- the dedup stage and its rebalances ------------------------------------------------------
    def _dedup_and_topics(self, names: Names, body: dict, out: Outcome) -> None:
        """Steps the rebalance state machine (eopipe.rebalance) from the facts, persisting its
        status before acting; keeps stepping for a few seconds while a rebalance runs."""
        meta = body["metadata"]
        status = body.get("status") or {}
        rb = status.get("rebalance") or None
        last = status.get("lastRebalance")
        deadline = time.monotonic() + REBALANCE_POLL_SECONDS
        while True:
            stages_before = len(out.stages)
            try:
                facts = self._observe(names, rb)
            except (KafkaException, KeyError, client.ApiException) as e:
                out.stages.append(Condition("TopicsReady", False, "KafkaUnavailable", _first_error(e)))
                out.stages.append(Condition("DedupReady", False, "KafkaUnavailable",
                                            "cannot observe the source topic; nothing changed"))
                out.retry = True
                break
            plan = rebalance_sm.step(facts, rb)
            if plan.rebalance != rb or plan.last is not None:
                # Write-ahead: the step is recorded before any of its actions happen, replacing
                # the recorded one whole (a restarted operator reads back only what it wrote).
                self._persist(meta, rebalance_patch({"rebalance": rb, "lastRebalance": last},
                                                    plan.rebalance, plan.last))
                if plan.last is not None:
                    last = plan.last
                rb = plan.rebalance
            out.events.extend(plan.events)
            spec_now = names.spec.model_copy(update={"source": names.spec.source.model_copy(
                update={"partitions": plan.partitions})})
            topics_ok = self._topics(Names(names.namespace, names.pipeline, spec_now), out)
            if out.stalled is not None:
                break
            self._apply_dedup(names, body, plan, out, topics_ok, facts)
            if rb is None or time.monotonic() >= deadline or not topics_ok:
                break
            time.sleep(1)
            del out.stages[stages_before:]
        out.fields["rebalance"] = rb
        if last is not None:
            out.fields["lastRebalance"] = last
        out.rebalancing = (f"{rb['phase']}: {rb.get('message', '')}" if rb else None)

    def _persist(self, meta: dict, status_patch: dict) -> None:
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
            "eopipe.dev", "v1alpha1", meta["namespace"], "exactlyoncepipelines", meta["name"],
            {"status": status_patch})

    def _observe(self, names: Names, rb: dict | None) -> rebalance_sm.Facts:
        spec = names.spec
        admin = self.kafka_admin(names)
        md = admin.list_topics(timeout=self.kafka_timeout).topics.get(names.source_topic)
        actual = len(md.partitions) if md is not None and md.error is None and md.partitions else None
        cm = self.applier.get("v1", "ConfigMap", names.assignment_configmap, names.namespace)
        assignment = None
        if cm is not None and (cm.get("data") or {}).get(dedup_builders.ASSIGNMENT_KEY):
            assignment = Assignment.from_json(json.loads(cm["data"][dedup_builders.ASSIGNMENT_KEY]))
        sts = self.applier.get("apps/v1", "StatefulSet", names.dedup, names.namespace)
        sts_replicas = None if sts is None else int((sts.get("spec") or {}).get("replicas") or 0)
        pods = self._pods(names)
        committed = None
        if rb is not None and rb.get("phase") == "Pausing" and actual:
            committed = self._committed(names, actual)
        return rebalance_sm.Facts(
            now_ms=int(time.time() * 1000), pod_prefix=names.dedup, replicas=spec.dedup.replicas,
            partitions=spec.source.partitions, paused=bool(spec.paused), actual_partitions=actual,
            assignment=assignment, sts_replicas=sts_replicas, pods=pods, committed=committed,
            window_ms=int(parse_duration(spec.dedup.window).total_seconds() * 1000))

    def _pods(self, names: Names) -> dict[str, rebalance_sm.PodFacts]:
        sel = ",".join(f"{k}={v}" for k, v in names.selector("dedup").items())
        items = self.core.list_namespaced_pod(names.namespace, label_selector=sel).items
        pods = {}
        for pod in items:
            st = pod.status
            ready = any(c.type == "Ready" and c.status == "True" for c in (st.conditions or []))
            pods[pod.metadata.name] = rebalance_sm.PodFacts(pod.metadata.name, st.pod_ip, ready,
                                                            port=dedup_builders.HTTP_PORT)

        def fetch(pf):
            if not pf.ip:
                return
            try:
                with urllib.request.urlopen(f"{pf.url}/status", timeout=POD_STATUS_TIMEOUT) as r:
                    pf.status = json.loads(r.read())
            except (OSError, ValueError):
                pf.status = None
        if pods:
            with ThreadPoolExecutor(min(8, len(pods))) as ex:
                list(ex.map(fetch, pods.values()))
        return pods

    def _committed(self, names: Names, partitions: int) -> dict[int, int] | None:
        conf = kafkaconf.client_config(names.spec.kafka, kafkaconf.secret_reader(self.core, names.namespace))
        c = Consumer({**conf, "group.id": names.consumer_group, "enable.auto.commit": False})
        try:
            tps = c.committed([TopicPartition(names.source_topic, p) for p in range(partitions)],
                              timeout=self.kafka_timeout)
            return {tp.partition: tp.offset for tp in tps}
        except KafkaException:
            return None
        finally:
            c.close()

    def _apply_dedup(self, names: Names, owner: dict, plan, out: Outcome, topics_ok: bool, facts) -> None:
        spec = names.spec
        current = plan.assignment
        out.fields["assignment"] = {"generation": current.generation, **current.to_json()["assignments"]}
        for manifest in (dedup_builders.assignment_configmap(names, current),
                         *dedup_builders.rbac(names),
                         dedup_builders.headless_service(names),
                         dedup_builders.pod_disruption_budget(names)):
            self.applier.apply(manifest, owner)
        replicas = plan.replicas
        sts = self.applier.apply(dedup_builders.statefulset(names, self.image, replicas), owner)
        st = sts.get("status") or {}
        ready = st.get("readyReplicas") or 0
        updated = st.get("updatedReplicas") or 0
        out.fields.update({"replicas": replicas, "readyReplicas": ready,
                           "partitions": current.partition_count or spec.source.partitions,
                           "effectiveWindow": spec.dedup.window})
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
        conf = kafkaconf.client_config(names.spec.kafka,
                                       kafkaconf.secret_reader(self.core, names.namespace))
        return AdminClient({**conf, "socket.connection.setup.timeout.ms": int(self.kafka_timeout * 1000)})

    def _topics(self, names: Names, out: Outcome) -> bool:
        try:
            report = ensure_topics(self.kafka_admin(names), desired_topics(names), timeout=self.kafka_timeout)
        except (KafkaException, KeyError, client.ApiException) as e:
            out.stages.append(Condition("TopicsReady", False, "KafkaUnavailable", _first_error(e)))
            out.retry = True
            return False
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
        out.fields["topicChanges"] = changes
        out.stages.append(Condition("TopicsReady", True, "TopicsReconciled",
                                    "; ".join(changes) or "all topics as specified"))
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
        for manifest in driver_rbac(names):
            self.applier.apply(manifest, owner)
        app = self.applier.apply(spark_application(names, self.spark_image), owner)
        state = ((app.get("status") or {}).get("applicationState") or {}).get("state") or "NEW"
        err = ((app.get("status") or {}).get("applicationState") or {}).get("errorMessage", "")
        out.fields["sparkApplicationState"] = state
        if state == "RUNNING":
            out.stages.append(Condition("ProcessingReady", True, "Running", "Spark application running"))
        elif state in ("FAILED", "SUBMISSION_FAILED", "FAILING"):
            out.stages.append(Condition("ProcessingReady", False, "SparkFailed",
                                        err or f"Spark application {state}; it restarts OnFailure"))
        else:
            out.stages.append(Condition("ProcessingReady", False, "SparkStarting", f"Spark application {state}"))
