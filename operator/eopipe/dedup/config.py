"""Typed configuration of the dedup worker, and the partition assignment it follows."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from eopipe.core import defaults, names
from eopipe.core.keys import KeySpec
from eopipe.core.spec import DNS1123_LABEL
from eopipe.dedup import snapshot

_LABEL = DNS1123_LABEL.strip("^$")
IDENTITY_PATTERN = f"{_LABEL}/{_LABEL}"  # spec.restoreFrom's namespace/name


def parse_partitions(text: str) -> list[int]:
    """`0,1,2` or ranges `0-3,7`; ValueError says what is wrong."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (hi.isdigit() if sep else True)):
            raise ValueError(f"bad partitions {text!r}: expected partition numbers and ranges like 0,1,2 or 0-5")
        if sep and int(lo) > int(hi):
            raise ValueError(f"bad partitions {text!r}: the range {part} is empty (write it {hi}-{lo})")
        out.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    if not out:
        raise ValueError(f"bad partitions {text!r}: no partition given")
    return sorted(out)


@dataclass
class WorkerConfig:
    bootstrap: str
    source_topic: str
    output_topic: str
    pipeline: str
    namespace: str = "default"
    # The pipeline whose consumer group and transactional ids these are, "<namespace>/<pipeline>":
    # None is this one; a restored pipeline's is the one it continues (core/names.py).
    identity: str | None = None
    dlq_topic: str | None = None
    # Ownership: a fixed list, or the operator's assignment (dedup/assignment_source.py).
    partitions: list[int] | None = None
    assignment_file: Path | None = None
    assignment_configmap: str | None = None
    pod_name: str | None = None
    key_spec: KeySpec = field(default_factory=KeySpec)
    window_seconds: float = float(defaults.WINDOW_SECONDS)
    segments: int = 4                       # the window is kept in this many time segments (+1 open)
    partitioner: str = "murmur2"
    state_dir: Path = Path(defaults.STATE_DIR)
    http_host: str = "127.0.0.1"
    http_port: int = names.DEDUP_HTTP_PORT
    commit_interval_ms: int = 100
    max_batch: int = 20_000                 # records per transaction at most
    consume_batch: int = 5_000              # records per consume() call at most
    memory_mb: int = 256                    # RocksDB block cache + memtables, whole process
    metadata_refresh_seconds: float = 10.0  # how often the source partition count is re-read
    handoff_timeout_seconds: float = 120.0
    # The producers' transaction.timeout.ms, and the bound of a stalled commit before the
    # partition replaces its clients (docs/design.md#fencing).
    transaction_timeout_seconds: float = 60.0
    kafka_config: dict[str, str] = field(default_factory=dict)  # extra client settings (security)
    # The pipeline's bearer token of the state endpoints (dedup/auth.py); without it they are
    # refused, unless insecure_state_endpoints serves them open (local runs only).
    token: str | None = field(default=None, repr=False)
    insecure_state_endpoints: bool = False
    # Snapshots of the state in an object store (dedup/backup.py): s3://bucket/prefix, every
    # interval, the newest `retention` kept; credentials from env AWS_ACCESS_KEY_ID/
    # AWS_SECRET_ACCESS_KEY, the endpoint of an S3-compatible store (None: AWS's).
    backup_uri: str | None = None
    backup_interval_seconds: float = defaults.BACKUP_INTERVAL_SECONDS
    backup_retention: int = defaults.BACKUP_RETENTION
    backup_endpoint: str | None = None
    # The pipeline's manifest (the assignment ConfigMap's pipeline.yaml), kept beside the snapshots.
    pipeline_manifest: Path | None = None

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
        if not 1 <= self.transaction_timeout_seconds <= 900:
            raise ValueError("the transaction timeout must be between 1 and 900 seconds")
        if self.token is not None and self.insecure_state_endpoints:
            raise ValueError("--insecure-state-endpoints with a token (EOPIPE_TOKEN or --token-file): give one or the other")
        if self.memory_mb < 8:
            raise ValueError("memory budget must be at least 8 MiB")
        if self.backup_uri is not None:
            snapshot.parse_uri(self.backup_uri)
        if self.identity is not None and not re.fullmatch(IDENTITY_PATTERN, self.identity):
            raise ValueError(f"--identity {self.identity!r}: expected NAMESPACE/PIPELINE")
        if self.backup_interval_seconds < 1 or self.backup_retention < 1:
            raise ValueError("the backup interval must be at least 1 s and the retention at least 1")
        self.state_dir = Path(self.state_dir)
        if not self.dlq_topic:
            # Malformed records are never dropped: without an explicit DLQ they go here.
            self.dlq_topic = names.dlq_topic(*self.kafka_identity)
        if self.assignment_file is not None:
            self.assignment_file = Path(self.assignment_file)

    @property
    def group_id(self) -> str:
        return names.consumer_group(*self.kafka_identity)

    def transactional_id(self, partition: int) -> str:
        return names.transactional_id(*self.kafka_identity, partition)

    @property
    def kafka_identity(self) -> tuple[str, str]:
        if self.identity is None:
            return self.namespace, self.pipeline
        namespace, _, pipeline = self.identity.partition("/")
        return namespace, pipeline

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
