"""A changed dedup window (docs/design.md#window-changes): the pure decision of whether a kept
store is scanned to cover a longer window, and a real RocksDB store reopened with a longer and
a shorter window (segments of the old length expire by their own end; coverage is honest)."""

from __future__ import annotations

import pytest

from eopipe.dedup.partition_store import legacy_length_ms
from eopipe.dedup.recovery import NONE, REBUILD, REPLAY, Facts, extend_since_ms, plan
from eopipe.dedup.store import StateStore

MIN = 60_000
HOUR = 60 * MIN
NOW = 1_800_000_000_000
WM = NOW - HOUR  # the store's watermark: its newest event time


def facts(**kw) -> Facts:
    """A clean restart with a 1 h window (15 m segments) of a store kept for 10 m."""
    base = dict(partition=0, committed=100, log_start=0, applied=100, store_count=3, store_reshard=None,
                home_count=3, reshard=None, now_ms=NOW, window_ms=HOUR, segment_ms=15 * MIN,
                store_covered_since=WM - 10 * MIN, store_watermark=WM, store_window=10 * MIN)
    return Facts(**{**base, **kw})


EXTEND = [
    pytest.param(dict(), WM - HOUR - 15 * MIN, id="window grew past what the store covers: scan from head - window - segment"),
    pytest.param(dict(store_covered_since=None), None, id="never expired anything: complete since it began"),
    pytest.param(dict(store_covered_since=WM - 2 * HOUR), None, id="covers the longer window already (kept longer before)"),
    pytest.param(dict(store_covered_since=WM - HOUR), None, id="covers exactly head - window"),
    pytest.param(dict(window_ms=10 * MIN), None, id="same window: no scan, even if coverage is short (a partial rebuild)"),
    pytest.param(dict(window_ms=5 * MIN), None, id="shorter window: no scan"),
    pytest.param(dict(store_window=None), WM - HOUR - 15 * MIN, id="older store (no window noted): decided by coverage"),
    pytest.param(dict(store_window=None, store_covered_since=WM - 2 * HOUR), None,
                 id="older store covering the window: no scan"),
    pytest.param(dict(store_watermark=NOW + MIN, store_covered_since=NOW - 10 * MIN), NOW - HOUR - 15 * MIN, id="watermark ahead of the clock: head is now"),
    pytest.param(dict(store_watermark=None, store_covered_since=NOW - 10 * MIN), NOW - HOUR - 15 * MIN, id="no watermark: head is now"),
]


@pytest.mark.parametrize("kw, want", EXTEND)
def test_extend_since(kw, want):
    assert extend_since_ms(facts(**kw)) == want


@pytest.mark.parametrize("kw, action, extend", [
    pytest.param(dict(), NONE, WM - HOUR - 15 * MIN, id="clean restart, longer window: kept and extended"),
    pytest.param(dict(committed=120), REPLAY, WM - HOUR - 15 * MIN, id="behind: replayed, then extended"),
    pytest.param(dict(applied=None), REBUILD, None, id="no store: a rebuild covers the window by itself"),
    pytest.param(dict(applied=150), REBUILD, None, id="store ahead: rebuilt, never extended"),
])
def test_plan_extends_only_a_kept_store(kw, action, extend):
    p = plan(facts(**kw))
    assert (p.action, p.extend_since_ms) == (action, extend)


@pytest.mark.parametrize("starts, window, want", [
    ([3 * 15 * MIN, 4 * 15 * MIN, 6 * 15 * MIN], HOUR, 15 * MIN),   # neighbours: the length itself
    ([2 * 15 * MIN, 4 * 15 * MIN], HOUR, 30 * MIN),                 # a gap: a multiple, never shorter
    ([NOW], HOUR, HOUR),                                            # a lone segment: capped at the window
    ([0], HOUR, HOUR),
])
def test_legacy_segment_length(starts, window, want):
    assert legacy_length_ms(starts, window) == want


