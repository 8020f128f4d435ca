"""Dedup snapshots in an object store (docs/design.md#snapshots): the I/O around dedup/snapshot.py.

- `Bucket` (dedup/objectstore.py): the few S3 calls;
- `Snapshotter`: the worker's thread that, every interval, checkpoints each running partition's
  RocksDB, uploads the files the store does not have yet, then the manifest (last), then prunes;
  and keeps the pipeline's manifest (`--pipeline-manifest`) there as it changes;
- `restore_latest`: a partition whose store is gone gets the newest snapshot back, when
  `snapshot.choose` says it may; any failure leaves no store (recovery then rebuilds).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import weakref
from dataclasses import replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Callable, Iterable

from prometheus_client import Counter, Gauge

from eopipe.dedup import snapshot
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.logs import event
from eopipe.dedup.metrics import Metrics
from eopipe.dedup.objectstore import BackupError, Bucket
from eopipe.dedup.partition_store import read_meta
from eopipe.dedup.migrate import sha256_file
from eopipe.dedup.snapshot import Choice, FileRef, Manifest, StoredFile
from eopipe.dedup.store import StateStore
from eopipe.dedup.transfer import ensure_room

log = logging.getLogger("eopipe.dedup")
PROGRESS_SECONDS = 10.0


class Progress:
    """A long transfer's log line (`msg`: bytes and files so far of the whole) at most every
    PROGRESS_SECONDS, so a store of gigabytes shows it moving; the final line is the caller's."""

    def __init__(self, msg: str, p: int, total_bytes: int, total_files: int, clock=time.monotonic):
        self.msg, self.p, self.total_bytes, self.total_files, self.clock = msg, p, total_bytes, total_files, clock
        self.bytes = self.files = 0
        self.t0 = self.last = clock()

    def add(self, size: int) -> bool:
        """One file of `size` bytes done; whether a line was logged."""
        self.bytes += size
        self.files += 1
        now = self.clock()
        if now - self.last < PROGRESS_SECONDS or self.files == self.total_files:
            return False
        self.last = now
        event(log, INFO, self.msg, partition=self.p, bytes=self.bytes, of_bytes=self.total_bytes, files=self.files,
              of_files=self.total_files, seconds=round(now - self.t0, 1))
        return True


# -- metrics ----------------------------------------------------------------------------------
class BackupMetrics:
    def __init__(self, m: Metrics):
        r, lp = m.registry, ["partition"]
        self.snapshots = Counter("eopipe_dedup_snapshots", "Snapshots uploaded to the object store", lp, registry=r)
        self.failures = Counter("eopipe_dedup_snapshot_failures", "Snapshots that failed", lp, registry=r)
        self.uploaded = Counter("eopipe_dedup_snapshot_uploaded_bytes", "Bytes uploaded for snapshots", lp, registry=r)
        self.offset = Gauge("eopipe_dedup_snapshot_offset", "Source offset of the last snapshot uploaded", lp,
                            registry=r)
        self.restores = Counter("eopipe_dedup_snapshot_restores",
                                "Recoveries of a lost store: restored from snapshot, or rebuilt instead",
                                ["partition", "outcome"], registry=r)


_metrics: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_metrics_lock = threading.Lock()


def metrics_of(m: Metrics) -> BackupMetrics:
    """The worker's snapshot series, registered once in its registry."""
    with _metrics_lock:
        bm = _metrics.get(m)
        if bm is None:
            bm = _metrics[m] = BackupMetrics(m)
        return bm


def bucket_of(cfg: WorkerConfig) -> Bucket:
    return Bucket(snapshot.parse_uri(cfg.backup_uri), cfg.backup_endpoint)


