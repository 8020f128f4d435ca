"""Partition -> pod assignment: balanced, sticky, and moving as few partitions as possible.

Shared by the operator (which publishes it with a generation) and the dedup worker (which reads
it). With N partitions and R pods every pod owns floor(N/R) or ceil(N/R) partitions.

The published document (one format, `Assignment.to_json` / `from_json`):

    {"generation": g, "assignments": {"<pod>": [partitions]},
     # optional, written by the rebalance state machine (docs/design.md#rebalancing):
     "partitionCount": N,            # the count the home check must use (never newer)
     "paused": true,                 # every owner commits and stops its partitions
     "handoffs": {"<p>": {"from": "<pod>", "url": "http://<podIP>:8080"}},          # Handoff
     "reshard": {"id": i, "from": N, "to": N2, "peers": {"<pod>": "http://<podIP>:8080"}},  # Reshard
     "reshards": [{"id": i, "from": N, "to": N2, "at": ms, "offsets": {"<p>": o}}]}  # ReshardEra

`reshards` is the history within the dedup window: partition p processed its offsets below
`offsets[p]` with `from` partitions; a rebuild uses it to find keys that now belong to a
partition but were deduplicated in another one before the re-shard.

The sub-documents are typed (`Handoff`, `Reshard`, `ReshardEra`: strict `parse`, `to_dict`
its exact inverse); `Assignment.from_json` parses them, so a malformed one makes the whole
document unreadable (ValueError) rather than a surprise deep in a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

CONFIGMAP_KEY = "assignment.json"  # the key of the published document in the ConfigMap


def json_int(doc: dict, key: str, what: str, *, optional: bool = False) -> int | None:
    v = doc.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{what}.{key}: expected an integer, got {v!r}")
    return v


def json_str(doc: dict, key: str, what: str, *, optional: bool = False) -> str | None:
    v = doc.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise ValueError(f"{what}.{key}: expected a string, got {v!r}")
    return v


def json_object(doc, what: str) -> dict:
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: expected an object, got {doc!r}")
    return doc


def partition_keys(doc, what: str) -> dict:
    """{"<p>": v} -> {p: v}, strictly."""
    doc = json_object(doc, what)
    try:
        return {int(k): v for k, v in doc.items()}
    except ValueError:
        raise ValueError(f"{what}: partition keys must be numbers, got {doc!r}") from None


def json_partition_map(doc, what: str) -> dict[int, int]:
    """{"<p>": n} -> {p: n}, strictly."""
    out = partition_keys(doc, what)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in out.values()):
        raise ValueError(f"{what}: expected integer values, got {doc!r}")
    return out


@dataclass(frozen=True)
class Handoff:
    """`handoffs["<p>"]`: the partition's previous owner and the URL it serves its snapshot at."""
    source: str  # "from"
    url: str

    @classmethod
    def parse(cls, doc) -> "Handoff":
        doc = json_object(doc, "handoff")
        return cls(json_str(doc, "from", "handoff"), json_str(doc, "url", "handoff"))

    def to_dict(self) -> dict:
        return {"from": self.source, "url": self.url}


@dataclass(frozen=True)
class Reshard:
    """`reshard`: the running re-shard from `source` to `target` partitions, and where each
    owner of an old partition serves its exported keys."""
    id: int
    source: int  # "from"
    target: int  # "to"
    peers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, doc) -> "Reshard":
        doc = json_object(doc, "reshard")
        peers = json_object(doc.get("peers", {}), "reshard.peers")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in peers.items()):
            raise ValueError(f"reshard.peers: expected pod -> URL, got {peers!r}")
        return cls(json_int(doc, "id", "reshard"), json_int(doc, "from", "reshard"), json_int(doc, "to", "reshard"),
                   dict(peers))

    def to_dict(self) -> dict:
        return {"id": self.id, "from": self.source, "to": self.target, "peers": dict(self.peers)}


@dataclass(frozen=True)
class ReshardEra:
    """`reshards[i]`: one past re-shard; partition p processed its offsets below `offsets[p]`
    with `source` partitions. `at` (ms) decides how long the era is kept."""
    id: int
    source: int  # "from"
    target: int  # "to"
    offsets: dict[int, int] = field(default_factory=dict)
    at: int | None = None

    @classmethod
    def parse(cls, doc) -> "ReshardEra":
        doc = json_object(doc, "reshards[]")
        parsed = json_partition_map(doc.get("offsets") or {}, "reshards[].offsets")
        return cls(json_int(doc, "id", "reshards[]"), json_int(doc, "from", "reshards[]"),
                   json_int(doc, "to", "reshards[]"), parsed, json_int(doc, "at", "reshards[]", optional=True))

    def to_dict(self) -> dict:
        doc: dict = {"id": self.id, "from": self.source, "to": self.target}
        if self.at is not None:
            doc["at"] = self.at
        doc["offsets"] = {str(p): o for p, o in sorted(self.offsets.items())}
        return doc


