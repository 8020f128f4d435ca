"""`eopipe verify`: lost and duplicated keys, counted from the topics, never from the workers.

Reads the source topic (read_committed) to its end, then the output topic until every source
key has arrived or no new record came for `settle` seconds, and compares:
  unique_in     distinct well-formed keys in the source
  out           records in the output
  lost          source keys missing from the output
  duplicated    keys present more than once in the output
  unexpected    output keys that never were in the source
  malformed_in  source records without a usable key; dead_lettered counts the DLQ
  aborted_reads output records written by aborted transactions (visible read_uncommitted only)
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from eopipe.keys import KeySpec, MalformedRecord, extract


@dataclass
class Report:
    unique_in: int = 0
    out: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    malformed_in: int = 0
    dead_lettered: int | None = None
    aborted_reads: int | None = None
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        dlq_ok = self.dead_lettered is None or self.dead_lettered >= self.malformed_in
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 and dlq_ok

    def line(self) -> str:
        s = (f"verify: unique_in={self.unique_in} out={self.out} lost={self.lost} "
             f"duplicated={self.duplicated} unexpected={self.unexpected} "
             f"malformed_in={self.malformed_in}")
        if self.dead_lettered is not None:
            s += f" dead_lettered={self.dead_lettered}"
        if self.aborted_reads is not None:
            s += f" aborted_reads={self.aborted_reads}"
        return s + (" OK" if self.ok else " FAILED")

    def to_dict(self) -> dict:
        return dict(asdict(self), ok=self.ok)


class TopicReader:
    """Reads whole topics from the beginning with a throwaway, never-committing consumer."""

    def __init__(self, bootstrap: str, isolation: str = "read_committed", config: dict | None = None):
        self._conf = {"bootstrap.servers": bootstrap, "group.id": f"eopipe-verify-{uuid.uuid4().hex}",
                      "enable.auto.commit": False, "isolation.level": isolation,
                      "enable.partition.eof": True, **(config or {})}

    def read(self, topic: str, *, until_end: bool = True, settle: float = 5.0,
             timeout: float = 120.0, stop=None):
        """Yields the topic's messages.

        until_end: stop once every partition reached the end offset it had when reading
        began (for read_committed, the end is the last stable offset, so an open transaction
        holds the read until it resolves). Otherwise stop after `settle` idle seconds or as
        soon as stop() says so."""
        c = Consumer(self._conf)
        try:
            md = c.list_topics(topic, timeout=30).topics[topic]
            if md.error:
                raise RuntimeError(f"topic {topic!r}: {md.error}")
            tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(md.partitions)]
            ends = {tp.partition: c.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
            pending = {p for p, end in ends.items() if end > 0}
            c.assign(tps)
            deadline = time.monotonic() + timeout
            idle_since = time.monotonic()
            while time.monotonic() < deadline:
                if until_end and not pending:
                    return
                if not until_end and stop is not None and stop():
                    return
                msgs = c.consume(10_000, timeout=0.5)
                got = False
                for m in msgs:
                    err = m.error()
                    if err is None:
                        got = True
                        yield m
                    elif err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= ends[m.partition()]:
                            pending.discard(m.partition())
                    else:
                        raise RuntimeError(f"reading {topic}: {err}")
                if got:
                    idle_since = time.monotonic()
                elif not until_end and time.monotonic() - idle_since >= settle:
                    return
            raise TimeoutError(f"reading {topic} did not finish in {timeout:.0f}s")
        finally:
            c.close()


def backlog(bootstrap: str, group: str, topic: str, timeout: float = 30.0) -> int:
    """0 if `group` has consumed every committed record of `topic`, else the offsets between its
    committed positions and the ends. Where offsets alone can't tell (transaction markers and
    aborted records occupy offsets but are no records), it reads for a committed record."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        parts = sorted(c.list_topics(topic, timeout=timeout).topics[topic].partitions)
        committed = c.committed([TopicPartition(topic, p) for p in parts], timeout=timeout)
        gap = {}
        for tp in committed:
            high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=timeout)[1]
            start = max(tp.offset, 0)
            if start < high:
                gap[tp.partition] = (start, high - start)
        if not gap:
            return 0
        c.assign([TopicPartition(topic, p, start) for p, (start, _) in gap.items()])
        pending = set(gap)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.5):
                if m.error() is None:
                    return sum(n for _, n in gap.values())  # a record not consumed yet
                if m.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(m.partition())
        return 0 if not pending else sum(n for _, n in gap.values())
    finally:
        c.close()


def wait_for_group(bootstrap: str, group: str, topic: str, timeout: float, stop=None) -> float:
    """Waits until `group` has consumed every committed record of `topic`, including records
    written there while waiting (reroutes); returns the seconds it took."""
    t0 = time.monotonic()
    while (behind := backlog(bootstrap, group, topic)) > 0:
        if stop is not None:
            stop()
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"group {group} still ~{behind} offsets behind on {topic} after {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - t0


def verify(bootstrap: str, source_topic: str, output_topic: str, *, key_spec: KeySpec,
           output_key_spec: KeySpec | None = None, dlq_topic: str | None = None,
           settle: float = 10.0, timeout: float = 300.0, count_aborted: bool = True,
           max_examples: int = 5) -> Report:
    rep = Report()
    reader = TopicReader(bootstrap)
    source: set[bytes] = set()
    for m in reader.read(source_topic, timeout=timeout):
        try:
            source.add(extract(key_spec, m.key(), m.value(), m.headers()))
        except MalformedRecord:
            rep.malformed_in += 1
    rep.unique_in = len(source)

    out_spec = output_key_spec or key_spec
    counts: Counter[bytes] = Counter()
    missing = set(source)

    def add(m) -> None:
        k = extract(out_spec, m.key(), m.value(), m.headers())
        counts[k] += 1
        missing.discard(k)

    # The pipeline may still be draining: wait until all keys arrived or output went quiet.
    for m in reader.read(output_topic, until_end=False, settle=settle, timeout=timeout,
                         stop=lambda: not missing):
        add(m)
    # Then read on to the end, so duplicates that trail the last new key are seen too.
    counts.clear()
    missing = set(source)
    for m in reader.read(output_topic, timeout=timeout):
        add(m)
    rep.out = sum(counts.values())
    lost = missing
    dups = [k for k, n in counts.items() if n > 1]
    unexpected = [k for k in counts if k not in source]
    rep.lost, rep.duplicated, rep.unexpected = len(lost), len(dups), len(unexpected)
    rep.examples = {name: [k.decode(errors="replace") for k in list(keys)[:max_examples]]
                    for name, keys in (("lost", lost), ("duplicated", dups), ("unexpected", unexpected))
                    if keys}
    if dlq_topic:
        rep.dead_lettered = sum(1 for _ in reader.read(dlq_topic, timeout=timeout))
    if count_aborted:
        seen = sum(1 for _ in TopicReader(bootstrap, "read_uncommitted").read(output_topic, timeout=timeout))
        rep.aborted_reads = max(0, seen - rep.out)
    return rep
