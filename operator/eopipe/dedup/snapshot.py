"""Dedup snapshots in an object store (docs/design.md#snapshots): the pure part.

- where things go: `<prefix>/p-<p>/m-<created_ms>.json` (a snapshot's manifest) and
  `<prefix>/p-<p>/f/<sha256>` (a file of a RocksDB checkpoint, content-addressed: immutable,
  so uploaded once whatever snapshot names it, and never mistaken for another file of the same
  name from an earlier life of the store); `<prefix>/pipeline.yaml`, the pipeline's own
  manifest, for `eopipe restore`;
- the manifest: what a snapshot is (its files, and the committed source offset and coverage it
  corresponds to), written last, parsed strictly and bounded (docs/security.md);
- `choose`: whether a partition whose store is gone restores a snapshot or rebuilds;
- `prune`: what retention deletes.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import Enum

from eopipe.core.backupspec import BUCKET_PATTERN

MAX_MANIFEST_BYTES = 1 << 20
PIPELINE_MANIFEST = "pipeline.yaml"
MAX_PIPELINE_MANIFEST_BYTES = 1 << 20  # a ConfigMap holds 1 MiB
MAX_FILES = 10_000
MAX_FILE_BYTES = 1 << 40
MANIFEST_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA = re.compile(r"[0-9a-f]{64}")
_MANIFEST_KEY = re.compile(r"m-(\d{16})\.json")
_BUCKET = re.compile(BUCKET_PATTERN)  # the CRD checks the same (spec.dedup.backup.uri)


class BadManifest(ValueError):
    pass


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str     # without a trailing slash; may be empty

    def partition(self, p: int) -> str:
        return f"{self.prefix}/p-{p}/" if self.prefix else f"p-{p}/"

    def manifest_key(self, p: int, created_ms: int) -> str:
        return f"{self.partition(p)}m-{created_ms:016d}.json"

    @property
    def pipeline_key(self) -> str:
        """The pipeline's manifest (dedup/backup.Snapshotter.keep_manifest, `eopipe restore`)."""
        return f"{self.prefix}/{PIPELINE_MANIFEST}" if self.prefix else PIPELINE_MANIFEST

    def file_key(self, p: int, sha256: str) -> str:
        return f"{self.partition(p)}f/{sha256}"


def parse_uri(uri: str) -> Location:
    """`s3://bucket[/prefix]`; ValueError says what is wrong."""
    scheme, sep, rest = uri.partition("://")
    if scheme != "s3" or not sep:
        raise ValueError(f"bad backup URI {uri!r}: expected s3://bucket/prefix")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"bad backup URI {uri!r}: {bucket!r} is not a bucket name")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"bad backup URI {uri!r}: empty, '.' or '..' path segment")
    return Location(bucket, prefix)


@dataclass(frozen=True)
class FileRef:
    name: str       # the file's name in the checkpoint directory
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    partition: int
    source_topic: str
    group: str                      # the consumer group whose committed offsets it corresponds to
    created_ms: int
    applied_offset: int             # the store's keys are exactly those of the records below this
    partition_count: int | None     # the partition count the keys are complete for
    watermark_ms: int | None
    covered_since_ms: int | None
    window_ms: int | None
    files: tuple[FileRef, ...]
    version: int = MANIFEST_VERSION

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["files"] = [asdict(f) for f in self.files]
        return json.dumps(d, sort_keys=True).encode()


