"""The Spark job's configuration: typed, validated in one place, with errors a human can act on.

The operator passes one JSON document (operator/eopipe/control/builders/spark.py `spark_config`) as
`--config-json '...'`, or it is mounted as a file (`--config FILE`). Everything is checked
before Spark starts; a bad config exits with status 2 and one line per problem (main.py adds
what Spark cannot analyse), so a broken manifest shows up as phase Failed on the pipeline
with a readable message, never as a stack trace from the middle of Spark.

Keys (required unless a default is given):
  pipeline, namespace        names; they make the transactional ids and the consumer ids
  bootstrap                  Kafka bootstrap servers
  source_topic               the deduped topic (read with read_committed)
  sql                        Spark SQL over the view `events` (default: SELECT * FROM events)
  trigger                    Go duration ("1s", "500ms", "1m30s") or "availableNow"
  checkpoint_location        durable path or URI (PVC path, s3a://, hdfs://, file://)
  sink                       {"kind": "kafka", "topic": T, "commit_topic": C}
                             | {"kind": "files", "path": P, "format": "parquet"|"json"}
  schema                     DDL of the JSON record value (default: eopipe load's events)
  watermark                  {"column": "timestamp", "delay": "10 seconds"} (optional)
  output_mode                append (default) | update | complete (files: append only)
  transform                  "module:function", DataFrame -> DataFrame, applied after sql
  starting_offsets           earliest (default) | latest; used only without a checkpoint
  upgrade_mode               keepCheckpoint (default) | fromSink | reprocess: how a query with
                             no checkpoint starts and what a refused one says (upgrade.py)
  max_offsets_per_trigger    optional bound of a micro-batch
  kafka                      extra Kafka client settings (librdkafka/Java names, e.g.
                             security.protocol, sasl.mechanism); EOPIPE_KAFKA_* variables
                             of the driver's environment are added (secrets come that way)
  spark_conf                 extra Spark settings applied when the session is built
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# The value of `eopipe load`'s events (operator/eopipe/tools/loadgen.py). Records that do not parse
# get nulls in these columns; key/partition/offset/timestamp are always there.
DEFAULT_SCHEMA = "id STRING, seq BIGINT, account STRING, amount_cents BIGINT, currency STRING, ts BIGINT"
# Kafka metadata columns of the `events` view, next to the parsed JSON fields.
META_COLUMNS = ("key", "partition", "offset", "timestamp")

KAFKA_ENV_PREFIX = "EOPIPE_KAFKA_"
UPGRADE_MODES = ("keepCheckpoint", "fromSink", "reprocess")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_INTERVAL = re.compile(r"^[0-9]+(\.[0-9]+)? *(millisecond|second|minute|hour|day)s?$", re.I)


class ConfigError(ValueError):
    """A bad configuration; `problems` lists every problem found, not just the first."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid spark_app config:\n" + "\n".join(f"  - {p}" for p in self.problems))


