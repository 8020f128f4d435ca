"""The spec model rejects bad input with clear messages, and the CRD in crds/ is generated from it."""

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from eopipe.control import crd
from eopipe.core.durations import parse_duration
from eopipe.core.spec import PipelineSpec

ROOT = Path(__file__).resolve().parents[2]


def _spec(**over):
    base = {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": "t", "partitions": 3}}
    for path, value in over.items():
        node = base
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return base


def test_crd_file_is_generated_from_the_model():
    from eopipe.control import docgen

    docgen.render()  # rendering other documents from the model must not change it
    committed = (ROOT / "crds" / "exactlyoncepipelines.eopipe.dev.yaml").read_text()
    assert committed == crd.render(), "crds/ is stale: run `eopipe crd > crds/exactlyoncepipelines.eopipe.dev.yaml`"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(example):
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    assert docs
    for doc in docs:
        if doc.get("kind") == "ExactlyOncePipeline":
            PipelineSpec.model_validate(doc["spec"])


def test_defaults():
    s = PipelineSpec.model_validate(_spec())
    assert (s.dedup.window, s.dedup.replicas, s.source.partitioner) == ("24h", 1, "murmur2")
    assert str(s.dedup.key.key_spec()) == "key" and s.deletion_policy == "Retain"


@pytest.mark.parametrize("over, message", [
    ({"source.partitions": 0}, "greater than or equal to 1"),
    ({"source.topic": "bad topic!"}, "pattern"),
    ({"dedup.window": "2d"}, "pattern"),
    ({"dedup.window": "200h"}, "dedup.window must not exceed source.retention"),
    ({"dedup.window": "0s"}, "dedup.window must be above 0: a zero window catches no duplicate"),
    ({"dedup.window": "0h0m0.0s"}, "dedup.window must be above 0"),
    ({"dedup.key": {"from": "jsonField"}}, "dedup.key.name is required"),
    ({"dedup.replicas": "two"}, "valid integer"),
    ({"dedup.replicas": 1000}, "dedup.replicas must not exceed source.partitions"),
    ({"sink": {}}, "exactly one of kafka or files"),
    ({"processing": {"checkpoint": {"pvc": {}}}}, "processing needs a sink"),
    ({"source.config": {"retention.ms": "1"}}, "set source.retention instead"),
    ({"surprise": 1}, "Extra inputs are not permitted"),
])
def test_rejects(over, message):
    with pytest.raises(ValidationError, match=message):
        PipelineSpec.model_validate(_spec(**over))


def test_the_smallest_window_is_accepted():
    assert PipelineSpec.model_validate(_spec(**{"dedup.window": "1ms"})).dedup.window == "1ms"


def test_parse_duration():
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    with pytest.raises(ValueError, match="Go duration syntax"):
        parse_duration("1 day")


def test_crd_stores_v1beta1_and_serves_v1alpha1_deprecated_with_the_same_schema():
    """Conversion strategy None is right only while every served version has the same schema:
    the API server then converts by rewriting apiVersion alone."""
    c = crd.crd()
    versions = {v["name"]: v for v in c["spec"]["versions"]}
    assert c["spec"]["conversion"] == {"strategy": "None"}
    assert [(n, v["served"], v["storage"], v.get("deprecated", False)) for n, v in versions.items()] == \
        [("v1beta1", True, True, False), ("v1alpha1", True, False, True)]
    assert "use eopipe.dev/v1beta1" in versions["v1alpha1"]["deprecationWarning"]
    same = {k: v for k, v in versions["v1alpha1"].items() if k not in ("name", "storage", "deprecated",
                                                                      "deprecationWarning")}
    assert same == {k: v for k, v in versions["v1beta1"].items() if k not in ("name", "storage")}


def test_crd_schema_is_structural():
    def walk(node, path="spec"):
        assert "$ref" not in node and "anyOf" not in node, path
        assert node.get("additionalProperties", {}) is not False, path
        if "properties" in node:
            assert node.get("type") == "object", path
            for k, v in node["properties"].items():
                walk(v, f"{path}.{k}")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + "[*]")
    schema = crd.spec_schema()
    walk(schema)
    assert schema["properties"]["source"]["properties"]["partitions"]["x-kubernetes-validations"][0]["rule"] == "self >= oldSelf"


