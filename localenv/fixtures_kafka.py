"""pytest plugin: a session-scoped real Kafka broker, and a three-node cluster on demand."""

from __future__ import annotations

import pytest

from localenv.kafka import KafkaBroker


def _session_kafka(kafka, name: str, request):
    kafka.start()
    yield kafka
    kafka.stop()
    if request.session.testsfailed:
        # pytest keeps the last basetemp dirs; say where the broker's logs are.
        print(f"\n{name} logs kept in {kafka.workdir}")


@pytest.fixture(scope="session")
def kafka(tmp_path_factory, request):
    yield from _session_kafka(KafkaBroker(tmp_path_factory.mktemp("kafka")), "kafka", request)


@pytest.fixture
def kafka_bootstrap(kafka) -> str:
    if not kafka.running:  # a fault test left it stopped; later tests need it back
        kafka.start()
    return kafka.bootstrap


@pytest.fixture(scope="session")
def kafka3_cluster(tmp_path_factory, request):
    """A three-node KRaft cluster behind toxiproxy (localenv/kafkacluster.py), started only when
    a test asks for it (the `kafka3` fixture)."""
    from localenv.kafkacluster import KafkaCluster

    yield from _session_kafka(KafkaCluster(tmp_path_factory.mktemp("kafka3")), "kafka3", request)


@pytest.fixture
def kafka3(kafka3_cluster):
    """The three-node cluster, every node running and every proxy healed before and after."""
    kafka3_cluster.ensure_all_running()
    yield kafka3_cluster
    kafka3_cluster.ensure_all_running()