def parse_go_duration_ms(text: str) -> int:
    """'1s' -> 1000, '1m30s' -> 90000, '250ms' -> 250 (the CRD's duration pattern)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a duration: {text!r}")
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_MS[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 1s, 1m30s)")
    return int(round(total))


@dataclass(frozen=True)
class KafkaSink:
    topic: str
    commit_topic: str
    kind: str = "kafka"


@dataclass(frozen=True)
class FileSink:
    path: str
    format: str = "parquet"
    kind: str = "files"


@dataclass(frozen=True)
class Watermark:
    column: str
    delay: str


@dataclass(frozen=True)
class Config:
    pipeline: str
    namespace: str
    bootstrap: str
    source_topic: str
    checkpoint_location: str
    sink: KafkaSink | FileSink
    sql: str = "SELECT * FROM events"
    trigger: str = "1s"
    schema: str = DEFAULT_SCHEMA
    watermark: Watermark | None = None
    output_mode: str = "append"
    transform: str | None = None
    starting_offsets: str = "earliest"
    upgrade_mode: str = "keepCheckpoint"
    max_offsets_per_trigger: int | None = None
    kafka: dict[str, str] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)

    @property
    def trigger_ms(self) -> int | None:
        """Processing-time interval in ms; None for availableNow (run what is there, then stop)."""
        return None if self.trigger == "availableNow" else parse_go_duration_ms(self.trigger)

    @property
    def transactional_id_prefix(self) -> str:
        # One transactional.id per (pipeline, task): eopipe.<namespace>.<pipeline>.spark.<task>
        return f"eopipe.{self.namespace}.{self.pipeline}.spark"

    def kafka_client_config(self) -> dict[str, str]:
        """Settings for every Kafka client of the job (librdkafka names == Java names here)."""
        return {"bootstrap.servers": self.bootstrap, **self.kafka}


_KNOWN = {"pipeline", "namespace", "bootstrap", "source_topic", "sql", "trigger",
          "checkpoint_location", "sink", "schema", "watermark", "output_mode", "transform",
          "starting_offsets", "max_offsets_per_trigger", "kafka", "spark_conf", "upgrade_mode"}


def parse(doc: object, environ: dict[str, str] | None = None) -> Config:
    """Validates a decoded JSON document; raises ConfigError listing every problem."""
    environ = os.environ if environ is None else environ
    if not isinstance(doc, dict):
        raise ConfigError([f"the config must be a JSON object, got {type(doc).__name__}"])
    problems: list[str] = []

    unknown = sorted(set(doc) - _KNOWN)
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")

    def text(key: str, default: str | None = None, pattern: re.Pattern | None = None,
             what: str = "") -> str | None:
        if key not in doc or doc[key] is None:
            if default is None:
                problems.append(f"{key}: required")
            return default
        v = doc[key]
        if not isinstance(v, str) or not v.strip():
            problems.append(f"{key}: must be a non-empty string, got {v!r}")
            return default
        if pattern is not None and not pattern.match(v):
            problems.append(f"{key}: {v!r} is not {what}")
        return v

    pipeline = text("pipeline", pattern=_NAME, what="a DNS-1123 name")
    namespace = text("namespace", pattern=_NAME, what="a DNS-1123 name")
    bootstrap = text("bootstrap")
    source_topic = text("source_topic", pattern=_TOPIC, what="a Kafka topic name")
    sql = text("sql", "SELECT * FROM events")
    checkpoint = text("checkpoint_location")
    schema = text("schema", DEFAULT_SCHEMA)
    trigger = text("trigger", "1s")
    if trigger and trigger != "availableNow":
        try:
            if parse_go_duration_ms(trigger) <= 0:
                problems.append(f"trigger: {trigger!r} must be longer than zero")
        except ValueError as e:
            problems.append(f"trigger: {e}")
    output_mode = text("output_mode", "append")
    if output_mode not in ("append", "update", "complete"):
        problems.append(f"output_mode: {output_mode!r} is not one of append, update, complete")
    starting = text("starting_offsets", "earliest")
    if starting not in ("earliest", "latest"):
        problems.append(f"starting_offsets: {starting!r} is not earliest or latest")
    upgrade_mode = text("upgrade_mode", "keepCheckpoint")
    if upgrade_mode not in UPGRADE_MODES:
        problems.append(f"upgrade_mode: {upgrade_mode!r} is not one of {', '.join(UPGRADE_MODES)}")
    transform = doc.get("transform")
    if transform is not None and (not isinstance(transform, str)
                                  or not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", transform)):
        problems.append(f"transform: {transform!r} is not 'package.module:function'")

    mopt = doc.get("max_offsets_per_trigger")
    if mopt is not None and (not isinstance(mopt, int) or isinstance(mopt, bool) or mopt <= 0):
        problems.append(f"max_offsets_per_trigger: must be a positive integer, got {mopt!r}")

    def string_map(key: str) -> dict[str, str]:
        v = doc.get(key) or {}
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            problems.append(f"{key}: must be an object of settings")
            return {}
        return {k: str(x).lower() if isinstance(x, bool) else str(x) for k, x in v.items()}

    kafka = string_map("kafka")
    kafka.update({k[len(KAFKA_ENV_PREFIX):].lower().replace("_", "."): v
                  for k, v in environ.items() if k.startswith(KAFKA_ENV_PREFIX)})
    for bad in ("bootstrap.servers", "isolation.level", "transactional.id", "enable.idempotence"):
        if bad in kafka:
            problems.append(f"kafka: {bad} is set by spark_app itself and may not be overridden")
    spark_conf = string_map("spark_conf")

    watermark = None
    wm = doc.get("watermark")
    if wm is not None:
        if not isinstance(wm, dict) or set(wm) - {"column", "delay"}:
            problems.append('watermark: must be {"column": ..., "delay": "10 seconds"}')
        else:
            col, delay = wm.get("column", "timestamp"), wm.get("delay")
            if not isinstance(col, str) or not col:
                problems.append(f"watermark.column: must be a column name, got {col!r}")
            if not isinstance(delay, str) or not _INTERVAL.match(delay.strip()):
                problems.append(f"watermark.delay: {delay!r} is not an interval like '10 seconds'")
            else:
                watermark = Watermark(col, delay.strip())

    sink = None
    s = doc.get("sink")
    if not isinstance(s, dict):
        problems.append('sink: required, {"kind": "kafka", "topic": ..., "commit_topic": ...} '
                        'or {"kind": "files", "path": ..., "format": "parquet"}')
    elif s.get("kind") == "kafka":
        extra = set(s) - {"kind", "topic", "commit_topic"}
        topic, commit = s.get("topic"), s.get("commit_topic")
        for k, v in (("topic", topic), ("commit_topic", commit)):
            if not isinstance(v, str) or not _TOPIC.match(v):
                problems.append(f"sink.{k}: {v!r} is not a Kafka topic name")
        if extra:
            problems.append(f"sink: unknown key(s) {', '.join(sorted(extra))} for a kafka sink")
        if topic and topic == commit:
            problems.append("sink: topic and commit_topic must differ")
        if topic and topic == source_topic:
            problems.append("sink.topic: must differ from source_topic (the job would read its own output)")
        sink = KafkaSink(topic, commit)
    elif s.get("kind") == "files":
        extra = set(s) - {"kind", "path", "format"}
        path, fmt = s.get("path"), s.get("format", "parquet")
        if not isinstance(path, str) or not path.strip():
            problems.append("sink.path: required for a files sink")
        if fmt not in ("parquet", "json"):
            problems.append(f"sink.format: {fmt!r} is not parquet or json")
        if extra:
            problems.append(f"sink: unknown key(s) {', '.join(sorted(extra))} for a files sink")
        if output_mode and output_mode != "append":
            problems.append(f"output_mode: the files sink supports append only, not {output_mode!r}")
        sink = FileSink(path, fmt)
    else:
        problems.append(f"sink.kind: {s.get('kind')!r} is not kafka or files")

    if checkpoint and isinstance(sink, FileSink) and sink.path and \
            checkpoint.rstrip("/") == sink.path.rstrip("/"):
        problems.append("checkpoint_location: must differ from sink.path")

    if problems:
        raise ConfigError(problems)
    return Config(pipeline=pipeline, namespace=namespace, bootstrap=bootstrap,
                  source_topic=source_topic, checkpoint_location=checkpoint, sink=sink, sql=sql,
                  trigger=trigger, schema=schema, watermark=watermark, output_mode=output_mode,
                  transform=transform, starting_offsets=starting, upgrade_mode=upgrade_mode,
                  max_offsets_per_trigger=mopt, kafka=kafka, spark_conf=spark_conf)


def load(config_json: str | None = None, config_file: str | None = None,
         environ: dict[str, str] | None = None) -> Config:
    """From `--config-json` or `--config FILE` (exactly one)."""
    if (config_json is None) == (config_file is None):
        raise ConfigError(["give exactly one of --config-json or --config FILE"])
    if config_file is not None:
        try:
            config_json = Path(config_file).read_text()
        except OSError as e:
            raise ConfigError([f"--config {config_file}: {e.strerror or e}"]) from None
    try:
        doc = json.loads(config_json)
    except json.JSONDecodeError as e:
        raise ConfigError([f"not valid JSON: {e}"]) from None
    return parse(doc, environ)
