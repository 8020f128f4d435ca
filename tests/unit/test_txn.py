"""What a transactional call's outcome means for the partition (eopipe.dedup.txn): a table over
real confluent-kafka errors, the watchdog, and the fenced-after-timeout decision."""

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
    (raises(KafkaError._STATE, fatal=True), {}, RuntimeError),
    # The commit path: a timeout means the outcome is unknown.
    (raises(KafkaError._TIMED_OUT, retriable=True), {"stall": True}, Stalled),
    (raises(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True), {"stall": True, "deadline": 0.0}, Stalled),
    # Elsewhere a timeout is retried until the deadline, then the transaction is aborted.
    (raises(KafkaError._TIMED_OUT, retriable=True), {"deadline": 0.0}, Abortable),
    (raises(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True), {}, Abortable),
    (raises(KafkaError.INVALID_TXN_STATE), {}, Abortable),
])
def test_error_classes(fn, kw, expected):
    with pytest.raises(expected):
        TxnCalls(0)("call", fn, **kw)


def test_retriable_errors_are_retried_until_success():
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "x", retriable=True))
        return "ok"

    assert TxnCalls(0)("call", flaky, deadline=time.monotonic() + 30) == "ok"
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
