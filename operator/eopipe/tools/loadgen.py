"""`eopipe load`: keyed payment events with the duplicates that at-least-once producers make.

Each event has a UUID id, used as the record key and as the JSON field "id" (or at the JSON
field paths `id_at` names: ("user.id",) puts it in {"user": {"id": ...}} only, for a pipeline
keyed on the nested field); its event time is the record timestamp. A share of the sends are resends of earlier events (same key, value
and timestamp), some of them delayed, and some sent to a wrong partition (a producer with
stale metadata or another partitioner). Partitions are computed here with the pipeline's
partitioner rather than left to the client, so placement is exact whatever client it is.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from typing import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

from eopipe.core import partitioner as partitioners

PACE_S = 0.005
MESSAGE_TIMEOUT_S = 300  # message.timeout.ms (librdkafka's default): a first record waits no longer


def _with_id(eid: str, id_at: tuple[str, ...]) -> dict:
    """{"id": eid} for ("id",), {"user": {"id": eid}} for ("user.id",): a dotted JSON field path each."""
    value: dict = {}
    for path in id_at:
        *objects, last = path.split(".")
        node = value
        for name in objects:
            node = node.setdefault(name, {})
        node[last] = eid
    return value


def _event(rng: random.Random, seq: int, now_ms: int, id_at: tuple[str, ...]) -> tuple[bytes, bytes, int]:
    eid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    value = {
        **_with_id(eid, id_at),
        "seq": seq,
        "account": f"acct-{rng.randrange(1000):04d}",
        "amount_cents": rng.randrange(100, 100_000),
        "currency": rng.choice(["EUR", "USD", "GBP"]),
        "ts": now_ms,
    }
    return eid.encode(), json.dumps(value, separators=(",", ":")).encode(), now_ms


def _partition_count(producer: Producer, topic: str, timeout: float = 90, missing_for: float = 20) -> int:
    """The topic's partition count. A broker that is restarting answers for a while not at all
    (asked again until `timeout`), or without the topic's partitions (until `missing_for`: a
    topic that really does not exist fails sooner)."""
    start, missing_since = time.monotonic(), None
    while True:
        left = timeout - (time.monotonic() - start)
        try:
            md = producer.list_topics(topic, timeout=min(10.0, max(1.0, left))).topics.get(topic)
        except KafkaException:
            if left <= 0:
                raise
            continue  # no broker answered in time
        if md is not None and md.error is None and md.partitions:
            return len(md.partitions)
        missing_since = missing_since or time.monotonic()
        if time.monotonic() - missing_since >= missing_for:
            raise RuntimeError(f"topic {topic!r} does not exist"
                               + (f" ({md.error.str()})" if md is not None and md.error is not None else ""))
        time.sleep(1)


def send(producer: Producer, topic: str, **record) -> None:
    """produce(), waiting for deliveries while the producer's queue is full (a slow broker)
    instead of failing with BufferError."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


class ProducerConfigError(ValueError):
    """A producer setting librdkafka refuses (unknown, or a bad value)."""


