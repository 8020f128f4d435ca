"""The Kafka clients of one partition: its read_committed consumer and its transactional
producer (the settings are the protocol's: docs/design.md#one-transaction), and how replaced
ones are let go."""

from __future__ import annotations

import threading

from confluent_kafka import KafkaException

from eopipe.core import partitioner as partitioners
from eopipe.dedup import logs
from eopipe.dedup.config import WorkerConfig


def _base(cfg: WorkerConfig) -> dict:
    # librdkafka's own logs go through Python logging (JSON lines like ours), summarized.
    return {"bootstrap.servers": cfg.bootstrap, "logger": logs.rdkafka_logger(),
            # A client's reconnect back-off doubles while a broker is down, up to this (librdkafka's
            # default 10 s): after a broker restart every client reconnects within a second of the
            # broker's return instead of up to 10 s later. The coordinator lookup of a pending
            # send_offsets_to_transaction only moves on a broker connection's state change
            # (docs/design.md#broker-restart), so its commit waited for that reconnect too.
            "reconnect.backoff.max.ms": 1000,
            **cfg.kafka_config}


def consumer_config(cfg: WorkerConfig, p: int) -> dict:
    return {
        **_base(cfg),
        "group.id": cfg.group_id,
        "client.id": f"{cfg.transactional_id(p)}.consumer",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "queued.max.messages.kbytes": 16384,
        "fetch.wait.max.ms": 100,
        # A full prefetch queue pauses fetching for this long (librdkafka's default 1 s). A
        # rebuild drains 16 MB in well under that, so it idled half the time (bench.migration,
        # 1M keys: 8.3 s with the default, 2.9-3.6 s with 10 ms).
        "fetch.queue.backoff.ms": 10,
    }


def producer_config(cfg: WorkerConfig, p: int) -> dict:
    txid = cfg.transactional_id(p)
    return {
        **_base(cfg),
        "client.id": f"{txid}.producer",
        "transactional.id": txid,
        "transaction.timeout.ms": int(cfg.transaction_timeout_seconds * 1000),
        # librdkafka wants socket.timeout.ms <= transaction.timeout.ms.
        "socket.timeout.ms": min(60_000, int(cfg.transaction_timeout_seconds * 1000)),
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "delivery.report.only.error": True,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 262_144,
        "partitioner": partitioners.LIBRDKAFKA_NAMES.get(cfg.partitioner, "murmur2_random"),
    }


def connect(producer, topic: str, timeout: float = 5.0) -> None:
    """Two metadata requests before init_transactions(). librdkafka drops its bootstrap
    connection once it has learnt the brokers; a coordinator lookup that falls in that gap is
    retried only after a fixed 500 ms, which hit about half of the inits here (and so half of
    the handoff pauses). The second request returns once a learnt broker is connected. An
    unreachable cluster is left to init_transactions under the watchdog."""
    try:
        for _ in range(2):
            producer.list_topics(topic, timeout=timeout)
    except KafkaException:
        pass


_graveyard: list = []  # clients with a call stuck inside: kept referenced, never destroyed


def discard(producer, consumer, stuck: bool) -> None:
    """Closes a replaced producer and consumer off the partition thread (closing may block on
    an unreachable broker). A producer with a call stuck inside is never destroyed."""
    if stuck:
        _graveyard.append(producer)
        producer = None

    def close() -> None:
        for c in (consumer, producer):
            if c is None:
                continue
            try:
                if hasattr(c, "close"):
                    c.close()
                else:
                    c.purge()
            except Exception:  # noqa: BLE001
                pass

    threading.Thread(target=close, name="discard-clients", daemon=True).start()


def close(producer, consumer, stuck: bool) -> None:
    """Closes a stopping partition's producer (delivering what it still holds, 5 s at most)
    and consumer, on the partition thread. A producer with a call stuck inside is left to the
    fencing by its successor."""
    if producer is not None and not stuck:
        try:
            producer.flush(5)
        except Exception:  # noqa: BLE001
            pass
    if consumer is not None:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001
            pass
