"""The ExactlyOncePipeline spec: typed, validated at the boundary, and the source of the CRD schema.

Field names are the manifest's camelCase. Rules that the API server can check (types, ranges,
patterns, CEL across fields) go into the CRD through `eopipe.control.crd`; the same rules are checked
here, so a spec that reaches the builders is always valid.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from eopipe.core.backupspec import Backup
from eopipe.core.defaults import WINDOW_SECONDS
from eopipe.core.durations import format_duration, parse_duration
from eopipe.core.keys import KeySpec

# ProcessingSpec and the shared types are re-exported: callers import them from here.
from eopipe.core.processing import FILE_SINK_RULES, PROCESSING_CEL_RULES, ProcessingSpec, file_sink_problem
from eopipe.core.specbase import (  # noqa: F401 (KubeObject, SecretKeyRef: re-exported)
    Duration,
    EnvVar,
    KubeObject,
    Model,
    Quantity,
    SecretKeyRef,
    TopicName,
    section,
)

GROUP = "eopipe.dev"
# The stored version, which the operator watches and writes. The versions before it are still
# served, deprecated, with the same schema: the API server converts by changing apiVersion alone
# (conversion strategy None; docs/design.md, "API versions").
VERSION = "v1beta1"
DEPRECATED_VERSIONS = ("v1alpha1",)
KIND = "ExactlyOncePipeline"
PLURAL = "exactlyoncepipelines"
RESOURCE = (GROUP, VERSION, PLURAL)  # how kopf and the custom objects API name it


def deprecation_warning(version: str) -> str:
    """What the API server says (kubectl prints it) of each request in a deprecated version."""
    return f"{GROUP}/{version} {KIND} is deprecated; use {GROUP}/{VERSION}"



class Sasl(Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    username: SecretKeyRef
    password: SecretKeyRef


class Tls(Model):
    ca: SecretKeyRef | None = Field(None, description="CA certificate (PEM) to trust")
    cert: SecretKeyRef | None = Field(None, description="client certificate (PEM), for mTLS")
    key: SecretKeyRef | None = Field(None, description="client private key (PEM), for mTLS")


class KafkaSpec(Model):
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port...]")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl: Sasl | None = None
    tls: Tls | None = None


class SourceSpec(Model):
    topic: TopicName
    partitions: int = Field(ge=1, le=10000, description="may grow, never shrink")
    replication_factor: int | None = Field(
        None, ge=1, le=32,
        description="of every topic the operator creates, with min.insync.replicas min(2, it); unset: from the "
                    "cluster's broker count, 3 (min.insync.replicas 2) with three or more brokers, else the "
                    "broker count (min.insync.replicas 1) and a LowReplication warning in TopicsReady")
    retention: Duration = Field("168h", description="source retention; must cover the dedup window")
    partitioner: Literal["murmur2", "crc32"] = Field(
        "murmur2", description="how producers place keys: murmur2 (Java default) or crc32 (librdkafka default)")
    config: dict[str, str] = section(dict, description="extra topic configs")


# What the API server says when a rule fails; the checks below raise the same text.
WINDOW_MESSAGE = ("dedup.window must not exceed source.retention: "
                  "a state rebuild replays the source over the window")
ZERO_WINDOW_MESSAGE = "dedup.window must be above 0: a zero window catches no duplicate"
PROCESSING_MESSAGE = "processing needs a sink"
KEY_NAME_MESSAGE = "dedup.key.name is required when from is header or jsonField"
KEY_PATH_MESSAGE = ("dedup.key.path is only for from: jsonField, instead of name (the list form of a field path, "
                    "for names with a dot in them)")
KEY_DOTS_MESSAGE = ("dedup.key.name: a JSON field path such as user.id has no empty name between dots; name a "
                    "field with a dot in its name by dedup.key.path, such as [a.b, c]")
SINK_MESSAGE = "sink needs exactly one of kafka or files"
RETENTION_MESSAGE = "set source.retention instead of config['retention.ms']"
TOPICS_MESSAGE = "topics.deduped and topics.deadLetter must differ from each other, source.topic and sink.kafka.topic"
# What the operator sets on every dedup pod (eopipe.core.names.Names.labels, the worker's env in
# eopipe.control.builders.dedup, eopipe.core.kafkaconf.ENV_PREFIX): a pod template cannot change it.
OPERATOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                   "app.kubernetes.io/managed-by", "eopipe.dev/pipeline")
OPERATOR_ENV = ("POD_NAME", "POD_NAMESPACE", "POD_IP", "EOPIPE_TOKEN")
OPERATOR_ENV_PREFIX = "EOPIPE_KAFKA_"
POD_LABELS_MESSAGE = ("dedup.podTemplate.labels may not set the operator's labels (" + ", ".join(OPERATOR_LABELS)
                      + "): the StatefulSet selects its pods by them")
POD_ENV_MESSAGE = (f"dedup.podTemplate.env may not set {', '.join(OPERATOR_ENV)} or {OPERATOR_ENV_PREFIX}*: "
                   "the operator sets them (Kafka settings come from spec.kafka)")
POD_ENV_VALUE_MESSAGE = "dedup.podTemplate.env: an entry has either value or valueFrom, not both"
RESTORE_FROM_MESSAGE = ("restoreFrom is set when the pipeline is created and never changed: it decides the "
                        "consumer group and transactional ids the dedup and Spark stages commit under")
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Fields whose change cannot be carried out in place, each with the way to get there instead.
IMMUTABLE = {
    ("source", "topic"): "source.topic is immutable: the dedup state and the consumer offsets belong "
                         "to the source topic; create a new pipeline for the new topic and move "
                         "producers to it",
    ("source", "partitioner"): "source.partitioner is immutable: it decides each key's home partition, "
                               "where its dedup state lives; create a new pipeline with the new "
                               "partitioner and move producers to it",
    ("dedup", "key"): "dedup.key is immutable: the dedup state is keyed by it; create a new pipeline "
                      "with the new key and move producers to it",
}


class DedupKey(Model):
    source: Literal["recordKey", "header", "jsonField"] = Field(
        "recordKey", alias="from", description="where the dedup key is read from")
    name: str | None = Field(
        None, min_length=1, max_length=1024,
        description="header name, or JSON field: a path through nested objects, such as user.id (the field id "
                    "of the object user)")
    path: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        None, min_length=1, max_length=32,
        description="for from: jsonField only, instead of name: the field's path as a list of names, for names with a dot "
                    "in them: [a.b, c] is the field c of the top-level object a.b")

    @model_validator(mode="after")
    def _name_when_needed(self):
        if self.path is not None and (self.source != "jsonField" or self.name is not None):
            raise ValueError(KEY_PATH_MESSAGE)
        if self.source != "recordKey" and not self.name and self.path is None:
            raise ValueError(KEY_NAME_MESSAGE)
        if self.source == "jsonField" and self.name is not None and not all(self.name.split(".")):
            raise ValueError(KEY_DOTS_MESSAGE)
        return self

    def key_spec(self) -> KeySpec:
        if self.source == "jsonField":  # a name is always a dotted path here, never the text's list form
            return KeySpec("jsonField", path=tuple(self.path or self.name.split(".")))
        return KeySpec(self.source, self.name)


class Storage(Model):
    size: Quantity = "1Gi"
    storage_class_name: str | None = None


class Resources(Model):
    requests: dict[str, Quantity] = section(dict)
    limits: dict[str, Quantity] = section(dict)


class PodTemplate(Model):
    labels: dict[str, str] = Field(default_factory=dict, max_length=64,
                                   description="added to the operator's labels, which cannot be overridden")
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64,
                                        description="added to the operator's annotations; these win")
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=64, description="as in a pod spec")
    tolerations: list[KubeObject] = Field(default_factory=list, max_length=64,
                                          description="Kubernetes tolerations, as in a pod spec")
    affinity: KubeObject | None = Field(
        None, description="a Kubernetes affinity; each of nodeAffinity, podAffinity and podAntiAffinity given "
                          "here replaces the operator's (a preferred podAntiAffinity across nodes)")
    priority_class_name: str | None = Field(None, min_length=1, max_length=253, description="as in a pod spec")
    env: list[EnvVar] = Field(default_factory=list, max_length=64,
                              description="extra environment variables of the worker container, after the "
                                          "operator's")

    @model_validator(mode="after")
    def _operator_owned(self):
        if set(self.labels) & set(OPERATOR_LABELS):
            raise ValueError(POD_LABELS_MESSAGE)
        if any(e.name in OPERATOR_ENV or e.name.startswith(OPERATOR_ENV_PREFIX) for e in self.env):
            raise ValueError(POD_ENV_MESSAGE)
        if any(e.value is not None and e.value_from is not None for e in self.env):
            raise ValueError(POD_ENV_VALUE_MESSAGE)
        return self


# spec.dedup.autoscale (docs/design.md#autoscaling): the operator's own lag-based autoscaler.
AUTOSCALE_RANGE_MESSAGE = "dedup.autoscale.minReplicas must not exceed dedup.autoscale.maxReplicas"
REPLICAS_PARTITIONS_MESSAGE = ("dedup.replicas must not exceed source.partitions: a dedup pod owns whole "
                               "partitions, so pods beyond the partition count would idle")
AUTOSCALE_PARTITIONS_MESSAGE = ("dedup.autoscale.maxReplicas must not exceed source.partitions: a dedup pod "
                                "owns whole partitions, so pods beyond the partition count would idle")


class Autoscale(Model):
    enabled: bool = Field(True, description="false: spec.dedup.replicas sets the count again (keeps the settings)")
    min_replicas: int = Field(1, ge=1, le=1000)
    max_replicas: int = Field(ge=1, le=1000, description="at most source.partitions")
    target_lag_per_replica: int = Field(
        1000, ge=1, le=1_000_000_000,
        description="source records not yet committed, per dedup pod, that the autoscaler aims at")
    target_records_per_second_per_replica: int | None = Field(
        None, ge=1, le=100_000_000,
        description="records/s into the source per dedup pod; the larger of the two recommendations wins")
    scale_up_stabilization: Duration = Field(
        "30s", description="scale up only to the lowest recommendation of this window")
    scale_down_stabilization: Duration = Field(
        "5m", description="scale down only to the highest recommendation of this window")
    max_step: int = Field(2, ge=1, le=1000, description="most pods one rebalance adds or removes")

    @model_validator(mode="after")
    def _range(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(AUTOSCALE_RANGE_MESSAGE)
        return self


class DedupSpec(Model):
    key: DedupKey = section(DedupKey)
    window: Duration = Field(format_duration(WINDOW_SECONDS), description="duplicates further apart than this are not caught")
    replicas: int = Field(1, ge=1, le=1000)
    image: str | None = Field(None, description="defaults to the operator's image")
    storage: Storage = section(Storage)
    resources: Resources = section(
        Resources, description="of the worker container; unset keys get the operator's defaults (requests cpu "
                               "250m, memory 512Mi; limits memory 1Gi) and the worker's RocksDB memory is 40% of "
                               "the memory limit")
    pod_template: PodTemplate = section(
        PodTemplate, description="what the dedup pods get besides what the operator sets")
    autoscale: Autoscale | None = Field(
        None, description="the operator sets the replicas from lag and throughput (spec.dedup.replicas is then "
                          "only the starting count)")
    lag_threshold: int | None = Field(
        None, ge=1, description="source records not yet committed above which, for lagThresholdWindow, the "
                                "pipeline is Degraded (LagGrowing)")
    lag_threshold_window: Duration = Field("5m", description="how long the lag must stay above lagThreshold")
    backup: Backup | None = Field(
        None, description="snapshots of the dedup state in an object store; a partition whose volume is lost is "
                          "restored from the newest one instead of rebuilt from the source over the window")

    @field_validator("window")
    @classmethod
    def _some_window(cls, v: str):
        if parse_duration(v).total_seconds() <= 0:
            raise ValueError(ZERO_WINDOW_MESSAGE)
        return v


class LocalObjectReference(Model):
    name: str = Field(min_length=1, max_length=253,
                      description="a Secret of type kubernetes.io/dockerconfigjson in the pipeline's namespace")


class KafkaSink(Model):
    topic: TopicName
    partitions: int = Field(1, ge=1, le=10000)


class FileSink(Model):
    path: str = Field(min_length=1, max_length=1024,
                      description="a remote URI (s3a://, gs://, abfs://, hdfs://) or a path on a ReadWriteMany "
                                  "checkpoint claim: the executors write the files")
    format: Literal["parquet", "json"] = "parquet"


class TopicsSpec(Model):
    deduped: TopicName | None = Field(
        None, description="the deduplicated records; default <namespace>.<pipeline>.deduped (restoreFrom's "
                          "namespace and name, when set)")
    dead_letter: TopicName | None = Field(
        None, description="records without a usable dedup key; default <namespace>.<pipeline>.dlq (restoreFrom's "
                          "namespace and name, when set)")


class SinkSpec(Model):
    kafka: KafkaSink | None = None
    files: FileSink | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.kafka is None) == (self.files is None):
            raise ValueError(SINK_MESSAGE)
        return self


class RestoreFrom(Model):
    """The pipeline this one continues (docs/design.md#restore-into-a-new-namespace): its Kafka
    identities (consumer group, transactional ids, the default topic names) are that one's."""
    namespace: str = Field(min_length=1, max_length=63, pattern=DNS1123_LABEL,
                           description="the namespace the pipeline ran in")
    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_LABEL, description="its name there")


