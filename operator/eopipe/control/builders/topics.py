"""Desired Kafka topics of a pipeline (spec in, topic list out)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eopipe.core.durations import duration_ms
from eopipe.core.names import Names


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int | None  # None: from the cluster's broker count (control/topics.replication)
    config: dict[str, str] = field(default_factory=dict)
    role: str = ""


def desired_topics(names: Names) -> list[TopicSpec]:
    spec = names.spec
    rf = spec.source.replication_factor
    retention_ms = str(duration_ms(spec.source.retention))
    # min.insync.replicas is decided with the replication factor, by the topic plan
    # (control/topics.replicated), which knows the cluster's broker count.
    topics = [
        TopicSpec(spec.source.topic, spec.source.partitions, rf,
                  {**spec.source.config, "retention.ms": retention_ms}, "source"),
        # One deduped partition per source partition: a key's records stay in order.
        TopicSpec(names.deduped_topic, spec.source.partitions, rf,
                  {"retention.ms": retention_ms}, "deduped"),
        TopicSpec(names.dlq_topic, 1, rf, {"retention.ms": retention_ms}, "dead-letter"),
    ]
    if spec.processing is not None:
        if names.sink_topic is not None:
            topics.append(TopicSpec(names.sink_topic, spec.sink.kafka.partitions, rf, {}, "sink"))
        # Markers of the Spark sink: only the latest (task -> batchId) matters.
        topics.append(TopicSpec(names.spark_commit_topic, 1, rf,
                                {"cleanup.policy": "compact"}, "spark-commits"))
    return topics
