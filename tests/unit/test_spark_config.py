"""spark_app's configuration: parsing, every problem listed, the operator's config accepted (no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_app import config as sconfig
from tests.helpers.pipelines import example_names

REPO = Path(__file__).resolve().parents[2]


def _base_config(**over) -> dict:
    doc = {"pipeline": "payments", "namespace": "team-a", "bootstrap": "k:9092",
           "source_topic": "payments.deduped", "sql": "SELECT * FROM events", "trigger": "1s",
           "checkpoint_location": "/ckpt/payments",
           "sink": {"kind": "kafka", "topic": "payments-out",
                    "commit_topic": "eopipe.team-a.payments.spark-commits"}}
    doc.update(over)
    return doc



def test_config_defaults_and_derived_values():
    cfg = sconfig.parse(_base_config(trigger="1m30s"), environ={})
    assert cfg.sql == "SELECT * FROM events" and cfg.output_mode == "append"
    assert cfg.schema == sconfig.DEFAULT_SCHEMA and cfg.starting_offsets == "earliest"
    assert cfg.trigger_ms == 90_000
    assert cfg.transactional_id_prefix == "eopipe.team-a.payments.spark"
    assert isinstance(cfg.sink, sconfig.KafkaSink) and cfg.sink.commit_topic.endswith("spark-commits")
    assert sconfig.parse(_base_config(trigger="availableNow"), environ={}).trigger_ms is None


@pytest.mark.parametrize("text,ms", [("1s", 1000), ("250ms", 250), ("1m30s", 90_000),
                                     ("1.5s", 1500), ("2h", 7_200_000)])
def test_go_durations(text, ms):
    assert sconfig.parse_go_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1", "s", "1 s", "1d", "1s2", "-1s"])
def test_bad_go_durations(text):
    with pytest.raises(ValueError):
        sconfig.parse_go_duration_ms(text)


def test_config_lists_every_problem():
    doc = _base_config(trigger="soon", output_mode="sometimes", bogus=1,
                       sink={"kind": "kafka", "topic": "same", "commit_topic": "same"},
                       watermark={"column": "timestamp", "delay": "ten"},
                       max_offsets_per_trigger=0, transform="not a hook")
    del doc["bootstrap"]
    with pytest.raises(sconfig.ConfigError) as e:
        sconfig.parse(doc, environ={})
    text = str(e.value)
    for needle in ("bootstrap: required", "trigger:", "output_mode:", "unknown key(s) bogus",
                   "topic and commit_topic must differ", "watermark.delay", "max_offsets_per_trigger",
                   "transform:"):
        assert needle in text, (needle, text)
    assert len(e.value.problems) >= 8


@pytest.mark.parametrize("sink,needle", [
    ({"kind": "s3"}, "sink.kind"),
    ({"kind": "files", "format": "csv"}, "sink.path: required"),
    ({"kind": "files", "path": "/out", "format": "csv"}, "sink.format"),
    ({"kind": "kafka", "topic": "payments.deduped", "commit_topic": "c"}, "must differ from source_topic"),
    ({"kind": "kafka", "topic": "bad topic!", "commit_topic": "c"}, "sink.topic"),
])
def test_config_sink_errors(sink, needle):
    with pytest.raises(sconfig.ConfigError, match="sink") as e:
        sconfig.parse(_base_config(sink=sink), environ={})
    assert needle in str(e.value)


def test_files_sink_is_append_only():
    with pytest.raises(sconfig.ConfigError, match="append only"):
        sconfig.parse(_base_config(output_mode="update", sink={"kind": "files", "path": "/out"}), environ={})


def test_kafka_settings_from_env_and_java_translation():
    env = {"EOPIPE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "EOPIPE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "EOPIPE_KAFKA_SASL_USERNAME": "alice", "EOPIPE_KAFKA_SASL_PASSWORD": 'p"w',
           "EOPIPE_KAFKA_SSL_CA_PEM": "PEM", "OTHER": "x"}
    cfg = sconfig.parse(_base_config(kafka={"client.id": "x"}), environ=env)
    assert cfg.kafka_client_config()["sasl.username"] == "alice"
    assert cfg.kafka_client_config()["bootstrap.servers"] == "k:9092"
    from spark_app.main import java_kafka_options

    java = java_kafka_options(cfg)
    assert java["kafka.security.protocol"] == "SASL_SSL" and java["kafka.client.id"] == "x"
    assert java["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule '
                                              'required username="alice" password="p\\"w";')
    assert java["kafka.ssl.truststore.type"] == "PEM" and java["kafka.ssl.truststore.certificates"] == "PEM"
    assert "kafka.sasl.username" not in java
    with pytest.raises(sconfig.ConfigError, match="isolation.level"):
        sconfig.parse(_base_config(kafka={"isolation.level": "read_uncommitted"}), environ={})


def test_the_operators_config_is_accepted():
    """What operator/eopipe/control/builders/spark.py passes is what spark_app accepts."""
    from eopipe.control.builders import spark

    app = spark.spark_application(example_names(), "img")
    args = app["spec"]["arguments"]
    assert args[0] == "--config-json"
    cfg = sconfig.load(config_json=args[1], environ={})
    assert cfg.source_topic == "team-a.payments.deduped" and cfg.sink.kind == "kafka"
    assert app["spec"]["mainApplicationFile"].endswith("/spark_app/main.py")
    assert (REPO / app["spec"]["mainApplicationFile"][len("local:///opt/eopipe/"):]).exists()


def test_bad_config_exits_2_with_reasons(tmp_path):
    log = tmp_path / "termination-log"  # the container's /dev/termination-log
    res = subprocess.run([sys.executable, "-m", "spark_app.main", "--config-json",
                          json.dumps(_base_config(trigger="later"))],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={**os.environ, "EOPIPE_TERMINATION_LOG": str(log)})
    assert res.returncode == 2, res.stderr
    assert "invalid spark_app config" in res.stderr and "trigger" in res.stderr
    assert log.read_text() == res.stderr.strip()  # what the driver pod's status will show
    res = subprocess.run([sys.executable, "-m", "spark_app.main", "--config", str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 2 and "nope.json" in res.stderr
    res = subprocess.run([sys.executable, "-m", "spark_app.main", "--config-json", "{not json"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 2 and "not valid JSON" in res.stderr


@pytest.mark.parametrize("processing, expect", [
    # spec.processing (over payments.yaml's) -> what spark_app's Config holds
    ({}, {"schema": "id STRING, seq BIGINT, account STRING, amount_cents BIGINT, currency STRING, ts BIGINT",
          "checkpoint_location": "/var/lib/eopipe/checkpoints/payments", "output_mode": "append", "watermark": None}),
    ({"schema": "page STRING, user STRUCT<id: STRING>", "checkpoint": {"uri": "gs://b/ck"},
      "watermark": {"column": "timestamp", "delay": "30 seconds"}, "outputMode": "update"},
     {"schema": "page STRING, user STRUCT<id: STRING>", "checkpoint_location": "gs://b/ck", "output_mode": "update",
      "watermark": sconfig.Watermark("timestamp", "30 seconds")}),
    ({"transform": "pkg.mod:fn", "maxOffsetsPerTrigger": 100},
     {"transform": "pkg.mod:fn", "max_offsets_per_trigger": 100}),
])
def test_every_processing_setting_is_one_spark_app_accepts(processing, expect):
    from eopipe.control.builders import spark
    from eopipe.core.names import Names
    from eopipe.core.spec import PipelineSpec

    base = example_names()
    raw = base.spec.model_dump(by_alias=True, exclude_none=True)
    raw["processing"].update(processing)
    names = Names(base.namespace, base.pipeline, PipelineSpec.model_validate(raw))
    cfg = sconfig.parse(spark.spark_config(names), environ={})
    assert {k: getattr(cfg, k) for k in expect} == expect
