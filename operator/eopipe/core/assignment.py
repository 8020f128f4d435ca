"""Partition -> pod assignment: balanced, sticky, and moving as few partitions as possible.

Shared by the operator (which publishes it with a generation) and the dedup worker (which reads
it). With N partitions and R pods every pod owns floor(N/R) or ceil(N/R) partitions.

The published document (one format, `Assignment.to_json` / `from_json`):

    {"generation": g, "assignments": {"<pod>": [partitions]},
     # optional, written by the rebalance state machine (docs/design.md#rebalancing):
     "partitionCount": N,            # the count the home check must use (never newer)
     "paused": true,                 # every owner commits and stops its partitions
     "handoffs": {"<p>": {"from": "<pod>", "url": "http://<podIP>:8080"}},
     "reshard": {"id": i, "from": N, "to": N2, "peers": {"<pod>": "http://<podIP>:8080"}},
     "reshards": [{"id": i, "from": N, "to": N2, "at": ms, "offsets": {"<p>": o}}]}

`reshards` is the history within the dedup window: partition p processed its offsets below
`offsets[p]` with `from` partitions; a rebuild uses it to find keys that now belong to a
partition but were deduplicated in another one before the re-shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONFIGMAP_KEY = "assignment.json"  # the key of the published document in the ConfigMap


@dataclass(frozen=True)
class Assignment:
    generation: int
    owners: dict[int, str] = field(default_factory=dict)  # partition -> pod
    partition_count: int | None = None
    paused: bool = False
    handoffs: dict[int, dict] = field(default_factory=dict)  # partition -> {"from", "url"}
    reshard: dict | None = None
    reshards: tuple = ()

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
            doc["handoffs"] = {str(p): dict(h) for p, h in sorted(self.handoffs.items())}
        if self.reshard:
            doc["reshard"] = dict(self.reshard)
        if self.reshards:
            doc["reshards"] = [dict(r) for r in self.reshards]
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "Assignment":
        owners = {int(p): pod for pod, parts in doc.get("assignments", {}).items() for p in parts}
        pc = doc.get("partitionCount")
        return cls(int(doc.get("generation", 0)), owners,
                   partition_count=int(pc) if pc is not None else None,
                   paused=bool(doc.get("paused", False)),
                   handoffs={int(p): dict(h) for p, h in (doc.get("handoffs") or {}).items()},
                   reshard=dict(doc["reshard"]) if doc.get("reshard") else None,
                   reshards=tuple(dict(r) for r in doc.get("reshards") or ()))

    def with_(self, **changes) -> "Assignment":
        from dataclasses import replace
        return replace(self, **changes)


def era_count(reshards, partition: int, offset: int, current: int) -> int:
    """The partition count that `partition` used when it processed `offset` (see reshards)."""
    for r in sorted(reshards, key=lambda r: r["id"]):
        bound = (r.get("offsets") or {}).get(str(partition))
        if bound is not None and offset < int(bound):
            return int(r["from"])
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
