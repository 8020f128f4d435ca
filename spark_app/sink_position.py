"""Where the exactly-once Kafka sink stands, from its markers: the start of a query that has
no checkpoint (lost, or deleted on purpose) over a sink that already holds output.

A query without a checkpoint is a new run: it starts at `startingOffsets` and, from the
earliest offset, would write everything again. Every committed marker of a narrow plan's unit
(`src-<p>`, or `task-0` of a one-task batch) names the source ranges its rows came from, in the
same transaction as the rows,
so the sink holds partition p's records exactly up to the largest `until` of p's markers
(Spark runs a partition's batches in order and starts batch B+1 only once every unit of B
committed). Starting there continues the output with no gap and no duplicate. A stateful
plan's units (`task-<i>`, by shuffle partition) name no source range: their sink position is
unknown, and such a query starts at `startingOffsets` as before (docs/design.md says so).

`plan_start` and `unplanned_leftovers` are the pure parts; `read_markers`, `end_offsets`,
`watermarks` and `clear_unplanned_checkpoint` do the I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping

EARLIEST, LATEST = -2, -1  # Spark's startingOffsets JSON codes


@dataclass(frozen=True)
class StartPlan:
    offsets: dict[int, int]  # source partition -> first offset to read (or EARLIEST/LATEST)
    from_markers: dict[int, int]  # the partitions the markers placed, and where
    problems: tuple[str, ...] = ()

    def spark_json(self, topic: str) -> str:
        return json.dumps({topic: {str(p): o for p, o in sorted(self.offsets.items())}})


def plan_start(markers: Iterable[dict], topic: str, partitions: Mapping[int, int], default: str) -> StartPlan:
    """markers: decoded marker values (latest per key, any query id); partitions: the source
    topic's partitions now, each with its end offset (high watermark); default: the query's
    startingOffsets for partitions no marker names.

    Markers past a partition's end, or naming a partition the topic no longer has, were written
    from a topic of that name deleted and made again since: no offset of the new one continues
    them, and starting there would read nothing for as long as the old offsets are ahead."""
    ends: dict[int, int] = {}
    parts: dict[tuple[int, int, str | None], list[tuple[int, int, int]]] = {}
    problems = []
    for m in markers:
        try:
            ranges = [(int(r["partition"]), int(r["from"]), int(r["until"]))
                      for r in m.get("source") or () if r.get("topic") == topic]
            split = (int(m["batch"]), m.get("query"), int(m["parts"])) if m.get("parts") else None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            problems.append(f"marker {m.get('unit')!r} has a malformed source range ({type(e).__name__}: {e})")
            continue
        for p, start, until in ranges:
            ends[p] = max(ends.get(p, until), until)
            if split:
                parts.setdefault((p, split[0], split[1]), []).append((start, until, split[2]))
    for (p, batch, _q), got in sorted(parts.items()):
        # A range Spark split into parts: its batch is written only if every part is.
        if max(u for _, u, _ in got) == ends[p] and len(got) < got[0][2]:
            problems.append(f"source partition {p}: batch {batch} committed {len(got)} of its "
                            f"{got[0][2]} parts; no single offset resumes it exactly")
    for p, until in sorted(ends.items()):
        if p not in partitions or until > partitions[p]:
            now = f"ends at offset {partitions[p]}" if p in partitions else "has no such partition"
            problems.append(f"source partition {p}: the sink holds its records up to offset {until}, but {topic} "
                            f"{now}: the topic was deleted and made again since the sink wrote; to start over, "
                            "delete the commit topic or set spec.processing.upgradeMode to reprocess")
    base = EARLIEST if default == "earliest" else LATEST
    offsets = {p: ends.get(p, base) for p in partitions}
    return StartPlan(offsets, {p: o for p, o in ends.items() if p in offsets}, tuple(problems))


# ----------------------------------------------------------------------------------- I/O

# Broker answers of a cluster in motion (a partition's leader not yet known to the broker asked,
# just after the topic's creation or a failover), not of a wrong request: ask again.
_MOVING = ("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART",
           "REPLICA_NOT_AVAILABLE", "BROKER_NOT_AVAILABLE", "_TRANSPORT")


def watermarks(consumer, tp, timeout: float) -> tuple[int, int]:
    """(low, high) of `tp` now, asked again while the cluster is in motion, up to `timeout`."""
    import time

    from confluent_kafka import KafkaError, KafkaException

    moving = {getattr(KafkaError, name) for name in _MOVING}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()),
                                                  cached=False)
        except KafkaException as e:
            if e.args[0].code() not in moving or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def read_markers(client_config: dict, commit_topic: str, timeout: float = 60.0) -> list[dict]:
    """The latest committed marker per key in the commit topic (read_committed, to the end)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    c = Consumer({**client_config, "group.id": f"{commit_topic}.position", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        md = c.list_topics(commit_topic, timeout=timeout).topics[commit_topic]
        if md.error is not None:
            raise KafkaException(md.error)
        tps = [TopicPartition(commit_topic, p, 0) for p in md.partitions]
        ends = {tp.partition: watermarks(c, tp, timeout) for tp in tps}
        pending = {p for p, (low, high) in ends.items() if high > low}
        c.assign([TopicPartition(commit_topic, p, ends[p][0]) for p in pending])
        latest: dict[bytes, dict] = {}
        while pending:
            m = c.poll(timeout)
            if m is None:
                raise TimeoutError(f"reading {commit_topic}: no message in {timeout:.0f}s")
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                # All that is committed now (an open transaction of a driver that is gone
                # ends at its timeout or when our tasks' producers fence it).
                pending.discard(m.partition())
                continue
            if m.value() is not None:
                try:
                    latest[m.key()] = json.loads(m.value())
                except ValueError:
                    raise ValueError(f"{commit_topic}[{m.partition()}]@{m.offset()}: marker {m.key()!r} "
                                     "is not JSON") from None
            if m.offset() + 1 >= ends[m.partition()][1]:
                pending.discard(m.partition())
        return list(latest.values())
    finally:
        c.close()


def end_offsets(client_config: dict, topic: str, timeout: float = 60.0) -> dict[int, int]:
    """Each partition of `topic` with its high watermark now."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**client_config, "group.id": f"{topic}.ends", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=timeout).topics[topic]
        return {p: watermarks(c, TopicPartition(topic, p), timeout)[1] for p in md.partitions}
    finally:
        c.close()


# Under a checkpoint, what Spark writes for batches; `metadata` (the query's id) is apart.
BATCH_DIRS = ("offsets", "commits", "state", "sources")


def unplanned_leftovers(listing: Mapping[str, Iterable[str]]) -> list[str] | None:
    """What to remove from a checkpoint whose offset log holds no batch (`listing`: each of
    BATCH_DIRS there -> the names in it), as `dir/name`; None once a batch is logged (Spark
    resumes it). A driver stopped while planning its first batch leaves `offsets/.0.<uuid>.tmp`
    (Hadoop's write-then-rename; on S3 the rename is a copy) and the Kafka source's `sources/0/0`: Spark
    then refuses every new start there (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), and a kept
    `sources/0/0` would replace the start planned here with that driver's."""
    if _batch_logged(listing.get("offsets", ())):
        return None
    return [f"{d}/{name}" for d in BATCH_DIRS for name in sorted(listing.get(d, ()))]


def _batch_logged(offsets: Iterable[str]) -> bool:
    """A batch file in the offset log (Spark's temp and checksum files are hidden)."""
    return any(not name.startswith(".") for name in offsets)


def clear_unplanned_checkpoint(spark, location: str) -> tuple[bool, list[str]]:
    """Whether no batch was ever planned at `location` (Spark would start at startingOffsets),
    and what a stopped first batch had left there, now removed. Through Hadoop's file system,
    so a path and an s3a:// URI are read alike."""
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(location.rstrip("/"))
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def names(d: str) -> list[str]:
        path = jvm.org.apache.hadoop.fs.Path(root, d)
        return [st.getPath().getName() for st in fs.listStatus(path)] if fs.exists(path) else []

    # The offset log first: a checkpoint that has batches (every start but the first) reads no more.
    offsets = names("offsets")
    if _batch_logged(offsets):
        return False, []
    gone = unplanned_leftovers({"offsets": offsets, **{d: names(d) for d in BATCH_DIRS if d != "offsets"}}) or []
    for rel in gone:
        fs.delete(jvm.org.apache.hadoop.fs.Path(root, rel), True)
    return True, gone
