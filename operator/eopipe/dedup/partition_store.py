"""The dedup state of one source partition: one RocksDB, one column family per time segment
(the layout, expiry and atomicity are described in dedup/store.py, which opens these)."""

from __future__ import annotations

import math
import struct
import time
from pathlib import Path
from typing import Iterable, Protocol

from rocksdict import AccessType, Checkpoint, Options, Rdict, WriteBatch

from eopipe.core import native

MAX_SKEW_MS = 60_000
_META_APPLIED = b"applied_offset"
_META_WATERMARK = b"watermark_ms"
_META_COVERED = b"covered_since_ms"
# The window the store was last opened for: a longer one may need its coverage extended
# (dedup/recovery.extend_since_ms); absent in stores written before it was kept.
_META_WINDOW = b"window_ms"
# The source partition count this partition's keys are complete for (set after a re-shard
# import; absent in stores that never went through one) and the last re-shard imported.
_META_NPARTS = b"partition_count"
_META_RESHARD = b"reshard_id"
_SEG_PREFIX = "seg-"
_I64 = struct.Struct(">q")


def _enc(v: int) -> bytes:
    return _I64.pack(v)


def _dec(b: bytes | None) -> int | None:
    return None if b is None else _I64.unpack(b)[0]


def _seg_name(start_ms: int, length_ms: int) -> str:
    """A segment's column family names its span: a store keeps segments of the lengths it had
    when each was created, so a changed window (segment = window / segments) expires each by
    its own end."""
    return f"{_SEG_PREFIX}{start_ms:016d}.{length_ms}"


def _parse_seg(name: str) -> tuple[int, int | None]:
    """(start, length) of a segment's name; length None: a name without one (older stores)."""
    start, _, length = name[len(_SEG_PREFIX):].partition(".")
    return int(start), int(length) if length else None


def legacy_length_ms(starts: list[int], window_ms: int) -> int:
    """The length of segments named without one (written before lengths were kept), all of one
    length L whose starts are multiples of L: their gcd is a multiple of L, so never shorter
    (a segment is never dropped early), and is L as soon as two of them are neighbours; capped
    at the window (a lone segment's gcd is its start)."""
    return max(1, min(math.gcd(*starts) or window_ms, window_ms))