class PipelineSpec(Model):
    kafka: KafkaSpec
    source: SourceSpec
    dedup: DedupSpec = section(DedupSpec)
    processing: ProcessingSpec | None = Field(None, description="omit for a dedup-only pipeline")
    sink: SinkSpec | None = None
    topics: TopicsSpec = section(TopicsSpec, description="names of the topics the dedup stage writes")
    deletion_policy: Literal["Retain", "Delete"] = Field(
        "Retain", description="Retain keeps the Kafka topics and the Spark checkpoint claim when the pipeline is "
                              "deleted; Delete deletes the topics and the claim the operator created for it, never "
                              "one that existed before")
    paused: bool = Field(False, description="stop processing: the dedup pods scale to zero and the Spark application "
                                            "stops (its SparkApplication is deleted, and created again on resume); "
                                            "topics, state volumes, the Spark checkpoint and offsets are kept")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=32,
        description="Secrets for pulling the dedup and Spark images, as in a pod spec")
    restore_from: RestoreFrom | None = Field(
        None, description="continue a pipeline of another namespace or name (its topics kept, its state in "
                          "spec.dedup.backup): this one takes its consumer group, transactional ids and default "
                          "topic names; set at creation only; `eopipe restore` writes it")

    @model_validator(mode="after")
    def _cross_field(self):
        if parse_duration(self.dedup.window) > parse_duration(self.source.retention):
            raise ValueError(WINDOW_MESSAGE)
        if self.dedup.replicas > self.source.partitions:
            raise ValueError(REPLICAS_PARTITIONS_MESSAGE)
        if self.dedup.autoscale is not None and self.dedup.autoscale.max_replicas > self.source.partitions:
            raise ValueError(AUTOSCALE_PARTITIONS_MESSAGE)
        if self.processing is not None and self.sink is None:
            raise ValueError(PROCESSING_MESSAGE)
        if problem := file_sink_problem(self.processing, self.sink.files.path if self.sink and self.sink.files else None):
            raise ValueError(problem)
        written = [t for t in (self.topics.deduped, self.topics.dead_letter) if t]
        sink = self.sink.kafka.topic if self.sink is not None and self.sink.kafka is not None else None
        if len(set(written)) < len(written) or {self.source.topic, sink} & set(written):
            raise ValueError(TOPICS_MESSAGE)
        return self

    @field_validator("source")
    @classmethod
    def _no_retention_override(cls, v: SourceSpec):
        if "retention.ms" in v.config:
            raise ValueError(RETENTION_MESSAGE)
        return v


