"""What a Spark stage has done, read without it: a file sink's rows through Spark's own reader
(which honours `_spark_metadata`, so files of uncommitted batches are not counted), and the
source offsets of a checkpoint's last committed batch."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition


def reader_script(path: str, fmt: str, columns: list[str]) -> str:
    """Python that reads a file sink's output with a local Spark and prints a line per row:
    `ROW ` and the row's columns as JSON."""
    return ("import json\n"
            "from pyspark.sql import SparkSession\n"
            "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled','false').getOrCreate()\n"
            f"for r in s.read.format({fmt!r}).load({path!r}).select(*{columns!r}).collect():\n"
            "    print('ROW ' + json.dumps(list(r), default=str))\n"
            "print('END')\n")


def parse_rows(out: str) -> list[list]:
    """The rows a reader_script printed; fails unless it printed them all."""
    lines = out.splitlines()
    assert "END" in lines, out[-3000:]
    return [json.loads(ln[4:]) for ln in lines if ln.startswith("ROW ")]


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in sorted(parts)}
    finally:
        c.close()


def checkpoint_offsets(checkpoint: Path) -> dict[int, int] | None:
    """The source offsets after the last committed batch of a checkpoint."""
    last = latest_batch(checkpoint, "commits")
    if last is None:
        return None
    lines = (checkpoint / "offsets" / str(last)).read_text().splitlines()
    offsets = json.loads(lines[-1])
    (topic_offsets,) = offsets.values()
    return {int(p): o for p, o in topic_offsets.items()}


def latest_batch(checkpoint: Path, log: str) -> int | None:
    """The newest batch id in a checkpoint's offsets or commits log."""
    return max((int(p.name) for p in (checkpoint / log).glob("[0-9]*")), default=None)