def _by_segment(entries: dict[bytes, int] | Iterable[tuple[bytes, int]], seg_ms: int, now_ms: int,
                wm: int | None) -> tuple[dict[int, list[bytes]], int | None]:
    """The keys by the start of their event time's segment (no event time: now), and the
    watermark `wm` moved up to the newest event time."""
    if isinstance(entries, dict) and entries:
        # The common case, a transaction's keys: all in one segment, found at C speed.
        try:
            lo, hi = min(entries.values()), max(entries.values())
            one = lo > 0 and lo // seg_ms == hi // seg_ms
        except TypeError:  # an event time of None
            one = False
        if one:
            return {(lo // seg_ms) * seg_ms: list(entries)}, hi if wm is None else max(wm, hi)
    by_seg: dict[int, list[bytes]] = {}
    for key, ts in entries.items() if isinstance(entries, dict) else entries:
        if ts is None or ts <= 0:
            ts = now_ms
        by_seg.setdefault((ts // seg_ms) * seg_ms, []).append(key)
        if wm is None or ts > wm:
            wm = ts
    return by_seg, wm


class Parent(Protocol):
    """What a partition's store uses of the process-wide one (dedup/store.StateStore)."""

    window_ms: int
    segment_ms: int

    def options(self) -> Options: ...

    def path(self, partition: int) -> Path: ...


class PartitionStore:
    """The dedup state of one source partition. Used by one thread at a time."""

    def __init__(self, parent: Parent, partition: int):
        self.parent = parent
        self.partition = partition
        self.path = parent.path(partition)
        self.path.mkdir(parents=True, exist_ok=True)
        names = Rdict.list_cf(str(self.path), parent.options()) if (self.path / "CURRENT").exists() else ["default"]
        cfs = {n: parent.options() for n in names if n != "default"}
        self._db = Rdict(str(self.path), parent.options(), column_families=cfs or None)
        # Segments by (start, length): the keys whose event time is in [start, start + length).
        self._segments: dict[tuple[int, int], Rdict] = {}
        self._handles: dict[tuple[int, int], object] = {}
        self._names: dict[tuple[int, int], str] = {}
        spans = {n: _parse_seg(n) for n in names if n.startswith(_SEG_PREFIX)}
        legacy = [start for start, length in spans.values() if length is None]
        legacy_len = legacy_length_ms(legacy, parent.window_ms) if legacy else 0
        for n, (start, length) in spans.items():
            seg = (start, length or legacy_len)
            self._names[seg] = n
            self._segments[seg] = self._db.get_column_family(n)
            self._handles[seg] = self._db.get_column_family_handle(n)
        self.applied_offset: int | None = _dec(self._db.get(_META_APPLIED))
        self.watermark_ms: int | None = _dec(self._db.get(_META_WATERMARK))
        # The event time since which the store holds every key it was given (None: since it
        # began): raised by expiry, set by a rebuild or an extension (docs/design.md#window-changes).
        self.covered_since_ms: int | None = _dec(self._db.get(_META_COVERED))
        if legacy and self.covered_since_ms is None:
            # An older store did not note what it expired: complete since its oldest segment.
            self.covered_since_ms = min(legacy)
        self.kept_window_ms: int | None = _dec(self._db.get(_META_WINDOW))
        self.partition_count: int | None = _dec(self._db.get(_META_NPARTS))
        self.reshard_id: int | None = _dec(self._db.get(_META_RESHARD))
        self._closed = False

    # -- reads ----------------------------------------------------------------------------
    def contains(self, keys: list[bytes]) -> set[bytes]:
        """The subset of `keys` present in any live segment (batched multi-gets)."""
        found: set[bytes] = set()
        remaining = keys
        for seg in sorted(self._segments, reverse=True):  # recent segments hit most
            if not remaining:
                break
            # One get per key: rocksdict's multi-get cost 0.7 µs a missing key, a get 0.3
            # (most keys are new and miss; the memtable's bloom filter answers them).
            hit, remaining = native.split_found(self._segments[seg].get, remaining)
            found.update(hit)
        return found

    def segment_starts(self) -> list[int]:
        return sorted(start for start, _ in self._segments)

    def segments(self) -> list[tuple[int, int]]:
        """(start, length) of every live segment, oldest first."""
        return sorted(self._segments)

    def iter_keys(self):
        """(segment start ms, key) for every key of every live segment."""
        for seg in sorted(self._segments):
            start = seg[0]
            it = self._segments[seg].iter()
            it.seek_to_first()
            while it.valid():
                yield start, it.key()
                it.next()

    # -- writes ---------------------------------------------------------------------------
    def _oldest_live_start(self, watermark: int) -> int:
        cut = watermark - self.parent.window_ms
        return (cut // self.parent.segment_ms) * self.parent.segment_ms

    def apply(self, entries: dict[bytes, int] | Iterable[tuple[bytes, int]], applied_offset: int | None,
              *, covered_since_ms: int | None = None, now_ms: int | None = None,
              partition_count: int | None = None, reshard_id: int | None = None) -> None:
        """Atomically adds keys (key -> event time ms) and sets applied_offset (None: keep it;
        a re-shard import adds keys without moving the offset) and the re-shard meta.

        Then drops the segments that fell out of the window."""
        seg_ms = self.parent.segment_ms
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        by_seg, wm = _by_segment(entries, seg_ms, now_ms, self.watermark_ms)
        if wm is not None:
            wm = min(wm, now_ms + MAX_SKEW_MS)
            if self.watermark_ms is not None:
                wm = max(wm, self.watermark_ms)
            oldest = self._oldest_live_start(wm)
            if any(s < oldest for s in by_seg):
                late = [k for s in [s for s in by_seg if s < oldest] for k in by_seg.pop(s)]
                by_seg.setdefault(oldest, []).extend(late)
        wb = WriteBatch(raw_mode=True)
        for start, keys in by_seg.items():
            # In key order: the memtable's skip list then inserts each key next to the previous
            # one instead of searching from the top (a third less CPU per key, sort included).
            native.put_sorted(wb.put, keys, b"", self._handle((start, seg_ms)))
        if applied_offset is not None:
            wb.put(_META_APPLIED, _enc(applied_offset))
        if partition_count is not None:
            wb.put(_META_NPARTS, _enc(partition_count))
        if reshard_id is not None:
            wb.put(_META_RESHARD, _enc(reshard_id))
        if wm is not None:
            wb.put(_META_WATERMARK, _enc(wm))
        if covered_since_ms is not None:
            wb.put(_META_COVERED, _enc(covered_since_ms))
        self._db.write(wb)
        if applied_offset is not None:
            self.applied_offset = applied_offset
        if partition_count is not None:
            self.partition_count = partition_count
        if reshard_id is not None:
            self.reshard_id = reshard_id
        self.watermark_ms = wm
        if covered_since_ms is not None:
            self.covered_since_ms = covered_since_ms
        if wm is not None:
            self.expire()

    def _handle(self, seg: tuple[int, int]):
        h = self._handles.get(seg)
        if h is None:
            name = self._names[seg] = _seg_name(*seg)
            self._segments[seg] = self._db.create_column_family(name, self.parent.options())
            h = self._handles[seg] = self._db.get_column_family_handle(name)
        return h

    def expire(self) -> list[int]:
        """Drops whole segments that ended, by their own length, at or before watermark -
        window, and notes that the store is complete only since the latest end dropped."""
        if self.watermark_ms is None:
            return []
        cut = self.watermark_ms - self.parent.window_ms
        dropped = [seg for seg in self._segments if seg[0] + seg[1] <= cut]
        if not dropped:
            return []
        since = max(start + length for start, length in dropped)
        if self.covered_since_ms is None or since > self.covered_since_ms:
            self.note(covered_since_ms=since)
        for seg in dropped:
            self._segments.pop(seg, None)
            self._handles.pop(seg, None)
            self._db.drop_column_family(self._names.pop(seg))
        return sorted(start for start, _ in dropped)

    def note(self, *, covered_since_ms: int | None = None, window_ms: int | None = None) -> None:
        """Sets the coverage meta: complete since `covered_since_ms`, kept for `window_ms`."""
        if covered_since_ms is not None:
            self._db.put(_META_COVERED, _enc(covered_since_ms))
            self.covered_since_ms = covered_since_ms
        if window_ms is not None:
            self._db.put(_META_WINDOW, _enc(window_ms))
            self.kept_window_ms = window_ms

    # -- reporting ------------------------------------------------------------------------
    def effective_window_ms(self) -> int:
        """How far back a duplicate is surely caught: the window, less any history the store
        never saw (a rebuild from a source whose retention had already dropped records)."""
        w = self.parent.window_ms
        if self.covered_since_ms is None or self.watermark_ms is None:
            return w
        return max(0, min(w, self.watermark_ms - self.covered_since_ms))

    def stats(self) -> dict:
        keys = sst = mem = 0
        for cf in self._segments.values():
            keys += cf.property_int_value("rocksdb.estimate-num-keys") or 0
            sst += cf.property_int_value("rocksdb.total-sst-files-size") or 0
            mem += cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return {"keys": keys, "bytes": sst + mem, "sst_bytes": sst, "memtable_bytes": mem,
                "segments": len(self._segments), "applied_offset": self.applied_offset,
                "watermark_ms": self.watermark_ms, "covered_since_ms": self.covered_since_ms,
                "effective_window_seconds": self.effective_window_ms() / 1000}

    def checkpoint(self, dest: Path | str) -> Path:
        """A consistent on-disk copy (hard links where possible) for a handoff or a snapshot."""
        Checkpoint(self._db).create_checkpoint(str(dest))
        return Path(dest)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._segments.clear()
        self._handles.clear()
        self._db.close()
        del self._db


def read_meta(path: Path) -> dict[str, int | None]:
    """The meta of a checkpoint (its keys are those of the records below applied_offset), read
    without changing it: a read-only open of its default column family."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        keys = {"applied_offset": _META_APPLIED, "partition_count": _META_NPARTS, "watermark_ms": _META_WATERMARK,
                "covered_since_ms": _META_COVERED, "window_ms": _META_WINDOW}
        return {name: _dec(db.get(k)) for name, k in keys.items()}
    finally:
        db.close()
