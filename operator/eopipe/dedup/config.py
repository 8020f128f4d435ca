"""Typed configuration of the dedup worker, and the partition assignment it follows."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from eopipe.keys import KeySpec


def parse_partitions(text: str) -> list[int]:
    """`0,1,2` or ranges `0-3,7`."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        if sep:
            out.update(range(int(lo), int(hi) + 1))
        else:
            out.add(int(part))
    if any(p < 0 for p in out):
        raise ValueError(f"negative partition in {text!r}")
    return sorted(out)


@dataclass
class WorkerConfig:
    bootstrap: str
    source_topic: str
    output_topic: str
    pipeline: str
    namespace: str = "default"
    dlq_topic: str | None = None
    # Ownership: a fixed list, or the operator's assignment (dedup/assignment_source.py).
    partitions: list[int] | None = None
    assignment_file: Path | None = None
    assignment_configmap: str | None = None
    pod_name: str | None = None
    key_spec: KeySpec = field(default_factory=KeySpec)
    window_seconds: float = 24 * 3600.0
    segments: int = 4                       # the window is kept in this many time segments (+1 open)
    partitioner: str = "murmur2"
    state_dir: Path = Path("/var/lib/eopipe")
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    commit_interval_ms: int = 100
    max_batch: int = 20_000                 # records per transaction at most
    consume_batch: int = 5_000              # records per consume() call at most
    memory_mb: int = 256                    # RocksDB block cache + memtables, whole process
    metadata_refresh_seconds: float = 10.0  # how often the source partition count is re-read
    handoff_timeout_seconds: float = float(os.environ.get("EOPIPE_HANDOFF_TIMEOUT_SECONDS", "120"))
    kafka_config: dict[str, str] = field(default_factory=dict)  # extra client settings (security)

    def __post_init__(self) -> None:
        follows = self.assignment_file is not None or self.assignment_configmap is not None
        if (self.partitions is None) != follows:
            raise ValueError("give either --partitions, or --assignment-file and/or --assignment-configmap")
        if follows and not self.pod_name:
            raise ValueError("an assignment needs --pod-name (or env POD_NAME)")
        if self.window_seconds <= 0:
            raise ValueError("the dedup window must be positive")
        if self.segments < 1:
            raise ValueError("segments must be >= 1")
        if self.commit_interval_ms < 1 or self.max_batch < 1 or self.consume_batch < 1:
            raise ValueError("commit interval and batch sizes must be positive")
        if self.memory_mb < 8:
            raise ValueError("memory budget must be at least 8 MiB")
        self.state_dir = Path(self.state_dir)
        if not self.dlq_topic:
            # Malformed records are never dropped: without an explicit DLQ they go here.
            self.dlq_topic = f"{self.source_topic}.dlq"
        if self.assignment_file is not None:
            self.assignment_file = Path(self.assignment_file)

    @property
    def group_id(self) -> str:
        return f"{self.namespace}.{self.pipeline}.dedup"

    def transactional_id(self, partition: int) -> str:
        return f"{self.namespace}.{self.pipeline}.dedup.{partition}"

    @property
    def window_ms(self) -> int:
        return int(self.window_seconds * 1000)

    @property
    def segment_ms(self) -> int:
        return max(1, self.window_ms // self.segments)

    @property
    def me(self) -> str:
        return self.pod_name or "local"


def default_http_host() -> str:
    return os.environ.get("POD_IP") or "127.0.0.1"
