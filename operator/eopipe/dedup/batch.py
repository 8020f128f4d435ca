"""A partition's open transaction: begun by its first record, filled by the hot path from the
polled records, committed or aborted here; the runner (dedup/partition.py) decides what an error
means for the partition.

Per record (docs/design.md#one-transaction): extract the key (malformed -> the DLQ), check its
home partition (not p -> reroute it there: docs/design.md#reroute), then per batch look the
rest up (the open transaction's keys, then one multi-get per live segment) and emit the unseen
ones. Nothing is remembered in the store until the transaction commits
(docs/design.md#state-after-commit): until then its keys are only in `pending`; commit() writes
them with the new offset in one RocksDB batch.
"""

from __future__ import annotations

import logging
import time
from logging import WARNING
from typing import Callable

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, TopicPartition

from eopipe.core import native
from eopipe.core import partitioner as partitioners
from eopipe.core.headers import H_OFFSET, H_PARTITION, H_REASON, H_REROUTED, H_TOPIC
from eopipe.core.keys import MalformedRecord, batch_extractor, extractor
from eopipe.dedup import clients, direct
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.logs import event
from eopipe.dedup.partition_store import PartitionStore
from eopipe.dedup.txn import API_TIMEOUT_S, COMMIT_ATTEMPT_S, Abortable, Committed, Counts, TxnCalls, raise_if_fatal

log = logging.getLogger("eopipe.dedup")


