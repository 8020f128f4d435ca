"""The Spark stage's part of the spec (`spec.processing`): query, schema, durable checkpoint and
what is passed through to the SparkApplication.

A Spark checkpoint is the query's memory (offsets, commits, state); the exactly-once sinks rest
on it. A path in the driver container is lost with the driver pod, so the spec only takes a
checkpoint on durable storage: a remote URI, or a PersistentVolumeClaim mounted in the driver.
A file sink's output is written by the executors, so it needs storage they all see.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import Field, model_validator

from eopipe.core.specbase import Duration, EnvVar, KubeObject, Model, Quantity, SparkMemory, section

REMOTE_SCHEMES = ("s3a", "gs", "abfs", "abfss", "hdfs")
REMOTE_URI_PATTERN = r"^(" + "|".join(REMOTE_SCHEMES) + r")://[^/\s]+(/\S*)?$"
DEFAULT_MOUNT_PATH = "/var/lib/eopipe"
# Spark's interval strings, as spark_app's config takes a watermark delay.
INTERVAL_PATTERN = r"^[0-9]+(\.[0-9]+)? *(millisecond|second|minute|hour|day)s?$"
TRANSFORM_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
OPERATOR_ENV_PREFIX = "EOPIPE_KAFKA_"  # spark_app reads the Kafka settings the operator sets there

_KINDS = "checkpoint.uri (" + ", ".join(f"{s}://" for s in REMOTE_SCHEMES) + \
    ") or checkpoint.pvc (a claim the operator creates, or claimName of an existing one)"
# What the API server says when a rule fails; the checks below raise the same text.
CHECKPOINT_MESSAGE = ("processing.checkpoint is required: set " + _KINDS + "; a path in the driver container "
                      "is lost when the driver pod is replaced, and with it the exactly-once guarantee")
CHECKPOINT_KIND_MESSAGE = "processing.checkpoint needs exactly one of uri or pvc"
REMOVED = {
    "checkpointLocation": "processing.checkpointLocation was removed: set processing." + _KINDS,
    "driverMemory": "processing.driverMemory was removed: set processing.driver.memory",
}
ENV_MESSAGE = (f"processing.env may not set {OPERATOR_ENV_PREFIX}*: the operator sets them "
               "(Kafka settings come from spec.kafka)")
ENV_VALUE_MESSAGE = "processing.env: an entry has either value or valueFrom, not both"
FILE_SINK_SHARED_MESSAGE = (
    "sink.files.path must be on storage the driver and every executor share: a remote URI ("
    + ", ".join(f"{s}://" for s in REMOTE_SCHEMES) + ") or a path under processing.checkpoint.pvc.mountPath "
    "with processing.checkpoint.pvc.accessMode ReadWriteMany")
FILE_SINK_MODE_MESSAGE = "the files sink supports processing.outputMode append only"
STATEFUL_MESSAGE = ("processing.watermark or outputMode update/complete make a stateful query, whose executors "
                    "write its state into the checkpoint: set checkpoint.uri, or checkpoint.pvc with accessMode "
                    "ReadWriteMany")


class CheckpointClaim(Model):
    claim_name: str | None = Field(
        None, min_length=1, max_length=253,
        description="an existing PersistentVolumeClaim in the pipeline's namespace, opened to the pipeline "
                    "(annotation eopipe.dev/pipelines, as a Secret); without it the operator "
                    "creates <pipeline>-spark-checkpoint (kept on pipeline deletion with deletionPolicy Retain)")
    size: Quantity = Field("1Gi", description="of the claim the operator creates")
    storage_class_name: str | None = Field(None, min_length=1, max_length=253,
                                           description="of the claim the operator creates; default: the "
                                                       "cluster's default StorageClass")
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        "ReadWriteOnce", description="ReadWriteMany (a shared file system) mounts the claim in the executors too, "
                                     "which a files sink on it needs; for claimName, the claim's own mode")
    mount_path: str = Field(DEFAULT_MOUNT_PATH, pattern=r"^/[^\s]*[^/\s]$", max_length=512,
                            description="where the claim is mounted; the checkpoint is "
                                        "<mountPath>/checkpoints/<pipeline>")


class Checkpoint(Model):
    uri: str | None = Field(None, pattern=REMOTE_URI_PATTERN, max_length=1024,
                            description="a remote directory, passed to Spark as it is; the file system's settings "
                                        "go in hadoopConf, its credentials in env from Secrets")
    pvc: CheckpointClaim | None = Field(None, description="a PersistentVolumeClaim mounted in the driver")

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.uri is None) == (self.pvc is None):
            raise ValueError(CHECKPOINT_KIND_MESSAGE)
        return self

    def location(self, pipeline: str) -> str:
        return self.uri if self.uri is not None else f"{self.pvc.mount_path}/checkpoints/{pipeline}"


class Watermark(Model):
    column: str = Field(min_length=1, max_length=256, description="an event-time column of the view `events`")
    delay: str = Field(pattern=INTERVAL_PATTERN, description="how late a record may be, e.g. '10 seconds'")


class Driver(Model):
    cores: int = Field(1, ge=1, le=64)
    core_request: Quantity | None = Field(
        None, description="CPU the pod asks the scheduler for (Spark's request.cores), e.g. 250m, "
                          "below cores on a small node; default: cores")
    memory: SparkMemory = "1g"
    memory_overhead: SparkMemory | None = Field(None, description="Spark's default: 10% of memory, at least 384m")


class Executors(Model):
    instances: int = Field(1, ge=1, le=1000)
    cores: int = Field(1, ge=1, le=64)
    core_request: Quantity | None = Field(
        None, description="CPU the pod asks the scheduler for (Spark's request.cores), e.g. 250m, "
                          "below cores on a small node; default: cores")
    memory: SparkMemory = "1g"
    memory_overhead: SparkMemory | None = Field(None, description="Spark's default: 10% of memory, at least 384m")


UPGRADE_MODES = ("keepCheckpoint", "fromSink", "reprocess")


class ProcessingSpec(Model):
    image: str | None = Field(None, description="Spark image with spark_app and the Kafka connector")
    sql: str = Field("SELECT * FROM events", min_length=1,
                     description="Spark SQL over the view `events` of the deduped records")
    value_schema: str | None = Field(
        None, alias="schema", min_length=1,
        description="Spark DDL of the JSON record value, e.g. 'page STRING, user STRUCT<id: STRING>, ts "
                    "TIMESTAMP'; its fields are columns of `events` beside key, partition, offset and timestamp. "
                    "Default: the fields of `eopipe load`'s events")
    watermark: Watermark | None = Field(None, description="event-time watermark on `events`, for windows and "
                                                          "stateful SQL")
    output_mode: Literal["append", "update", "complete"] = Field(
        "append", description="Spark's output mode; the files sink takes append only")
    trigger: Duration = "1s"
    max_offsets_per_trigger: int | None = Field(None, ge=1, description="bound of one micro-batch")
    transform: str | None = Field(None, pattern=TRANSFORM_PATTERN,
                                  description="module:function, DataFrame -> DataFrame after the SQL; the module "
                                              "must be in the image (its side effects are not exactly-once)")
    checkpoint: Checkpoint | None = Field(None, description="durable storage of Spark's checkpoint (required)")
    upgrade_mode: Literal[UPGRADE_MODES] = Field(
        "keepCheckpoint",
        description="what a change of sql, schema, watermark, outputMode or transform does with the checkpoint "
                    "(docs/upgrades.md): keepCheckpoint goes on from it where Spark accepts the new query, else "
                    "the pipeline stalls naming fromSink; fromSink starts a new checkpoint where the sink's output "
                    "ends (exact for stateless SQL; stateful operators start empty); reprocess starts a new "
                    "checkpoint at reprocessFrom (not exactly-once with the output already written)")
    reprocess_from: Literal["earliest", "latest"] = Field(
        "earliest", description="where upgradeMode reprocess starts reading the deduped topic")
    checkpoint_location: str | None = Field(None, description="removed: use checkpoint")
    driver_memory: str | None = Field(None, description="removed: use driver.memory")
    driver: Driver = section(Driver)
    executors: Executors = section(Executors)
    service_account: str | None = Field(
        None, min_length=1, max_length=253,
        description="the driver's ServiceAccount, one the tenant policy allows and no other pipeline of the "
                    "namespace runs as; default <pipeline>-spark, which the operator creates with the rights "
                    "Spark needs (its executor pods and their config map)")
    spark_conf: dict[str, str] = Field(default_factory=dict, max_length=256,
                                       description="Spark settings; win over the operator's")
    hadoop_conf: dict[str, str] = Field(default_factory=dict, max_length=256,
                                        description="Hadoop settings (e.g. fs.s3a.endpoint) for the checkpoint "
                                                    "and file sink URIs")
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=64,
                                          description="of the driver and executor pods")
    tolerations: list[KubeObject] = Field(default_factory=list, max_length=64,
                                          description="Kubernetes tolerations of the driver and executor pods")
    affinity: KubeObject | None = Field(None, description="a Kubernetes affinity of the driver and executor pods")
    env: list[EnvVar] = Field(default_factory=list, max_length=64,
                              description="environment of the driver and executors (credentials: valueFrom "
                                          "secretKeyRef)")
    env_from: list[KubeObject] = Field(default_factory=list, max_length=16,
                                       description="Kubernetes EnvFromSources (secretRef, configMapRef) of the "
                                                   "driver and executors")

    @model_validator(mode="after")
    def _durable(self):
        for field, message in (("checkpoint_location", REMOVED["checkpointLocation"]),
                               ("driver_memory", REMOVED["driverMemory"])):
            if getattr(self, field) is not None:
                raise ValueError(message)
        if self.checkpoint is None:
            raise ValueError(CHECKPOINT_MESSAGE)
        if any(e.name.startswith(OPERATOR_ENV_PREFIX) for e in self.env):
            raise ValueError(ENV_MESSAGE)
        if any(e.value is not None and e.value_from is not None for e in self.env):
            raise ValueError(ENV_VALUE_MESSAGE)
        if self.stateful and not self.executors_share_checkpoint:
            raise ValueError(STATEFUL_MESSAGE)
        return self

    @property
    def stateful(self) -> bool:
        """Whether the SQL can only be a stateful query (Spark refuses an aggregation in append
        mode without a watermark); a transform may still add state (docs/design.md, Known limits)."""
        return self.watermark is not None or self.output_mode != "append"

    def query_key(self) -> str:
        """What a checkpoint was started for: the query's definition (and, under reprocess, where
        it reads from); a change of it is what upgradeMode answers. A short digest for status."""
        parts = [self.sql, self.value_schema, self.watermark and self.watermark.model_dump(),
                 self.output_mode, self.transform]
        if self.upgrade_mode == "reprocess":
            parts.append(f"reprocess:{self.reprocess_from}")
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def executors_share_checkpoint(self) -> bool:
        """A remote URI or a ReadWriteMany claim, which the executors mount too."""
        return self.checkpoint.uri is not None or self.checkpoint.pvc.access_mode == "ReadWriteMany"

    def shared_path(self, path: str) -> bool:
        """Whether the driver and every executor see `path` (a files sink's output)."""
        pvc = self.checkpoint.pvc if self.checkpoint is not None else None
        return is_remote(path) or (pvc is not None and pvc.access_mode == "ReadWriteMany"
                                   and path.startswith(pvc.mount_path + "/"))


def is_remote(path: str) -> bool:
    return any(path.startswith(f"{s}://") for s in REMOTE_SCHEMES)


def file_sink_problem(processing: ProcessingSpec | None, path: str | None) -> str | None:
    """The message for a files sink the pipeline cannot write exactly once, else None."""
    if processing is None or path is None:
        return None
    if not processing.shared_path(path):
        return FILE_SINK_SHARED_MESSAGE
    if processing.output_mode != "append":
        return FILE_SINK_MODE_MESSAGE
    return None


# CEL rules the API server enforces; each mirrors a check above.
PROCESSING_CEL_RULES = {
    ("processing",): [
        *({"rule": f"!has(self.{field})", "message": message} for field, message in REMOVED.items()),
        {"rule": "has(self.checkpoint)", "message": CHECKPOINT_MESSAGE},
        {"rule": f"!has(self.env) || self.env.all(e, !e.name.startsWith('{OPERATOR_ENV_PREFIX}'))",
         "message": ENV_MESSAGE},
        {"rule": "!has(self.env) || self.env.all(e, !(has(e.value) && has(e.valueFrom)))",
         "message": ENV_VALUE_MESSAGE},
        {"rule": "!(has(self.watermark) || (has(self.outputMode) && self.outputMode != 'append')) || "
                 "!has(self.checkpoint) || has(self.checkpoint.uri) || "
                 "(has(self.checkpoint.pvc) && self.checkpoint.pvc.accessMode == 'ReadWriteMany')",
         "message": STATEFUL_MESSAGE},
    ],
    ("processing", "checkpoint"): [
        {"rule": "has(self.uri) != has(self.pvc)", "message": CHECKPOINT_KIND_MESSAGE},
    ],
}
_FILES = "has(self.sink) && has(self.sink.files) && has(self.processing)"
_PVC = "has(self.processing.checkpoint) && has(self.processing.checkpoint.pvc)"
# Root rules (they compare spec.sink with spec.processing).
FILE_SINK_RULES = [
    {"rule": f"!({_FILES}) || self.sink.files.path.matches('^({'|'.join(REMOTE_SCHEMES)})://') || ({_PVC} && "
             "self.processing.checkpoint.pvc.accessMode == 'ReadWriteMany' && "
             "self.sink.files.path.startsWith(self.processing.checkpoint.pvc.mountPath + '/'))",
     "message": FILE_SINK_SHARED_MESSAGE},
    {"rule": f"!({_FILES}) || !has(self.processing.outputMode) || self.processing.outputMode == 'append'",
     "message": FILE_SINK_MODE_MESSAGE},
]
