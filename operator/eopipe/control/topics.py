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
- Replication: a topic without an explicit factor (source.replicationFactor unset) gets it from
  the cluster's broker count, read in the same step (`replication`): 3 replicas and
  min.insync.replicas 2 with three or more brokers, else as many as there are brokers, with a
  warning in the report. An explicit factor always wins (above the broker count, Kafka's
  create call fails, as it always did).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from eopipe.control.builders.topics import TopicSpec


@dataclass(frozen=True)
class Existing:
    """A topic as Kafka has it: partition count, configs (as describe_configs reports them) and
    replicas per partition (0: not known)."""
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    replication: int = 0


# The replication a topic gets when the spec does not set one, given enough brokers: one broker
# may be lost without losing an acknowledged record or stopping transactional writes.
SAFE_REPLICATION, SAFE_MIN_INSYNC = 3, 2
LOW_REPLICATION = "LowReplication"  # the warning's reason (TopicsReady stays True)


@dataclass(frozen=True)
class TopicWarning:
    """Something the pipeline runs with but should not (a status condition's reason and message)."""
    reason: str
    message: str


@dataclass(frozen=True)
class Replication:
    factor: int
    min_insync: int
    warning: str | None = None  # why this is less than SAFE_REPLICATION / SAFE_MIN_INSYNC


def replication(brokers: int, explicit: int | None) -> Replication:
    """The replication factor and min.insync.replicas of a topic the operator creates. Pure.
    `explicit`: source.replicationFactor (it wins, with min.insync.replicas min(2, it));
    `brokers`: the cluster's broker count, which an unset factor follows."""
    if explicit is not None:
        return Replication(explicit, min(SAFE_MIN_INSYNC, explicit))
    if brokers >= SAFE_REPLICATION:
        return Replication(SAFE_REPLICATION, SAFE_MIN_INSYNC)
    fits = max(1, brokers)
    return Replication(fits, 1, f"the cluster has {brokers} broker{'s' if brokers != 1 else ''}: topics get "
                                f"replication {fits} and min.insync.replicas 1 ({SAFE_REPLICATION} and "
                                f"{SAFE_MIN_INSYNC} need {SAFE_REPLICATION} brokers), so losing a broker can "
                                "lose records; set source.replicationFactor to choose")


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
    warnings: list[TopicWarning] = field(default_factory=list)


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
    warnings: list[TopicWarning] = field(default_factory=list)  # TopicsReady stays True, with these

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


def replicated(t: TopicSpec, brokers: int) -> TopicSpec:
    """`t` with its replication decided: an unset factor from `brokers`, and min.insync.replicas
    to match unless the topic's own configs set it (source.config)."""
    r = replication(brokers, t.replication_factor)
    return replace(t, replication_factor=r.factor, config={"min.insync.replicas": str(r.min_insync), **t.config})


def plan(desired: list[TopicSpec], existing: dict[str, Existing], owned: Iterable[str], *,
         window_ms: int, bootstrap: str = "<bootstrap>", brokers: int = SAFE_REPLICATION) -> TopicPlan:
    """What to do about `desired` given what Kafka has (`existing`, by name), what the operator
    created for this pipeline (`owned`) and the cluster's broker count. Pure."""
    owned = set(owned)
    wanted = {t.name for t in desired}
    p = TopicPlan(owned=sorted(owned & wanted), released=sorted(owned - wanted))
    # Said on every pass while true, not only the pass that creates: a condition that went back
    # to TopicsReconciled would hide that one broker's loss can lose records.
    low = [t.name for t in desired if t.replication_factor is None
           and (t.name not in existing or (t.name in owned and existing[t.name].replication < SAFE_REPLICATION))]
    if low and (why := replication(brokers, None).warning):
        p.warnings.append(TopicWarning(LOW_REPLICATION, f"{why} ({', '.join(low)})"))
    for t in desired:
        have = existing.get(t.name)
        if have is None:
            p.create.append(replicated(t, brokers))  # owned once the create call succeeds (or again)
            continue
        if t.replication_factor is not None:
            t = replicated(t, brokers)
        elif have.replication:
            # An existing topic keeps its replicas (changing them is a reassignment, the owner's);
            # min.insync.replicas follows what it has, as if it had been created on that many brokers.
            fits = replication(brokers, None).factor
            if t.name in owned and have.replication < fits:
                p.warnings.append(TopicWarning(LOW_REPLICATION, (
                    f"topic {t.name} has replication {have.replication}, the cluster's brokers allow {fits}: "
                    "raise it with kafka-reassign-partitions.sh")))
            t = replicated(t, have.replication)
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
def observe(admin: AdminClient, names: Iterable[str], timeout: float = 30) -> tuple[dict[str, Existing], int]:
    """The named topics that exist, with partition counts, configs and replicas, and the
    cluster's broker count (from the same metadata)."""
    cluster = admin.list_topics(timeout=timeout)
    md = cluster.topics
    present = [n for n in names if n in md]
    configs: dict[str, dict[str, str]] = {}
    if present:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in present]
        for r, fut in admin.describe_configs(resources, request_timeout=timeout).items():
            configs[r.name] = {k: e.value for k, e in fut.result(timeout).items()}

    def replicas(topic) -> int:
        return max((len(p.replicas) for p in topic.partitions.values()), default=0)
    return ({n: Existing(len(md[n].partitions), configs.get(n, {}), replicas(md[n])) for n in present},
            len(cluster.brokers))


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
    existing, brokers = observe(admin, [t.name for t in desired], timeout)
    p = plan(desired, existing, owned, window_ms=window_ms, bootstrap=bootstrap, brokers=brokers)
    report = TopicReport(refused=p.refused, mismatches=p.mismatches, adopted=list(p.adopted),
                         owned=list(p.owned), released=p.released, warnings=p.warnings)
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
