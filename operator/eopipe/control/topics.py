"""Make Kafka's topics match the desired ones, without harming a topic the operator does not own.

`plan` is pure: the facts (the desired topics, the existing ones with partitions and configs,
the set of topics the operator created for this pipeline) in; the actions and what it refuses
to do out. The rest is the AdminClient I/O around it.

- A topic the operator created (owned, recorded in `status.ownedTopics` only once the create
  call succeeded) is managed: missing -> created again, fewer partitions -> grown, config
  drift -> reverted.
- A topic that existed before the pipeline first saw it is adopted, never owned: the operator
  only checks what the pipeline needs (enough partitions; for the source a `delete` cleanup
  policy and a retention that covers the dedup window; for the Spark commit markers
  compaction) and reports each mismatch with the command that fixes it. It never alters an
  adopted topic's configs or partitions and never deletes it.
- No topic ever loses partitions: more than desired is refused (Stalled/NotSupported).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from eopipe.control.builders.topics import TopicSpec


@dataclass(frozen=True)
class Existing:
    """A topic as Kafka has it: partition count and configs (as describe_configs reports them)."""
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mismatch:
    """An adopted topic that does not give the pipeline what it needs; the owner fixes it."""
    topic: str
    problem: str
    fix: str
    partitions: bool = False  # too few partitions: the pipeline cannot use the topic as it is

    def message(self) -> str:
        return f"topic {self.topic} (not created by eopipe, so not changed by it): {self.problem}; fix: {self.fix}"


@dataclass
class TopicPlan:
    create: list[TopicSpec] = field(default_factory=list)
    grow: dict[str, tuple[int, int]] = field(default_factory=dict)       # owned only
    set_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # owned only
    refused: dict[str, str] = field(default_factory=dict)                # impossible (a shrink)
    mismatches: list[Mismatch] = field(default_factory=list)              # adopted, left alone
    adopted: list[str] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)     # owned and still desired (before creating)
    released: list[str] = field(default_factory=list)  # owned, no longer desired: kept, not owned


@dataclass
class TopicReport:
    created: list[str] = field(default_factory=list)
    partitions_added: dict[str, tuple[int, int]] = field(default_factory=dict)
    configs_set: dict[str, dict[str, str]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)  # status.ownedTopics after this pass
    released: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.partitions_added or self.configs_set)


def _kafka_topics(bootstrap: str, topic: str, partitions: int) -> str:
    return (f"kafka-topics.sh --bootstrap-server {bootstrap} --alter --topic {topic} --partitions {partitions} "
            f"(Strimzi: KafkaTopic {topic} spec.partitions: {partitions})")


def _kafka_configs(bootstrap: str, topic: str, key: str, value: str) -> str:
    return (f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics --entity-name {topic} "
            f"--add-config {key}={value} (Strimzi: KafkaTopic {topic} spec.config.{key}: \"{value}\")")


def _adopted_checks(t: TopicSpec, have: Existing, window_ms: int, bootstrap: str) -> list[Mismatch]:
    out = []
    if have.partitions < t.partitions:
        out.append(Mismatch(t.name, f"{have.partitions} partitions, the pipeline needs {t.partitions}",
                            _kafka_topics(bootstrap, t.name, t.partitions), partitions=True))
    policy = {p.strip() for p in have.config.get("cleanup.policy", "delete").split(",")}
    if t.role == "source":
        if "compact" in policy:
            out.append(Mismatch(t.name, f"cleanup.policy={','.join(sorted(policy))}: compaction drops records "
                                        "a state rebuild replays", _kafka_configs(bootstrap, t.name, "cleanup.policy",
                                                                                  "delete")))
        retention = have.config.get("retention.ms")
        if retention is not None and retention != "-1" and int(retention) < window_ms:
            want = t.config.get("retention.ms", str(window_ms))
            out.append(Mismatch(t.name, f"retention.ms={retention} is shorter than the dedup window ({window_ms} ms): "
                                        "a state rebuild cannot replay the whole window",
                                _kafka_configs(bootstrap, t.name, "retention.ms", want)))
    elif t.role == "spark-commits" and "compact" not in policy:
        out.append(Mismatch(t.name, f"cleanup.policy={','.join(sorted(policy))}: the Spark sink's markers "
                                    "must be kept by compaction", _kafka_configs(bootstrap, t.name,
                                                                                 "cleanup.policy", "compact")))
    return out


def plan(desired: list[TopicSpec], existing: dict[str, Existing], owned: Iterable[str], *,
         window_ms: int, bootstrap: str = "<bootstrap>") -> TopicPlan:
    """What to do about `desired` given what Kafka has (`existing`, by name) and what the
    operator created for this pipeline (`owned`). Pure."""
    owned = set(owned)
    wanted = {t.name for t in desired}
    p = TopicPlan(owned=sorted(owned & wanted), released=sorted(owned - wanted))
    for t in desired:
        have = existing.get(t.name)
        if have is None:
            p.create.append(t)  # owned once the create call succeeds (or again, if it was owned)
            continue
        if have.partitions > t.partitions:
            p.refused[t.name] = (f"topic has {have.partitions} partitions, spec asks for {t.partitions}: "
                                 "Kafka cannot remove partitions")
            continue
        if t.name not in owned:
            p.adopted.append(t.name)
            p.mismatches.extend(_adopted_checks(t, have, window_ms, bootstrap))
            continue
        if have.partitions < t.partitions:
            p.grow[t.name] = (have.partitions, t.partitions)
        drift = {k: v for k, v in t.config.items() if have.config.get(k) != v}
        if drift:
            p.set_configs[t.name] = drift
    return p


# -- I/O ---------------------------------------------------------------------------------------------
def observe(admin: AdminClient, names: Iterable[str], timeout: float = 30) -> dict[str, Existing]:
    """The named topics that exist, with partition counts and configs."""
    md = admin.list_topics(timeout=timeout).topics
    present = [n for n in names if n in md]
    configs: dict[str, dict[str, str]] = {}
    if present:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in present]
        for r, fut in admin.describe_configs(resources, request_timeout=timeout).items():
            configs[r.name] = {k: e.value for k, e in fut.result(timeout).items()}
    return {n: Existing(len(md[n].partitions), configs.get(n, {})) for n in present}


def _create(admin: AdminClient, topics: list[TopicSpec], timeout: float):
    """(created: the create call succeeded, taken: someone else created it first, errors)."""
    created: list[str] = []
    taken: list[str] = []
    errors: list[Exception] = []
    if not topics:
        return created, taken, errors
    futs = admin.create_topics([NewTopic(t.name, t.partitions, t.replication_factor, config=t.config)
                                for t in topics], operation_timeout=timeout)
    for name, fut in futs.items():
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as e:
            if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                taken.append(name)
            else:
                errors.append(e)
        except Exception as e:  # noqa: BLE001 - e.g. a timeout: not known to be created, so not owned
            errors.append(e)
    return created, taken, errors


def ensure_topics(admin: AdminClient, desired: list[TopicSpec], owned: Iterable[str] = (), *,
                  window_ms: int = 0, bootstrap: str = "<bootstrap>", timeout: float = 30,
                  record_owned: Callable[[list[str]], None] | None = None) -> TopicReport:
    """Carries out `plan`. `record_owned(owned)` is called as soon as a create call succeeded,
    before anything else happens, so the ownership of a created topic is written down even if a
    later step fails; a topic whose creation was not confirmed is never claimed."""
    p = plan(desired, observe(admin, [t.name for t in desired], timeout), owned,
             window_ms=window_ms, bootstrap=bootstrap)
    report = TopicReport(refused=p.refused, mismatches=p.mismatches, adopted=list(p.adopted),
                         owned=list(p.owned), released=p.released)
    created, taken, errors = _create(admin, p.create, timeout)
    report.created = created
    report.adopted += taken  # created by someone else between our look and our create
    report.owned = sorted(set(p.owned) | set(created))
    if created and record_owned is not None:
        record_owned(report.owned)
    if errors:
        raise errors[0]

    if p.grow:
        futs = admin.create_partitions([NewPartitions(n, b) for n, (_a, b) in p.grow.items()],
                                       operation_timeout=timeout)
        for fut in futs.values():
            fut.result(timeout)
        report.partitions_added = dict(p.grow)
    if p.set_configs:
        changes = [ConfigResource(ConfigResource.Type.TOPIC, n, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in drift.items()])
            for n, drift in p.set_configs.items()]
        for fut in admin.incremental_alter_configs(changes).values():
            fut.result(timeout)
        report.configs_set = dict(p.set_configs)
    return report


def delete_topics(admin: AdminClient, names: list[str], timeout: float = 30) -> list[str]:
    """Deletes those of `names` that exist (the caller passes only owned topics)."""
    existing = admin.list_topics(timeout=timeout).topics
    gone = [n for n in names if n in existing]
    if gone:
        for fut in admin.delete_topics(gone, operation_timeout=timeout).values():
            fut.result(timeout)
    return gone
