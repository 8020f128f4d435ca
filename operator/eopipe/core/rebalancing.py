"""The rebalance's typed contract: the facts it decides on and the records it keeps in status.

`Facts` / `PodFacts`: what a reconcile pass observed (control/observe.py fills them once per
step; control/rebalance.py decides on them). `Rebalance` is `status.rebalance` (the running
rebalance, resumed from status after a restart) and `RebalanceSummary` is
`status.lastRebalance`. Both are frozen, with a strict `parse` (ValueError naming the key)
and `to_dict` writing exactly the JSON the state machine has always written: the keys are
camelCase in status and snake_case here; a key that is absent stays absent (None here).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from eopipe.core.assignment import Assignment, json_int, json_object, json_partition_map, json_str
from eopipe.core.defaults import WINDOW_SECONDS
from eopipe.core.names import DEDUP_HTTP_PORT
from eopipe.core.wire import PartitionState, PartitionStatus, PodStatus

REPLICAS, PARTITIONS = "replicas", "partitions"  # Rebalance.type
SCALING_UP, HANDING_OFF, FINALIZING = "ScalingUp", "HandingOff", "Finalizing"
PAUSING, CREATING_PARTITIONS, RESHARDING = "Pausing", "CreatingPartitions", "Resharding"


# -- facts ---------------------------------------------------------------------------------------
@dataclass
class PodFacts:
    name: str
    ip: str | None = None
    ready: bool = False
    status: PodStatus | None = None  # the worker's /status; None if unreachable
    port: int = DEDUP_HTTP_PORT

    @property
    def url(self) -> str | None:
        return f"http://{self.ip}:{self.port}" if self.ip else None

    @property
    def generation(self) -> int:
        g = self.status.generation if self.status else None
        return -1 if g is None else g

    @property
    def paused(self) -> bool:
        return bool(self.status and self.status.paused)

    def partition(self, p: int) -> PartitionStatus | None:
        return self.status.partitions.get(p) if self.status else None

    def running(self, p: int, generation: int) -> bool:
        ps = self.partition(p)
        return self.generation >= generation and ps is not None and ps.state is PartitionState.RUNNING


@dataclass(frozen=True)
class Facts:
    """Observed once per step, never changed: a decision that differs (the autoscaler's count)
    is a new Facts made with dataclasses.replace, the observation staying as it was."""
    now_ms: int
    pod_prefix: str                   # "<pipeline>-dedup": pods are <prefix>-<ordinal>
    replicas: int                     # the wanted count: spec.dedup.replicas (or the autoscaler's)
    partitions: int                   # spec.source.partitions
    paused: bool = False              # spec.paused
    actual_partitions: int | None = None  # the source topic in Kafka; None: missing/unknown
    assignment: Assignment | None = None  # the published one; None: none yet
    sts_replicas: int | None = None   # the StatefulSet's spec.replicas; None: no StatefulSet
    pods: dict[str, PodFacts] = field(default_factory=dict)
    committed: dict[int, int] | None = None  # the group's committed offsets (while Pausing)
    window_ms: int = WINDOW_SECONDS * 1000  # spec.dedup.window
    # Dedup pods running on a cordoned node (control/nodeloss.draining): their partitions go to
    # the other pods by snapshot handoff before the pod is deleted.
    draining: frozenset[str] = frozenset()
    # Dedup pods on a lost node (control/nodeloss.lost): their partitions go to the other pods at
    # once, restored there from the object store or rebuilt from Kafka (no snapshot to fetch).
    lost: frozenset[str] = frozenset()


# -- records -------------------------------------------------------------------------------------
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


# Attributes whose key is not the camelCase of their name ("from" is a keyword).
_KEYS = {"source": "from"}


def _key(name: str) -> str:
    return _KEYS.get(name, _camel(name))


def _scalars(cls, doc: dict, what: str, required: tuple[str, ...]) -> dict:
    """The int/str/bool/float fields of `cls` read from `doc` by their JSON key, strictly."""
    out = {}
    for f in fields(cls):
        kind = _KINDS.get(f.type)
        if kind is None:
            continue
        key, optional = _key(f.name), f.name not in required
        if kind == "int":
            out[f.name] = json_int(doc, key, what, optional=optional)
        elif kind == "str":
            out[f.name] = json_str(doc, key, what, optional=optional)
        elif kind == "float":
            v = doc.get(key)
            if not (v is None and optional) and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise ValueError(f"{what}.{key}: expected a number, got {v!r}")
            out[f.name] = v
        elif kind == "bool":
            v = doc.get(key, False)
            if not isinstance(v, bool):
                raise ValueError(f"{what}.{key}: expected true or false, got {v!r}")
            out[f.name] = v
    return out


_KINDS = {"int": "int", "int | None": "int", "str": "str", "str | None": "str",
          "float | None": "float", "bool": "bool"}


@dataclass(frozen=True)
class Move:
    """`rebalance.moves["<p>"]`: where partition p goes and, once it runs there, how it went."""
    to: str
    source: str | None = None   # "from": the previous owner; None: none (a new partition)
    done: bool = False
    method: str | None = None   # MigrationMethod, or "none" (a re-shard with nothing to import)
    bytes: int | None = None
    pause_ms: int | None = None
    keys: int | None = None

    @classmethod
    def parse(cls, doc) -> "Move":
        return cls(**_scalars(cls, json_object(doc, "move"), "move", required=("to",)))

    def to_dict(self) -> dict:
        # "from" is always written (null for none: the API server drops it, and parse reads it back).
        doc: dict = {"from": self.source, "to": self.to}
        if self.done:
            doc["done"] = True
        doc.update({_key(k): v for k in ("method", "bytes", "pause_ms", "keys")
                    if (v := getattr(self, k)) is not None})
        return doc


@dataclass(frozen=True)
class Rebalance:
    """`status.rebalance`: the running rebalance (docs/design.md#rebalancing)."""
    id: int
    type: str                   # REPLICAS | PARTITIONS
    phase: str                  # a key of control.rebalance.PHASES
    from_replicas: int
    to_replicas: int
    from_partitions: int
    to_partitions: int
    started_at: str | None = None
    started_at_ms: int | None = None
    moves: dict[int, Move] = field(default_factory=dict)
    target_generation: int | None = None
    target: Assignment | None = None    # the assignment this phase publishes
    handoff_started_at_ms: int | None = None
    finalizing_since_ms: int | None = None
    paused_at_ms: int | None = None
    resumed_at_ms: int | None = None
    offsets: dict[int, int] | None = None  # the re-shard boundaries (the group's committed offsets)
    message: str | None = None

    _REQUIRED = ("id", "type", "phase", "from_replicas", "to_replicas", "from_partitions", "to_partitions")

    @classmethod
    def parse(cls, doc) -> "Rebalance":
        doc = json_object(doc, "rebalance")
        moves = json_object(doc.get("moves") or {}, "rebalance.moves")
        try:
            parsed_moves = {int(p): Move.parse(m) for p, m in moves.items()}
        except ValueError as e:
            raise ValueError(f"rebalance.moves: {e}") from None
        target = doc.get("target")
        return cls(**_scalars(cls, doc, "rebalance", cls._REQUIRED), moves=parsed_moves,
                   target=None if target is None else Assignment.from_json(json_object(target, "rebalance.target")),
                   offsets=None if doc.get("offsets") is None else json_partition_map(doc["offsets"], "rebalance.offsets"))

    def to_dict(self) -> dict:
        doc: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "moves":
                doc["moves"] = {str(p): m.to_dict() for p, m in sorted(v.items())}
            elif v is None:
                continue
            elif f.name == "target":
                doc["target"] = v.to_json()
            elif f.name == "offsets":
                doc["offsets"] = {str(p): o for p, o in sorted(v.items())}
            else:
                doc[_key(f.name)] = v
        return doc

    @property
    def label(self) -> str:
        if self.type == PARTITIONS:
            return f"rebalance {self.id} (partitions {self.from_partitions} -> {self.to_partitions})"
        return f"rebalance {self.id} (replicas {self.from_replicas} -> {self.to_replicas})"

    @property
    def done_moves(self) -> int:
        return sum(1 for m in self.moves.values() if m.done)


@dataclass(frozen=True)
class RebalanceSummary:
    """`status.lastRebalance`: how the last rebalance went. The replicas-only and
    partitions-only figures are None (absent) for the other type."""
    id: int
    type: str
    from_replicas: int
    to_replicas: int
    from_partitions: int
    to_partitions: int
    started_at: str | None          # always written (null if the record had none)
    finished_at: str
    duration_seconds: float | None
    bytes_moved: int
    # partitions
    partitions_created: int | None = None
    keys_moved: int | None = None
    pause_ms: int | None = None
    rebuilt: tuple[int, ...] | None = None
    # replicas
    partitions_moved: int | None = None
    snapshot: int | None = None
    rebuild: int | None = None
    max_pause_ms: int | None = None

    _REQUIRED = ("id", "type", "from_replicas", "to_replicas", "from_partitions", "to_partitions",
                 "finished_at", "duration_seconds", "bytes_moved")

    @classmethod
    def parse(cls, doc) -> "RebalanceSummary":
        doc = json_object(doc, "lastRebalance")
        rebuilt = doc.get("rebuilt")
        if rebuilt is not None and not (isinstance(rebuilt, list) and all(
                isinstance(p, int) and not isinstance(p, bool) for p in rebuilt)):
            raise ValueError(f"lastRebalance.rebuilt: expected a list of partitions, got {rebuilt!r}")
        return cls(**{**_scalars(cls, doc, "lastRebalance", cls._REQUIRED), "started_at": doc.get("startedAt")},
                   rebuilt=None if rebuilt is None else tuple(rebuilt))

    def to_dict(self) -> dict:
        doc: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name != "started_at":
                continue
            doc[_key(f.name)] = list(v) if f.name == "rebuilt" else v
        return doc
