"""The partitioner matches the Java client byte for byte, and librdkafka's named partitioners."""

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from eopipe.core import partitioner
from localenv.kafka import ensure_kafka_jars

KEYS = [b"", b"a", b"ab", b"abc", b"21", b"foobar", b"a-little-bit-long-string",
        "ünïcødé-κλειδί".encode(), bytes(range(256))] + [
    uuid.UUID(int=i * 7919 + 13).hex.encode() for i in range(300)] + [
    os.urandom(n) for n in range(1, 64)]


def test_murmur2_matches_kafka_java_client():
    jars = ensure_kafka_jars()
    src = Path(__file__).parent / "java" / "KafkaPartition.java"
    out = subprocess.run(
        ["java", "-cp", f"{jars}/*", str(src), "12"],
        input="\n".join(k.hex() for k in KEYS) + "\n",
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split("\n")
    for key, line in zip(KEYS, out):
        h, p = map(int, line.split())
        assert partitioner.murmur2(key) == h, key
        assert partitioner.murmur2_partition(key, 12) == p, key


@pytest.mark.kafka
@pytest.mark.parametrize("name", ["murmur2", "crc32"])
def test_matches_librdkafka_partitioner(kafka_bootstrap, name):
    topic = f"part-{name}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 7, 1)])[topic].result(30)
    placed = {}
    p = Producer({"bootstrap.servers": kafka_bootstrap,
                  "partitioner": partitioner.LIBRDKAFKA_NAMES[name]})
    keys = [k for k in KEYS if k]  # librdkafka places empty keys at random
    for k in keys:
        p.produce(topic, key=k, value=b"x",
                  on_delivery=lambda err, msg: placed.__setitem__(msg.key(), msg.partition()))
    p.flush(30)
    fn = partitioner.get(name)
    assert placed == {k: fn(k, 7) for k in keys}
    assert len(set(placed.values())) == 7