def immutable_changes(old: PipelineSpec, new: PipelineSpec) -> list[str]:
    """The API server's messages for an update from `old` to `new` (the transition rules)."""
    def at(spec, path):
        for name in path:
            spec = getattr(spec, name)
        return spec
    out = [msg for path, msg in IMMUTABLE.items() if at(old, path) != at(new, path)]
    return (out + [RESTORE_FROM_MESSAGE]) if old.restore_from != new.restore_from else out


# CEL rules the API server enforces; each mirrors a check above (or needs oldSelf).
CEL_RULES = {
    (): [
        {"rule": "!has(self.dedup) || !has(self.dedup.window) || !has(self.source.retention) || "
                 "duration(self.dedup.window) <= duration(self.source.retention)",
         "message": WINDOW_MESSAGE},
        {"rule": "!has(self.processing) || has(self.sink)", "message": PROCESSING_MESSAGE},
        {"rule": "!has(self.topics) || ("
                 "(!has(self.topics.deduped) || (self.topics.deduped != self.source.topic && "
                 "!(has(self.sink) && has(self.sink.kafka) && self.topics.deduped == self.sink.kafka.topic))) && "
                 "(!has(self.topics.deadLetter) || (self.topics.deadLetter != self.source.topic && "
                 "!(has(self.sink) && has(self.sink.kafka) && self.topics.deadLetter == self.sink.kafka.topic) && "
                 "!(has(self.topics.deduped) && self.topics.deadLetter == self.topics.deduped))))",
         "message": TOPICS_MESSAGE},
        {"rule": "!has(self.dedup) || !has(self.dedup.replicas) || self.dedup.replicas <= self.source.partitions",
         "message": REPLICAS_PARTITIONS_MESSAGE},
        {"rule": "!has(self.dedup) || !has(self.dedup.autoscale) || "
                 "self.dedup.autoscale.maxReplicas <= self.source.partitions",
         "message": AUTOSCALE_PARTITIONS_MESSAGE},
        # A transition rule (checked on update only): neither added, removed nor changed.
        {"rule": "has(self.restoreFrom) == has(oldSelf.restoreFrom) && "
                 "(!has(self.restoreFrom) || self.restoreFrom == oldSelf.restoreFrom)",
         "message": RESTORE_FROM_MESSAGE},
    ],
    ("source",): [
        {"rule": "!('retention.ms' in self.config)", "message": RETENTION_MESSAGE},
    ],
    ("source", "partitions"): [
        {"rule": "self >= oldSelf",
         "message": "source.partitions may not decrease (Kafka cannot remove partitions)"},
    ],
    # A string that passed the schema's pattern, so duration() parses it.
    ("dedup", "window"): [
        {"rule": "duration(self) > duration('0s')", "message": ZERO_WINDOW_MESSAGE},
    ],
    ("dedup", "key"): [
        {"rule": "!has(self.path) || (has(self.from) && self.from == 'jsonField' && !has(self.name))",
         "message": KEY_PATH_MESSAGE},
        {"rule": "!has(self.from) || self.from == 'recordKey' || has(self.name) || has(self.path)",
         "message": KEY_NAME_MESSAGE},
        {"rule": "!has(self.from) || self.from != 'jsonField' || !has(self.name) || "
                 "self.name.matches('^[^.]+([.][^.]+)*$')",
         "message": KEY_DOTS_MESSAGE},
    ],
    ("dedup", "podTemplate"): [
        {"rule": "!has(self.labels) || !(" + " || ".join(f"'{k}' in self.labels" for k in OPERATOR_LABELS) + ")",
         "message": POD_LABELS_MESSAGE},
        {"rule": "!has(self.env) || self.env.all(e, !(e.name in [" + ", ".join(f"'{n}'" for n in OPERATOR_ENV)
                 + f"]) && !e.name.startsWith('{OPERATOR_ENV_PREFIX}'))",
         "message": POD_ENV_MESSAGE},
        {"rule": "!has(self.env) || self.env.all(e, !(has(e.value) && has(e.valueFrom)))",
         "message": POD_ENV_VALUE_MESSAGE},
    ],
    ("dedup", "autoscale"): [
        {"rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
         "message": AUTOSCALE_RANGE_MESSAGE},
    ],
    ("sink",): [
        {"rule": "has(self.kafka) != has(self.files)", "message": SINK_MESSAGE},
    ],
}
CEL_RULES[()] += FILE_SINK_RULES
CEL_RULES.update(PROCESSING_CEL_RULES)
for _path, _message in IMMUTABLE.items():  # transition rules: checked only on update
    CEL_RULES.setdefault(_path, []).append({"rule": "self == oldSelf", "message": _message})