def store(root, window_ms: int, segments: int = 4) -> StateStore:
    return StateStore(root, window_ms=window_ms, segment_ms=window_ms // segments, memory_bytes=16 << 20)


def test_shorter_window_expires_old_segments_by_their_own_length(tmp_path):
    # Kept for 40 m in 10 m segments; the key at WM-4m lies in the segment [WM-8m, WM+2m).
    wm = (WM // (10 * MIN)) * 10 * MIN + 8 * MIN
    s = store(tmp_path, 40 * MIN)
    p = s.open(0)
    p.apply({b"old": wm - 25 * MIN, b"recent": wm - 4 * MIN, b"head": wm}, 1, now_ms=NOW)
    assert (wm - 8 * MIN, 10 * MIN) in p.segments()
    s.close()
    # Reopened with 5 m (75 s segments): the cut is WM-5m. The old segment of `recent` ends
    # at WM+2m, after the cut: kept (by the new 75 s length it would have "ended" at WM-6m45s).
    s = store(tmp_path, 5 * MIN)
    p = s.open(0)
    p.expire()
    assert p.contains([b"old", b"recent", b"head"]) == {b"recent", b"head"}
    assert p.covered_since_ms == wm - 18 * MIN  # the end of the dropped segment of `old`
    assert p.effective_window_ms() == 5 * MIN
    # New keys go to segments of the new length, next to the old ones.
    p.apply({b"new": wm - MIN}, 2, now_ms=NOW)
    assert (((wm - MIN) // (75_000)) * 75_000, 75_000) in p.segments()
    assert p.contains([b"recent", b"new"]) == {b"recent", b"new"}
    s.close()


def test_longer_window_reports_only_what_the_store_covers(tmp_path):
    s = store(tmp_path, 10 * MIN)
    p = s.open(0)
    p.apply({b"a": WM - 30 * MIN}, 1, now_ms=NOW)
    p.apply({b"head": WM}, 2, now_ms=NOW)  # expires the segment of `a`
    assert p.contains([b"a"]) == set()
    assert p.covered_since_ms == WM - 30 * MIN + 150_000 - (WM - 30 * MIN) % 150_000
    assert p.effective_window_ms() == 10 * MIN
    s.close()
    s = store(tmp_path, HOUR)
    p = s.open(0)
    # Complete only since the end of what it dropped: about 27.5 m of the hour, said so.
    assert p.effective_window_ms() == WM - p.covered_since_ms < 30 * MIN
    p.note(covered_since_ms=WM - HOUR - 15 * MIN, window_ms=HOUR)  # what an extension scan notes
    s.close()
    p = store(tmp_path, HOUR).open(0)
    assert (p.effective_window_ms(), p.kept_window_ms) == (HOUR, HOUR)


def test_an_older_store_is_read_with_its_segment_length_inferred(tmp_path):
    from rocksdict import Options, Rdict

    seg = 15 * MIN
    first = (WM // seg) * seg - 3 * seg
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    db = Rdict(str(tmp_path / "p-0"), o)
    for i in range(4):  # segments named without a length, as written before lengths were kept
        cf = db.create_column_family(f"seg-{first + i * seg:016d}", o)
        cf[f"k{i}".encode()] = b""
        del cf
    db.close()
    del db
    s = store(tmp_path, 20 * MIN)  # and reopened with a shorter window: 5 m segments
    p = s.open(0)
    assert p.segments() == [(first + i * seg, seg) for i in range(4)]
    assert p.covered_since_ms == first  # it may have expired older ones: complete since its oldest
    assert p.contains([b"k0", b"k3"]) == {b"k0", b"k3"}
    p.apply({b"head": first + 3 * seg + MIN}, 1, now_ms=NOW)
    # cut = head - 20 m = first + 26 m: only the first segment (ends first + 15 m) is gone.
    assert p.contains([b"k0", b"k1", b"k2", b"k3"]) == {b"k1", b"k2", b"k3"}
