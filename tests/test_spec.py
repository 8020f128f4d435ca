"""The spec model rejects bad input with clear messages, and the CRD in crds/ is generated from it."""

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from eopipe import crd
from eopipe.spec import PipelineSpec, parse_duration

ROOT = Path(__file__).resolve().parents[1]


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
    from eopipe import docgen

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
    assert s.dedup.key.spec_string() == "key" and s.deletion_policy == "Retain"


@pytest.mark.parametrize("over, message", [
    ({"source.partitions": 0}, "greater than or equal to 1"),
    ({"source.topic": "bad topic!"}, "pattern"),
    ({"dedup.window": "2d"}, "pattern"),
    ({"dedup.window": "200h"}, "dedup.window must not exceed source.retention"),
    ({"dedup.key": {"from": "jsonField"}}, "dedup.key.name is required"),
    ({"dedup.replicas": "two"}, "valid integer"),
    ({"sink": {}}, "exactly one of kafka or files"),
    ({"processing": {"checkpointLocation": "/cp"}}, "processing needs a sink"),
    ({"source.config": {"retention.ms": "1"}}, "set source.retention instead"),
    ({"surprise": 1}, "Extra inputs are not permitted"),
])
def test_rejects(over, message):
    with pytest.raises(ValidationError, match=message):
        PipelineSpec.model_validate(_spec(**over))


def test_parse_duration():
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    with pytest.raises(ValueError, match="Go duration syntax"):
        parse_duration("1 day")


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
