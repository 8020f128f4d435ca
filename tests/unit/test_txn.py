"""What a transactional call's outcome means for the partition (eopipe.dedup.txn): a table over
real confluent-kafka errors, the watchdog, and the fenced-after-timeout decision; and the
Transaction's own commit and abort (eopipe.dedup.batch): the store is written only after Kafka
committed, and a failed commit or abort forgets nothing."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from eopipe.core.assignment import Assignment
from eopipe.dedup import txn
from eopipe.dedup.txn import Abortable, Fenced, Stalled, Stopping, TxnCalls, Wedged, fencing_was_a_timeout


def raises(code, **flags):
    def fn():
        raise KafkaException(KafkaError(code, "test", **flags))
    return fn


@pytest.mark.parametrize("fn, kw, expected", [
    (raises(KafkaError._FENCED, fatal=True), {}, Fenced),
    (raises(KafkaError.PRODUCER_FENCED, fatal=True), {}, Fenced),
    (raises(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True), {}, Fenced),
    (raises(KafkaError._STATE, fatal=True), {}, txn.ProducerFatal),  # one warning, p restarted
    # The commit path: a timeout past the commit's deadline, or one not retriable, means the
    # outcome is unknown (a retriable one before the deadline is retried: below).
    (raises(KafkaError._TIMED_OUT, retriable=True), {"stall": True, "deadline": 0.0}, Stalled),
    (raises(KafkaError._TIMED_OUT), {"stall": True}, Stalled),
    (raises(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True), {"stall": True, "deadline": 0.0}, Stalled),
    # Elsewhere a timeout is retried until the deadline, then the transaction is aborted.
    (raises(KafkaError._TIMED_OUT, retriable=True), {"deadline": 0.0}, Abortable),
    (raises(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True), {}, Abortable),
    (raises(KafkaError.INVALID_TXN_STATE), {}, Abortable),
])
def test_error_classes(fn, kw, expected):
    with pytest.raises(expected):
        TxnCalls(0)("call", fn, **kw)


@pytest.mark.parametrize("code, kw", [
    (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, {}),
    # A broker restart leaves a commit-path attempt waiting on a stale coordinator; a new attempt
    # looks it up again (docs/design.md#broker-restart): a retriable timeout before the deadline.
    (KafkaError._TIMED_OUT, {"stall": True}),
])
def test_retriable_errors_are_retried_until_success(code, kw):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise KafkaException(KafkaError(code, "x", retriable=True))
        return "ok"

    assert TxnCalls(0)("call", flaky, deadline=time.monotonic() + 30, **kw) == "ok"
    assert len(attempts) == 3


def test_a_stopping_partition_does_not_retry_forever():
    halt = threading.Event()
    halt.set()
    with pytest.raises(Stopping):
        TxnCalls(0, halt)("call", raises(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True))


@pytest.mark.parametrize("stall, expected", [(False, Wedged), (True, Stalled)])
def test_a_call_that_outlives_the_watchdog(monkeypatch, stall, expected):
    monkeypatch.setattr(txn, "WATCHDOG_GRACE_S", 0.1)
    calls = TxnCalls(0)
    release = threading.Event()
    with pytest.raises(expected):
        calls("call", lambda: release.wait(5), timeout=0.1, stall=stall)
    release.set()
    assert calls.wedged


@pytest.mark.parametrize("answers, returns_after, expected", [
    # Past its own timeout while the coordinator answers a fresh lookup: a stale coordinator
    # (librdkafka #5511) that nothing will wake; given up at once, not at the watchdog.
    ([True], None, "stale coordinator"),
    ([False, False, True], None, "stale coordinator"),
    # Every broker down: the probe fails, the call is left to finish on the broker's return...
    ([False, False], 0.6, "ok"),
    # ...or, never returning, to the watchdog.
    ([False] * 50, None, "did not return within"),
])
def test_a_commit_call_past_its_timeout_probes_the_coordinator(monkeypatch, answers, returns_after, expected):
    monkeypatch.setattr(txn, "WATCHDOG_GRACE_S", 1.5)
    monkeypatch.setattr(txn, "PROBE_AFTER_S", 0.2)
    release, probes = threading.Event(), []
    if returns_after is not None:
        threading.Timer(returns_after, release.set).start()

    def probe():
        probes.append(1)
        return answers[min(len(probes), len(answers)) - 1]

    calls = TxnCalls(0)
    try:
        result = calls("send_offsets_to_transaction", lambda: release.wait(5) and "ok", timeout=0.1,
                       stall=True, probe=probe, deadline=time.monotonic() + 30)
    except Stalled as e:
        result = str(e)
    finally:
        release.set()
    assert expected in result
    assert probes and calls.wedged is (result != "ok")


MINE = Assignment(3, {0: "pod-a", 1: "pod-b"}, partition_count=2)


@pytest.mark.parametrize("age, fixed, assignment, expected", [
    (5, False, MINE, False),             # younger than the timeout: a real fencing
    (5, True, None, False),
    (61, True, None, True),              # fixed ownership: p is ours by definition
    (61, False, MINE, True),             # still ours by the assignment: the coordinator aborted it
    (61, False, Assignment(4, {0: "pod-b", 1: "pod-b"}, partition_count=2), False),  # moved: a zombie
    (61, False, Assignment(4, {0: "pod-a", 1: "pod-b"}, partition_count=2, paused=True), False),
    (61, False, None, False),            # assignment unreadable: unknown, stay fenced
])
def test_fencing_after_the_transaction_timeout(age, fixed, assignment, expected):
    assert fencing_was_a_timeout(age, 60, fixed, assignment, "pod-a", 0) is expected


# -- the Transaction's own commit and abort (dedup/batch.py) ------------------------------------
class FakeProducer:
    """Records the transactional calls in order; `fail` maps a call to the error it raises."""

    def __init__(self, log, fail=None):
        self.log, self.fail = log, fail or {}

    def _call(self, name):
        self.log.append(name)
        if name in self.fail:
            raise KafkaException(KafkaError(self.fail[name], "test", **FLAGS.get(self.fail[name], {})))

    def begin_transaction(self):
        self._call("begin_transaction")

    def send_offsets_to_transaction(self, offsets, metadata, timeout):
        self.log.append(("offsets", [(o.topic, o.partition, o.offset) for o in offsets], metadata))

    def commit_transaction(self, timeout):
        self._call("commit_transaction")

    def abort_transaction(self, timeout):
        self._call("abort_transaction")


FLAGS = {KafkaError.INVALID_TXN_STATE: {"txn_requires_abort": True}, KafkaError._TIMED_OUT: {"retriable": True}}


class FakeStore:
    def __init__(self, log):
        self.log = log

    def apply(self, entries, offset, **kw):
        self.log.append(("apply", dict(entries), offset))


def transaction(log, fail=None):
    from types import SimpleNamespace

    from eopipe.dedup.batch import Transaction
    from eopipe.dedup.config import WorkerConfig

    cfg = WorkerConfig(bootstrap="127.0.0.1:9", source_topic="src", output_topic="out", pipeline="p",
                       partitions=[3], transaction_timeout_seconds=10)
    t = Transaction(cfg, 3, FakeProducer(log, fail), SimpleNamespace(consumer_group_metadata=lambda: "group"),
                    FakeStore(log), TxnCalls(3), lambda: 1, False, committed=5,
                    after_commit=lambda p: log.append(("after_commit", p)))
    t.begin()
    t.pending[b"k"] = 1000
    t.next_offset, t.records = 9, 4
    t.counts.consumed, t.counts.emitted, t.counts.duplicates = 4, 1, 3
    return t


def test_a_commit_writes_the_store_only_after_kafka_committed():
    log: list = []
    t = transaction(log)
    done = t.commit()
    assert log == ["begin_transaction", ("offsets", [("src", 3, 9)], "group"), "commit_transaction",
                   ("after_commit", 3), ("apply", {b"k": 1000}, 9)]
    assert done.offset == 9 and (done.counts.consumed, done.counts.emitted, done.counts.duplicates) == (4, 1, 3)
    assert done.counts.rerouted == done.counts.dead_lettered == 0 and done.seconds >= 0
    # Empty again, starting at the new committed offset.
    assert not t.open and t.pending == {} and t.records == 0 and t.committed == t.next_offset == 9
    assert t.counts.consumed == 0


def test_a_failed_commit_leaves_the_store_and_the_transaction_to_the_runner():
    log: list = []
    t = transaction(log, {"commit_transaction": KafkaError.INVALID_TXN_STATE})
    with pytest.raises(Abortable):
        t.commit()
    assert not any(e[0] in ("apply", "after_commit") for e in log if isinstance(e, tuple))
    assert t.open and t.pending == {b"k": 1000} and t.committed == 5


@pytest.mark.parametrize("fail, expected", [
    (None, None),
    (KafkaError._TIMED_OUT, Stalled),                 # outcome unknown: the runner replaces its clients
    (KafkaError.INVALID_TXN_STATE, Abortable),
])
def test_an_abort_goes_back_to_the_committed_offset(fail, expected):
    log: list = []
    t = transaction(log, {"abort_transaction": fail} if fail else None)
    if expected is None:
        t.abort()
        assert not t.open and t.pending == {} and t.next_offset == t.committed == 5 and t.counts.consumed == 0
    else:
        with pytest.raises(expected):
            t.abort(0.3)  # a retriable timeout is retried for this long
        assert t.open and t.pending  # not settled: nothing forgotten
    assert "abort_transaction" in log and not any(isinstance(e, tuple) and e[0] == "apply" for e in log)


# -- the hot path: Transaction.process over a polled batch (dedup/batch.py) ------------------------
def _keys_at(home: int, n: int, nparts: int = 4) -> list[bytes]:
    from eopipe.core.partitioner import murmur2_partition

    keys = (f"k{i}".encode() for i in range(10_000))
    return [k for k in keys if murmur2_partition(k, nparts) == home][:n]


MINE, OTHERS = _keys_at(3, 3), _keys_at(1, 1)


def _msg(offset, key=None, value=None, headers=None, error=None):
    from confluent_kafka import Message

    return Message(topic="src", partition=3, offset=offset, key=key, value=value, headers=headers,
                   timestamp=(1, 1000 + offset), error=error)


@pytest.mark.parametrize("spec, batch, stored, expected, counts", [
    # New keys go out, in order, to p's output partition; a stored key and a key twice are duplicates.
    ("key", [_msg(10, MINE[0], b"a"), _msg(11, MINE[1], b"b"), _msg(12, MINE[0], b"c"), _msg(13, MINE[2], b"d")],
     {MINE[1]}, [("out", b"a", MINE[0], 3, 1010), ("out", b"d", MINE[2], 3, 1013)], (4, 2, 2, 0, 0)),
    # No key: to the dead-letter topic; a key homed elsewhere: rerouted to its home, marked.
    ("key", [_msg(10, None, b"a"), _msg(11, OTHERS[0], b"b"), _msg(12, MINE[0], b"c")], set(),
     [("dlq", b"a", None, -1, 1010), ("src", b"b", OTHERS[0], 1, 1011), ("out", b"c", MINE[0], 3, 1012)],
     (3, 1, 0, 1, 1)),
    # A consumer's end-of-partition event is no record; the reroute mark never reaches the output.
    ("key", [_msg(10, MINE[0], b"a", headers=[("eopipe.rerouted.from", b"0:5"), ("h", b"1")]),
             _msg(11, error=KafkaError(KafkaError._PARTITION_EOF))], set(),
     [("out", b"a", MINE[0], 3, 1010)], (1, 1, 0, 0, 0)),
    # A JSON key: its field (the record key is not used), a malformed value to the DLQ.
    ("json:id", [_msg(10, b"x", b'{"id": "%s"}' % MINE[0]), _msg(11, b"y", b"{not json"),
                 _msg(12, b"z", b'{"id": "%s"}' % MINE[0])], set(),
     [("out", b'{"id": "%s"}' % MINE[0], b"x", 3, 1010), ("dlq", b"{not json", b"y", -1, 1011)], (3, 1, 1, 0, 1)),
])
def test_a_polled_batch(spec, batch, stored, expected, counts):
    from types import SimpleNamespace

    from eopipe.core.headers import H_REROUTED
    from eopipe.core.keys import KeySpec
    from eopipe.dedup.batch import Transaction
    from eopipe.dedup.config import WorkerConfig

    sent = []

    class Producer(FakeProducer):
        def produce(self, topic, value, key, partition, *args, timestamp=None, headers=None):
            if args:  # the hot path's positional form: callback, on_delivery, timestamp, headers
                timestamp, headers = args[2], args[3]
            sent.append((topic, value, key, partition, timestamp, headers))

        def poll(self, timeout):
            return 0

    cfg = WorkerConfig(bootstrap="127.0.0.1:9", source_topic="src", output_topic="out", pipeline="p",
                       dlq_topic="dlq", partitions=[3], key_spec=KeySpec.parse(spec))
    store = SimpleNamespace(contains=lambda keys: {k for k in keys if k in stored})
    t = Transaction(cfg, 3, Producer([]), SimpleNamespace(), store, TxnCalls(3), lambda: 4, False, committed=10)
    t.process(batch)
    by_topic = sorted(sent, key=lambda s: s[0])  # each topic in its order (the DLQ's go first)
    assert [s[:5] for s in by_topic] == sorted(expected, key=lambda s: s[0])
    rerouted = [s[5] for s in sent if s[0] == "src"]
    assert all(h[-1] == (H_REROUTED, b"3:11") for h in rerouted)
    # The reroute mark never reaches the output; the other headers do, as they were.
    assert [s[5] for s in sent if s[0] == "out" and s[5]] == [[("h", b"1")]] * any(m.headers() for m in batch)
    c = t.counts
    assert (c.consumed, c.emitted, c.duplicates, c.rerouted, c.dead_lettered) == counts
    assert t.open and t.next_offset == batch[-1].offset() + 1 - (batch[-1].error() is not None)
    assert set(t.pending) == {s[2] if spec == "key" else MINE[0] for s in sent if s[0] == "out"}


def test_a_fatal_produce_error_is_a_known_producer_failure():
    """An idempotent producer's fatal error (OUT_OF_ORDER_SEQUENCE_NUMBER after a leader was
    killed) ends p's producer: ProducerFatal, which the runner logs as one warning and restarts."""
    from types import SimpleNamespace

    from eopipe.dedup.batch import Transaction
    from eopipe.dedup.config import WorkerConfig

    class Producer(FakeProducer):
        def produce(self, *args, **kw):
            raise KafkaException(KafkaError(KafkaError._FATAL, "out of order sequence number", fatal=True))

    cfg = WorkerConfig(bootstrap="127.0.0.1:9", source_topic="src", output_topic="out", pipeline="p", partitions=[3])
    t = Transaction(cfg, 3, Producer([]), SimpleNamespace(), SimpleNamespace(contains=lambda keys: set()),
                    TxnCalls(3), lambda: 4, False, committed=10)
    with pytest.raises(txn.ProducerFatal) as e:
        t.process([_msg(10, MINE[0], b"a")])
    assert e.value.code == "_FATAL" and e.value.reason == "out of order sequence number"


