"""One level-based reconcile of a pipeline: desired state from spec, applied, facts observed.

Called by the Kopf handlers on create/update/resume and by the periodic resync, so a child
object or topic deleted by hand is recreated on the next pass. Returns the outcome; the
handler writes status and events.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from kubernetes import client
from pydantic import ValidationError

from eopipe import kafkaconf
from eopipe.assignment import Assignment, assign
from eopipe.builders import dedup as dedup_builders
from eopipe.builders.names import Names
from eopipe.builders.spark import driver_rbac, spark_application
from eopipe.builders.topics import desired_topics
from eopipe.kube import Applier
from eopipe.spec import PipelineSpec
from eopipe.status import Condition
from eopipe.topics import ensure_topics

log = logging.getLogger(__name__)

SPARK_API = "sparkoperator.k8s.io/v1beta2"


@dataclass
class Outcome:
    stages: list[Condition] = field(default_factory=list)
    stalled: Condition | None = None
    fields: dict = field(default_factory=dict)  # extra status fields
    retry: bool = False  # something failed that is worth retrying soon


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

        topics_ok = self._topics(names, out)
        if out.stalled is not None:
            return out
        self._dedup(names, body, out, topics_ok)
        self._processing(names, body, out)
        return out

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

    def _dedup(self, names: Names, owner: dict, out: Outcome, topics_ok: bool) -> None:
        spec = names.spec
        replicas = 0 if spec.paused else spec.dedup.replicas
        cm = self.applier.get("v1", "ConfigMap", names.assignment_configmap, names.namespace)
        previous = Assignment(0)
        if cm is not None:
            previous = Assignment.from_json(json.loads(cm["data"][dedup_builders.ASSIGNMENT_KEY]))
        pods = [f"{names.dedup}-{i}" for i in range(spec.dedup.replicas)]
        owners = assign(spec.source.partitions, pods, previous.owners)
        current = previous if owners == previous.owners and cm is not None \
            else Assignment(previous.generation + 1, owners)
        out.fields["assignment"] = {"generation": current.generation,
                                    **current.to_json()["assignments"]}
        for manifest in (dedup_builders.assignment_configmap(names, current),
                         dedup_builders.headless_service(names),
                         dedup_builders.pod_disruption_budget(names)):
            self.applier.apply(manifest, owner)
        sts = self.applier.apply(dedup_builders.statefulset(names, self.image, replicas), owner)
        st = sts.get("status") or {}
        ready = st.get("readyReplicas") or 0
        updated = st.get("updatedReplicas") or 0
        out.fields.update({"replicas": replicas, "readyReplicas": ready,
                           "partitions": spec.source.partitions,
                           "effectiveWindow": spec.dedup.window})
        if spec.paused:
            out.stages.append(Condition("DedupReady", True, "Paused", "scaled to zero while paused"))
        elif ready >= replicas and updated >= replicas and topics_ok:
            out.stages.append(Condition("DedupReady", True, "PodsReady", f"{ready}/{replicas} pods ready"))
        else:
            out.stages.append(Condition("DedupReady", False, "PodsNotReady",
                                        f"{ready}/{replicas} pods ready"))

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
