"""The old owner's side of a rebalance: the state this pod gives away.

Snapshots of the partitions it handed off (docs/design.md#snapshot-handoff), served until the
handoff is over, and during a re-shard its exports (docs/design.md#re-shard-on-partition-growth).
The HTTP thread answers from an Ownership snapshot the control loop publishes, never from the
control loop's own state. The file mechanics are in dedup/migrate.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from logging import ERROR, INFO

from eopipe.core.assignment import Assignment, Handoff
from eopipe.core.wire import H_APPLIED, H_KEYS, H_SHA, H_STOPPED, ReshardRequest, SnapshotRequest
from eopipe.dedup import migrate
from eopipe.dedup.logs import event
from eopipe.dedup.store import StateStore

log = logging.getLogger("eopipe.dedup")


@dataclass(frozen=True)
class Ownership:
    """What the control loop last knew: the generation it follows, the partitions it owns, those
    with a runner still alive or starting (`busy`), and the handoffs of its assignment."""

    generation: int | None = None
    owned: tuple[int, ...] = ()
    busy: frozenset[int] = frozenset()
    handoffs: dict[int, Handoff] = field(default_factory=dict)


class Outgoing:
    """The snapshots of the partitions this pod handed off (`released`) and its exports."""

    def __init__(self, store: StateStore, me: str):
        self.store = store
        self.me = me
        self.released: dict[int, dict] = {}   # partition -> snapshot manifest

    def release(self, a: Assignment, owned: tuple[int, ...], busy: set[int], stopped: dict[int, int]) -> None:
        """Handed-off partitions: snapshot and serve them, then drop the local store. Stores of
        partitions this pod neither owns nor hands off are stale: dropped. `busy`: partitions
        whose runner has not stopped yet; `stopped`: when the ones stopped just now stopped."""
        root = self.store.root
        for p in self.store.partitions_on_disk():
            if p in owned or p in busy:
                continue
            ho = a.handoffs.get(p)
            if ho and ho.source == self.me and migrate.read_snapshot_manifest(root, p) is None:
                t0 = time.monotonic()
                try:
                    man = migrate.make_snapshot(self.store, p, generation=a.generation,
                                                stopped_at_ms=stopped.get(p, int(time.time() * 1000)))
                except Exception as e:  # noqa: BLE001 - the new owner rebuilds
                    event(log, ERROR, "snapshot failed; the new owner will rebuild", partition=p, error=str(e))
                    continue
                event(log, INFO, "partition released: snapshot ready", partition=p, to=a.owners.get(p),
                      bytes=man["bytes"], applied_offset=man["applied_offset"], keys=man["keys"],
                      snapshot_ms=int((time.monotonic() - t0) * 1000))
            self.store.drop(p)
        # Serve what is on disk for the handoffs from this pod; forget the rest.
        for p in range(max([0, *a.handoffs, *self.released]) + 1):
            ho = a.handoffs.get(p)
            if ho and ho.source == self.me and p not in owned:
                man = migrate.read_snapshot_manifest(root, p)
                if man is not None:
                    self.released[p] = man
            elif p in self.released or migrate.read_snapshot_manifest(root, p) is not None:
                self.released.pop(p, None)
                migrate.remove_snapshot(root, p)
        migrate.cleanup_reshards(root, {a.reshard.id} if a.reshard else set())

    def serve(self, own: Ownership, req: SnapshotRequest | ReshardRequest):
        """A state-transfer GET, routed and authorized by dedup/http.py: (code, headers, body:
        bytes or a file's Path), or None."""
        if isinstance(req, SnapshotRequest):
            return self._snapshot(own, req)
        if isinstance(req, ReshardRequest):
            return self._export(req)
        return None

    def _snapshot(self, own: Ownership, req: SnapshotRequest):
        p, root = req.partition, self.store.root
        man = self.released.get(p) or migrate.read_snapshot_manifest(root, p)
        if man is not None and p not in own.owned:
            tar_path, _ = migrate.snapshot_paths(root, p)
            return 200, {H_SHA: man["sha256"], H_APPLIED: man.get("applied_offset"),
                         H_STOPPED: man.get("stopped_at_ms"), H_KEYS: man.get("keys")}, tar_path
        if (own.generation or 0) < req.generation or p in own.owned or p in own.busy:
            return 503, {"Retry-After": "1"}, b"not released yet\n"
        ho = own.handoffs.get(p)
        if ho and ho.source == self.me and self.store.exists(p):
            return 503, {"Retry-After": "1"}, b"snapshot being prepared\n"
        return 404, {}, b"no state for this partition here\n"

    def _export(self, req: ReshardRequest):
        root = self.store.root
        man = migrate.read_export_manifest(root, req.reshard, req.source)
        if man is None:
            return 503, {"Retry-After": "1"}, b"export not written yet\n"
        if man.get("missing"):
            return 410, {}, b"state of this partition was rebuilt; rebuild instead\n"
        t = man["targets"].get(str(req.target))
        if t is None:
            return 200, {H_SHA: "", H_KEYS: 0}, b""
        return 200, {H_SHA: t["sha256"], H_KEYS: t["keys"]}, \
            migrate.export_dir(root, req.reshard, req.source) / f"to-{req.target}.bin"
