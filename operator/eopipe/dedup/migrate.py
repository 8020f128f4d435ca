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

A transfer is data from another pod, so it is read within bounds: a download must announce its
Content-Length, is refused before a byte is written unless that fits the free disk space with
DISK_MARGIN to spare, and is refused if the body runs longer (or shorter) than announced; a
snapshot is unpacked only if its members are plain files that fit on disk; an export is parsed
with every length checked against what is left, and its key count against the announced one.
Every refusal is a TransferError, which the worker answers with a rebuild (dedup/handoff.py).

Pure file and HTTP helpers only; the worker decides when to call them.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import struct
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from eopipe.core.wire import H_APPLIED, H_KEYS, H_SHA, H_STOPPED
from eopipe.dedup import auth

_REC = struct.Struct(">qI")
CHUNK = 1 << 20
BUSY_RETRY = 0.05  # seconds before asking again after a 503
# Left free after a transfer lands: RocksDB's own writes (WAL, flushes, compactions) and the
# logs need room too, and a full disk would fail the partitions that are running.
DISK_MARGIN = 64 << 20
_INT = re.compile(r"-?[0-9]{1,19}")


class TransferError(Exception):
    """The state could not be fetched; `final` means retrying will not help (404, 410);
    `busy` that the peer answered it is not ready yet (503): worth asking again soon."""

    def __init__(self, msg: str, final: bool = False, busy: bool = False):
        super().__init__(msg)
        self.final = final
        self.busy = busy


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


def _get(url: str, timeout: float, token: str | None = None):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=auth.headers(token)), timeout=timeout)
    except urllib.error.HTTPError as e:
        # 401/403: the peer has another token or none; waiting does not change that.
        if e.code in (401, 403, 404, 410):
            raise TransferError(f"{url}: HTTP {e.code}", final=True) from None
        raise TransferError(f"{url}: HTTP {e.code}", busy=e.code == 503) from None
    except http.client.HTTPException as e:  # not HTTP, or cut short in its head
        raise TransferError(f"{url}: malformed answer ({type(e).__name__})") from None
    except (urllib.error.URLError, OSError) as e:
        raise TransferError(f"{url}: {getattr(e, 'reason', e)}") from None


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def ensure_room(directory: Path, size: int, what: str) -> None:
    """TransferError (final: a rebuild needs no transfer) unless `size` bytes fit in
    `directory`'s file system with DISK_MARGIN left."""
    free = free_bytes(directory)
    if size > free - DISK_MARGIN:
        raise TransferError(f"{what}: {size} bytes do not fit ({free} free, {DISK_MARGIN} kept)", final=True)


def announced_size(url: str, value: str | None) -> int:
    """The Content-Length a transfer must announce: without it, no bound to check it against."""
    if value is None or not _INT.fullmatch(value.strip()) or int(value) < 0:
        raise TransferError(f"{url}: no valid Content-Length", final=True)
    return int(value)


def header_facts(url: str, headers) -> dict[str, int | None]:
    """The transfer's facts as numbers (None: not sent; "None" as an older server sent it)."""
    out: dict[str, int | None] = {}
    for k in (H_APPLIED, H_STOPPED, H_KEYS):
        v = (headers.get(k) or "").strip()
        if v in ("", "None"):
            out[k] = None
        elif _INT.fullmatch(v):
            out[k] = int(v)
        else:
            raise TransferError(f"{url}: malformed {k} header", final=True)
    return out


def copy_capped(src, dst, size: int, what: str) -> str:
    """Copies exactly `size` bytes of src (a response) into dst; its sha256 (hex). TransferError
    if src ends short of `size`, or has more: a body over what it announced is not read past
    the first byte too many."""
    h = hashlib.sha256()
    got = 0
    while chunk := src.read(min(CHUNK, size + 1 - got)):
        got += len(chunk)
        if got > size:
            raise TransferError(f"{what}: body longer than the {size} bytes announced", final=True)
        dst.write(chunk)
        h.update(chunk)
    if got != size:
        raise TransferError(f"{what}: got {got} bytes, expected {size}")
    return h.hexdigest()


