"""Moving a partition's state between pods: the worker's side of a rebalance.

Taking a partition over by the old owner's snapshot (docs/design.md#snapshot-handoff), the
export and import of keys whose home moved in a re-shard
(docs/design.md#re-shard-on-partition-growth), the record of how each partition's state came
here, and what this pod gives away: snapshots of the partitions it released, and its exports.
Any transfer that fails falls back to a rebuild from the source topic: slower, never wrong.
The file and HTTP mechanics are in dedup/migrate.py.
"""

from __future__ import annotations

import logging
import tarfile
import time
from logging import ERROR, INFO, WARNING
from typing import TYPE_CHECKING

from eopipe.core import partitioner as partitioners
from eopipe.core.assignment import Assignment
from eopipe.core.wire import (
    H_APPLIED,
    H_KEYS,
    H_SHA,
    H_STOPPED,
    Migration,
    MigrationMethod,
    PartitionState,
    RecoveryAction,
    ReshardRequest,
    SnapshotRequest,
)
from eopipe.dedup import migrate
from eopipe.dedup.logs import event
from eopipe.dedup.recovery import window_start_ms
from eopipe.dedup.store import StateStore
from eopipe.dedup.txn import Stopping

if TYPE_CHECKING:
    from eopipe.dedup.partition import PartitionRunner
    from eopipe.dedup.worker import Worker

log = logging.getLogger("eopipe.dedup")


# -- the new owner ------------------------------------------------------------------------------
def take_over(r: PartitionRunner) -> None:
    """If p is being handed to this pod, fetch the old owner's snapshot and install it as p's
    store. Any failure leaves the store missing, so recovery rebuilds it. Runs before the store
    is opened and before init_transactions."""
    a = r.w.assignment
    ho = a.handoffs.get(r.p)
    if not ho or ho.get("from") in (None, r.cfg.me):
        return
    store = r.w.store
    rec = migrate.read_migration_record(store.root, r.p)
    if store.exists(r.p):
        if rec and rec.get("generation") == a.generation:
            r.migration = Migration.from_json({**rec, "restarted": True})
        else:
            r.migration = Migration(method=MigrationMethod.LOCAL, generation=a.generation, from_=ho.get("from"))
        return
    r.set_state(PartitionState.FETCHING)
    t0 = time.monotonic()
    url = ho["url"].rstrip("/") + SnapshotRequest(r.p, a.generation).path
    tmp = store.root / "snapshots" / f"incoming-{r.p}.tar"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    m = r.migration = Migration(generation=a.generation, from_=ho.get("from"))
    said: set[str] = set()

    def retrying(e: migrate.TransferError) -> None:  # once per kind: a 503 is asked again every 50 ms
        if (kind := "busy" if e.busy else str(e)) not in said:
            said.add(kind)
            event(log, INFO, "snapshot not available yet; retrying", partition=r.p, error=str(e))
    try:
        facts = migrate.fetch_with_retries(
            url, tmp, deadline=time.monotonic() + r.cfg.handoff_timeout_seconds,
            should_stop=r.halt.is_set, token=r.cfg.token, on_retry=retrying)
        t1 = time.monotonic()
        migrate.install_snapshot(tmp, store, r.p)
        r.migration = m.model_copy(update=dict(
            method=MigrationMethod.SNAPSHOT, bytes=facts["bytes"], sha256=facts["sha256"],
            fetch_ms=int((time.monotonic() - t0) * 1000),
            transfer_ms=facts["ms"] + int((time.monotonic() - t1) * 1000),
            stopped_at_ms=facts.get(H_STOPPED)))
        event(log, INFO, "snapshot installed", partition=r.p, bytes=facts["bytes"],
              source=ho.get("from"), fetch_ms=r.migration.fetch_ms, transfer_ms=r.migration.transfer_ms)
    except (migrate.TransferError, OSError, tarfile.TarError) as e:
        if r.halt.is_set():
            raise Stopping() from None
        store.drop(r.p)
        r.migration = m.model_copy(update=dict(method=MigrationMethod.REBUILD, bytes=0, reason=str(e)[:300]))
        event(log, WARNING, "snapshot transfer failed: rebuilding from the source topic",
              partition=r.p, source=ho.get("from"), error=str(e))
    finally:
        tmp.unlink(missing_ok=True)


def reshard(r: PartitionRunner) -> None:
    """During a re-shard (N -> N2, all partitions were paused first): export the keys of this
    old partition whose home moved, then import the keys that moved into p from every old
    partition's owner. p runs only once its state is complete for N2."""
    rs = r.w.assignment.reshard
    if not rs:
        return
    rid, frm, to = int(rs["id"]), int(rs["from"]), int(rs["to"])
    store = r.store
    root = r.w.store.root
    # A store rebuilt just now holds keys by the new count only.
    rebuilt = r.plan.action is RecoveryAction.REBUILD
    if r.p < frm and migrate.read_export_manifest(root, rid, r.p) is None:
        # Rebuilt: say the export is missing, and the importers rebuild instead of trusting it.
        man = migrate.write_exports(root, rid, r.p, store.iter_keys(), partitioners.get(r.cfg.partitioner), to,
                                    missing=rebuilt)
        event(log, INFO, "re-shard export written", partition=r.p, reshard=rid, missing=rebuilt,
              targets={q: t["keys"] for q, t in man["targets"].items()})
    if store.reshard_id == rid or r.p >= to:
        return
    if rebuilt:
        store.apply({}, None, partition_count=to, reshard_id=rid)
        r.migration = Migration(method=MigrationMethod.REBUILD, reshard=rid, keys=0, bytes=0)
        return
    t0 = time.monotonic()
    r.set_state(PartitionState.IMPORTING)
    try:
        entries, nbytes = _gather(r, rid, frm, rs.get("peers") or {})
    except migrate.TransferError as e:
        if r.halt.is_set():
            raise Stopping() from None
        event(log, WARNING, "re-shard import failed: rebuilding from the source topic",
              partition=r.p, reshard=rid, error=str(e))
        lo, _ = r.source.watermarks(r.p)
        r.rebuild(r.committed, lo, window_start_ms(int(time.time() * 1000), r.cfg.window_ms, r.cfg.segment_ms))
        r.store.apply({}, None, partition_count=to, reshard_id=rid)
        r.assign(r.committed)
        r.migration = Migration(method=MigrationMethod.REBUILD, reshard=rid, reason=str(e)[:300])
        return
    store.apply(entries, None, partition_count=to, reshard_id=rid)
    r.migration = Migration(method=MigrationMethod.RESHARD_IMPORT, reshard=rid, keys=len(entries), bytes=nbytes,
                            import_ms=int((time.monotonic() - t0) * 1000))
    event(log, INFO, "re-shard import done", partition=r.p, reshard=rid, keys=len(entries), bytes=nbytes)


