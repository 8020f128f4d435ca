"""RocksDB dedup state: one DB per source partition, one column family per time segment.

Layout under the state directory:

    <state_dir>/p-<partition>/        one RocksDB per partition: moved, dropped, rebuilt alone
        default CF                    meta: applied_offset, watermark_ms, covered_since_ms
        seg-<start_ms> CFs            the keys whose event time falls in [start, start+segment)

- Expiry is by event time: a partition's watermark is the highest event time it has applied
  (capped at wall clock + MAX_SKEW_MS, so one record from a clock far ahead cannot expire
  everything); segments that ended before `watermark - window` are dropped whole with
  DropColumnFamily. Nothing is deleted key by key. A key whose event time is already older
  than the kept segments is kept in the oldest one, so it is still remembered for a while.
- `apply()` writes the keys and the new applied_offset/watermark in ONE WriteBatch (atomic,
  WAL on), so after any crash the keys present are exactly those below applied_offset.
- All partitions of the process share one LRU block cache, and a WriteBufferManager that
  charges memtables to that cache: the memory of the process is bounded by `memory_bytes`
  whatever the number of partitions and segments. The bound is soft (no write stall, which
  could hold every partition behind an idle one's memtables): a burst passes it while
  flushes catch up, and flushes are decided on writes, so an idle store can stay over it. Index and filter blocks live in the
  cache too; bloom filters (10 bits/key) make the common case (a new key) cheap.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Callable

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

from eopipe.dedup.partition_store import PartitionStore


class StateStore:
    """The process-wide store: shared memory budget, one PartitionStore per owned partition."""

    def __init__(self, root: Path | str, *, window_ms: int, segment_ms: int,
                 memory_bytes: int = 256 << 20, max_open_files: int = 256):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.window_ms = int(window_ms)
        self.segment_ms = max(1, int(segment_ms))
        self.memory_bytes = int(memory_bytes)
        self.cache = Cache(self.memory_bytes)
        # Memtables are charged to the block cache: cache capacity bounds both together.
        self.write_buffer_bytes = self.memory_bytes // 2
        self.write_buffer_manager = WriteBufferManager.new_write_buffer_manager_with_cache(
            self.write_buffer_bytes, False, self.cache)
        self.max_open_files = max_open_files
        self._lock = threading.Lock()
        self._open: dict[int, PartitionStore] = {}

    def options(self) -> Options:
        o = Options(raw_mode=True)
        o.create_if_missing(True)
        o.create_missing_column_families(True)
        t = BlockBasedOptions()
        t.set_block_cache(self.cache)
        t.set_bloom_filter(10, False)
        t.set_cache_index_and_filter_blocks(True)
        t.set_pin_l0_filter_and_index_blocks_in_cache(True)
        o.set_block_based_table_factory(t)
        o.set_write_buffer_manager(self.write_buffer_manager)
        # Per memtable; the manager flushes earlier when all of them together hit the budget.
        o.set_write_buffer_size(max(1 << 20, min(16 << 20, self.write_buffer_bytes // 4)))
        o.set_max_write_buffer_number(2)
        o.set_max_open_files(self.max_open_files)
        o.set_keep_log_file_num(2)
        o.set_max_background_jobs(2)
        o.optimize_for_point_lookup(max(8, self.memory_bytes >> 20 >> 2))
        # optimize_for_point_lookup installs its own table factory: ours (shared cache) wins.
        o.set_block_based_table_factory(t)
        return o

    def path(self, partition: int) -> Path:
        return self.root / f"p-{partition}"

    def exists(self, partition: int) -> bool:
        return (self.path(partition) / "CURRENT").exists()

    def open(self, partition: int) -> PartitionStore:
        with self._lock:
            ps = self._open.get(partition)
            if ps is None:
                ps = self._open[partition] = PartitionStore(self, partition)
            return ps

    def checkpoint_open(self, partition: int, dest: Path, wanted: Callable[[PartitionStore], bool]) -> bool:
        """A checkpoint of the partition's open store into `dest` if `wanted(it)`; under the lock,
        so the store cannot be closed under the checkpoint. False: not open, or not wanted."""
        with self._lock:
            ps = self._open.get(partition)
            if ps is None or not wanted(ps):
                return False
            ps.checkpoint(dest)
            return True

    def close_partition(self, partition: int) -> None:
        with self._lock:
            ps = self._open.pop(partition, None)
        if ps is not None:
            ps.close()

    def drop(self, partition: int) -> None:
        """Deletes the partition's state (closing it first). Used for rebuilds and moves."""
        self.close_partition(partition)
        shutil.rmtree(self.path(partition), ignore_errors=True)

    def partitions_on_disk(self) -> list[int]:
        out = []
        for d in self.root.glob("p-*"):
            try:
                out.append(int(d.name[2:]))
            except ValueError:
                pass
        return sorted(out)

    def memory(self) -> dict:
        return {"budget_bytes": self.memory_bytes,
                "cache_usage_bytes": self.cache.get_usage(),
                "cache_pinned_bytes": self.cache.get_pinned_usage(),
                "write_buffer_budget_bytes": self.write_buffer_manager.get_buffer_size(),
                "write_buffer_usage_bytes": self.write_buffer_manager.get_usage()}

    def close(self) -> None:
        with self._lock:
            stores, self._open = list(self._open.values()), {}
        for ps in stores:
            ps.close()
