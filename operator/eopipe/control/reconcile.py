"""One level-based reconcile of a pipeline: desired state from spec, applied, facts observed.

Called by the Kopf handlers on create/update/resume and by the periodic resync, so a child
object or topic deleted by hand is recreated on the next pass. Returns the outcome; the
handler writes status and events (through the one StatusRecorder, control/recorder.py).

The orchestration only: the policy and conflict checks, then the stages, each in its module
and each returning its conditions (status.STAGES): the dedup stage with its rebalances and the
topics it needs (stage_dedup, stage_topics), the health checks on it (stage_health), node loss
(stage_nodes: last, as its DedupReady explains a lag the others see), the Spark stage
(stage_spark). A pass has one Kafka admin client (passctx.Pass), let go at its end.
"""

from __future__ import annotations

import threading

from kubernetes import client
from pydantic import ValidationError

from eopipe.control import policy, stage_dedup, stage_health, stage_nodes, stage_spark
from eopipe.control.builders.topics import desired_topics
from eopipe.control.conflicts import Claim, claim, claim_of, conflicts
from eopipe.control.kube import Applier, ApplyError
from eopipe.control.observe import Observer
from eopipe.control.ownership import ObjectConflict
from eopipe.control.passctx import Outcome, Pass, Plane, first_error
from eopipe.control.recorder import StatusRecorder
from eopipe.control.settings import Settings
from eopipe.control.status import DEDUP, PROCESSING, STALLED, TOPICS, Condition
from eopipe.core.names import Names
from eopipe.core.spec import RESOURCE, PipelineSpec

__all__ = ["Outcome", "Reconciler"]


class Reconciler:
    def __init__(self, api: client.ApiClient, settings: Settings):
        kafka_timeout = settings.kafka_timeout_seconds
        core = client.CoreV1Api(api)
        applier = Applier(api)
        self.plane = Plane(api=api, core=core, applier=applier,
                           observer=Observer(core, applier, kafka_timeout, settings.tenant_policy),
                           recorder=StatusRecorder(api), settings=settings, kafka_timeout=kafka_timeout)
        self.api, self.settings, self.kafka_timeout = api, settings, kafka_timeout
        self.recorder = self.plane.recorder
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
            out.stalled = Condition(STALLED, True, "InvalidSpec", first_error(e))
            return out
        names = Names(meta["namespace"], meta["name"], spec)
        out.fields["topics"] = {t.role: t.name for t in desired_topics(names)}

        refused = self._refusals(names)
        if refused:
            # Nothing is applied: what runs now (if anything) stays until the spec is fixed.
            why = "; ".join(refused)
            out.stalled = Condition(STALLED, True, "PolicyDenied", why)
            out.stages += [Condition(t, False, "PolicyDenied", why) for t in (DEDUP, PROCESSING)]
            return out
        found = conflicts(claim_of(names, meta.get("creationTimestamp") or ""), self._claims())
        if found:
            # The newer of two pipelines that would write one topic does nothing: no topic
            # created or altered, no worker started.
            why = "; ".join(c.message() for c in found)
            out.stalled = Condition(STALLED, True, "Conflict", why)
            out.stages += [Condition(t, False, "Conflict", why) for t in (TOPICS, DEDUP, PROCESSING)]
            return out

        p = Pass(self.plane, names, body, out)
        try:
            self._stages(p)
        finally:
            p.close()
        return out

    def _stages(self, p: Pass) -> None:
        out = p.out
        out.stages += stage_dedup.run(p)  # the topics stage runs inside it, at the partition count it steps to
        if out.stalled is not None:
            return
        for check in (stage_health.transactions, stage_health.lag_threshold, stage_nodes.run):
            if (degraded := check(p)) is not None:
                out.replace(degraded)
        try:
            out.stages.append(stage_spark.run(p))
        except ObjectConflict as e:
            out.stages.append(stage_dedup.object_conflict(e, p, PROCESSING))
        except ApplyError as e:
            out.stages.append(Condition(PROCESSING, False, "ApplyFailed", str(e)))

    def _refusals(self, names: Names) -> list[str]:
        """What the admin's tenant policy refuses in the spec, the Secrets and claims it names included."""
        out = policy.refusals(names.spec, self.settings.tenant_policy, self.settings.allowed_registries,
                              names.namespace)
        for kind, refs in (("Secret", policy.secret_refs(names.spec)),
                           ("PersistentVolumeClaim", policy.claim_refs(names.spec))):
            out += policy.opt_in_refusals(kind, refs, self.plane.observer.annotations(kind, names, refs),
                                          names.pipeline)
        return out

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

    def kafka_admin(self, names: Names):
        """An admin client outside a pass (deleting a pipeline's topics)."""
        return self.plane.observer.kafka_admin(names)
