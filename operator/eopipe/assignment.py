"""Partition -> pod assignment: balanced, sticky, and moving as few partitions as possible.

Shared by the operator (which publishes it with a generation) and the dedup worker (which reads
it). With N partitions and R pods every pod owns floor(N/R) or ceil(N/R) partitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Assignment:
    generation: int
    owners: dict[int, str] = field(default_factory=dict)  # partition -> pod

    def partitions_of(self, pod: str) -> list[int]:
        return sorted(p for p, owner in self.owners.items() if owner == pod)

    def to_json(self) -> dict:
        pods: dict[str, list[int]] = {}
        for p, pod in sorted(self.owners.items()):
            pods.setdefault(pod, []).append(p)
        return {"generation": self.generation, "assignments": pods}

    @classmethod
    def from_json(cls, doc: dict) -> "Assignment":
        owners = {int(p): pod for pod, parts in doc.get("assignments", {}).items() for p in parts}
        return cls(int(doc.get("generation", 0)), owners)


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