def test_the_name_budget_is_the_tightest_derived_name():
    from eopipe.core import names as n

    longest = n.Names("team-a", "p" * n.MAX_PIPELINE_NAME, PipelineSpec.model_validate(_spec()))
    # The StatefulSet's pods are labelled controller-revision-hash=<statefulset>-<hash>.
    assert len(f"{longest.dedup}-") + n.REVISION_HASH_MAX == n.LABEL_VALUE_MAX
    # Every other derived name fits with room to spare.
    assert len(f"{longest.dedup}-999") <= 63 and len(f"{longest.spark_app}-ui-svc") <= 63
    assert len(longest.assignment_configmap) <= 253


def test_the_crd_checks_the_name_at_its_root():
    """Only a rule at the root of openAPIV3Schema may read metadata.name; the committed CRD has it."""
    from eopipe.core.manifest import ROOT_RULES
    from eopipe.core.names import MAX_PIPELINE_NAME

    committed = yaml.safe_load((ROOT / "crds" / "exactlyoncepipelines.eopipe.dev.yaml").read_text())
    root = committed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = root["x-kubernetes-validations"]
    assert rules == ROOT_RULES
    assert rules[0]["rule"] == f"self.metadata.name.size() <= {MAX_PIPELINE_NAME}"
    assert f"at most {MAX_PIPELINE_NAME} characters" in rules[0]["message"]
    assert "x-kubernetes-validations" not in root["properties"]["metadata"]


def test_fields_that_cannot_change_have_transition_rules():
    from eopipe.core.spec import IMMUTABLE

    schema = crd.spec_schema()
    for path, message in IMMUTABLE.items():
        node = schema
        for name in path:
            node = node["properties"][name]
        assert {"rule": "self == oldSelf", "message": message} in node["x-kubernetes-validations"], path
    assert {("source", "topic"), ("source", "partitioner"), ("dedup", "key")} <= set(IMMUTABLE)


@pytest.mark.parametrize("over", [
    {"dedup.window": "200h"},
    {"dedup.window": "0s"},
    {"dedup.key": {"from": "jsonField"}},
    {"dedup.key": {"from": "header"}},
    {"dedup.key": {"from": "header", "path": ["a"]}},
    {"dedup.key": {"from": "jsonField", "name": "a", "path": ["a"]}},
    {"dedup.key": {"from": "jsonField", "name": "user..id"}},
    {"dedup.key": {"from": "jsonField", "name": ".id"}},
    {"sink": {}},
    {"processing": {"checkpoint": {"pvc": {}}}},
    {"source.config": {"retention.ms": "1"}},
])
def test_the_models_messages_are_the_cel_rules(over):
    """What `eopipe validate` and the operator say is what the API server says."""
    from eopipe.core.spec import CEL_RULES

    with pytest.raises(ValidationError) as e:
        PipelineSpec.model_validate(_spec(**over))
    (err,) = e.value.errors()
    messages = {(".".join(path), r["message"]) for path, rules in CEL_RULES.items() for r in rules}
    assert (".".join(err["loc"]), str(err["ctx"]["error"])) in messages


# -- spec.processing: the Spark stage's checkpoint on durable storage, the file sink on shared storage
_PVC = {"pvc": {}}
_RWX = {"pvc": {"accessMode": "ReadWriteMany"}}
_KAFKA_SINK = {"kafka": {"topic": "out"}}


def _processing(processing: dict, sink: dict | None = None) -> dict:
    return _spec(processing=processing, sink=sink or _KAFKA_SINK)


