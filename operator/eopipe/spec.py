"""The ExactlyOncePipeline spec: typed, validated at the boundary, and the source of the CRD schema.

Field names are the manifest's camelCase. Rules that the API server can check (types, ranges,
patterns, CEL across fields) go into the CRD through `eopipe.crd`; the same rules are checked
here, so a spec that reaches the builders is always valid.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "eopipe.dev"
VERSION = "v1alpha1"
KIND = "ExactlyOncePipeline"
PLURAL = "exactlyoncepipelines"

# Go duration strings (what CEL's duration() parses): "90s", "15m", "24h", "1h30m".
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"


def parse_duration(text: str) -> timedelta:
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"bad duration {text!r}: use Go duration syntax such as '90s', '15m' or '24h'")
    return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text)))


Duration = Annotated[str, Field(pattern=DURATION_PATTERN)]
TopicName = Annotated[str, Field(pattern=TOPIC_PATTERN)]
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]
# Spark's own memory strings (JVM style), as SparkApplication takes them: "512m", "2g".
SparkMemory = Annotated[str, Field(pattern=r"^[0-9]+[kmgt]?$")]


def section(model, **kw):
    """A sub-object that may be omitted: the model's defaults apply, and the CRD says so."""
    return Field(default_factory=model, json_schema_extra={"default": {}}, **kw)


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True)


class SecretKeyRef(Model):
    name: str = Field(min_length=1, description="Secret name, in the pipeline's namespace")
    key: str = Field(min_length=1)


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
    replication_factor: int = Field(1, ge=1, le=32)
    retention: Duration = Field("168h", description="source retention; must cover the dedup window")
    partitioner: Literal["murmur2", "crc32"] = Field(
        "murmur2", description="how producers place keys: murmur2 (Java default) or crc32 (librdkafka default)")
    config: dict[str, str] = section(dict, description="extra topic configs")


class DedupKey(Model):
    source: Literal["recordKey", "header", "jsonField"] = Field(
        "recordKey", alias="from", description="where the dedup key is read from")
    name: str | None = Field(None, min_length=1, description="header or JSON field name")

    @model_validator(mode="after")
    def _name_when_needed(self):
        if self.source != "recordKey" and not self.name:
            raise ValueError(f"dedup.key.name is required when from is {self.source}")
        return self

    def spec_string(self) -> str:
        """The worker's --key argument."""
        return {"recordKey": "key", "header": f"header:{self.name}", "jsonField": f"json:{self.name}"}[self.source]


class Storage(Model):
    size: Quantity = "1Gi"
    storage_class_name: str | None = None


class Resources(Model):
    requests: dict[str, Quantity] = section(dict)
    limits: dict[str, Quantity] = section(dict)


class DedupSpec(Model):
    key: DedupKey = section(DedupKey)
    window: Duration = Field("24h", description="duplicates further apart than this are not caught")
    replicas: int = Field(1, ge=1, le=1000)
    image: str | None = Field(None, description="defaults to the operator's image")
    storage: Storage = section(Storage)
    resources: Resources = section(Resources)


class Executors(Model):
    instances: int = Field(1, ge=1, le=1000)
    cores: int = Field(1, ge=1, le=64)
    memory: SparkMemory = "1g"


class ProcessingSpec(Model):
    image: str | None = Field(None, description="Spark image with spark_app and the Kafka connector")
    sql: str = Field("SELECT * FROM events", min_length=1,
                     description="Spark SQL over the view `events` of the deduped records")
    trigger: Duration = "1s"
    checkpoint_location: str = Field(min_length=1, description="durable URI or PVC path for checkpoints")
    driver_memory: SparkMemory = "1g"
    executors: Executors = section(Executors)


class KafkaSink(Model):
    topic: TopicName
    partitions: int = Field(1, ge=1, le=10000)


class FileSink(Model):
    path: str = Field(min_length=1)
    format: Literal["parquet", "json"] = "parquet"


class SinkSpec(Model):
    kafka: KafkaSink | None = None
    files: FileSink | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.kafka is None) == (self.files is None):
            raise ValueError("sink needs exactly one of kafka or files")
        return self


class PipelineSpec(Model):
    kafka: KafkaSpec
    source: SourceSpec
    dedup: DedupSpec = section(DedupSpec)
    processing: ProcessingSpec | None = Field(None, description="omit for a dedup-only pipeline")
    sink: SinkSpec | None = None
    deletion_policy: Literal["Retain", "Delete"] = Field(
        "Retain", description="Retain keeps the Kafka topics when the pipeline is deleted")
    paused: bool = Field(False, description="stop processing without deleting anything")

    @model_validator(mode="after")
    def _cross_field(self):
        if parse_duration(self.dedup.window) > parse_duration(self.source.retention):
            raise ValueError("dedup.window must not exceed source.retention: "
                             "a state rebuild replays the source over the window")
        if self.processing is not None and self.sink is None:
            raise ValueError("processing needs a sink")
        return self

    @field_validator("source")
    @classmethod
    def _no_retention_override(cls, v: SourceSpec):
        if "retention.ms" in v.config:
            raise ValueError("set source.retention instead of config['retention.ms']")
        return v


# CEL rules the API server enforces; each mirrors a check above (or needs oldSelf).
CEL_RULES = {
    (): [
        {"rule": "!has(self.dedup) || !has(self.dedup.window) || !has(self.source.retention) || "
                 "duration(self.dedup.window) <= duration(self.source.retention)",
         "message": "dedup.window must not exceed source.retention"},
        {"rule": "!has(self.processing) || has(self.sink)", "message": "processing needs a sink"},
    ],
    ("source",): [
        {"rule": "!('retention.ms' in self.config)",
         "message": "set source.retention instead of config['retention.ms']"},
    ],
    ("source", "partitions"): [
        {"rule": "self >= oldSelf",
         "message": "source.partitions may not decrease (Kafka cannot remove partitions)"},
    ],
    ("source", "topic"): [{"rule": "self == oldSelf", "message": "source.topic is immutable"}],
    ("source", "partitioner"): [{"rule": "self == oldSelf", "message": "source.partitioner is immutable"}],
    ("dedup", "key"): [
        {"rule": "!has(self.from) || self.from == 'recordKey' || has(self.name)",
         "message": "dedup.key.name is required when from is header or jsonField"},
    ],
    ("sink",): [
        {"rule": "has(self.kafka) != has(self.files)", "message": "sink needs exactly one of kafka or files"},
    ],
}