@pytest.mark.parametrize("err, expected", [
    # A newer owner took p: its fencing arrives with a failed delivery, served by poll().
    (KafkaError(KafkaError._FENCED, "fenced by newer producer instance", fatal=True), txn.Fenced),
    (KafkaError(KafkaError._FATAL, "out of order sequence number", fatal=True), txn.ProducerFatal),
    (KafkaError(KafkaError._MSG_TIMED_OUT, "message timed out"), txn.Abortable),
])
def test_a_failed_delivery_is_what_the_produce_error_would_be(err, expected):
    """Not a bare KafkaException: that restarted p, whose init_transactions fenced the newer owner back."""
    from types import SimpleNamespace

    from eopipe.dedup.batch import Transaction
    from eopipe.dedup.config import WorkerConfig

    class Producer(FakeProducer):
        def produce(self, *args, **kw):
            pass

        def poll(self, timeout):
            raise KafkaException(err)

    cfg = WorkerConfig(bootstrap="127.0.0.1:9", source_topic="src", output_topic="out", pipeline="p", partitions=[3])
    t = Transaction(cfg, 3, Producer([]), SimpleNamespace(), SimpleNamespace(contains=lambda keys: set()),
                    TxnCalls(3), lambda: 4, False, committed=10)
    with pytest.raises(expected):
        t.process([_msg(10, MINE[0], b"a")])