def _gather(r: PartitionRunner, rid: int, frm: int, peers: dict) -> tuple[list[tuple[bytes, int]], int]:
    """The keys every other old partition exported to p: read from disk for the partitions this
    pod owns, fetched from their owners for the rest. Returns them and the bytes read."""
    root = r.w.store.root
    deadline = time.monotonic() + r.cfg.handoff_timeout_seconds
    entries: list[tuple[bytes, int]] = []
    nbytes = 0
    for src in range(frm):
        if src == r.p:
            continue
        owner = r.w.assignment.owners.get(src)
        if owner == r.cfg.me:
            man = None
            while man is None:
                man = migrate.read_export_manifest(root, rid, src)
                if man is None:
                    if time.monotonic() > deadline or r.halt.is_set():
                        raise migrate.TransferError(f"own export of {src} not written")
                    time.sleep(0.2)
            if man.get("missing"):
                raise migrate.TransferError(f"export of {src} unavailable", final=True)
            got = migrate.read_own_export(root, rid, src, r.p, man)
            nbytes += ((man.get("targets") or {}).get(str(r.p)) or {}).get("bytes", 0)
        else:
            url = peers.get(owner)
            if not url:
                raise migrate.TransferError(f"no address for {owner}, owner of {src}", final=True)
            tmp = root / "reshard" / f"incoming-{r.p}-{src}.bin"
            try:
                tmp.parent.mkdir(parents=True, exist_ok=True)
                facts = migrate.fetch_with_retries(url.rstrip("/") + ReshardRequest(rid, src, r.p).path, tmp,
                                                   deadline=deadline, should_stop=r.halt.is_set, token=r.cfg.token)
                data = tmp.read_bytes()
            except OSError as e:  # our own disk: a TransferError too, so the partition rebuilds
                raise migrate.TransferError(f"import from {src}: {e.strerror or e}") from None
            finally:
                tmp.unlink(missing_ok=True)
            nbytes += len(data)
            got = migrate.parse_export(data, facts.get(H_KEYS))
        entries.extend(got)
    return entries, nbytes


def record_migration(r: PartitionRunner) -> None:
    """p runs: note the pause it saw and keep the record, so a restart still reports it."""
    m = r.migration
    if m is None:
        return
    now = int(time.time() * 1000)
    if m.pause_ms is None:
        m.pause_ms = max(0, now - (m.stopped_at_ms or r.started_at_ms))
    m.generation = r.w.assignment.generation
    m.running_at_ms = now
    migrate.save_migration_record(r.w.store.root, r.p, m.to_json())


# -- the old owner ------------------------------------------------------------------------------
class Outgoing:
    """The state this pod gives away: snapshots of the partitions it handed off (`released`,
    served until the handoff is over) and, during a re-shard, its exports."""

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
            if ho and ho.get("from") == self.me and migrate.read_snapshot_manifest(root, p) is None:
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
            if ho and ho.get("from") == self.me and p not in owned:
                man = migrate.read_snapshot_manifest(root, p)
                if man is not None:
                    self.released[p] = man
            elif p in self.released or migrate.read_snapshot_manifest(root, p) is not None:
                self.released.pop(p, None)
                migrate.remove_snapshot(root, p)
        migrate.cleanup_reshards(root, {int(a.reshard["id"])} if a.reshard else set())

    def serve(self, w: Worker, req: SnapshotRequest | ReshardRequest):
        """A state-transfer GET, routed and authorized by dedup/http.py: (code, headers, body:
        bytes or a file's Path), or None."""
        if isinstance(req, SnapshotRequest):
            return self._snapshot(w, req)
        if isinstance(req, ReshardRequest):
            return self._export(req)
        return None

    def _snapshot(self, w: Worker, req: SnapshotRequest):
        p, root = req.partition, self.store.root
        man = self.released.get(p) or migrate.read_snapshot_manifest(root, p)
        if man is not None and p not in w.owned:
            tar_path, _ = migrate.snapshot_paths(root, p)
            return 200, {H_SHA: man["sha256"], H_APPLIED: man.get("applied_offset"),
                         H_STOPPED: man.get("stopped_at_ms"), H_KEYS: man.get("keys")}, tar_path
        if (w.generation or 0) < req.generation or p in w.owned or p in w.runners:
            return 503, {"Retry-After": "1"}, b"not released yet\n"
        ho = w.assignment.handoffs.get(p)
        if ho and ho.get("from") == self.me and self.store.exists(p):
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
