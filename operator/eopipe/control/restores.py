"""Restores from the object store, told as events (pure: the pods' /status and the last record in,
the next record and the events out).

A dedup pod that found a partition's store gone restores it from the newest snapshot in
`spec.dedup.backup` (dedup/backup.py) and reports it in its /status: the partition's
`recovery.snapshot_offset`. The operator posts one `StateRestored` event per restore, and keeps
in `status.restores` the last one it told of per partition, so that a later pass, or another
operator after a restart, does not tell it again. A restore is told apart from the one before
by the pod, the snapshot's offset and the recovery's duration (a new restore on the same pod
from the same snapshot takes its own time, to the millisecond)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eopipe.core.wire import PodStatus

Event = tuple[str, str, str]  # (Normal|Warning, reason, message)
REASON = "StateRestored"


@dataclass(frozen=True)
class Told:
    record: dict[str, dict] = field(default_factory=dict)  # status.restores, by partition (a str)
    events: list[Event] = field(default_factory=list)
    changed: bool = False


def told(reports: Mapping[str, PodStatus], recorded) -> Told:
    """`recorded`: status.restores as read; anything but an object of objects (a hand-edited
    status) counts as nothing recorded, and is replaced."""
    recorded = {k: v for k, v in recorded.items() if isinstance(v, dict)} if isinstance(recorded, Mapping) else {}
    record = dict(recorded)
    events: list[Event] = []
    for pod, st in sorted(reports.items()):
        for p, ps in sorted(st.partitions.items()):
            r = ps.recovery
            if r.snapshot_offset is None:
                continue
            seen = {"pod": pod, "snapshotOffset": r.snapshot_offset,
                    "replayed": r.replayed or 0, "seconds": round(r.recovery_seconds or 0.0, 3)}
            if record.get(str(p)) == seen:
                continue
            record[str(p)] = seen
            events.append(("Normal", REASON,
                           f"partition {p} on {pod}: its state was gone and is restored from the object "
                           f"store's snapshot at offset {r.snapshot_offset}, then {seen['replayed']} records "
                           f"replayed from there ({seen['seconds']} s), not rebuilt over the window"))
    return Told(record, events, record != recorded)
