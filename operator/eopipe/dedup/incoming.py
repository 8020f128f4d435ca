"""The new owner's side of a rebalance: what a partition's state gets from other pods.

Taking a partition over by the old owner's snapshot (docs/design.md#snapshot-handoff), the
export and import of keys whose home moved in a re-shard
(docs/design.md#re-shard-on-partition-growth), and the record of how the state came here. Each
is a function of facts that returns what to install; the runner (dedup/partition.py) applies it.
Any transfer that fails ends in a rebuild from the source topic: slower, never wrong. The file
mechanics are in dedup/migrate.py, the HTTP ones in dedup/transfer.py.
"""

from __future__ import annotations

import logging
import tarfile
import threading
import time
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Callable, Iterator

from eopipe.core import partitioner as partitioners
from eopipe.core.assignment import Assignment
from eopipe.core.wire import H_KEYS, H_STOPPED, Migration, MigrationMethod, ReshardRequest, SnapshotRequest
from eopipe.dedup import migrate, transfer
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.logs import event
from eopipe.dedup.partition_store import PartitionStore
from eopipe.dedup.store import StateStore
from eopipe.dedup.transfer import TransferError
from eopipe.dedup.txn import Stopping

log = logging.getLogger("eopipe.dedup")


# -- handoff ------------------------------------------------------------------------------------
def take_over(cfg: WorkerConfig, states: StateStore, a: Assignment, p: int, halt: threading.Event,
              fetching: Callable[[], None]) -> Migration | None:
    """If p is being handed to this pod, fetch the old owner's snapshot and unpack it as p's
    store; returns how p's state got here (None: not a handoff). Any failure leaves the store
    missing, so recovery rebuilds it. Runs before the store is opened and before
    init_transactions; `fetching` is called when a download starts."""
    ho = a.handoffs.get(p)
    if not ho or ho.source == cfg.me:
        return None
    rec = migrate.read_migration_record(states.root, p)
    if states.exists(p):
        if rec and rec.get("generation") == a.generation:
            return Migration.from_json({**rec, "restarted": True})
        return Migration(method=MigrationMethod.LOCAL, generation=a.generation, from_=ho.source)
    fetching()
    t0 = time.monotonic()
    url = ho.url.rstrip("/") + SnapshotRequest(p, a.generation).path
    tmp = states.root / "snapshots" / f"incoming-{p}.tar"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    m = Migration(generation=a.generation, from_=ho.source)
    said: set[str] = set()

    def retrying(e: TransferError) -> None:  # once per kind: a 503 is asked again every 50 ms
        if (kind := "busy" if e.busy else str(e)) not in said:
            said.add(kind)
            event(log, INFO, "snapshot not available yet; retrying", partition=p, error=str(e))
    try:
        facts = transfer.fetch_with_retries(
            url, tmp, deadline=time.monotonic() + cfg.handoff_timeout_seconds,
            should_stop=halt.is_set, token=cfg.token, on_retry=retrying)
        t1 = time.monotonic()
        migrate.install_snapshot(tmp, states, p)
        m = m.model_copy(update=dict(
            method=MigrationMethod.SNAPSHOT, bytes=facts["bytes"], sha256=facts["sha256"],
            fetch_ms=int((time.monotonic() - t0) * 1000),
            transfer_ms=facts["ms"] + int((time.monotonic() - t1) * 1000),
            stopped_at_ms=facts.get(H_STOPPED)))
        event(log, INFO, "snapshot installed", partition=p, bytes=facts["bytes"],
              source=ho.source, fetch_ms=m.fetch_ms, transfer_ms=m.transfer_ms)
    except (TransferError, OSError, tarfile.TarError) as e:
        if halt.is_set():
            raise Stopping() from None
        states.drop(p)
        m = m.model_copy(update=dict(method=MigrationMethod.REBUILD, bytes=0, reason=str(e)[:300]))
        event(log, WARNING, "snapshot transfer failed: rebuilding from the source topic",
              partition=p, source=ho.source, error=str(e))
    finally:
        tmp.unlink(missing_ok=True)
    return m


# -- re-shard -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportFile:
    """A checked export on this pod's disk: its own, or a peer's downloaded (`downloaded`: this
    pod's copy, removed once applied)."""

    path: Path
    keys: int
    downloaded: bool = False


@dataclass(frozen=True)
class Import:
    """What a re-shard gives p: the keys of `files` to apply, after which p's store is complete
    for `to` partitions; or, with `rebuild`, none: rebuild p from the source instead."""

    reshard: int
    to: int
    files: tuple[ExportFile, ...]
    migration: Migration
    rebuild: bool = False
    newest: tuple[bytes, int] | None = None  # the record with the latest segment start

    def batches(self) -> Iterator[list[tuple[bytes, int]]]:
        """The keys, a batch at a time (migrate.IMPORT_BATCH). The newest record comes first,
        so the store's watermark, and with it which segments are live, is the one the whole
        import gives before any other key lands: applied in batches or at once, the same keys stay."""
        if self.newest is not None:
            yield [self.newest]
        for f in self.files:
            yield from migrate.read_export(f.path, f.keys, migrate.IMPORT_BATCH)

    def discard(self) -> None:
        for f in self.files:
            if f.downloaded:
                f.path.unlink(missing_ok=True)


