"""A partition's transactional producer calls, each under a watchdog, and what their errors mean;
what a transaction held and what its commit returns (Counts, Committed).

librdkafka's send_offsets_to_transaction() can block past its timeout when the group
coordinator went away (librdkafka issues #5456/#5511, seen here on a broker restart). So every
transactional call runs on a helper thread under a watchdog; a call that outlives its timeout
by WATCHDOG_GRACE_S wedges the partition, which is then restarted with a new producer (whose
init_transactions fences the stuck one: docs/design.md#fencing). On the commit path (send
offsets, commit, abort) a timeout or the watchdog raises Stalled instead: the partition replaces
its producer and consumer itself, at once, within the transaction timeout.

A commit-path call that outlives its own timeout while a fresh lookup reaches the group
coordinator (`probe`) waits on a coordinator librdkafka decommissioned and cached (#5511: with
three brokers, the killed coordinator dropped from the metadata); nothing will wake it, so it is
given up at once instead of at the watchdog. While the probe fails (every broker down) the call
is left to finish on the broker's return, as it does (docs/design.md#broker-restart).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass
from logging import DEBUG, WARNING

from confluent_kafka import KafkaError, KafkaException

from eopipe.dedup.logs import event

log = logging.getLogger("eopipe.dedup")

FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
API_TIMEOUT_S = 15.0
# One attempt of send_offsets_to_transaction / commit_transaction. A broker restart leaves an
# attempt waiting for a coordinator connection that librdkafka re-checks only on a connection's
# state change; a fresh attempt looks the coordinator up again. A retriable timeout is retried
# (confluent-kafka documents both calls as retriable) until the commit's deadline.
COMMIT_ATTEMPT_S = 2.0
WATCHDOG_GRACE_S = 10.0
# A commit-path call this long past its own timeout is stuck, not slow: probe the coordinator.
PROBE_AFTER_S = 1.0


@dataclass(slots=True)
class Counts:
    """The records of one transaction, by what became of them (added once per polled batch)."""

    consumed: int = 0
    emitted: int = 0
    duplicates: int = 0
    rerouted: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True)
class Committed:
    offset: int          # the committed offset now (== the store's applied offset)
    counts: Counts       # what the transaction held
    seconds: float       # send_offsets_to_transaction + commit_transaction


class Fenced(Exception):
    """Another producer took p's transactional.id: stop p for good."""


class Abortable(Exception):
    """Abort the open transaction and go back to the committed offset."""


class Stopping(Exception):
    """p was told to stop while it was getting ready."""


class Wedged(RuntimeError):
    """A call did not return: restart p with a new producer."""


class ProducerFatal(RuntimeError):
    """A fatal producer error other than fencing (an idempotent producer's
    OUT_OF_ORDER_SEQUENCE_NUMBER after the output's leader was killed, say): this producer can
    do nothing more, and p is restarted with new clients. Known, so one warning, no traceback."""

    def __init__(self, what: str, err: KafkaError):
        super().__init__(f"fatal producer error in {what}: {err}")
        self.code = err.name()
        self.reason = err.str()


def raise_if_fatal(what: str, err: KafkaError) -> None:
    """A fatal producer error as what it means for p: Fenced (a newer owner took p; a restart
    would fence it back) or ProducerFatal; any other error returns to the caller."""
    if err.fatal():
        if err.code() in FENCED_CODES:
            raise Fenced(f"{what}: {err}") from None
        raise ProducerFatal(what, err) from None


class Stalled(Exception):
    """A commit-path call (send_offsets_to_transaction, commit_transaction, abort_transaction)
    timed out or outlived the watchdog: its outcome is unknown. p replaces its producer and
    consumer at once, fences the old producer with init_transactions and resumes from the
    committed offset (docs/design.md#fencing)."""


