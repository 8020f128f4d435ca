"""The local broker is a real Kafka: transactions commit and abort, read_committed filters."""

import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.kafka


def _topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _read_all(bootstrap: str, topic: str, isolation: str, expect_at_least: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "isolation.level": isolation,
                  "enable.auto.commit": False})
    c.subscribe([topic])
    values, idle = [], 0
    try:
        while idle < 6:
            msgs = c.consume(500, timeout=0.5)
            if not msgs:
                idle += 1 if len(values) >= expect_at_least else 0
                continue
            idle = 0
            for m in msgs:
                assert m.error() is None, m.error()
                values.append(m.value())
    finally:
        c.close()
    return values


def test_transactions_commit_and_abort(kafka_bootstrap):
    topic = _topic(kafka_bootstrap)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"committed-{i}".encode())
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"aborted-{i}".encode())
    p.flush(30)  # the aborted records really reach the log
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"committed-last")
    p.commit_transaction(30)

    committed = _read_all(kafka_bootstrap, topic, "read_committed", 11)
    assert committed == [f"committed-{i}".encode() for i in range(10)] + [b"committed-last"]
    # The aborted records are in the log: read_uncommitted sees them.
    uncommitted = _read_all(kafka_bootstrap, topic, "read_uncommitted", 16)
    assert sorted(v for v in uncommitted if v.startswith(b"aborted")) == [
        f"aborted-{i}".encode() for i in range(5)]


def test_zombie_producer_is_fenced(kafka_bootstrap):
    from confluent_kafka import KafkaException

    topic = _topic(kafka_bootstrap)
    conf = {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"fence-{topic}"}
    old, new = Producer(conf), Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"from-zombie")
    old.flush(30)
    new.init_transactions(30)  # bumps the epoch: aborts the zombie's open transaction
    with pytest.raises(KafkaException) as err:
        old.commit_transaction(30)
    assert err.value.args[0].fatal() or err.value.args[0].txn_requires_abort()
    new.begin_transaction()
    new.produce(topic, value=b"from-new")
    new.commit_transaction(30)
    assert _read_all(kafka_bootstrap, topic, "read_committed", 1) == [b"from-new"]


def test_broker_restart_keeps_committed_data(kafka, kafka_bootstrap):
    topic = _topic(kafka_bootstrap)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"rs-{topic}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"before")
    p.commit_transaction(30)
    seconds = kafka.restart(kill=True)
    assert kafka.running and seconds > 0
    # The same producer continues after the broker came back.
    p.begin_transaction()
    p.produce(topic, value=b"after")
    p.commit_transaction(60)
    assert _read_all(kafka.bootstrap, topic, "read_committed", 2) == [b"before", b"after"]