@pytest.mark.parametrize("processing, sink, message", [
    ({}, None, "processing.checkpoint is required: set checkpoint.uri"),
    ({"checkpointLocation": "/var/lib/eopipe/checkpoints/p", "checkpoint": _PVC}, None,
     "processing.checkpointLocation was removed: set processing.checkpoint.uri"),
    ({"checkpoint": _PVC, "driverMemory": "2g"}, None, "processing.driverMemory was removed: set processing.driver"),
    ({"checkpoint": {}}, None, "exactly one of uri or pvc"),
    ({"checkpoint": {"uri": "s3a://b/c", **_PVC}}, None, "exactly one of uri or pvc"),
    ({"checkpoint": {"uri": "file:///tmp/c"}}, None, "should match"),  # a local URI is not durable
    ({"checkpoint": {"uri": "/var/lib/c"}}, None, "should match"),
    ({"checkpoint": {"pvc": {"accessMode": "ReadOnlyMany"}}}, None, "literal_error|Input should be"),
    ({"checkpoint": {"pvc": {"mountPath": "relative"}}}, None, "should match"),
    ({"checkpoint": _PVC}, {"files": {"path": "/var/lib/eopipe/out"}}, "storage the driver and every executor share"),
    ({"checkpoint": {"uri": "s3a://b/c"}}, {"files": {"path": "/var/lib/eopipe/out"}}, "every executor share"),
    ({"checkpoint": _RWX}, {"files": {"path": "/elsewhere/out"}}, "every executor share"),  # not on the claim
    ({"checkpoint": _RWX, "outputMode": "update"}, {"files": {"path": "/var/lib/eopipe/out"}}, "append only"),
    ({"checkpoint": _PVC, "watermark": {"column": "ts", "delay": "10 seconds"}}, None, "stateful query"),
    ({"checkpoint": _PVC, "outputMode": "complete"}, None, "stateful query"),
    ({"checkpoint": _RWX, "watermark": {"column": "ts", "delay": "soon"}}, None, "should match"),
    ({"checkpoint": _PVC, "env": [{"name": "EOPIPE_KAFKA_ACKS", "value": "0"}]}, None, "may not set EOPIPE_KAFKA_"),
    ({"checkpoint": _PVC, "env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {}}}]}, None,
     "either value or valueFrom"),
    ({"checkpoint": _PVC, "transform": "not a function"}, None, "should match"),
])
def test_processing_rejects(processing, sink, message):
    with pytest.raises(ValidationError, match=message):
        PipelineSpec.model_validate(_processing(processing, sink))


@pytest.mark.parametrize("processing, sink, location", [
    ({"checkpoint": _PVC}, None, "/var/lib/eopipe/checkpoints/p"),
    ({"checkpoint": {"pvc": {"claimName": "mine", "mountPath": "/data"}}}, None, "/data/checkpoints/p"),
    ({"checkpoint": {"uri": "s3a://bucket/ck/p"}}, {"files": {"path": "s3a://bucket/out/p"}}, "s3a://bucket/ck/p"),
    ({"checkpoint": {"uri": "gs://b/ck"}, "watermark": {"column": "ts", "delay": "1 minute"},
      "outputMode": "update"}, None, "gs://b/ck"),
    ({"checkpoint": _RWX}, {"files": {"path": "/var/lib/eopipe/output/p"}}, "/var/lib/eopipe/checkpoints/p"),
    ({"checkpoint": {"uri": "hdfs://nn:8020/ck"}}, {"files": {"path": "abfss://c@a.dfs.core.windows.net/o"}},
     "hdfs://nn:8020/ck"),
])
def test_processing_accepts_durable_checkpoints(processing, sink, location):
    spec = PipelineSpec.model_validate(_processing(processing, sink))
    assert spec.processing.checkpoint.location("p") == location


@pytest.mark.parametrize("processing, sink", [
    ({}, None),
    ({"checkpointLocation": "/cp", "checkpoint": _PVC}, None),
    ({"checkpoint": {"uri": "s3a://b/c", **_PVC}}, None),
    ({"checkpoint": _PVC}, {"files": {"path": "/var/lib/eopipe/out"}}),
    ({"checkpoint": _RWX, "outputMode": "update"}, {"files": {"path": "/var/lib/eopipe/out"}}),
    ({"checkpoint": _PVC, "watermark": {"column": "ts", "delay": "10 seconds"}}, None),
    ({"checkpoint": _PVC, "env": [{"name": "EOPIPE_KAFKA_ACKS", "value": "0"}]}, None),
])
def test_the_processing_messages_are_the_cel_rules(processing, sink):
    from eopipe.core.spec import CEL_RULES

    with pytest.raises(ValidationError) as e:
        PipelineSpec.model_validate(_processing(processing, sink))
    (err,) = e.value.errors()
    messages = {(".".join(path), r["message"]) for path, rules in CEL_RULES.items() for r in rules}
    assert (".".join(err["loc"]), str(err["ctx"]["error"])) in messages


@pytest.mark.parametrize("key, text, path", [
    ({"from": "jsonField", "name": "id"}, "json:id", ("id",)),
    ({"from": "jsonField", "name": "user.id"}, "json:user.id", ("user", "id")),
    ({"from": "jsonField", "path": ["a.b", "c"]}, 'json:["a.b", "c"]', ("a.b", "c")),
    ({"from": "jsonField", "name": "[x"}, 'json:["[x"]', ("[x",)),  # a name is never the text's list form
    ({"from": "header", "name": "trace.id"}, "header:trace.id", ()),  # a header's name is one name
])
def test_the_key_the_worker_is_given(key, text, path):
    """The operator passes str(key_spec()) as the worker's --key; it reads back as the same key."""
    from eopipe.core.keys import KeySpec

    spec = PipelineSpec.model_validate(_spec(**{"dedup.key": key})).dedup.key.key_spec()
    assert (str(spec), spec.path) == (text, path)
    assert KeySpec.parse(text) == spec