class _CallThread:
    """Runs calls one at a time on a daemon thread (a stuck call must not block exit)."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, fut = self._q.get()
            if fn is None:
                return
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def submit(self, fn) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((fn, fut))
        return fut

    def shutdown(self) -> None:
        self._q.put((None, None))


class TxnCalls:
    """The transactional calls of partition p's producer."""

    def __init__(self, partition: int, halt: threading.Event | None = None):
        self.p = partition
        self.halt = halt
        # The call stuck inside the producer (the watchdog gave up on it): leave it to the fencing.
        self.stuck_call: concurrent.futures.Future | None = None
        self._thread: _CallThread | None = None

    @property
    def wedged(self) -> bool:
        return self.stuck_call is not None

    def __call__(self, what: str, fn, *, deadline: float | None = None, timeout: float = API_TIMEOUT_S,
                 stall: bool = False, probe=None):
        """Runs `fn` (which waits at most `timeout` itself), retrying retriable errors until
        `deadline` (monotonic; None: no limit) or until p is told to stop.

        Raises Fenced (stop the partition), Abortable (abort and go back), Wedged, Stopping or
        re-raises. With `stall` (the commit path), a timeout, the watchdog or a retriable error
        past the deadline raise Stalled instead: replace the clients, fence, resume. `probe()`
        (with `stall`): True when the group coordinator answers a fresh lookup."""
        delay = 0.1
        if self._thread is None:
            self._thread = _CallThread(f"txn-{self.p}")
        while True:
            fut = self._thread.submit(fn)
            try:
                return self._wait(fut, timeout, probe if stall else None)
            except concurrent.futures.TimeoutError as e:
                self.stuck_call = fut
                msg = f"{what} {e.args[0] if e.args else 'did not return'}"
                if stall:
                    raise Stalled(f"{msg}; replacing the producer") from None
                raise Wedged(f"{msg}; restarting the partition with a new producer") from None
            except KafkaException as e:
                err = e.args[0]
                raise_if_fatal(what, err)
                past = deadline is not None and time.monotonic() >= deadline
                if stall and ((err.code() == KafkaError._TIMED_OUT and not err.retriable()) or (
                        err.retriable() and past)):
                    raise Stalled(f"{what}: {err}") from None
                if err.txn_requires_abort():
                    raise Abortable(f"{what}: {err}") from None
                if self.halt is not None and self.halt.is_set() and deadline is None:
                    raise Stopping(f"{what}: {err}") from None
                if err.retriable() and not past:
                    # One warning per call; its further retries at debug.
                    event(log, WARNING if delay == 0.1 else DEBUG, "retrying transactional call",
                          partition=self.p, call=what, error=str(err))
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5 if stall else 2.0)
                    continue
                raise Abortable(f"{what}: {err}") from None

    @staticmethod
    def _wait(fut: concurrent.futures.Future, timeout: float, probe):
        """fut's result; TimeoutError (saying why) past the watchdog, or with `probe` as soon
        as the coordinator answers while the call is past its own timeout."""
        limit = time.monotonic() + timeout + WATCHDOG_GRACE_S
        if probe is None:
            try:
                return fut.result(timeout + WATCHDOG_GRACE_S)
            except concurrent.futures.TimeoutError:
                raise concurrent.futures.TimeoutError(
                    f"did not return within {timeout + WATCHDOG_GRACE_S:.0f}s") from None
        wait = timeout + PROBE_AFTER_S
        while True:
            try:
                return fut.result(wait)
            except concurrent.futures.TimeoutError:
                pass
            if probe():
                raise concurrent.futures.TimeoutError(
                    f"outlived its {timeout:.0f}s timeout while the group coordinator answers "
                    "(a stale coordinator, librdkafka #5511)") from None
            wait = min(PROBE_AFTER_S, limit - time.monotonic())
            if wait <= 0:
                raise concurrent.futures.TimeoutError(
                    f"did not return within {timeout + WATCHDOG_GRACE_S:.0f}s")

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown()
            self._thread = None


def fencing_was_a_timeout(age_seconds: float, timeout_seconds: float, fixed_ownership: bool,
                          assignment, me: str, p: int) -> bool:
    """A fencing error for a transaction older than the transaction timeout is most likely the
    coordinator's own abort of it (which bumps the epoch; librdkafka reports it as fenced), not a
    new owner, when p is still ours: with fixed ownership (--partitions) always, else by the
    assignment as last read (None: unreadable, so unknown: stay fenced) while not paused. A real
    zombie was moved off p, so it stays fenced."""
    if age_seconds < timeout_seconds:
        return False
    if fixed_ownership:
        return True
    return assignment is not None and p in assignment.partitions_of(me) and not assignment.paused

