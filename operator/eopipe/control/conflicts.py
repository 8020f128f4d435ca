"""Two pipelines must never write the same Kafka topic: pure detection of who yields.

Kafka topics are cluster-wide, pipelines namespaced. Each pipeline's written topics (deduped,
dead-letter, and with a processing stage the sink and the Spark commit markers) come from its
spec through `core.names`; a topic it only reads (its source) is no conflict, so any number of
pipelines may read one source topic. When two pipelines would write one topic, the newer one
(by `metadata.creationTimestamp`, then namespace and name) yields: it is Stalled with reason
Conflict and the operator neither touches its topics nor starts its workers; the older one
goes on as if the newer did not exist. The dedup stage's consumer group (and with it its
transactional ids) is claimed the same way: a pipeline restored from another (`spec.restoreFrom`)
takes that one's, and only one may commit under it. So is the Spark driver's ServiceAccount of a
namespace (an admin may list one for several pipelines: `tenantPolicy.spark.serviceAccounts`):
each pipeline's query would hold the other's rights through it, and the chart's driver policy
holds a driver's pods to every pipeline that shares it, so their executors could not start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from pydantic import ValidationError

from eopipe.control.builders.spark import driver_account
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec


GROUP = "consumer group"
GROUP_PREFIX = "group:"  # a claim's groups and topics share one namespace of names, kept apart by this
ACCOUNT = "Spark driver ServiceAccount"
ACCOUNT_PREFIX = "serviceaccount:"


@dataclass(frozen=True)
class Claim:
    """What one pipeline writes, and its age."""
    namespace: str
    name: str
    created: str  # metadata.creationTimestamp, RFC 3339 in UTC ("...Z"): ordered as text
    written: dict[str, str]  # role -> topic

    @property
    def rank(self) -> tuple[str, str, str]:
        return (self.created, self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Conflict:
    topic: str
    role: str         # the topic's role in the yielding pipeline
    other: str        # namespace/name of the older pipeline
    other_role: str   # the topic's role there

    def message(self) -> str:
        if self.role == ACCOUNT:
            return (f"the Spark driver's ServiceAccount {self.topic.rpartition('/')[2]} is also that of the older "
                    f"pipeline {self.other}; two pipelines must not run their drivers as one (each query would hold "
                    f"the other's rights), so this one does nothing until it names another "
                    f"(spec.processing.serviceAccount) or {self.other} is gone")
        if self.role == GROUP:
            return (f"consumer group {self.topic.removeprefix(GROUP_PREFIX)} (and its transactional ids) is also "
                    f"that of the older pipeline {self.other} (spec.restoreFrom); two pipelines must not commit "
                    f"under one, so this one does nothing until {self.other} is gone")
        return (f"topic {self.topic} ({self.role}) is also the {self.other_role} topic of the older pipeline "
                f"{self.other}; two pipelines must not write one topic, so this one does nothing until it "
                f"names another topic (spec.topics, spec.sink.kafka.topic) or {self.other} is gone")


def claim(body: dict) -> Claim | None:
    """The claim of a pipeline object as the API returns it; None if its spec is not valid
    (such a pipeline is Stalled/InvalidSpec and writes nothing)."""
    meta = body.get("metadata") or {}
    try:
        spec = PipelineSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    return claim_of(Names(meta.get("namespace", ""), meta.get("name", ""), spec), meta.get("creationTimestamp") or "")


def claim_of(names: Names, created: str) -> Claim:
    written = {**names.written_topics, GROUP: GROUP_PREFIX + names.consumer_group}
    if names.spec.processing is not None:
        written[ACCOUNT] = f"{ACCOUNT_PREFIX}{names.namespace}/{driver_account(names)}"
    return Claim(names.namespace, names.pipeline, created, written)


def conflicts(me: Claim, others: Iterable[Claim]) -> list[Conflict]:
    """The topics `me` would write that an older pipeline writes too (empty: `me` may go on).
    `others` may include `me` itself (a listing does): it is skipped."""
    out = []
    for other in sorted(others, key=lambda c: c.rank):
        if (other.namespace, other.name) == (me.namespace, me.name) or other.rank > me.rank:
            continue
        theirs = {topic: role for role, topic in other.written.items()}
        for role, topic in me.written.items():
            if topic in theirs:
                out.append(Conflict(topic, role, other.ref, theirs[topic]))
    return out