# -- taking snapshots -------------------------------------------------------------------------
class Snapshotter(threading.Thread):
    """Every `backup_interval_seconds`, a snapshot of each running partition whose store moved on."""

    def __init__(self, cfg: WorkerConfig, store: StateStore, metrics: Metrics,
                 partitions: Callable[[], Iterable[int]], running: Callable[[int], bool],
                 bucket: Bucket | None = None):
        super().__init__(name="snapshots", daemon=True)
        self.cfg, self.store, self.partitions, self.running = cfg, store, partitions, running
        self.bucket = bucket or bucket_of(cfg)
        self.metrics = metrics_of(metrics)
        self.halt = threading.Event()
        self.last: dict[int, int] = {}          # p -> applied offset of its last snapshot
        self.uploaded: dict[int, set[str]] = {}  # p -> file keys known to be in the store
        self._sha: dict[tuple, str] = {}         # (inode, size, mtime) -> sha256: SSTs hashed once
        self._manifests: dict[str, Manifest] = {}  # key -> manifest: one written is never rewritten
        self._pipeline: bytes | None = None         # the pipeline's manifest as last uploaded
        self.work = Path(cfg.state_dir) / ".snapshots"

    def stop(self) -> None:
        self.halt.set()

    def run(self) -> None:
        c = self.cfg
        event(log, INFO, "snapshots on", uri=c.backup_uri, endpoint=c.backup_endpoint,
              interval_seconds=c.backup_interval_seconds, retention=c.backup_retention)
        if not self.bucket.has_credentials:
            event(log, WARNING, "snapshots: no credentials (env AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
        while not self.halt.wait(c.backup_interval_seconds):
            try:
                self.keep_manifest()
            except Exception as e:  # noqa: BLE001 - the next round tries again
                event(log, WARNING, "pipeline manifest not uploaded", error=f"{type(e).__name__}: {e}")
            for p in list(self.partitions()):
                if self.halt.is_set():
                    break
                try:
                    self.take(p)
                except Exception as e:  # noqa: BLE001 - the next round tries again
                    self.metrics.failures.labels(str(p)).inc()
                    event(log, WARNING, "snapshot failed", partition=p, error=f"{type(e).__name__}: {e}")
        shutil.rmtree(self.work, ignore_errors=True)

    def keep_manifest(self) -> None:
        """The pipeline's manifest (a ConfigMap's file: the kubelet refreshes it) uploaded when it changed.
        Every pod does it: any one left keeps it current."""
        path = self.cfg.pipeline_manifest
        if path is None or not path.is_file():
            return
        with open(path, "rb") as f:
            data = f.read(snapshot.MAX_PIPELINE_MANIFEST_BYTES + 1)
        if data == self._pipeline or not data:
            return
        if len(data) > snapshot.MAX_PIPELINE_MANIFEST_BYTES:
            raise ValueError(f"{path}: larger than {snapshot.MAX_PIPELINE_MANIFEST_BYTES} bytes")
        self.bucket.put_bytes(self.bucket.loc.pipeline_key, data)
        self._pipeline = data
        event(log, INFO, "pipeline manifest uploaded", key=self.bucket.loc.pipeline_key, bytes=len(data))

    def checkpoint(self, p: int, dest: Path) -> bool:
        """A checkpoint of p's open store, if p runs and its store moved on since the last one.
        Under the store's lock, so p's store cannot be closed under the checkpoint."""
        return self.store.checkpoint_open(p, dest, lambda ps: self.running(p) and ps.applied_offset is not None
                                          and ps.applied_offset != self.last.get(p))

    def _sha256(self, path: Path) -> str:
        st = path.stat()
        k = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if k not in self._sha:
            self._sha[k] = sha256_file(path)
        return self._sha[k]

    def take(self, p: int) -> Manifest | None:
        t0, cpu0 = time.monotonic(), time.thread_time()
        dest = self.work / f"p-{p}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not self.checkpoint(p, dest):
                return None
            meta = read_meta(dest)
            b, lbl = self.bucket, str(p)
            known = self.uploaded.setdefault(p, set())
            refs, sent = [], 0
            files = sorted(x for x in dest.iterdir() if x.is_file())
            progress = Progress("uploading snapshot", p, sum(f.stat().st_size for f in files), len(files))
            for f in files:
                ref = FileRef(f.name, self._sha256(f), f.stat().st_size)
                key = b.loc.file_key(p, ref.sha256)
                if key not in known and not b.exists(key):
                    b.put_file(key, f)
                    sent += ref.size
                known.add(key)
                refs.append(ref)
                progress.add(ref.size)
            m = Manifest(partition=p, source_topic=self.cfg.source_topic, group=self.cfg.group_id,
                         created_ms=int(time.time() * 1000),
                         files=tuple(refs), **meta)
            mkey = b.loc.manifest_key(p, m.created_ms)
            b.put_bytes(mkey, m.to_json())  # last: the snapshot is complete
            self._manifests[mkey] = m
            self.last[p] = m.applied_offset
            self.prune(p)
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        self.metrics.snapshots.labels(lbl).inc()
        self.metrics.uploaded.labels(lbl).inc(sent)
        self.metrics.offset.labels(lbl).set(m.applied_offset)
        event(log, INFO, "snapshot uploaded", partition=p, applied_offset=m.applied_offset, files=len(refs),
              bytes=m.bytes, uploaded_bytes=sent, seconds=round(time.monotonic() - t0, 3),
              cpu_seconds=round(time.thread_time() - cpu0, 3))  # this thread's: what the data path lost
        return m

    def prune(self, p: int) -> None:
        b = self.bucket
        kept, old = snapshot.retention(b.manifests(p), self.cfg.backup_retention)
        mine = b.loc.partition(p)
        for k in [k for k in self._manifests if k.startswith(mine) and k not in kept]:
            del self._manifests[k]  # deleted, here or by another owner: only the kept are cached
        for k in kept:  # read once each, not at every round
            if k not in self._manifests:
                self._manifests[k] = b.manifest(k, p)
        referenced = {b.loc.file_key(p, f.sha256) for k in kept for f in self._manifests[k].files}
        files = [StoredFile(k, age) for k, age in b.list(mine + "f/")]
        gone = old + snapshot.orphans(files, referenced, grace_s=max(600.0, 2 * self.cfg.backup_interval_seconds))
        if gone:
            b.delete(gone)
            self.uploaded[p] = self.uploaded.get(p, set()) - set(gone)


# -- restoring --------------------------------------------------------------------------------
def newest(b: Bucket, p: int) -> tuple[Manifest | None, str]:
    """The newest complete snapshot of p, or None and why."""
    keys = b.manifests(p)
    if not keys:
        return None, "no snapshot"
    key = max(keys, key=snapshot.manifest_created)
    try:
        return b.manifest(key, p), key
    except (snapshot.BadManifest, BackupError) as e:
        return None, f"{key}: bad manifest: {e}"


def download(b: Bucket, m: Manifest, store: StateStore, p: int) -> None:
    """The snapshot's files into p's store directory, whole or not at all."""
    tmp = Path(store.root) / f".restore-p-{p}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        ensure_room(tmp, m.bytes, "snapshot")
        progress = Progress("restoring snapshot", p, m.bytes, len(m.files))
        for ref in m.files:
            b.download(b.loc.file_key(p, ref.sha256), tmp / ref.name, ref)
            progress.add(ref.size)
        shutil.rmtree(store.path(p), ignore_errors=True)
        os.replace(tmp, store.path(p))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore_latest(cfg: WorkerConfig, store: StateStore, metrics: Metrics, facts: snapshot.Facts,
                   p: int) -> snapshot.Decision:
    """Brings back p's newest snapshot when `snapshot.choose` says so (the facts' snapshot is
    looked up here); else, or on any failure, leaves p without a store, logged."""
    t0 = time.monotonic()
    bm = metrics_of(metrics)
    b, m, where = None, None, "no snapshot"
    try:
        b = bucket_of(cfg)
        m, where = newest(b, p)
    except Exception as e:  # noqa: BLE001 - no snapshot: recovery rebuilds
        where = f"the object store: {type(e).__name__}: {e}"
    d = snapshot.choose(replace(facts, snapshot=m))
    if d.choice is Choice.KEEP:
        return d
    if d.choice is Choice.RESTORE:
        try:
            download(b, m, store, p)
        except Exception as e:  # noqa: BLE001
            d = snapshot.Decision(Choice.REBUILD, f"download failed: {type(e).__name__}: {e}")
    if d.choice is Choice.RESTORE:
        bm.restores.labels(str(p), "snapshot").inc()
        event(log, INFO, "restored from snapshot", partition=p, snapshot_offset=m.applied_offset,
              committed=facts.committed, snapshot=where, files=len(m.files), bytes=m.bytes,
              seconds=round(time.monotonic() - t0, 3))
    else:
        bm.restores.labels(str(p), "rebuild").inc()
        event(log, WARNING, "not restored from snapshot: rebuilding from the source", partition=p,
              reason=d.reason if m is not None or d.choice is not Choice.REBUILD else where)
    return d