def _int(d: dict, k: str, *, optional: bool = False, lo: int = 0, hi: int = 1 << 62) -> int | None:
    v = d[k]
    if v is None and optional:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise BadManifest(f"{k}: expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def parse_manifest(data: bytes, partition: int) -> Manifest:
    """A manifest as the store returned it: exactly our keys and types, bounded, for `partition`."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise BadManifest(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadManifest(f"not JSON: {e}") from None
    keys = {"version", "partition", "source_topic", "group", "created_ms", "applied_offset", "partition_count",
            "watermark_ms", "covered_since_ms", "window_ms", "files"}
    if not isinstance(d, dict) or set(d) != keys:
        raise BadManifest(f"expected the keys {sorted(keys)}")
    if d["version"] != MANIFEST_VERSION:
        raise BadManifest(f"version {d['version']!r}, this worker reads {MANIFEST_VERSION}")
    if _int(d, "partition") != partition:
        raise BadManifest(f"manifest of partition {d['partition']}, not {partition}")
    if not isinstance(d["source_topic"], str) or not 0 < len(d["source_topic"]) <= 249:
        raise BadManifest("source_topic: expected a topic name")
    if not isinstance(d["group"], str) or not 0 < len(d["group"]) <= 255:
        raise BadManifest("group: expected a consumer group name")
    files = d["files"]
    if not isinstance(files, list) or not 0 < len(files) <= MAX_FILES:
        raise BadManifest(f"files: expected a list of 1 to {MAX_FILES}")
    refs = []
    for f in files:
        if not isinstance(f, dict) or set(f) != {"name", "sha256", "size"}:
            raise BadManifest("a file: expected the keys name, sha256, size")
        if not isinstance(f["name"], str) or not _NAME.fullmatch(f["name"]) or f["name"] in (".", ".."):
            raise BadManifest(f"a file name {f['name']!r}: not a plain file name")
        if not isinstance(f["sha256"], str) or not _SHA.fullmatch(f["sha256"]):
            raise BadManifest(f"a file's sha256 {f['sha256']!r}: expected 64 lowercase hex digits")
        refs.append(FileRef(f["name"], f["sha256"], _int(f, "size", hi=MAX_FILE_BYTES)))
    if len({r.name for r in refs}) != len(refs) or "CURRENT" not in {r.name for r in refs}:
        raise BadManifest("files: names repeat, or no CURRENT")
    return Manifest(partition=partition, source_topic=d["source_topic"], group=d["group"],
                    created_ms=_int(d, "created_ms"),
                    applied_offset=_int(d, "applied_offset"),
                    partition_count=_int(d, "partition_count", optional=True, lo=1),
                    watermark_ms=_int(d, "watermark_ms", optional=True),
                    covered_since_ms=_int(d, "covered_since_ms", optional=True),
                    window_ms=_int(d, "window_ms", optional=True, lo=1), files=tuple(refs))


def manifest_created(key: str) -> int | None:
    """The creation time a manifest's key names (its last path segment), None: not a manifest."""
    m = _MANIFEST_KEY.fullmatch(key.rpartition("/")[2])
    return int(m.group(1)) if m else None


# -- the decision ---------------------------------------------------------------------------
class Choice(str, Enum):
    KEEP = "keep"          # a store is here (or nothing to restore): the usual recovery
    RESTORE = "restore"    # download the snapshot, then replay [its offset, committed)
    REBUILD = "rebuild"    # no usable snapshot: the usual rebuild over the window


@dataclass(frozen=True)
class Facts:
    store_present: bool
    committed: int          # the group's committed offset for p (< 0: none)
    log_start: int          # p's first offset still in the log
    source_topic: str
    group: str              # the pipeline's consumer group
    home_count: int         # the partition count of the home check now
    reshard: bool           # a re-shard in progress
    now_ms: int
    window_ms: int
    segment_ms: int
    snapshot: Manifest | None   # the newest complete snapshot (None: none, or unreadable)


@dataclass(frozen=True)
class Decision:
    choice: Choice
    reason: str


def choose(f: Facts) -> Decision:
    """Restore a snapshot only where the replay after it gives exactly the store a rebuild would
    (docs/design.md#snapshots): every record from its offset to `committed` still in the log,
    its keys complete for today's partition count, and not all of them expired already."""
    s = f.snapshot
    if f.store_present:
        return Decision(Choice.KEEP, "a store is present")
    if f.committed < 0:
        return Decision(Choice.KEEP, "nothing committed yet: the store starts empty")
    if s is None:
        return Decision(Choice.REBUILD, "no snapshot")
    if (s.source_topic, s.group) != (f.source_topic, f.group):
        # Another pipeline's keys (another key, window, topic) or offsets: never this one's state.
        return Decision(Choice.REBUILD, f"the snapshot is of topic {s.source_topic!r}, group {s.group!r}")
    if s.applied_offset > f.committed:
        return Decision(Choice.REBUILD,
                        f"the snapshot is ahead of the committed offset ({s.applied_offset} > {f.committed})")
    if s.applied_offset < f.log_start:
        return Decision(Choice.REBUILD, "retention deleted records after the snapshot "
                                        f"(its offset {s.applied_offset} < log start {f.log_start})")
    if f.reshard or s.partition_count != f.home_count:
        return Decision(Choice.REBUILD,
                        f"the snapshot's keys are complete for {s.partition_count} partitions, not {f.home_count}")
    start = f.now_ms - f.window_ms - f.segment_ms
    if s.watermark_ms is not None and s.watermark_ms < start:
        return Decision(Choice.REBUILD, "the snapshot is older than the window")
    return Decision(Choice.RESTORE, f"replay from {s.applied_offset} to {f.committed}")


# -- retention ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredFile:
    key: str
    age_s: float


def retention(manifest_keys: list[str], keep: int) -> tuple[list[str], list[str]]:
    """The manifests kept (the newest `keep`) and those retention deletes, oldest first."""
    ordered = sorted((k for k in manifest_keys if manifest_created(k) is not None), key=manifest_created)
    cut = max(0, len(ordered) - keep)
    return ordered[cut:], ordered[:cut]


def orphans(files: list[StoredFile], referenced: set[str], grace_s: float) -> list[str]:
    """The files no kept manifest names (`referenced`: their keys), older than `grace_s`: a
    snapshot being uploaded (e.g. by an old owner still finishing) names its files only at its
    end, so a young unnamed file may be about to be named."""
    return [f.key for f in files if f.key not in referenced and f.age_s > grace_s]
