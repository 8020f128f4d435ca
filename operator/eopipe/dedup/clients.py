"""The Kafka clients of one partition: its read_committed consumer and its transactional
producer (the settings are the protocol's: docs/design.md#one-transaction), and how replaced
ones are let go."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException

from eopipe.core import partitioner as partitioners
from eopipe.dedup import logs
from eopipe.dedup.config import WorkerConfig

log = logging.getLogger("eopipe.dedup")


def _base(cfg: WorkerConfig) -> dict:
    # librdkafka's own logs go through Python logging (JSON lines like ours), summarized, one
    # ClientLog per client (retired with it: dedup/logs.rdkafka_level).
    return {"bootstrap.servers": cfg.bootstrap, "logger": logs.ClientLog(),
            # A client's reconnect back-off doubles while a broker is down, up to this (librdkafka's
            # default 10 s): after a broker restart every client reconnects within a second of the
            # broker's return instead of up to 10 s later. The coordinator lookup of a pending
            # send_offsets_to_transaction only moves on a broker connection's state change
            # (docs/design.md#broker-restart), so its commit waited for that reconnect too.
            "reconnect.backoff.max.ms": 1000,
            # With every known broker down (one broker restarting), librdkafka's default
            # re-bootstrap decommissions the learnt brokers; a coordinator request cached on a
            # decommissioned broker is never woken again (librdkafka #5511, timeout unchecked:
            # #5456), so send_offsets_to_transaction hung until the watchdog (12 s) and the
            # partition replaced its clients. Without re-bootstrap the broker's own reconnects
            # wake the request and the open transaction commits on the broker's return
            # (docs/design.md#broker-restart). A partition that does replace its clients
            # bootstraps them afresh.
            "metadata.recovery.strategy": "none",
            **cfg.kafka_config}


def consumer_config(cfg: WorkerConfig, p: int) -> dict:
    return {**_base(cfg), **_consumer_own(cfg, p)}


def producer_config(cfg: WorkerConfig, p: int) -> dict:
    return {**_base(cfg), **_producer_own(cfg, p)}


def owned_settings(cfg: WorkerConfig) -> set[str]:
    """The settings the worker gives its consumers and producers over the operator's (the
    protocol's and its tuning): a --kafka-config of one of them would be lost."""
    return set(_consumer_own(cfg, 0)) | set(_producer_own(cfg, 0))


def _consumer_own(cfg: WorkerConfig, p: int) -> dict:
    return {
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


def _producer_own(cfg: WorkerConfig, p: int) -> dict:
    txid = cfg.transactional_id(p)
    return {
        "client.id": f"{txid}.producer",
        "transactional.id": txid,
        "transaction.timeout.ms": int(cfg.transaction_timeout_seconds * 1000),
        # librdkafka wants socket.timeout.ms <= transaction.timeout.ms.
        "socket.timeout.ms": min(60_000, int(cfg.transaction_timeout_seconds * 1000)),
        "linger.ms": linger_ms(cfg.commit_interval_ms),
        "batch.num.messages": 10000,
        "delivery.report.only.error": True,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 262_144,
        "partitioner": partitioners.LIBRDKAFKA_NAMES.get(cfg.partitioner, "murmur2_random"),
    }


def linger_ms(commit_interval_ms: int) -> int:
    """The producer's linger.ms: a fifth of the commit interval, between 5 and 50 ms. Records are
    read only once their transaction commits, and the commit sends what lingers, so a longer
    linger costs little latency. A short one costs CPU: with 5 ms and 100 ms commits, each
    partition's producer thread polled its socket without waiting some 40,000 times a second
    (perf stat, 1M records: 1.5M polls in 8.4 s; 0.3-0.5M with 20 ms; docs/design.md#the-hot-path)."""
    return max(5, min(50, commit_interval_ms // 5))


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


# librdkafka refuses a seek (_STATE) until the partition's fetch has started, which an assign
# just made may not have yet (a replay's earlier assignment of it still being removed).
SEEK_WAIT_S = 30.0


def seek_when_fetching(consumer, tp, halt: threading.Event, wait_s: float = SEEK_WAIT_S) -> None:
    """consumer.seek(tp), retried while librdkafka says the assignment's fetch has not started."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            consumer.seek(tp)
            return
        except KafkaException as e:
            if e.args[0].code() not in (KafkaError._STATE, KafkaError._PREV_IN_PROGRESS) or \
                    time.monotonic() >= deadline or halt.is_set():
                raise
        time.sleep(0.02)


def coordinator_answers(consumer, tp, timeout: float = 1.0) -> bool:
    """True when the consumer's group coordinator answers an offset fetch for `tp` now (the
    consumer looks the coordinator up afresh when its own went away)."""
    try:
        consumer.committed([tp], timeout=timeout)
        return True
    except KafkaException:
        return False


_graveyard: list = []  # clients whose stuck call never returned: kept referenced, never destroyed
# How long a replaced producer's stuck call is given to return before the producer is left in
# the graveyard. It returns when its request is answered or times out (socket.timeout.ms, at
# most 60 s): a broker restart's call returns soon after the broker is back.
REAP_WAIT_S = 90.0


def discard(producer, consumer, stuck_call: concurrent.futures.Future | None = None, client_logs=()) -> None:
    """Closes a replaced producer and consumer off the partition thread (closing may block on
    an unreachable broker). A producer with a call stuck inside (`stuck_call`, the watchdog gave
    up on it) is closed once that call returned: destroying it earlier would free what the call
    still uses; if it never returns, the producer is never destroyed. Their ClientLogs are
    retired: the successor fences the producer on purpose."""
    for lg in client_logs:
        lg.retire()

    def close() -> None:
        _close_quietly(consumer)
        if stuck_call is not None:
            try:
                stuck_call.exception(REAP_WAIT_S)
            except concurrent.futures.TimeoutError:
                _graveyard.append(producer)
                return
            log.info("replaced producer closed: its stuck call returned")
        _close_quietly(producer)

    threading.Thread(target=close, name="discard-clients", daemon=True).start()


def _close_quietly(c) -> None:
    if c is None:
        return
    try:
        c.close()
    except Exception:  # noqa: BLE001
        pass


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
