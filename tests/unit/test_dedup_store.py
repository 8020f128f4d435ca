"""The dedup state store on a real RocksDB on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eopipe.dedup.store import StateStore

MIN = 60_000
T0 = 1_800_000_000_000  # a fixed "now" (ms) so expiry is deterministic


def make(root: Path, **kw) -> StateStore:
    kw.setdefault("window_ms", 4 * MIN)
    kw.setdefault("segment_ms", MIN)
    kw.setdefault("memory_bytes", 32 << 20)
    return StateStore(root, **kw)


def cf_names(path: Path) -> list[str]:
    from rocksdict import Options, Rdict

    return sorted(Rdict.list_cf(str(path), Options(raw_mode=True)))


def test_segments_expire_whole_by_event_time(tmp_path):
    s = make(tmp_path)
    p = s.open(0)
    p.apply({b"k0": T0, b"k1": T0 + MIN, b"k2": T0 + 2 * MIN}, 3, now_ms=T0 + 2 * MIN)
    assert p.contains([b"k0", b"k1", b"k2", b"nope"]) == {b"k0", b"k1", b"k2"}
    assert len(p.segment_starts()) == 3
    # Event time moves to T0+5m30s: [T0, T0+1m) ended before watermark - window (T0+1m30s).
    p.apply({b"k5": T0 + 5 * MIN + MIN // 2}, 4, now_ms=T0 + 6 * MIN)
    assert p.contains([b"k0", b"k1", b"k2", b"k5"]) == {b"k1", b"k2", b"k5"}
    assert T0 not in p.segment_starts()
    assert f"seg-{T0:016d}" not in cf_names(p.path)  # dropped as a column family, not key by key
    # A record older than everything kept is remembered in the oldest kept segment.
    p.apply({b"late": T0 - 10 * MIN}, 5, now_ms=T0 + 6 * MIN)
    assert p.contains([b"late"]) == {b"late"}
    assert min(p.segment_starts()) == T0 + MIN
    # A timestamp far in the future is capped at wall clock + skew: it cannot expire all.
    p.apply({b"future": T0 + 1000 * MIN}, 6, now_ms=T0 + 6 * MIN)
    assert p.watermark_ms == T0 + 6 * MIN + 60_000
    assert p.contains([b"k5", b"future"]) == {b"k5", b"future"}
    # Every kept segment still overlaps the window; the one holding k5 does.
    assert all(start + s.segment_ms > p.watermark_ms - s.window_ms for start in p.segment_starts())
    st = p.stats()
    assert st["keys"] == 2 and st["bytes"] > 0 and st["effective_window_seconds"] == 240
    s.close()
    # Reopened: same segments, same keys, same offsets.
    s = make(tmp_path)
    p = s.open(0)
    assert p.applied_offset == 6 and p.contains([b"k0", b"k5", b"future"]) == {b"k5", b"future"}
    s.close()


WRITER = r"""
import sys
from eopipe.dedup.store import StateStore
s = StateStore(sys.argv[1], window_ms=10**12, segment_ms=10**11, memory_bytes=16 << 20)
p = s.open(0)
i = p.applied_offset or 0
print("ready", flush=True)
while True:
    p.apply({f"b{i}-{j}".encode(): 1_000_000 + i for j in range(200)}, i + 1)
    i += 1
"""


def test_applied_offset_is_atomic_with_keys_under_sigkill(tmp_path):
    """SIGKILL a process writing batches: whatever survives, the keys present are exactly
    the batches below applied_offset."""
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3 + 0.2 * round_)  # let it write a while; the kill lands mid-stream
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        s = make(tmp_path, window_ms=10**12, segment_ms=10**11)
        p = s.open(0)
        applied = p.applied_offset
        assert applied and applied > 0
        for i in (0, applied // 2, applied - 1):
            assert len(p.contains([f"b{i}-{j}".encode() for j in range(200)])) == 200
        for i in (applied, applied + 1):
            assert p.contains([f"b{i}-{j}".encode() for j in range(200)]) == set()
        s.close()


def test_partitions_are_separate_units_drop_and_rebuild(tmp_path):
    s = make(tmp_path)
    for part in (0, 1, 2):
        s.open(part).apply({f"p{part}".encode(): T0}, 10 + part, now_ms=T0)
    assert s.partitions_on_disk() == [0, 1, 2]
    s.drop(1)
    assert s.partitions_on_disk() == [0, 2] and not s.path(1).exists()
    assert s.open(0).contains([b"p0"]) == {b"p0"} and s.open(2).applied_offset == 12
    fresh = s.open(1)
    assert fresh.applied_offset is None and fresh.contains([b"p1"]) == set()
    fresh.apply({b"p1": T0}, 11, now_ms=T0, covered_since_ms=T0 - MIN)
    assert fresh.effective_window_ms() == MIN  # rebuilt from only one minute of history
    # A checkpoint is a complete copy of one partition, openable as that partition.
    s.open(0).checkpoint(tmp_path / "ckpt")
    s.close()
    s2 = make(tmp_path / "other")
    (tmp_path / "ckpt").rename(s2.path(0))
    p = s2.open(0)
    assert p.applied_offset == 10 and p.contains([b"p0"]) == {b"p0"}
    s2.close()


def test_memory_budget_is_shared_and_bounds_usage(tmp_path):
    budget = 16 << 20
    s = make(tmp_path, memory_bytes=budget, window_ms=10 * MIN, segment_ms=MIN)
    assert s.write_buffer_manager.get_buffer_size() == budget // 2
    parts = [s.open(i) for i in range(8)]
    for batch in range(10):
        for i, p in enumerate(parts):
            p.apply({os.urandom(16): T0 + batch * 1000 for _ in range(3000)}, batch + 1, now_ms=T0 + 10_000)
    # One cache for all eight partitions, memtables charged to it. The manager's limit is soft
    # (no write stall, which could wedge a partition behind an idle one's memtables): a burst
    # can pass it while flushes catch up, and it decides to flush only when a partition writes.
    # So the bound is the one usage settles back under while the partitions keep writing.
    offset, deadline = 10, time.monotonic() + 60
    while (mem := s.memory())["write_buffer_usage_bytes"] > budget // 2 and time.monotonic() < deadline:
        offset += 1
        for p in parts:
            p.apply({os.urandom(16): T0}, offset, now_ms=T0 + 10_000)
        time.sleep(0.2)
    assert 0 < mem["write_buffer_usage_bytes"] <= budget // 2
    assert mem["cache_usage_bytes"] <= budget * 1.1
    opts = next(s.path(3).glob("OPTIONS-*")).read_text()
    assert "filter_policy=bloomfilter" in opts
    assert "cache_index_and_filter_blocks=true" in opts
    assert "max_open_files=256" in opts
    assert sum(p.stats()["keys"] for p in parts) >= 8 * 10 * 3000 * 0.9
    s.close()


@pytest.mark.parametrize("segments", [1, 4])
def test_kept_history_always_covers_the_window(tmp_path, segments):
    window = 4 * MIN
    s = make(tmp_path, window_ms=window, segment_ms=window // segments)
    p = s.open(0)
    for step in range(40):
        ts = T0 + step * 20_000
        p.apply({f"k{step}".encode(): ts}, step + 1, now_ms=ts)
        # Every key whose event time is within the window of the watermark is still known.
        recent = [f"k{i}".encode() for i in range(step + 1) if ts - (T0 + i * 20_000) <= window]
        assert p.contains(recent) == set(recent)
        assert len(p.segment_starts()) <= segments + 1
    s.close()
