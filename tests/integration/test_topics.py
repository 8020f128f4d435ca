"""Topic reconciliation against the real broker: create, grow, revert drift, refuse shrink on the
topics the operator owns; only check the ones it adopted."""

import time
import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from eopipe.control.builders.topics import TopicSpec
from eopipe.control.topics import delete_topics, ensure_topics

pytestmark = pytest.mark.kafka


def _eventually(fn, expect, timeout=20):
    """Topic metadata and configs propagate asynchronously, even on one broker (a topic just
    created may still be unknown to the broker asked)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = fn()
        except KafkaException as e:
            got = e
        if got == expect or time.monotonic() >= deadline:
            return got
        time.sleep(0.2)


def _config(admin, topic, key):
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(30)[key].value


def _partitions(admin, topic):
    t = admin.list_topics(topic, timeout=10).topics[topic]
    return len(t.partitions)


def test_topic_lifecycle(kafka_bootstrap):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    name = f"t-{uuid.uuid4().hex[:8]}"
    want = [TopicSpec(name, 2, 1, {"retention.ms": "3600000"})]

    recorded = []
    first = ensure_topics(admin, want, record_owned=recorded.append)
    assert first.created == [name] and first.owned == [name] and recorded == [[name]]
    owned = first.owned
    assert _eventually(lambda: _partitions(admin, name), 2) == 2
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "3600000") == "3600000"
    assert not ensure_topics(admin, want, owned).changed  # idempotent

    grown = ensure_topics(admin, [TopicSpec(name, 5, 1, {"retention.ms": "3600000"})], owned)
    assert grown.partitions_added == {name: (2, 5)}
    assert _eventually(lambda: _partitions(admin, name), 5) == 5

    # Drift made by hand is reverted.
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "1000") == "1000"
    assert ensure_topics(admin, [TopicSpec(name, 5, 1, {"retention.ms": "3600000"})], owned).configs_set == {
        name: {"retention.ms": "3600000"}}
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "3600000") == "3600000"

    shrink = ensure_topics(admin, want, owned)
    assert "cannot remove partitions" in shrink.refused[name] and not shrink.changed
    assert _partitions(admin, name) == 5

    assert delete_topics(admin, [name, "never-existed"]) == [name]



def test_an_adopted_topic_is_checked_never_changed(kafka_bootstrap):
    """A topic that existed before (its producers' own configs, fewer partitions than asked, a
    retention shorter than the window): reported with the fix; configs and partitions left alone."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    name = f"adopted-{uuid.uuid4().hex[:8]}"
    theirs = {"retention.ms": "3600000", "min.insync.replicas": "2", "max.message.bytes": "500000"}
    admin.create_topics([NewTopic(name, 2, 1, config=theirs)])[name].result(30)
    assert _eventually(lambda: _config(admin, name, "min.insync.replicas"), "2") == "2"
    want = [TopicSpec(name, 3, 1, {"retention.ms": "604800000", "min.insync.replicas": "1"}, "source")]

    for _ in range(3):  # every resync alike
        report = ensure_topics(admin, want, (), window_ms=24 * 3600 * 1000, bootstrap=kafka_bootstrap,
                               record_owned=pytest.fail)
        assert report.adopted == [name] and report.owned == [] and not report.changed
        problems = {m.problem.split(" ")[0]: m for m in report.mismatches}
        assert problems["2"].partitions and f"--topic {name} --partitions 3" in problems["2"].fix
        assert problems["retention.ms=3600000"].fix.startswith(
            f"kafka-configs.sh --bootstrap-server {kafka_bootstrap} --alter --entity-type topics "
            f"--entity-name {name} --add-config retention.ms=604800000")
    time.sleep(1)
    assert _partitions(admin, name) == 2
    for key, value in theirs.items():
        assert _config(admin, name, key) == value, key

    # The owner fixes it as told: nothing is reported any more, and still nothing is changed.
    admin.create_partitions([NewPartitions(name, 3)])[name].result(30)
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "-1") == "-1"
    assert _eventually(lambda: _partitions(admin, name), 3) == 3
    report = ensure_topics(admin, want, (), window_ms=24 * 3600 * 1000)
    assert not report.mismatches and not report.changed and report.adopted == [name]
    assert _config(admin, name, "min.insync.replicas") == "2"
    admin.delete_topics([name])[name].result(30)
