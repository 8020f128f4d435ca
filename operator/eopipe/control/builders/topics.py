"""Desired Kafka topics of a pipeline (spec in, topic list out)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eopipe.core.durations import duration_ms
from eopipe.core.names import Names


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)
    role: str = ""


def desired_topics(names: Names) -> list[TopicSpec]:
    spec = names.spec
    rf = spec.source.replication_factor
    retention_ms = str(duration_ms(spec.source.retention))
    # Transactions on the output need at least 2 in-sync replicas to survive a broker loss;
    # a single-replica topic (a dev cluster) can only ask for 1.
    durable = {"min.insync.replicas": str(min(2, rf))}
    topics = [
        TopicSpec(spec.source.topic, spec.source.partitions, rf,
                  {**durable, **spec.source.config, "retention.ms": retention_ms}, "source"),
        # One deduped partition per source partition: a key's records stay in order.
        TopicSpec(names.deduped_topic, spec.source.partitions, rf,
                  {**durable, "retention.ms": retention_ms}, "deduped"),
        TopicSpec(names.dlq_topic, 1, rf, {**durable, "retention.ms": retention_ms}, "dead-letter"),
    ]
    if spec.processing is not None:
        if names.sink_topic is not None:
            topics.append(TopicSpec(names.sink_topic, spec.sink.kafka.partitions, rf, durable, "sink"))
        # Markers of the Spark sink: only the latest (task -> batchId) matters.
        topics.append(TopicSpec(names.spark_commit_topic, 1, rf,
                                {**durable, "cleanup.policy": "compact"}, "spark-commits"))
    return topics
