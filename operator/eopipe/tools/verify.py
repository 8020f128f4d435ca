"""`eopipe verify`: lost and duplicated keys, counted from the topics, never from the workers.

Reads the source topic (read_committed) to its end, then the output topic until every source
key has arrived or no new record came for `settle` seconds, and compares:
  unique_in     distinct well-formed keys in the source
  out           records in the output
  lost          source keys missing from the output
  duplicated    keys present more than once in the output
  unexpected    output keys that never were in the source
  out_of_order  output records placed before a record whose key came earlier in the
                same-numbered source partition (a key keeps its partition, so the dedup stage
                keeps each source partition's order); checked only where that is promised:
                output and source with as many partitions, and not order=False (a Spark sink)
  malformed_in  source records without a usable key; dead_lettered counts the DLQ
  too_large     source keys not in the output because their record was too large to send:
                the DLQ holds a reference (no value, origin headers) to where it stays in the
                source, and the source record there holds that key
  aborted_reads output records written by aborted transactions (visible read_uncommitted only)

The timeout bounds the whole run. When it cannot finish (Kafka unreachable, a topic missing,
a read that does not reach its end in time, e.g. behind an open transaction) it raises
Incomplete: no verdict either way.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from eopipe.core.headers import H_OFFSET, H_PARTITION, H_REROUTED, H_TOPIC
from eopipe.core.kafkaconf import OFFSETS_NOW
from eopipe.core.keys import KeySpec, MalformedRecord, extract

# librdkafka's own log lines (a refused connection, ...) go here rather than straight to stderr:
# they reach the application's logging if it has any, else nowhere; Incomplete says what failed.
_KAFKA_LOG = logging.getLogger("eopipe.verify.kafka")
_KAFKA_LOG.addHandler(logging.NullHandler())


class Incomplete(TimeoutError):
    """The topics could not be read to a verdict within the timeout; str() says what is missing."""


def _kafka_error(e: KafkaException) -> str:
    err = e.args[0] if e.args else None
    return err.str() if isinstance(err, KafkaError) else str(e)


# Errors of a cluster in motion (a leader or group coordinator moving, not yet elected or still
# loading), not of the request.
_TRANSIENT = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.BROKER_NOT_AVAILABLE, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
})


def transient(e: KafkaException) -> bool:
    """Whether `e` says the cluster is in motion (ask again soon) rather than the request is wrong."""
    err = e.args[0] if e.args else None
    return isinstance(err, KafkaError) and err.code() in _TRANSIENT


@dataclass
class Report:
    unique_in: int = 0
    out: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    out_of_order: int | None = None
    malformed_in: int = 0
    dead_lettered: int | None = None
    too_large: int = 0  # keys whose record went to the DLQ as a reference: too large to send
    aborted_reads: int | None = None
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        dlq_ok = self.dead_lettered is None or self.dead_lettered >= self.malformed_in + self.too_large
        return (self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 and not self.out_of_order
                and dlq_ok)

    def line(self) -> str:
        s = (f"verify: unique_in={self.unique_in} out={self.out} lost={self.lost} "
             f"duplicated={self.duplicated} unexpected={self.unexpected} "
             f"malformed_in={self.malformed_in}")
        if self.out_of_order is not None:
            s += f" out_of_order={self.out_of_order}"
        if self.dead_lettered is not None:
            s += f" dead_lettered={self.dead_lettered}"
        if self.too_large:
            s += f" too_large={self.too_large}"
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
                      "enable.partition.eof": True, "logger": _KAFKA_LOG,
                      # not librdkafka's 1 s pause whenever the prefetch queue is full
                      "fetch.queue.backoff.ms": 10, **(config or {})}
        self.partitions: dict[str, int] = {}  # topic -> partition count, of the topics read

    def read(self, topic: str, *, until_end: bool = True, settle: float = 5.0,
             timeout: float = 120.0, stop=None, deadline: float | None = None, settled: bool = False):
        """Yields the topic's messages; Incomplete if it cannot finish by `deadline` (a
        time.monotonic() value; default: `timeout` seconds from now), metadata included.

        until_end: stop once every partition reached the end offset it had when reading
        began. For read_committed that end is the last stable offset: records of transactions
        still open are not waited for, unless `settled`, which takes the high watermark as the
        end, so every transaction open when reading began must resolve first. Otherwise stop
        after `settle` idle seconds or as soon as stop() says so."""
        deadline = time.monotonic() + timeout if deadline is None else deadline

        def left() -> float:
            return max(0.1, deadline - time.monotonic())
        c = Consumer(self._conf)
        try:
            tps, ends = self._layout(c, topic, left, deadline, settled)
            pending = {p for p, end in ends.items() if end > 0}
            reached: dict[int, int] = {}  # partition -> the offset read up to
            stable: dict[int, int] = {}  # partition -> where it ended (read_committed: the last stable offset)
            c.assign(tps)
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
                        reached[m.partition()] = m.offset() + 1
                        yield m
                    elif err.code() == KafkaError._PARTITION_EOF:
                        stable[m.partition()] = m.offset()
                        if m.offset() >= ends[m.partition()]:
                            pending.discard(m.partition())
                    else:
                        raise Incomplete(f"reading {topic}: {err.str()}")
                if got:
                    idle_since = time.monotonic()
                elif not until_end and time.monotonic() - idle_since >= settle:
                    return
            if not until_end:
                raise Incomplete(f"{topic} was still receiving records when time ran out")
            raise Incomplete(f"{topic} was not read to its end: " + "; ".join(
                f"partition {p} at offset {stable.get(p, reached.get(p, 0))} of {ends[p]}"
                + (" (an open transaction holds read_committed readers there)" if p in stable else "")
                for p in sorted(pending)))
        finally:
            c.close()


    def at(self, topic: str, positions: list[tuple[int, int]], deadline: float) -> list:
        """The records at these (partition, offset) positions; none for a position whose record
        is gone (retention), aborted, or past the end."""
        c = Consumer(self._conf)
        got = []
        try:
            for p, o in sorted(set(positions)):
                c.assign([TopicPartition(topic, p, o)])
                while time.monotonic() < deadline:
                    msgs = c.consume(1, 1.0)
                    if msgs and msgs[0].error() is None:
                        if msgs[0].offset() == o:
                            got.append(msgs[0])
                        break
                    if msgs and msgs[0].error().code() == KafkaError._PARTITION_EOF:
                        break
        finally:
            c.close()
        return got

    def _layout(self, c: Consumer, topic: str, left, deadline: float, settled: bool):
        """The topic's partitions and the offsets to read them to. A broker that just restarted
        answers for a few seconds with no leader: that is retried until the deadline."""
        while True:
            try:
                md = c.list_topics(topic, timeout=left()).topics.get(topic)
                if md is None:
                    raise Incomplete(f"topic {topic}: not found")
                if md.error:
                    raise KafkaException(md.error)
                tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(md.partitions)]
                self.partitions[topic] = len(tps)
                return tps, self._ends(c, tps, left, settled)
            except KafkaException as e:
                if not transient(e) or time.monotonic() + 1 >= deadline:
                    raise Incomplete(f"topic {topic}: {_kafka_error(e)}") from None
                time.sleep(1)

    def _ends(self, c: Consumer, tps: list[TopicPartition], left, settled: bool) -> dict[int, int]:
        if settled and self._conf["isolation.level"] == "read_committed":
            c = Consumer({**self._conf, "isolation.level": "read_uncommitted"})  # its ends: high watermarks
            try:
                return {tp.partition: c.get_watermark_offsets(tp, timeout=left())[1] for tp in tps}
            finally:
                c.close()
        return {tp.partition: c.get_watermark_offsets(tp, timeout=left())[1] for tp in tps}


def backlog(bootstrap: str, group: str, topic: str, timeout: float = 30.0) -> int:
    """0 if `group` has consumed every committed record of `topic`, else the offsets between its
    committed positions and the ends. Where offsets alone can't tell (transaction markers and
    aborted records occupy offsets but are no records), it reads for a committed record."""
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    c = Consumer({**conf, "enable.partition.eof": True, "isolation.level": "read_committed"})
    offsets = Consumer({**conf, **OFFSETS_NOW})
    try:
        parts = sorted(c.list_topics(topic, timeout=timeout).topics[topic].partitions)
        committed = offsets.committed([TopicPartition(topic, p) for p in parts], timeout=timeout)
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
        offsets.close()
        c.close()


def _backlog_or_unknown(bootstrap: str, group: str, topic: str) -> int | None:
    try:
        return backlog(bootstrap, group, topic)
    except KafkaException as e:
        if not transient(e):
            raise
        return None


def wait_for_group(bootstrap: str, group: str, topic: str, timeout: float, stop=None) -> float:
    """Waits until `group` has consumed every committed record of `topic`, including records
    written there while waiting (reroutes); returns the seconds it took. A group coordinator
    still loading after a broker restart counts as not there yet."""
    t0 = time.monotonic()
    while (behind := _backlog_or_unknown(bootstrap, group, topic)) != 0:
        if stop is not None:
            stop()
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"group {group} still ~{behind} offsets behind on {topic} after {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - t0


class OrderCheck:
    """Order within a partition: walking an output partition, the source offsets of its keys'
    first occurrences in the same-numbered source partition must only grow. A source record
    the worker rerouted away (its copy elsewhere names it in the reroute header) is not where
    its key was taken from, so it does not count: after partition growth a misplaced record
    may be rerouted twice and reach the output from a later copy in the partition it started
    in. Keys that did not come through that source partition are not ordered against it."""

    def __init__(self):
        self._seen: dict[tuple[int, bytes], int | list[int]] = {}  # (partition, key) -> offset(s)
        self._away: set[tuple[int, int]] = set()                    # (partition, offset) rerouted
        self._first: dict[tuple[int, bytes], int] | None = None
        self._last: dict[int, int] = {}
        self.violations = 0
        self.examples: list[bytes] = []

    def source(self, partition: int, offset: int, key: bytes, headers) -> None:
        at = self._seen.setdefault((partition, key), offset)
        if at != offset:
            self._seen[(partition, key)] = [*(at if isinstance(at, list) else [at]), offset]
        for name, value in headers or ():
            if name == H_REROUTED and value:
                p, _, o = value.decode(errors="replace").partition(":")
                if p.isdigit() and o.isdigit():
                    self._away.add((int(p), int(o)))

    def _first_offsets(self) -> dict[tuple[int, bytes], int]:
        away, first = self._away, {}
        for (p, k), at in self._seen.items():
            kept = [o for o in (at if isinstance(at, list) else [at]) if (p, o) not in away]
            if kept:
                first[(p, k)] = min(kept)
        return first

    def see(self, partition: int, key: bytes) -> None:
        if self._first is None:
            self._first, self._seen = self._first_offsets(), {}
        at = self._first.get((partition, key))
        if at is None:
            return
        if at < self._last.get(partition, -1):
            self.violations += 1
            if len(self.examples) < 5:
                self.examples.append(key)
        else:
            self._last[partition] = at


def _header(m, name: str) -> bytes | None:
    return next((v for k, v in m.headers() or () if k == name), None)


def _key_or_none(spec: KeySpec, m) -> bytes | None:
    try:
        return extract(spec, m.key(), m.value(), m.headers())
    except MalformedRecord:
        return None


def verify(bootstrap: str, source_topic: str, output_topic: str, *, key_spec: KeySpec,
           output_key_spec: KeySpec | None = None, dlq_topic: str | None = None,
           settle: float = 10.0, timeout: float = 300.0, count_aborted: bool = True,
           order: bool = True, max_examples: int = 5) -> Report:
    rep = Report()
    deadline = time.monotonic() + timeout
    reader = TopicReader(bootstrap)
    source: set[bytes] = set()
    order_check = OrderCheck()
    for m in reader.read(source_topic, deadline=deadline, settled=True):
        try:
            k = extract(key_spec, m.key(), m.value(), m.headers())
        except MalformedRecord:
            rep.malformed_in += 1
            continue
        source.add(k)
        if order:
            order_check.source(m.partition(), m.offset(), k, m.headers())
    rep.unique_in = len(source)

    out_spec = output_key_spec or key_spec
    counts: Counter[bytes] = Counter()
    missing = set(source)

    def add(m) -> bytes:
        k = extract(out_spec, m.key(), m.value(), m.headers())
        counts[k] += 1
        missing.discard(k)
        return k

    # The pipeline may still be draining: wait until all keys arrived or output went quiet.
    for m in reader.read(output_topic, until_end=False, settle=settle, deadline=deadline,
                         stop=lambda: not missing):
        add(m)
    # Then read on to the end, so duplicates that trail the last new key are seen too.
    counts.clear()
    missing = set(source)
    check_order, order = order, order_check
    for m in reader.read(output_topic, deadline=deadline, settled=True):
        order.see(m.partition(), add(m))
    if check_order and reader.partitions[output_topic] == reader.partitions[source_topic]:
        rep.out_of_order = order.violations
    rep.out = sum(counts.values())
    lost = missing
    if dlq_topic:
        # A record too large to send is dead-lettered as a reference to where it stays in the
        # source: its key is accounted for if that source record really holds it.
        rep.dead_lettered, refs = 0, []
        for m in reader.read(dlq_topic, deadline=deadline):
            rep.dead_lettered += 1
            at = _header(m, H_PARTITION), _header(m, H_OFFSET)
            if m.value() is None and _header(m, H_TOPIC) == source_topic.encode() and None not in at:
                refs.append((int(at[0]), int(at[1])))
        if refs and lost:
            held = {_key_or_none(key_spec, r) for r in reader.at(source_topic, refs, deadline)}
            rep.too_large = len(lost & held)
            lost = lost - held
    dups = [k for k, n in counts.items() if n > 1]
    unexpected = [k for k in counts if k not in source]
    rep.lost, rep.duplicated, rep.unexpected = len(lost), len(dups), len(unexpected)
    rep.examples = {name: [k.decode(errors="replace") for k in list(keys)[:max_examples]]
                    for name, keys in (("lost", lost), ("duplicated", dups), ("unexpected", unexpected),
                                       ("out_of_order", order.examples)) if keys}
    if count_aborted:
        seen = sum(1 for _ in TopicReader(bootstrap, "read_uncommitted").read(output_topic, deadline=deadline))
        rep.aborted_reads = max(0, seen - rep.out)
    return rep
