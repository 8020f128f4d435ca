"""Replication of the topics the operator creates, against real brokers: a pipeline without
source.replicationFactor gets 3 replicas and min.insync.replicas 2 on a three-broker cluster,
and on one broker what fits, with a LowReplication warning; an explicit factor wins."""

import time
import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from eopipe.control.builders.topics import desired_topics
from eopipe.control.topics import ensure_topics
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from tests.helpers.pipelines import topic_config

pytestmark = pytest.mark.kafka


def _names(bootstrap: str, **source) -> Names:
    name = f"r{uuid.uuid4().hex[:8]}"
    spec = PipelineSpec.model_validate({"kafka": {"bootstrapServers": bootstrap},
                                        "source": {"topic": f"{name}-src", "partitions": 2, **source}})
    return Names("test", name, spec)


def _made(admin: AdminClient, topic: str) -> tuple[int, str]:
    """(replicas of each partition, min.insync.replicas) as Kafka has them. A topic just created
    may be unknown yet to the broker asked (its metadata or its configs)."""
    deadline = time.monotonic() + 20
    while not (md := admin.list_topics(topic, timeout=10).topics[topic]).partitions and time.monotonic() < deadline:
        time.sleep(0.2)
    (replicas,) = {len(p.replicas) for p in md.partitions.values()}
    while (min_isr := topic_config(admin, topic, "min.insync.replicas")) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return replicas, min_isr


def _ensure(bootstrap: str, names: Names):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    report = ensure_topics(admin, desired_topics(names), window_ms=3600_000, bootstrap=bootstrap)
    return admin, report


def test_an_unset_factor_is_3_with_min_insync_2_on_three_brokers(kafka3):
    names = _names(kafka3.direct_bootstrap)
    admin, report = _ensure(kafka3.direct_bootstrap, names)
    topics = [t.name for t in desired_topics(names)]
    assert sorted(report.created) == sorted(topics) and not report.warnings
    assert {t: _made(admin, t) for t in topics} == {t: (3, "2") for t in topics}


def test_an_explicit_factor_wins_on_three_brokers(kafka3):
    names = _names(kafka3.direct_bootstrap, replicationFactor=1)
    admin, report = _ensure(kafka3.direct_bootstrap, names)
    assert not report.warnings
    assert {_made(admin, t) for t in report.created} == {(1, "1")}


def test_one_broker_gets_what_fits_and_a_warning(kafka_bootstrap):
    names = _names(kafka_bootstrap)
    admin, report = _ensure(kafka_bootstrap, names)
    assert {_made(admin, t) for t in report.created} == {(1, "1")}
    (w,) = report.warnings
    assert w.reason == "LowReplication" and w.message.startswith("the cluster has 1 broker: topics get replication 1")
    # The next pass: the topics exist, owned, as the brokers allow; nothing to change, and the
    # warning is said again (it stays true as long as the cluster has one broker).
    again = ensure_topics(admin, desired_topics(names), report.owned, window_ms=3600_000)
    assert not again.changed and [x.message for x in again.warnings] == [w.message]


def test_an_explicit_factor_above_the_broker_count_fails_as_kafka_says(kafka_bootstrap):
    names = _names(kafka_bootstrap, replicationFactor=3)
    with pytest.raises(KafkaException, match="INVALID_REPLICATION_FACTOR|[Rr]eplication factor"):
        _ensure(kafka_bootstrap, names)