def reshard(cfg: WorkerConfig, states: StateStore, a: Assignment, p: int, store: PartitionStore, rebuilt: bool,
            halt: threading.Event, importing: Callable[[], None]) -> Import | None:
    """During a re-shard (N -> N2, all partitions were paused first): export the keys of this
    old partition whose home moved, then gather the keys that moved into p from every old
    partition's owner. None: nothing to import. `rebuilt`: p's store was rebuilt just now (it
    holds keys by the new count only); `importing` is called when the import starts."""
    rs = a.reshard
    if not rs:
        return None
    rid, frm, to = rs.id, rs.source, rs.target
    root = states.root
    if p < frm and migrate.read_export_manifest(root, rid, p) is None:
        # Rebuilt: say the export is missing, and the importers rebuild instead of trusting it.
        man = migrate.write_exports(root, rid, p, store.iter_keys(), partitioners.get(cfg.partitioner), to,
                                    missing=rebuilt)
        event(log, INFO, "re-shard export written", partition=p, reshard=rid, missing=rebuilt,
              targets={q: t["keys"] for q, t in man["targets"].items()})
    if store.reshard_id == rid or p >= to:
        return None
    if rebuilt:
        return Import(rid, to, (), Migration(method=MigrationMethod.REBUILD, reshard=rid, keys=0, bytes=0))
    t0 = time.monotonic()
    importing()
    try:
        files, nbytes, newest = _gather(cfg, root, a, p, rid, frm, rs.peers, halt)
    except TransferError as e:
        if halt.is_set():
            raise Stopping() from None
        event(log, WARNING, "re-shard import failed: rebuilding from the source topic",
              partition=p, reshard=rid, error=str(e))
        return Import(rid, to, (), Migration(method=MigrationMethod.REBUILD, reshard=rid, reason=str(e)[:300]),
                      rebuild=True)
    return Import(rid, to, files, Migration(method=MigrationMethod.RESHARD_IMPORT, reshard=rid,
                                            keys=sum(f.keys for f in files), bytes=nbytes,
                                            import_ms=int((time.monotonic() - t0) * 1000)), newest=newest)


def _gather(cfg: WorkerConfig, root, a: Assignment, p: int, rid: int, frm: int, peers: dict,
            halt: threading.Event) -> tuple[tuple[ExportFile, ...], int, tuple[bytes, int] | None]:
    """The exports every other old partition wrote for p, checked on this pod's disk: its own
    for the partitions this pod owns, fetched from their owners for the rest. Returns them, the
    bytes read and the newest record; on a failure, removes what it downloaded."""
    deadline = time.monotonic() + cfg.handoff_timeout_seconds
    files: list[ExportFile] = []
    fetched: list[Path] = []
    nbytes, newest = 0, None
    try:
        for src in range(frm):
            if src == p:
                continue
            owner = a.owners.get(src)
            if owner == cfg.me:
                man = None
                while man is None:
                    man = migrate.read_export_manifest(root, rid, src)
                    if man is None:
                        if time.monotonic() > deadline or halt.is_set():
                            raise TransferError(f"own export of {src} not written")
                        time.sleep(0.2)
                if man.get("missing"):
                    raise TransferError(f"export of {src} unavailable", final=True)
                if (path := migrate.own_export(root, rid, src, p, man)) is None:
                    continue
                announced = man["targets"][str(p)].get("keys")
            else:
                url = peers.get(owner)
                if not url:
                    raise TransferError(f"no address for {owner}, owner of {src}", final=True)
                # Under the re-shard's own directory, which cleanup_reshards removes with it.
                path = root / "reshard" / str(rid) / f"incoming-{p}-{src}.bin"
                fetched.append(path)
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    announced = transfer.fetch_with_retries(
                        url.rstrip("/") + ReshardRequest(rid, src, p).path, path, deadline=deadline,
                        should_stop=halt.is_set, token=cfg.token).get(H_KEYS)
                except OSError as e:  # our own disk: a TransferError too, so the partition rebuilds
                    raise TransferError(f"import from {src}: {e.strerror or e}") from None
            try:
                n, top = migrate.check_export(path, announced)
                nbytes += path.stat().st_size
            except OSError as e:
                raise TransferError(f"import from {src}: {e.strerror or e}") from None
            files.append(ExportFile(path, n, downloaded=path in fetched))
            if top is not None and (newest is None or top[1] > newest[1]):
                newest = top
    except BaseException:
        for path in fetched:
            path.unlink(missing_ok=True)
        raise
    return tuple(files), nbytes, newest


# -- the record ---------------------------------------------------------------------------------
def record_migration(states: StateStore, p: int, m: Migration, generation: int, started_at_ms: int) -> Migration:
    """p runs: note the pause it saw and keep the record, so a restart still reports it."""
    now = int(time.time() * 1000)
    m = m.model_copy(update=dict(
        pause_ms=m.pause_ms if m.pause_ms is not None else max(0, now - (m.stopped_at_ms or started_at_ms)),
        generation=generation, running_at_ms=now))
    migrate.save_migration_record(states.root, p, m.to_json())
    return m
