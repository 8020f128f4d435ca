"""dedup/clients: a replaced producer is closed once no call is inside it, never while
one is (destroying it would free what the call still uses), its logs are retired; the
clients do not re-bootstrap unless told to."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from eopipe.dedup import clients
from eopipe.dedup.logs import ClientLog


class Client:
    def __init__(self):
        self.closed = threading.Event()

    def close(self):
        self.closed.set()


@pytest.mark.parametrize("stuck, returns, producer_closed", [
    (False, None, True),    # no call inside: closed at once
    (True, True, True),     # the stuck call returned: closed after it
    (True, False, False),   # it never returned: kept, never destroyed
])
def test_discard(monkeypatch, stuck, returns, producer_closed):
    monkeypatch.setattr(clients, "REAP_WAIT_S", 0.3)
    monkeypatch.setattr(clients, "_graveyard", [])
    producer, consumer, logs = Client(), Client(), (ClientLog(), ClientLog())
    fut = concurrent.futures.Future() if stuck else None
    if stuck:
        fut.set_running_or_notify_cancel()
    clients.discard(producer, consumer, fut, logs)
    assert all(lg.retired for lg in logs)
    assert consumer.closed.wait(2)
    if stuck:
        assert not producer.closed.wait(0.1), "closed while a call was inside"
        if returns:
            fut.set_result(None)
    assert producer.closed.wait(2 if producer_closed else 0.6) == producer_closed
    assert (producer in clients._graveyard) == (not producer_closed)


@pytest.mark.parametrize("extra, strategy", [
    ({}, "none"),                                             # no re-bootstrap: librdkafka #5511
    ({"metadata.recovery.strategy": "rebootstrap"}, "rebootstrap"),  # the operator's settings win
])
def test_clients_do_not_rebootstrap_unless_told(extra, strategy):
    from eopipe.dedup.config import WorkerConfig

    cfg = WorkerConfig(bootstrap="k:9092", source_topic="s", output_topic="o", pipeline="p", partitions=[0],
                       kafka_config=extra)
    for conf in (clients.consumer_config(cfg, 0), clients.producer_config(cfg, 0)):
        assert conf["metadata.recovery.strategy"] == strategy
        assert isinstance(conf["logger"], ClientLog)


@pytest.mark.parametrize("setting, owned", [
    ("isolation.level", True),            # read_committed: the protocol
    ("enable.auto.commit", True),         # offsets go in the transaction
    ("transactional.id", True),           # the fencing
    ("linger.ms", True),                  # tuning the worker measured (docs/design.md#the-hot-path)
    ("metadata.recovery.strategy", False),  # the operator's settings win (above)
    ("security.protocol", False),
    ("sasl.username", False),
])
def test_owned_settings_are_the_ones_a_kafka_config_would_lose(setting, owned):
    from eopipe.dedup.config import WorkerConfig

    cfg = WorkerConfig(bootstrap="k:9092", source_topic="s", output_topic="o", pipeline="p", partitions=[0],
                       kafka_config={setting: "x"})
    assert (setting in clients.owned_settings(cfg)) == owned
    lost = any(conf.get(setting) != "x" for conf in (clients.consumer_config(cfg, 0), clients.producer_config(cfg, 0)))
    assert lost == owned


@pytest.mark.parametrize("commit_interval_ms, linger", [
    (100, 20),     # the default: a fifth of the interval
    (10, 5),       # never below librdkafka's 5 ms
    (1, 5),
    (250, 50),
    (5_000, 50),   # never above 50: what was measured
])
def test_the_producer_lingers_a_fifth_of_the_commit_interval(commit_interval_ms, linger):
    from eopipe.dedup.config import WorkerConfig

    cfg = WorkerConfig(bootstrap="k:9092", source_topic="s", output_topic="o", pipeline="p", partitions=[0],
                       commit_interval_ms=commit_interval_ms)
    assert clients.producer_config(cfg, 0)["linger.ms"] == linger
