"""`eopipe load` sends each partition's first record alone and waits for it (eopipe/tools/loadgen.py):
librdkafka can take a refused first batch as written once a later batch succeeds (a topic just
made, its leader not ready), a record lost with no error. The client is a recording stand-in:
what is checked is the order of calls, not Kafka."""

from types import SimpleNamespace

import pytest

from eopipe.tools import loadgen


class Recorder:
    def __init__(self, _config, partitions: int, undelivered: int):
        self.calls: list = []
        self.partitions, self.undelivered = partitions, undelivered

    def list_topics(self, topic, timeout):
        md = SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
        return SimpleNamespace(topics={topic: md})

    def produce(self, _topic, partition, **_record):
        self.calls.append(partition)

    def flush(self, _timeout=None):
        self.calls.append("flush")
        return self.undelivered

    def poll(self, _timeout):
        return 0


@pytest.fixture
def recorder(monkeypatch):
    made = []

    def factory(partitions: int = 3, undelivered: int = 0):
        monkeypatch.setattr(loadgen, "Producer", lambda cfg: made.append(Recorder(cfg, partitions, undelivered)) or made[-1])
        return made

    return factory


@pytest.mark.parametrize("partitions, count, poison", [(1, 5, 0), (3, 60, 0), (4, 40, 3)])
def test_each_partitions_first_record_is_delivered_before_the_next_is_sent(recorder, partitions, count, poison):
    made = recorder(partitions)
    loadgen.run_load("b", "t", count, poison=poison, seed=1)
    calls = made[0].calls
    sends = [c for c in calls if c != "flush"]
    assert len(sends) == count + poison and set(sends) == set(range(partitions))
    for p in range(partitions):
        first = calls.index(p)
        assert calls[first + 1] == "flush", (p, calls[:first + 2])
    assert calls.count("flush") == partitions + 1  # one per first record, one at the end


def test_a_first_record_not_delivered_stops_the_load(recorder):
    made = recorder(undelivered=1)
    with pytest.raises(RuntimeError, match=r"records not delivered \(partition \d's first\)"):
        loadgen.run_load("b", "t", 10, seed=1)
    assert made[0].calls == [made[0].calls[0], "flush"]