def download(url: str, dest: Path, *, timeout: float = 30, token: str | None = None) -> dict:
    """GETs url into dest with the pipeline's token, within the bounds above; checks the size
    and sha256. Returns the headers' facts (numbers) and how long it took (ms)."""
    t0 = time.monotonic()
    with _get(url, timeout, token) as r:
        size = announced_size(url, r.headers.get("Content-Length"))
        facts = header_facts(url, r.headers)
        want = r.headers.get(H_SHA)
        ensure_room(Path(dest).parent, size, url)
        try:
            with open(dest, "wb") as f:
                digest = copy_capped(r, f, size, url)
        except (OSError, http.client.HTTPException) as e:  # the peer went away mid-body, or our disk
            raise TransferError(f"{url}: {type(e).__name__}: {e}") from None
    if want and digest != want:
        raise TransferError(f"{url}: sha256 mismatch (got {digest[:12]}, expected {want[:12]})")
    return {"bytes": size, "sha256": digest, "ms": int((time.monotonic() - t0) * 1000), **facts}


def fetch_with_retries(url: str, dest: Path, *, deadline: float, should_stop=lambda: False,
                       on_retry=lambda err: None, token: str | None = None) -> dict:
    """Retries transient failures (connection refused while A restarts, 503 while A prepares,
    a checksum mismatch) until the monotonic deadline; 404/410 give up at once. A 503 is asked
    again after BUSY_RETRY: A is seconds at most from ready, and the partition waits for it."""
    delay = 0.2
    while True:
        if should_stop():
            raise TransferError("stopping", final=True)
        try:
            return download(url, dest, timeout=max(1.0, min(60.0, deadline - time.monotonic())), token=token)
        except TransferError as e:
            busy = e.busy
            wait = BUSY_RETRY if busy else delay
            if e.final or time.monotonic() + wait >= deadline:
                raise
            on_retry(e)
        time.sleep(wait)
        if not busy:
            delay = min(delay * 1.5, 2.0)


def install_snapshot(tar_path: Path, store, partition: int) -> None:
    """Replaces partition's store with the snapshot's contents (the store must be closed)."""
    target = store.path(partition)
    staging = target.with_name(target.name + ".incoming")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(tar_path, "r") as tf:
        members = tf.getmembers()
        for m in members:
            # Plain files only (a GNU sparse member is a "file" that unpacks far beyond its size).
            if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or "/" in m.name or m.name.startswith("."):
                raise TransferError(f"unexpected member {m.name!r} in snapshot", final=True)
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


def parse_export(data: bytes, keys: int | None = None) -> list[tuple[bytes, int]]:
    """(key, segment start) of an export file; TransferError (final) if it is malformed: a
    record cut short, a length past the end, or (with `keys`, the count its manifest or headers
    announced) another number of records."""
    out = []
    i, n = 0, len(data)
    while i < n:
        if n - i < _REC.size:
            raise TransferError(f"export cut short: {n - i} bytes after record {len(out)}", final=True)
        start, klen = _REC.unpack_from(data, i)
        i += _REC.size
        if klen > n - i:
            raise TransferError(f"export record {len(out)}: key of {klen} bytes, {n - i} left", final=True)
        if keys is not None and len(out) >= keys:
            raise TransferError(f"export has more than the {keys} keys announced", final=True)
        out.append((data[i:i + klen], start))
        i += klen
    if keys is not None and len(out) != keys:
        raise TransferError(f"export has {len(out)} keys, {keys} announced", final=True)
    return out


def read_own_export(state_dir: Path, reshard_id: int, partition: int, target: int, manifest: dict) -> list:
    """The keys this pod's own export of `partition` gives `target`, checked against the
    manifest (bytes, sha256, keys) as a peer's would be; TransferError if they differ."""
    t = (manifest.get("targets") or {}).get(str(target))
    if t is None:
        return []
    f = export_dir(state_dir, reshard_id, partition) / f"to-{target}.bin"
    try:
        data = f.read_bytes()
    except OSError as e:
        raise TransferError(f"own export of {partition}: {e.strerror or e}", final=True) from None
    if len(data) != t.get("bytes") or hashlib.sha256(data).hexdigest() != t.get("sha256"):
        raise TransferError(f"own export of {partition} to {target} does not match its manifest", final=True)
    return parse_export(data, t.get("keys"))


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
