"""Names of everything a pipeline owns, derived from the pipeline alone so every part agrees.

Kafka topics are cluster-wide while pipelines are namespaced: the topics a pipeline writes
(deduped, dead-letter, Spark commits) and its transactional ids therefore carry namespace and
pipeline name, so two pipelines that read one source topic never write the same topic. The
deduped and dead-letter topics can be named in `spec.topics` instead. A pipeline restored into
another namespace (`spec.restoreFrom`) keeps these names of the pipeline it continues: its
Kafka `identity`.
"""

from __future__ import annotations

from dataclasses import dataclass

from eopipe.core.spec import PipelineSpec

LABEL_APP = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "eopipe-operator"  # its value on every object the operator makes
LABEL_PIPELINE = "eopipe.dev/pipeline"
# On the Spark driver and executor pods: a digest of the SparkApplication spec they run
# (control/sparkstatus.py tells a failure of this spec from one of a run before a change).
LABEL_SPARK_SPEC = "eopipe.dev/spark-spec"

# The dedup pods' HTTP port (/status, /metrics, the state transfers).
DEDUP_HTTP_PORT = 8080
# The Spark driver's progress endpoint (spark_app/progress.py serves GET /progress there; the
# operator reads it into status.processing). Clear of Spark's own driver ports (4040 UI, 7078-7079).
SPARK_PROGRESS_PORT = 4045
SPARK_PROGRESS_PATH = "/progress"
# The record counts a dedup pod reports (/status `counts`, status.dedupStats).
COUNT_KINDS = ("consumed", "emitted", "duplicates", "deadLettered")
# The Kubeflow Spark Operator's SparkApplication resource, which the Spark stage applies.
SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
SPARK_API = f"{SPARK_GROUP}/{SPARK_VERSION}"

# The longest pipeline name that every derived Kubernetes name has room for (admission refuses
# longer ones). The tightest is the dedup StatefulSet `<name>-dedup` (Names.dedup): the
# StatefulSet controller labels each pod controller-revision-hash=<statefulset>-<hash>, the hash
# up to 10 characters, and a label value holds at most 63, so the StatefulSet name gets
# 63 - 1 - 10 = 52 and the pipeline name 52 - len("-dedup") = 46. Everything else fits in that:
# pods `<name>-dedup-<ordinal>` (label statefulset.kubernetes.io/pod-name, 63), the Spark
# objects `<name>-spark` (the Spark operator's `<app>-ui-svc` Service, 63), the ConfigMap
# `<name>-dedup-assignment` and the Secret `<name>-dedup-token` (253), the NetworkPolicy `<name>-dedup` (253).
LABEL_VALUE_MAX = 63
REVISION_HASH_MAX = 10
MAX_PIPELINE_NAME = LABEL_VALUE_MAX - 1 - REVISION_HASH_MAX - len("-dedup")


# The dedup stage's Kafka identities: the operator reads the group's offsets and the worker
# commits them, so both derive them here.
def consumer_group(namespace: str, pipeline: str) -> str:
    return f"{namespace}.{pipeline}.dedup"


def transactional_id(namespace: str, pipeline: str, partition: int) -> str:
    return f"{consumer_group(namespace, pipeline)}.{partition}"


def deduped_topic(namespace: str, pipeline: str) -> str:
    """The default deduped topic (spec.topics.deduped overrides it)."""
    return f"{namespace}.{pipeline}.deduped"


def label_selector(pipeline: str, component: str) -> str:
    """The API's label selector of a pipeline's component (Names.selector as one string)."""
    return f"{LABEL_PIPELINE}={pipeline},{LABEL_COMPONENT}={component}"


def dedup_set(pipeline: str) -> str:
    """StatefulSet, headless Service and PodDisruptionBudget of the dedup pods."""
    return f"{pipeline}-dedup"


def spark_app(pipeline: str) -> str:
    """The SparkApplication, and the prefix of its driver pod's name."""
    return f"{pipeline}-spark"


def spark_commit_topic(namespace: str, pipeline: str) -> str:
    """Where the Spark stage's sink keeps its commit markers (spark_app/sink_kafka.py)."""
    return f"eopipe.{namespace}.{pipeline}.spark-commits"


def dlq_topic(namespace: str, pipeline: str) -> str:
    """The default dead-letter topic (spec.topics.deadLetter overrides it); also the dedup
    worker's when it is run without --dlq-topic."""
    return f"{namespace}.{pipeline}.dlq"


@dataclass(frozen=True)
class Names:
    namespace: str
    pipeline: str
    spec: PipelineSpec

    @property
    def source_topic(self) -> str:
        return self.spec.source.topic

    @property
    def identity(self) -> tuple[str, str]:
        """(namespace, pipeline) of the Kafka names: its own, or those of the pipeline it continues."""
        origin = self.spec.restore_from
        return (origin.namespace, origin.name) if origin is not None else (self.namespace, self.pipeline)

    @property
    def deduped_topic(self) -> str:
        return self.spec.topics.deduped or deduped_topic(*self.identity)

    @property
    def dlq_topic(self) -> str:
        return self.spec.topics.dead_letter or dlq_topic(*self.identity)

    @property
    def sink_topic(self) -> str | None:
        sink = self.spec.sink
        return sink.kafka.topic if sink is not None and sink.kafka is not None else None

    @property
    def spark_commit_topic(self) -> str:
        return spark_commit_topic(*self.identity)

    @property
    def written_topics(self) -> dict[str, str]:
        """The topics this pipeline writes, by role: two pipelines must never share one
        (control.conflicts). The source is read only."""
        out = {"deduped": self.deduped_topic, "dead-letter": self.dlq_topic}
        if self.spec.processing is not None:
            if self.sink_topic is not None:
                out["sink"] = self.sink_topic
            out["spark-commits"] = self.spark_commit_topic
        return out

    @property
    def dedup(self) -> str:
        return dedup_set(self.pipeline)

    @property
    def assignment_configmap(self) -> str:
        return f"{self.pipeline}-dedup-assignment"

    @property
    def token_secret(self) -> str:
        """The Secret with the bearer token of the dedup pods' state endpoints (253 characters)."""
        return f"{self.pipeline}-dedup-token"

    @property
    def spark_app(self) -> str:
        return spark_app(self.pipeline)

    @property
    def spark_checkpoint_claim(self) -> str:
        """The PersistentVolumeClaim the operator creates for Spark's checkpoint."""
        return f"{self.pipeline}-spark-checkpoint"

    @property
    def consumer_group(self) -> str:
        return consumer_group(*self.identity)

    def labels(self, component: str) -> dict[str, str]:
        return {LABEL_APP: "eopipe", LABEL_INSTANCE: self.pipeline, LABEL_COMPONENT: component,
                LABEL_MANAGED_BY: MANAGED_BY, LABEL_PIPELINE: self.pipeline}

    def selector(self, component: str) -> dict[str, str]:
        return {LABEL_PIPELINE: self.pipeline, LABEL_COMPONENT: component}

    def label_selector(self, component: str) -> str:
        return label_selector(self.pipeline, component)