class Transaction:
    """The open transaction of partition p, from begin to commit or abort."""

    def __init__(self, cfg: WorkerConfig, partition: int, producer, consumer, store: PartitionStore,
                 calls: TxnCalls, home_count: Callable[[], int], no_dedup: bool, committed: int,
                 after_commit: Callable[[int], None] = lambda p: None, writer=None):
        self.cfg = cfg
        self.p = partition
        self.out_p = partition  # the output partition; -1 once the output turned out too small
        self.producer = producer
        self.consumer = consumer          # its group metadata goes with the offsets
        self.store = store
        self.calls = calls
        self.home_count = home_count      # the partition count of the home check, read per batch
        self.no_dedup = no_dedup          # the test-only fault: every record counts as new
        self.homes = partitioners.get_many(cfg.partitioner)  # the home check, a batch at once
        self.extract = extractor(cfg.key_spec)
        self.extract_many = batch_extractor(cfg.key_spec)  # None: one by one (self.extract)
        self.after_commit = after_commit  # the test-only fault between commit and store write
        self.writer = writer              # the producer's direct.Writer, for a direct.Batch's records
        self.reset(committed)

    def reset(self, committed: int) -> None:
        """After a commit or an abort: empty, ending where it starts (`committed`)."""
        self.committed = committed
        self.open = False
        self.began = time.monotonic()
        self.records = 0
        self.deadline = 0.0
        self.pending: dict[bytes, int] = {}
        self.next_offset = committed
        self.counts = Counts()

    def begin(self) -> None:
        self.calls("begin_transaction", self.producer.begin_transaction)
        self.open = True
        self.began = time.monotonic()
        self.deadline = self.began + self.cfg.commit_interval_ms / 1000

    def process(self, msgs) -> None:
        """The polled records, in three passes over the batch: their keys (malformed -> the
        DLQ), their home partitions at once (elsewhere -> rerouted), then one lookup and the
        emits. Records and keys in two parallel lists: no tuple per record (and less for the
        garbage collector to scan). The per-record steps are compiled (core/native.pyx), and
        with a direct.Batch (records read straight from librdkafka, dedup/direct.pyx) `good`
        holds indexes into it: `rec` gives a record's Message-like copy where one is needed."""
        cfg = self.cfg
        p = self.p
        produce = self.producer.produce
        by_key = cfg.key_spec.kind == "recordKey"  # the record key itself: no call per record
        batch = msgs if type(msgs) is direct.Batch else None
        if batch is not None:
            good, keys, odd, end = batch.split(by_key)  # odd: an error or no key, in order
            rec, values = batch.record, batch.values
        else:
            good, keys, odd, last = native.split(msgs, by_key)
            end = last.offset() + 1 if last is not None else -1
            rec, values = _same, _values
        bad = 0
        for m in odd:
            if m.error() is not None:
                self._consumer_error(m.error())
            else:
                bad += self._dead_letter(produce, m, "record has no key")
        if end < 0:
            return
        if not by_key:  # the whole batch at once where it can be, else one by one
            many = self.extract_many
            keys = batch.json_keys(good, cfg.key_spec.path) if batch is not None and many is not None else None
            if keys is None and many is not None:
                keys = many(values(good))
            if keys is None:
                good, keys, bad = self._keys_one_by_one(produce, good, rec)  # odd held errors only
        n = len(good) + bad
        dead = bad
        rerouted = 0
        nparts = self.home_count()
        if nparts > 1:
            homes = self.homes(keys, nparts)
            if homes.count(p) != len(homes):  # some are not p's: reroute them, keep the rest
                rerouted, failed, good, keys = self._reroute(produce, good, keys, homes, rec)
                dead += failed
        if not self.open:
            self.begin()
        # Dedup: the open transaction's keys, then the store's live segments (store.contains).
        pending = self.pending
        lookup = [k for k in keys if k not in pending] if pending else keys  # a key twice: found twice, no harm
        seen = self.store.contains(lookup) if lookup else set()
        emitted = dups = 0
        i, total = 0, len(good)
        while i < total:
            # To the partition it was read from, not by the producer's partitioner: the output
            # keeps each source partition's order whatever the record key, and right after
            # partition growth no stale partition count places it elsewhere. (An output with
            # fewer partitions: see _produce.)
            if batch is not None:
                i, sent, found = batch.emit(good, keys, i, pending, seen, self.no_dedup, self.writer,
                                            cfg.output_topic, self.out_p, H_REROUTED)
            else:
                i, sent, found = native.emit(good, keys, i, pending, seen, self.no_dedup, produce,
                                             cfg.output_topic, self.out_p, H_REROUTED)
            emitted += sent
            dups += found
            if i < total:  # its produce raised: the helper handles a full queue and errors
                m = rec(good[i])
                hdrs = native.output_headers(m.headers(), H_REROUTED)
                ts = pending[keys[i]]  # emit noted it
                if self._produce(produce, cfg.output_topic, m.value(), m.key(), self.out_p, ts, hdrs, m):
                    emitted += 1
                else:
                    dead += 1
                i += 1
        self._poll(0)
        c = self.counts
        c.consumed += n
        c.emitted += emitted
        c.duplicates += dups
        c.rerouted += rerouted
        c.dead_lettered += dead
        self.records += n
        self.next_offset = end

    def _keys_one_by_one(self, produce, good: list, rec) -> tuple[list, list, int]:
        """(the records with a key, their keys, how many went to the DLQ without one)."""
        extract = self.extract
        kept: list = []
        keys: list = []
        bad = 0
        for x in good:
            m = rec(x)
            try:
                k = extract(m.key(), m.value(), m.headers())
            except MalformedRecord as e:
                bad += self._dead_letter(produce, m, str(e))
                continue
            kept.append(x)
            keys.append(k)
        return kept, keys, bad

    def _reroute(self, produce, good: list, keys: list, homes: list[int], rec) -> tuple[int, int, list, list]:
        """Sends the records whose home is not p to their home partition of the source, marked
        (docs/design.md#reroute); (rerouted, dead-lettered instead, p's records, their keys)."""
        if not self.open:
            self.begin()
        p, src = self.p, self.cfg.source_topic
        mine_m: list = []
        mine_k: list = []
        rerouted = failed = 0
        for x, k, h in zip(good, keys, homes):
            if h == p:
                mine_m.append(x)
                mine_k.append(k)
                continue
            m = rec(x)
            hdrs = list(m.headers() or ())
            hdrs.append((H_REROUTED, f"{p}:{m.offset()}".encode()))
            if self._produce(produce, src, m.value(), m.key(), h, _ts(m), hdrs, m):
                rerouted += 1
            else:
                failed += 1
        return rerouted, failed, mine_m, mine_k

    def _consumer_error(self, err) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise KafkaException(err)
        event(log, WARNING, "consumer error", partition=self.p, error=str(err))

    def _dead_letter(self, produce, m, reason: str) -> int:
        """A malformed record to the dead-letter topic, with where it came from; 1 (a count)."""
        if not self.open:
            self.begin()
        hdrs = list(m.headers() or ()) + _origin(self.cfg.source_topic, m, reason)
        self._produce(produce, self.cfg.dlq_topic, m.value(), m.key(), -1, _ts(m), hdrs, m)
        return 1

    def commit(self, deadline: float | None = None) -> Committed:
        """Sends the offsets and commits, each under the watchdog; then remembers the keys in the
        store, atomically with the new offset, and starts empty there. Raises Abortable, Stalled
        (the outcome is unknown) or Fenced: what they mean for p is the runner's decision."""
        offsets = [TopicPartition(self.cfg.source_topic, self.p, self.next_offset)]
        t0 = time.monotonic()
        # A commit never outlives the transaction timeout: by then the coordinator aborts the
        # transaction and bumps the epoch, so waiting longer cannot help; give up a second
        # before, replace the producer and let its init_transactions settle the transaction.
        stall_by = max(t0 + 1.0, self.began + self.cfg.transaction_timeout_seconds - 1.0)
        deadline = stall_by if deadline is None else min(deadline, stall_by)

        def left() -> float:  # one attempt's timeout: a timed-out attempt is retried (dedup/txn.py)
            return max(1.0, min(COMMIT_ATTEMPT_S, deadline - time.monotonic()))

        producer, consumer = self.producer, self.consumer
        self.calls("send_offsets_to_transaction", lambda: producer.send_offsets_to_transaction(
            offsets, consumer.consumer_group_metadata(), left()), deadline=deadline, timeout=left(),
            stall=True, probe=lambda: clients.coordinator_answers(consumer, offsets[0]))
        self.calls("commit_transaction", lambda: producer.commit_transaction(left()),
                   deadline=deadline, timeout=left(), stall=True)
        seconds = time.monotonic() - t0
        self.after_commit(self.p)
        # Only now is the batch's effect final: remember its keys, atomically with the offset.
        self.store.apply(self.pending, self.next_offset)
        done = Committed(self.next_offset, self.counts, seconds)
        self.reset(self.next_offset)
        return done

    def abort(self, timeout: float | None = None) -> None:
        """Aborts under the watchdog and starts empty at the committed offset (the runner seeks
        the consumer back). Raises Abortable or Stalled (the outcome is unknown), or Fenced."""
        timeout = min(API_TIMEOUT_S, self.cfg.transaction_timeout_seconds if timeout is None else timeout)
        producer = self.producer
        self.calls("abort_transaction", lambda: producer.abort_transaction(timeout), timeout=timeout,
                   deadline=time.monotonic() + timeout, stall=True)
        self.reset(self.committed)

    def _produce(self, produce, topic, value, key, partition, ts, headers, m) -> bool:
        """Sends one record; False: it was too large to send, and a reference to the consumed
        record `m` went to the dead-letter topic instead."""
        while True:
            try:
                if headers:
                    produce(topic, value, key, partition, timestamp=ts, headers=headers)
                else:
                    produce(topic, value, key, partition, timestamp=ts)
                return True
            except BufferError:
                self._poll(0.05)
            except KafkaException as e:
                err = e.args[0]
                if err.code() == KafkaError.MSG_SIZE_TOO_LARGE and value is not None:
                    # Sent again it fails again: the partition would abort and retry forever.
                    # The record stays in the source; the dead letter says where.
                    self._produce(produce, self.cfg.dlq_topic, None, key, -1, ts,
                                  _origin(self.cfg.source_topic, m, f"record too large for {topic}: {err.str()}"), m)
                    return False
                if err.code() == KafkaError._UNKNOWN_PARTITION and partition >= 0 and topic != self.cfg.source_topic:
                    # An output with fewer partitions than the source (not grown with it): the
                    # producer's partitioner places its records from now on; no partition order
                    # is kept there.
                    partition = self.out_p = -1
                    continue
                _raise_for("produce", err)

    def _poll(self, timeout: float) -> None:
        """Serves delivery reports. A failed delivery raises here (a fenced producer's, when a
        newer owner took p): as the produce call's own error would, never as a bare
        KafkaException, which would restart p and fence the newer owner back."""
        try:
            self.producer.poll(timeout)
        except KafkaException as e:
            _raise_for("delivery", e.args[0])


def _raise_for(what: str, err: KafkaError):
    """A producer error as what it means for p: Fenced, ProducerFatal or Abortable."""
    raise_if_fatal(what, err)
    raise Abortable(f"{what}: {err}") from None


def _origin(topic: str, m, reason: str) -> list[tuple[str, bytes]]:
    return [(H_REASON, reason.encode()), (H_TOPIC, topic.encode()),
            (H_PARTITION, str(m.partition()).encode()), (H_OFFSET, str(m.offset()).encode())]


def _same(m):
    return m


def _values(msgs: list) -> list:
    return [m.value() for m in msgs]


def _ts(m) -> int:
    ts_type, ts = m.timestamp()
    return ts if ts_type != TIMESTAMP_NOT_AVAILABLE else 0