class Sender:
    """An idempotent producer's sends to one topic, each partition's first record alone: sent,
    then waited for until delivered or failed (message.timeout.ms) before the next. librdkafka
    (2.16) can take a first batch refused as "not leader" (a topic or partition made a moment
    earlier) as written when a later batch to the partition succeeds: a record lost with no error
    (confluent-kafka-go #921). Failed deliveries are counted; `finish` raises on any."""

    def __init__(self, bootstrap: str, topic: str, producer_config: dict | None = None):
        # Reports of failed deliveries only: no Python callback for each record delivered.
        try:
            self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                                      "delivery.report.only.error": True,
                                      "message.timeout.ms": MESSAGE_TIMEOUT_S * 1000, **(producer_config or {})})
        except KafkaException as e:
            if e.args[0].code() != KafkaError._INVALID_ARG:
                raise
            raise ProducerConfigError(e.args[0].str()) from None
        self.topic = topic
        self.failed: list[str] = []
        self._first_written: set[int] = set()

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(str(err))

    def send(self, partition: int, **record) -> None:
        send(self.producer, self.topic, partition=partition, on_delivery=self._delivered, **record)
        self.producer.poll(0)  # serves the failed deliveries' reports
        if partition not in self._first_written:
            self._raise_if_undelivered(self.producer.flush(MESSAGE_TIMEOUT_S + 10), f" (partition {partition}'s first)")
            self._first_written.add(partition)

    def finish(self, timeout: float = 120) -> None:
        self._raise_if_undelivered(self.producer.flush(timeout))

    def _raise_if_undelivered(self, remaining: int, which: str = "") -> None:
        """A count of what was sent would overstate what the topic holds: say so rather than return it."""
        if remaining or self.failed:
            raise RuntimeError(f"{remaining + len(self.failed)} records not delivered{which}"
                               + (f", e.g. {self.failed[0]}" if self.failed else ""))


def run_load(bootstrap: str, topic: str, count: int, *, dup_ratio: float = 0.2,
             wrong_partition_ratio: float = 0.05, poison: int = 0, partitioner: str = "murmur2",
             rate: float | None = None, seed: int | None = None,
             progress: Callable[[dict], None] | None = None,
             producer_config: dict | None = None, id_at: tuple[str, ...] = ("id",),
             stop: threading.Event | None = None) -> dict:
    """Sends `count` records (originals + resends) and `poison` malformed ones, or fewer once
    `stop` is set; returns stats of what was sent."""
    if not 0 <= dup_ratio < 1 or not 0 <= wrong_partition_ratio <= 1:
        raise ValueError("dup_ratio must be in [0, 1) and wrong_partition_ratio in [0, 1]")
    rng = random.Random(seed)
    part = partitioners.get(partitioner)
    out = Sender(bootstrap, topic, producer_config)
    emit = out.send
    partitions = _partition_count(out.producer, topic)

    sent: list[tuple[bytes, bytes, int]] = []
    stats = {"records": 0, "unique": 0, "duplicates": 0, "wrong_partition": 0, "poison": 0}
    poison_at = set(rng.sample(range(count + poison), poison)) if poison else set()
    t0 = last_report = time.monotonic()
    for i in range(count + poison):
        if stop is not None and stop.is_set():
            break
        if i in poison_at:
            # No key and a value that is not JSON: nothing can dedup it; it must reach the DLQ.
            emit(rng.randrange(partitions), value=b"{not json")
            stats["poison"] += 1
        else:
            if sent and rng.random() < dup_ratio:
                # A resend: mostly recent (a retry), sometimes much older (a delayed redelivery).
                back = rng.randrange(min(len(sent), 50)) if rng.random() < 0.8 else rng.randrange(len(sent))
                key, value, ts = sent[-1 - back]
                stats["duplicates"] += 1
            else:
                key, value, ts = _event(rng, stats["unique"], int(time.time() * 1000), id_at)
                sent.append((key, value, ts))
                stats["unique"] += 1
            p = part(key, partitions)
            if partitions > 1 and rng.random() < wrong_partition_ratio:
                p = (p + rng.randrange(1, partitions)) % partitions
                stats["wrong_partition"] += 1
            emit(p, key=key, value=value, timestamp=ts)
        stats["records"] += 1
        if rate:
            # Paced in steps of PACE_S, not per record: a sleep per record at 5,000/s cost some 40%
            # of the generator's CPU (wake-ups), which a benchmark's stages on the same cores lack.
            ahead = stats["records"] / rate - (time.monotonic() - t0)
            if ahead > PACE_S:
                time.sleep(ahead)
        if progress and time.monotonic() - last_report >= 1:
            last_report = time.monotonic()
            progress(dict(stats, seconds=last_report - t0, total=count + poison))
    out.finish()
    stats["seconds"] = time.monotonic() - t0
    return stats
