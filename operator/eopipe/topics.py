"""Make Kafka's topics match the desired ones (AdminClient), idempotently.

Creates missing topics, adds partitions, and sets the managed configs (reverting drift made
by hand). Never removes partitions: a topic with more partitions than desired is reported as
a refused change, which the operator turns into Stalled/NotSupported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, NewTopic)

from eopipe.builders.topics import TopicSpec


@dataclass
class TopicReport:
    created: list[str] = field(default_factory=list)
    partitions_added: dict[str, tuple[int, int]] = field(default_factory=dict)
    configs_set: dict[str, dict[str, str]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.partitions_added or self.configs_set)


def _result(fut, timeout: float):
    try:
        return fut.result(timeout)
    except KafkaException as e:
        if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return None
        raise


def ensure_topics(admin: AdminClient, desired: list[TopicSpec], timeout: float = 30) -> TopicReport:
    report = TopicReport()
    existing = admin.list_topics(timeout=timeout).topics
    missing = [t for t in desired if t.name not in existing]
    if missing:
        futs = admin.create_topics([NewTopic(t.name, t.partitions, t.replication_factor, config=t.config)
                                    for t in missing], operation_timeout=timeout)
        for name, fut in futs.items():
            _result(fut, timeout)
            report.created.append(name)

    grow = []
    for t in desired:
        if t.name not in existing:
            continue
        have = len(existing[t.name].partitions)
        if have < t.partitions:
            grow.append(NewPartitions(t.name, t.partitions))
            report.partitions_added[t.name] = (have, t.partitions)
        elif have > t.partitions:
            report.refused[t.name] = (f"topic has {have} partitions, spec asks for {t.partitions}: "
                                      "Kafka cannot remove partitions")
    if grow:
        for fut in admin.create_partitions(grow, operation_timeout=timeout).values():
            fut.result(timeout)

    present = [t for t in desired if t.name in existing and t.config]
    if present:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t.name) for t in present]
        current = {r.name: fut.result(timeout) for r, fut in admin.describe_configs(resources).items()}
        changes = []
        for t in present:
            drift = {k: v for k, v in t.config.items()
                     if k not in current[t.name] or current[t.name][k].value != v}
            if drift:
                report.configs_set[t.name] = drift
                changes.append(ConfigResource(
                    ConfigResource.Type.TOPIC, t.name,
                    incremental_configs=[ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                                         for k, v in drift.items()]))
        if changes:
            for fut in admin.incremental_alter_configs(changes).values():
                fut.result(timeout)
    return report


def delete_topics(admin: AdminClient, names: list[str], timeout: float = 30) -> list[str]:
    existing = admin.list_topics(timeout=timeout).topics
    gone = [n for n in names if n in existing]
    if gone:
        for fut in admin.delete_topics(gone, operation_timeout=timeout).values():
            fut.result(timeout)
    return gone
