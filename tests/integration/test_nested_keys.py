"""A pipeline keyed on a nested JSON field (`dedup.key: {from: jsonField, name: user.id}`): the
worker, given the --key the operator builds from the spec, deduplicates it exactly once, and
`eopipe verify` reads the same key."""

import json

import pytest

from eopipe.control.builders.dedup import worker_args
from eopipe.core.keys import KeySpec
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from eopipe.tools.verify import TopicReader, verify
from tests.helpers.workers import assert_clean

pytestmark = pytest.mark.kafka


def _operator_key(pipe, key: dict) -> str:
    """The --key of the worker command line the operator builds for a pipeline with this key."""
    spec = PipelineSpec.model_validate({"kafka": {"bootstrapServers": pipe.bootstrap},
                                        "source": {"topic": pipe.source, "partitions": pipe.partitions},
                                        "dedup": {"key": key}})
    args = worker_args(Names("test", pipe.name, spec))
    return args[args.index("--key") + 1]


def _verify(pipe, key: str):
    rep = verify(pipe.bootstrap, pipe.source, pipe.output, key_spec=KeySpec.parse(key), dlq_topic=pipe.dlq,
                 settle=5, timeout=300)
    print(rep.line())
    return rep


def test_a_pipeline_keyed_on_user_id_dedups_nested_json_exactly_once(pipe):
    key = _operator_key(pipe, {"from": "jsonField", "name": "user.id"})
    assert key == "json:user.id"
    w = pipe.worker([0, 1, 2], extra=["--key", key]).start().wait_ready()
    stats = pipe.load(3000, dup_ratio=0.3, wrong_partition_ratio=0.1, poison=20, seed=33, id_at=("user.id",))
    pipe.wait_drained()
    assert w.terminate() == 0, w.tail()
    rep = _verify(pipe, key)
    assert_clean(rep, poison=20)  # 0 lost, 0 duplicated, the malformed ones dead-lettered
    assert rep.unique_in == rep.out == stats["unique"] and stats["duplicates"] > 500
    # The records have no top-level id: reading only top-level fields would dead-letter them all.
    values = [json.loads(m.value()) for m in TopicReader(pipe.bootstrap).read(pipe.source) if m.key()]
    assert len(values) >= stats["records"] - 20 and not any("id" in v for v in values)  # + rerouted ones


def test_a_field_with_a_dot_in_its_name_is_named_by_path(pipe):
    """`path: [user.id]` is the top-level field "user.id", not the nested one."""
    from confluent_kafka import Producer

    from eopipe.core.partitioner import murmur2_partition

    key = _operator_key(pipe, {"from": "jsonField", "path": ["user.id"]})
    assert key == 'json:["user.id"]'
    w = pipe.worker([0, 1, 2], extra=["--key", key]).start().wait_ready()
    prod = Producer({"bootstrap.servers": pipe.bootstrap})
    for i in range(200):
        flat = f"f-{i % 100}"  # each sent twice; the nested field differs every time
        prod.produce(pipe.source, json.dumps({"user.id": flat, "user": {"id": f"n-{i}"}}).encode(),
                     partition=murmur2_partition(flat.encode(), 3))
    assert prod.flush(30) == 0
    pipe.wait_drained()
    assert w.terminate() == 0, w.tail()
    rep = _verify(pipe, key)
    assert_clean(rep)
    assert rep.out == 100