@dataclass(frozen=True)
class Assignment:
    generation: int
    owners: dict[int, str] = field(default_factory=dict)  # partition -> pod
    partition_count: int | None = None
    paused: bool = False
    handoffs: dict[int, Handoff] = field(default_factory=dict)  # partition -> its previous owner
    reshard: Reshard | None = None                                # the running re-shard
    reshards: tuple[ReshardEra, ...] = ()                         # past re-shards, oldest first

    def partitions_of(self, pod: str) -> list[int]:
        return sorted(p for p, owner in self.owners.items() if owner == pod)

    def to_json(self) -> dict:
        pods: dict[str, list[int]] = {}
        for p, pod in sorted(self.owners.items()):
            pods.setdefault(pod, []).append(p)
        doc: dict = {"generation": self.generation, "assignments": pods}
        if self.partition_count is not None:
            doc["partitionCount"] = self.partition_count
        if self.paused:
            doc["paused"] = True
        if self.handoffs:
            doc["handoffs"] = {str(p): h.to_dict() for p, h in sorted(self.handoffs.items())}
        if self.reshard:
            doc["reshard"] = self.reshard.to_dict()
        if self.reshards:
            doc["reshards"] = [r.to_dict() for r in self.reshards]
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "Assignment":
        owners = {int(p): pod for pod, parts in doc.get("assignments", {}).items() for p in parts}
        pc = doc.get("partitionCount")
        return cls(int(doc.get("generation", 0)), owners,
                   partition_count=int(pc) if pc is not None else None,
                   paused=bool(doc.get("paused", False)),
                   handoffs={p: Handoff.parse(h) for p, h in partition_keys(doc.get("handoffs") or {}, "handoffs").items()},
                   reshard=Reshard.parse(doc["reshard"]) if doc.get("reshard") else None,
                   reshards=tuple(ReshardEra.parse(r) for r in doc.get("reshards") or ()))

    def with_(self, **changes) -> "Assignment":
        return replace(self, **changes)


def era_count(reshards: tuple[ReshardEra, ...], partition: int, offset: int, current: int) -> int:
    """The partition count that `partition` used when it processed `offset` (see reshards)."""
    for r in sorted(reshards, key=lambda r: r.id):
        bound = r.offsets.get(partition)
        if bound is not None and offset < bound:
            return r.source
    return current


def grow(partitions: int, pods: list[str], previous: dict[int, str]) -> dict[int, str]:
    """Owners for a partition increase: every existing partition keeps its owner (its state
    stays where it is), the new ones go to the least loaded pods. Balanced if `previous` was."""
    owners = {p: pod for p, pod in previous.items() if p < partitions}
    pods = sorted(set(pods) | set(owners.values()))
    load = {pod: sum(1 for o in owners.values() if o == pod) for pod in pods}
    for p in range(partitions):
        if p not in owners:
            pod = min(pods, key=lambda q: (load[q], q))
            owners[p] = pod
            load[pod] += 1
    return owners


def assign(partitions: int, pods: list[str], previous: dict[int, str] | None = None) -> dict[int, str]:
    """Balanced assignment of partitions 0..partitions-1 to pods, keeping previous owners where
    balance allows. Deterministic for the same inputs."""
    if not pods:
        raise ValueError("no pods to assign partitions to")
    pods = sorted(set(pods))
    base, extra = divmod(partitions, len(pods))
    previous = previous or {}
    kept: dict[str, list[int]] = {pod: [] for pod in pods}
    for p in range(partitions):
        if previous.get(p) in kept:
            kept[previous[p]].append(p)

    owners: dict[int, str] = {}
    # Every pod keeps up to `base` of its partitions; the `extra` pods holding the most beyond
    # that keep one more, which is what minimises movement.
    by_surplus = sorted(pods, key=lambda pod: (-len(kept[pod]), pod))
    quota = {pod: base + (1 if i < extra else 0) for i, pod in enumerate(by_surplus)}
    for pod in pods:
        for p in kept[pod][:quota[pod]]:
            owners[p] = pod
    free = [p for p in range(partitions) if p not in owners]
    load = {pod: sum(1 for o in owners.values() if o == pod) for pod in pods}
    for p in free:
        pod = min((pod for pod in pods if load[pod] < quota[pod]), key=lambda q: (load[q], q))
        owners[p] = pod
        load[pod] += 1
    return owners


def moves(before: dict[int, str], after: dict[int, str]) -> dict[int, tuple[str | None, str]]:
    """Partitions whose owner changes: partition -> (old owner or None, new owner)."""
    return {p: (before.get(p), pod) for p, pod in sorted(after.items()) if before.get(p) != pod}
