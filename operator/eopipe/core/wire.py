"""What the planes say to each other over HTTP: the dedup worker's /status, and state transfer.

The dedup worker writes `PodStatus` at GET /status; the operator reads it into its rebalance
facts (control/rebalance.py `PodFacts`). During a rebalance both versions run side by side, so
the JSON keeps its keys, a reader ignores the keys it does not know (a newer writer) and
defaults the ones that are missing (an older one), and a state or method it does not know
stays a plain str (never "running", so a rebalance waits rather than misreads it).

Between dedup pods (docs/design.md#snapshot-handoff, docs/design.md#re-shard-on-partition-growth):
    GET /snapshots/<p>?generation=<g>    a released partition's packed store
    GET /reshard/<id>/<p>/<q>            the keys of old partition p whose new home is q
with the facts of the transfer in the H_* headers. Both need `Authorization: Bearer <token>`, the
pipeline's token (eopipe.dedup.auth); /status is open.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class PartitionState(StrEnum):
    STARTING = "starting"
    FETCHING = "fetching"        # downloading the old owner's snapshot (handoff)
    RECOVERING = "recovering"
    IMPORTING = "importing"      # importing re-sharded keys from the old partitions' owners
    RUNNING = "running"
    STOPPING = "stopping"        # committing its open transaction
    STOPPED = "stopped"
    FENCED = "fenced"
    FAILED = "failed"


class RecoveryAction(StrEnum):
    NONE = "none"
    RESET = "reset"
    REBUILD = "rebuild"
    REPLAY = "replay"


class MigrationMethod(StrEnum):
    SNAPSHOT = "snapshot"
    REBUILD = "rebuild"
    LOCAL = "local"                      # the state was already on this pod
    RESHARD_IMPORT = "reshard-import"


def _tolerant(enum: type[Enum]):
    return Annotated[enum | str, Field(union_mode="left_to_right")]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @classmethod
    def from_json(cls, doc: dict):
        return cls.model_validate(doc)

    def to_json(self) -> dict:
        # Only what the writer set: the JSON has the keys it had before these models.
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Recovery(_Wire):
    """How the partition's last recovery went (empty until it is done)."""
    recovery: _tolerant(RecoveryAction) | None = None
    applied_before: int | None = None    # the store's applied offset before it
    replayed: int | None = None          # source records scanned into the store
    recovery_seconds: float | None = None
    high_watermark: int | None = None


class Migration(_Wire):
    """How the partition's state came to this pod (handoff or re-shard), kept across restarts."""
    method: _tolerant(MigrationMethod) | None = None
    generation: int | None = None
    from_: str | None = Field(None, alias="from")   # the old owner
    restarted: bool | None = None       # this pod restarted after the migration
    reshard: int | None = None
    bytes: int | None = None
    keys: int | None = None
    sha256: str | None = None
    fetch_ms: int | None = None          # from the first request, waits for the old owner included
    transfer_ms: int | None = None       # the download and install that succeeded
    import_ms: int | None = None
    stopped_at_ms: int | None = None    # when the old owner stopped the partition
    pause_ms: int | None = None         # from then until it ran here
    running_at_ms: int | None = None
    reason: str | None = None           # why the state was rebuilt


class StoreStats(_Wire):
    """The partition's RocksDB state; the operator reports the window it really covers. The
    other figures (segments, SST and memtable bytes, watermark) pass through for people."""
    model_config = ConfigDict(extra="allow")

    keys: int | None = None
    bytes: int | None = None
    # How far back a duplicate is surely caught: less than the window after a rebuild from a
    # source whose retention had already dropped part of it.
    effective_window_seconds: float | None = None


class PartitionStatus(_Wire):
    state: _tolerant(PartitionState)
    error: str | None = None
    committed: int | None = None         # the group's committed offset == the store's applied
    lag: int | None = None
    recovery: Recovery = Field(default_factory=Recovery)
    migration: Migration | None = None
    store: StoreStats | None = None


class PodStatus(_Wire):
    pipeline: str | None = None
    namespace: str | None = None
    pod: str | None = None
    generation: int | None = None        # of the assignment applied; None: none read yet
    owned: list[int] = Field(default_factory=list)
    paused: bool = False                 # told to pause, and every partition committed and stopped
    partition_count: int | None = None   # of the home check
    source_partitions: int | None = None
    window_seconds: float | None = None
    ready: bool = False
    partitions: dict[int, PartitionStatus] = Field(default_factory=dict)
    released: dict[int, dict[str, Any]] = Field(default_factory=dict)  # snapshot manifests served
    memory: dict[str, Any] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)  # committed since the pod started (Totals)


# -- state transfer ---------------------------------------------------------------------------
H_SHA = "X-Eopipe-Sha256"
H_APPLIED = "X-Eopipe-Applied-Offset"
H_STOPPED = "X-Eopipe-Stopped-At-Ms"
H_KEYS = "X-Eopipe-Keys"


@dataclass(frozen=True)
class SnapshotRequest:
    partition: int
    generation: int = 0    # the asker's assignment generation: a server behind it says 503

    @property
    def path(self) -> str:
        return f"/snapshots/{self.partition}?generation={self.generation}"


@dataclass(frozen=True)
class ReshardRequest:
    reshard: int
    source: int            # the old partition
    target: int            # the partition its keys move to

    @property
    def path(self) -> str:
        return f"/reshard/{self.reshard}/{self.source}/{self.target}"


def parse_transfer(path: str, query: str) -> SnapshotRequest | ReshardRequest | None:
    """The request a state-transfer path asks for; None if it is none. ValueError: malformed."""
    parts = path.strip("/").split("/")
    if parts[0] == "snapshots" and len(parts) == 2:
        generation = 0
        for kv in query.split("&"):
            k, _, v = kv.partition("=")
            if k == "generation" and v.isdigit():
                generation = int(v)
        return SnapshotRequest(int(parts[1]), generation)
    if parts[0] == "reshard" and len(parts) == 4:
        return ReshardRequest(int(parts[1]), int(parts[2]), int(parts[3]))
    return None
