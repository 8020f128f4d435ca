"""Names of everything a pipeline owns, derived from the pipeline alone so every part agrees.

Kafka topics are cluster-wide while pipelines are namespaced: derived topic names therefore
carry the source topic, which the user already keeps unique per Kafka cluster, and the
Spark commit topic and transactional ids carry namespace and pipeline name.
"""

from __future__ import annotations

from dataclasses import dataclass

from eopipe.spec import PipelineSpec

LABEL_APP = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PIPELINE = "eopipe.dev/pipeline"


@dataclass(frozen=True)
class Names:
    namespace: str
    pipeline: str
    spec: PipelineSpec

    @property
    def source_topic(self) -> str:
        return self.spec.source.topic

    @property
    def deduped_topic(self) -> str:
        return f"{self.spec.source.topic}.deduped"

    @property
    def dlq_topic(self) -> str:
        return f"{self.spec.source.topic}.dlq"

    @property
    def sink_topic(self) -> str | None:
        sink = self.spec.sink
        return sink.kafka.topic if sink is not None and sink.kafka is not None else None

    @property
    def spark_commit_topic(self) -> str:
        return f"eopipe.{self.namespace}.{self.pipeline}.spark-commits"

    @property
    def dedup(self) -> str:
        """StatefulSet, headless Service and PodDisruptionBudget of the dedup pods."""
        return f"{self.pipeline}-dedup"

    @property
    def assignment_configmap(self) -> str:
        return f"{self.pipeline}-dedup-assignment"

    @property
    def spark_app(self) -> str:
        return f"{self.pipeline}-spark"

    @property
    def consumer_group(self) -> str:
        return f"{self.namespace}.{self.pipeline}.dedup"

    def labels(self, component: str) -> dict[str, str]:
        return {LABEL_APP: "eopipe", LABEL_INSTANCE: self.pipeline, LABEL_COMPONENT: component,
                LABEL_MANAGED_BY: "eopipe-operator", LABEL_PIPELINE: self.pipeline}

    def selector(self, component: str) -> dict[str, str]:
        return {LABEL_PIPELINE: self.pipeline, LABEL_COMPONENT: component}
