"""pytest plugin: a session-scoped real Kafka broker."""

from __future__ import annotations

import pytest

from tests.localenv.kafka import KafkaBroker


@pytest.fixture(scope="session")
def kafka(tmp_path_factory, request):
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()
    if request.session.testsfailed:
        # pytest keeps the last basetemp dirs; say where the broker's logs are.
        print(f"\nkafka logs kept in {broker.workdir}")


@pytest.fixture
def kafka_bootstrap(kafka) -> str:
    if not kafka.running:  # a fault test left it stopped; later tests need it back
        kafka.start()
    return kafka.bootstrap
