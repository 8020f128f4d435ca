"""Topic reconciliation against the real broker: create, grow, revert drift, refuse shrink."""

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from eopipe.builders.topics import TopicSpec
from eopipe.topics import delete_topics, ensure_topics

pytestmark = pytest.mark.kafka


def _eventually(fn, expect, timeout=20):
    """Topic metadata and configs propagate asynchronously even on one broker."""
    deadline = time.monotonic() + timeout
    while (got := fn()) != expect and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


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

    first = ensure_topics(admin, want)
    assert first.created == [name]
    assert _eventually(lambda: _partitions(admin, name), 2) == 2
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "3600000") == "3600000"
    assert not ensure_topics(admin, want).changed  # idempotent

    grown = ensure_topics(admin, [TopicSpec(name, 5, 1, {"retention.ms": "3600000"})])
    assert grown.partitions_added == {name: (2, 5)}
    assert _eventually(lambda: _partitions(admin, name), 5) == 5

    # Drift made by hand is reverted.
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "1000") == "1000"
    assert ensure_topics(admin, [TopicSpec(name, 5, 1, {"retention.ms": "3600000"})]).configs_set == {
        name: {"retention.ms": "3600000"}}
    assert _eventually(lambda: _config(admin, name, "retention.ms"), "3600000") == "3600000"

    shrink = ensure_topics(admin, want)
    assert "cannot remove partitions" in shrink.refused[name] and not shrink.changed
    assert _partitions(admin, name) == 5

    assert delete_topics(admin, [name, "never-existed"]) == [name]
