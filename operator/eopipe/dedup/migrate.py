"""Moving dedup state between pods: snapshots (docs/design.md#snapshot-handoff) and re-shard
exports (docs/design.md#re-shard-on-partition-growth); their URL paths and headers are in
eopipe.core.wire.

Handoff of partition p from pod A to pod B:
    A stops p (commit, close), takes a RocksDB checkpoint of p's store, packs it as an
    uncompressed tar under <state_dir>/snapshots/, and serves it at GET /snapshots/<p> with
    Content-Length and X-Eopipe-Sha256 (plus the applied offset and when p stopped). B downloads
    it (bounded retries and deadline), checks size and sha256, unpacks it as p's store and then
    runs the normal recovery (replay of [applied, committed), init_transactions fences A).
    Any failure (A gone, 404, bad checksum, timeout) -> B rebuilds p from the source topic.

Re-shard of a partition increase N -> N2 (all owners paused first):
    the owner of each old partition p exports the keys whose home by partitioner(k) mod N2 is
    not p, one file per target q under <state_dir>/reshard/<id>/p-<p>/ (records: i64 segment
    start ms, u32 length, key), with a manifest.json written last; served at
    GET /reshard/<id>/<p>/<q>. The owner of q imports from every old partition's owner.

A transfer is data from another pod, so it is read within bounds (the download's: dedup/transfer.py):
a snapshot is unpacked only if its members are plain files that fit on disk; an export is parsed
from its file a batch at a time, with every length checked against what is left, and its key
count against the announced one.
Every refusal is a TransferError, which the worker answers with a rebuild (dedup/incoming.py).

Pure file helpers only; the worker decides when to call them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tarfile
import time
from pathlib import Path

from eopipe.dedup.transfer import CHUNK, TransferError, ensure_room

_REC = struct.Struct(">qI")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json_atomic(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


# -- migration records: how a partition's state came here, kept across restarts ----------------
def _record_path(state_dir: Path, partition: int) -> Path:
    return Path(state_dir) / "migrations" / f"p-{partition}.json"


def read_migration_record(state_dir: Path, partition: int) -> dict | None:
    try:
        return json.loads(_record_path(state_dir, partition).read_text())
    except (OSError, ValueError):
        return None


def save_migration_record(state_dir: Path, partition: int, doc: dict) -> None:
    path = _record_path(state_dir, partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(path, doc)


# -- snapshots --------------------------------------------------------------------------------
def snapshot_paths(state_dir: Path, partition: int) -> tuple[Path, Path]:
    d = Path(state_dir) / "snapshots"
    return d / f"p-{partition}.tar", d / f"p-{partition}.json"


def make_snapshot(store, partition: int, *, generation: int, stopped_at_ms: int) -> dict:
    """Checkpoints the (closed) store of `partition`, packs it, writes the manifest last."""
    tar_path, manifest_path = snapshot_paths(store.root, partition)
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    ck = tar_path.parent / f"p-{partition}.checkpoint"
    shutil.rmtree(ck, ignore_errors=True)
    ps = store.open(partition)
    try:
        stats = ps.stats()
        applied = ps.applied_offset
        ps.checkpoint(ck)
    finally:
        store.close_partition(partition)
    with tarfile.open(tar_path, "w") as tf:
        for f in sorted(ck.iterdir()):
            tf.add(f, arcname=f.name)
    shutil.rmtree(ck, ignore_errors=True)
    manifest = {"partition": partition, "generation": generation, "applied_offset": applied,
                "bytes": tar_path.stat().st_size, "sha256": sha256_file(tar_path),
                "keys": stats["keys"], "stopped_at_ms": stopped_at_ms,
                "created_at_ms": int(time.time() * 1000)}
    _write_json_atomic(manifest_path, manifest)
    return manifest


def read_snapshot_manifest(state_dir: Path, partition: int) -> dict | None:
    tar_path, manifest_path = snapshot_paths(state_dir, partition)
    try:
        doc = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return None
    return doc if tar_path.exists() else None


def remove_snapshot(state_dir: Path, partition: int) -> None:
    for p in snapshot_paths(state_dir, partition):
        p.unlink(missing_ok=True)


# A partition's RocksDB directory holds its SST files (up to 64 MiB each) and a few more: far
# fewer than this, however large the state.
MAX_SNAPSHOT_FILES = 100_000


def install_snapshot(tar_path: Path, store, partition: int) -> None:
    """Replaces partition's store with the snapshot's contents (the store must be closed)."""
    target = store.path(partition)
    staging = target.with_name(target.name + ".incoming")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(tar_path, "r") as tf:
        members = []
        for m in tf:  # read one at a time: a snapshot of countless empty members ends at the cap, not in memory
            # Plain files only (a GNU sparse member is a "file" that unpacks far beyond its size).
            if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or "/" in m.name or m.name.startswith("."):
                raise TransferError(f"unexpected member {m.name!r} in snapshot", final=True)
            if len(members) == MAX_SNAPSHOT_FILES:
                raise TransferError(f"snapshot has more than {MAX_SNAPSHOT_FILES} files", final=True)
            members.append(m)
        ensure_room(staging, sum(m.size for m in members), "snapshot unpacked")
        # Members checked above; the "data" filter once more where the Python has it (3.11.4+:
        # the image's Debian 3.11.2 has not, and the checks above are enough there).
        tf.extractall(staging, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    store.drop(partition)
    os.replace(staging, target)


# -- re-shard exports ---------------------------------------------------------------------------
def export_dir(state_dir: Path, reshard_id: int, partition: int) -> Path:
    return Path(state_dir) / "reshard" / str(reshard_id) / f"p-{partition}"


def write_exports(state_dir: Path, reshard_id: int, partition: int, items, home, new_count: int,
                  *, missing: bool = False) -> dict:
    """Splits (segment start, key) items by home(key, new_count) != partition into one file per
    target; the manifest (written last) marks the export complete."""
    d = export_dir(state_dir, reshard_id, partition)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    files: dict[int, object] = {}
    counts: dict[int, int] = {}
    scanned = 0
    try:
        if not missing:
            for start, key in items:
                scanned += 1
                q = home(key, new_count)
                if q == partition:
                    continue
                f = files.get(q)
                if f is None:
                    f = files[q] = open(d / f"to-{q}.bin", "wb")
                f.write(_REC.pack(start, len(key)))
                f.write(key)
                counts[q] = counts.get(q, 0) + 1
    finally:
        for f in files.values():
            f.close()
    targets = {str(q): {"keys": counts[q], "bytes": (d / f"to-{q}.bin").stat().st_size,
                        "sha256": sha256_file(d / f"to-{q}.bin")} for q in sorted(files)}
    manifest = {"reshard": reshard_id, "partition": partition, "to": new_count, "missing": missing,
                "scanned": scanned, "targets": targets}
    _write_json_atomic(d / "manifest.json", manifest)
    return manifest


def read_export_manifest(state_dir: Path, reshard_id: int, partition: int) -> dict | None:
    try:
        return json.loads((export_dir(state_dir, reshard_id, partition) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


# Records per list read from an export: a re-shard moves a partition's whole key set, which
# can be far larger than a dedup pod's memory, so it reaches the store a batch at a time.
IMPORT_BATCH = 50_000


def read_export(path: Path, keys: int | None = None, batch: int = IMPORT_BATCH):
    """The (key, segment start) records of an export file, in lists of at most `batch`;
    TransferError (final) where it is malformed: a record cut short, a length past the end, or
    (with `keys`, the count its manifest or headers announced) another number of records."""
    with open(path, "rb") as f:
        left = os.fstat(f.fileno()).st_size
        out: list[tuple[bytes, int]] = []
        n = 0
        while left:
            if left < _REC.size:
                raise TransferError(f"export cut short: {left} bytes after record {n}", final=True)
            start, klen = _REC.unpack(f.read(_REC.size))
            left -= _REC.size
            if klen > left:  # checked before the read, which would allocate klen bytes
                raise TransferError(f"export record {n}: key of {klen} bytes, {left} left", final=True)
            if keys is not None and n >= keys:
                raise TransferError(f"export has more than the {keys} keys announced", final=True)
            out.append((f.read(klen), start))
            left -= klen
            n += 1
            if len(out) == batch:
                yield out
                out = []
    if keys is not None and n != keys:
        raise TransferError(f"export has {n} keys, {keys} announced", final=True)
    if out:
        yield out


def check_export(path: Path, keys: int | None = None) -> tuple[int, tuple[bytes, int] | None]:
    """One pass over an export (read_export's checks): its record count and its newest record."""
    n, newest = 0, None
    for got in read_export(path, keys):
        n += len(got)
        top = max(got, key=lambda e: e[1])
        if newest is None or top[1] > newest[1]:
            newest = top
    return n, newest


def own_export(state_dir: Path, reshard_id: int, partition: int, target: int, manifest: dict) -> Path | None:
    """This pod's own export file of `partition` for `target` (None: it exported nothing there),
    checked against the manifest (bytes, sha256) as a peer's would be; TransferError if they differ."""
    t = (manifest.get("targets") or {}).get(str(target))
    if t is None:
        return None
    f = export_dir(state_dir, reshard_id, partition) / f"to-{target}.bin"
    try:
        same = f.stat().st_size == t.get("bytes") and sha256_file(f) == t.get("sha256")
    except OSError as e:
        raise TransferError(f"own export of {partition}: {e.strerror or e}", final=True) from None
    if not same:
        raise TransferError(f"own export of {partition} to {target} does not match its manifest", final=True)
    return f


def cleanup_reshards(state_dir: Path, keep: set[int]) -> None:
    root = Path(state_dir) / "reshard"
    if not root.exists():
        return
    for d in root.iterdir():
        try:
            rid = int(d.name)
        except ValueError:
            continue
        if rid not in keep:
            shutil.rmtree(d, ignore_errors=True)
