"""Reading the source topic back into a partition's store: the I/O of a recovery plan's replay
and rebuild (dedup/recovery.py decides which; docs/design.md#recovery).

Every record below the committed offset was already emitted, dropped as a duplicate or
rerouted, so a scan only inserts keys and produces nothing. A key counts for p only if p
deduplicated it: its home, by the partition count of the record's time (re-shard history),
was p.
"""

from __future__ import annotations

import logging
import threading
import time
from logging import INFO, WARNING

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, TopicPartition

from eopipe.core import partitioner as partitioners
from eopipe.core.assignment import era_count
from eopipe.core.keys import MalformedRecord, extract
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.logs import event
from eopipe.dedup.recovery import reshard_bounds
from eopipe.dedup.txn import Stopping

log = logging.getLogger("eopipe.dedup")

REPLAY_FLUSH_KEYS = 100_000
STALL_S = 120.0


class SourceReader:
    """Reads of the source topic through partition p's own consumer (assigned by hand)."""

    def __init__(self, consumer, cfg: WorkerConfig, partition: int, halt: threading.Event):
        self.consumer = consumer
        self.cfg = cfg
        self.p = partition
        self.halt = halt

    def retry(self, what: str, fn, attempts: int = 30):
        for i in range(attempts):
            if self.halt.is_set():
                raise Stopping()
            try:
                return fn()
            except KafkaException as e:
                if i == attempts - 1:
                    raise
                event(log, WARNING, "retrying", partition=self.p, call=what, error=str(e.args[0]))
                time.sleep(1)

    def _tp(self, partition: int, offset: int | None = None) -> TopicPartition:
        if offset is None:
            return TopicPartition(self.cfg.source_topic, partition)
        return TopicPartition(self.cfg.source_topic, partition, offset)

    def committed(self) -> int:
        """The group's committed offset for p; < 0: none."""
        return self.retry("committed offset", lambda: self.consumer.committed([self._tp(self.p)], timeout=30)[0].offset)

    def watermarks(self, partition: int) -> tuple[int, int]:
        return self.retry("watermarks", lambda: self.consumer.get_watermark_offsets(self._tp(partition), timeout=30))

    def _offset_since(self, partition: int, since_ms: int, lo: int, end: int) -> int:
        off = self.retry("offsets_for_times", lambda: self.consumer.offsets_for_times(
            [self._tp(partition, since_ms)], timeout=30)[0].offset)
        return end if off < 0 else min(max(off, lo), end)

    def replay(self, store, start: int, end: int, *, reshards, count: int) -> int:
        """Inserts the keys of [start, end) that p deduplicated; the store is then applied up to end."""
        return self._scan(store, self.p, start, end, applied=end, reshards=reshards, count=count)

    def rebuild(self, store, end: int, lo: int, *, since_ms: int, reshards, count: int) -> int:
        """Fills an empty store with the keys of p's records since `since_ms` below `end`. After
        a re-shard within the window, keys that now belong to p may have been deduplicated in
        other partitions before it: those partitions' history (below their re-shard boundary,
        records they processed at home) is scanned too."""
        start = self._offset_since(self.p, since_ms, lo, end)
        bounds = reshard_bounds(reshards, self.p)
        event(log, WARNING, "rebuilding dedup state from the source topic", partition=self.p,
              start=start, end=end, other_partitions=sorted(bounds))
        n = 0
        for q, bound in sorted(bounds.items()):
            qlo, _ = self.watermarks(q)
            n += self._scan(store, q, self._offset_since(q, since_ms, qlo, bound), bound, applied=None,
                            reshards=reshards, count=count, target=self.p)
        # Starting at the log start, retention dropped part of the window: the store notes from
        # when it is complete (its effective window).
        return n + self._scan(store, self.p, start, end, applied=end, reshards=reshards, count=count,
                              partial_coverage=lo > 0 and start == lo)

    def _scan(self, store, partition: int, start: int, end: int, *, applied: int | None, reshards,
              count: int, target: int | None = None, partial_coverage: bool = False) -> int:
        if start >= end:
            store.apply({}, applied)
            return 0
        event(log, INFO, "replaying source into state", partition=self.p, source_partition=partition,
              start=start, end=end)
        self.consumer.assign([self._tp(partition, start)])
        home = partitioners.get(self.cfg.partitioner)
        spec = self.cfg.key_spec
        entries: dict[bytes, int] = {}
        covered_since = None
        n = 0
        last = start - 1
        done = False
        idle_deadline = time.monotonic() + STALL_S
        while not done:
            if self.halt.is_set():
                raise Stopping()
            msgs = self.consumer.consume(self.cfg.consume_batch, 0.5)
            if msgs:
                idle_deadline = time.monotonic() + STALL_S
            elif time.monotonic() > idle_deadline:
                raise RuntimeError(f"replay of partition {partition} stalled at offset {last + 1} < {end}")
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True  # the end of the committed data: nothing more below `end`
                        break
                    raise KafkaException(err)
                off = m.offset()
                if off >= end:
                    done = True
                    break
                last = off
                n += 1
                ts_type, ts = m.timestamp()
                if covered_since is None and partial_coverage:
                    covered_since = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else int(time.time() * 1000)
                try:
                    k = extract(spec, m.key(), m.value(), m.headers())
                except MalformedRecord:
                    continue
                cnt = era_count(reshards, partition, off, count) if reshards else count
                if home(k, cnt) != partition:
                    continue  # rerouted, not deduplicated here
                if target is not None and home(k, count) != target:
                    continue
                entries[k] = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else 0
            if len(entries) >= REPLAY_FLUSH_KEYS:
                store.apply(entries, last + 1 if applied is not None else None,
                            covered_since_ms=covered_since)
                entries = {}
        store.apply(entries, applied, covered_since_ms=covered_since)
        return n
