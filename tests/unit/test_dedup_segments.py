"""The keys of an apply by segment (dedup/partition_store._by_segment): keys and event times in,
the segments' keys and the new watermark out."""

import pytest

from eopipe.dedup.partition_store import _by_segment

SEG = 60_000
NOW = 1_800_000_000_000


@pytest.mark.parametrize("entries, wm, expected, expected_wm", [
    # a transaction's keys, all in one segment: the watermark is their newest event time
    ({b"a": 120_001, b"b": 179_999}, None, {120_000: [b"a", b"b"]}, 179_999),
    # a watermark already ahead stays
    ({b"a": 120_001}, 500_000, {120_000: [b"a"]}, 500_000),
    # two segments
    ({b"a": 60_000, b"b": 120_000, b"c": 61_000}, None, {60_000: [b"a", b"c"], 120_000: [b"b"]}, 120_000),
    # no event time (0 or None): now, which moves the watermark
    ({b"a": 0, b"b": 120_001}, None, {NOW: [b"a"], 120_000: [b"b"]}, NOW),
    ({b"a": None}, 7, {NOW: [b"a"]}, NOW),
    # pairs rather than a dict (a replay): the same rules
    ([(b"a", 120_001), (b"b", -1)], None, {120_000: [b"a"], NOW: [b"b"]}, NOW),
    # nothing: nothing, the watermark as it was
    ({}, None, {}, None),
    ({}, 5, {}, 5),
])
def test_keys_by_segment(entries, wm, expected, expected_wm):
    by_seg, got_wm = _by_segment(entries, SEG, NOW, wm)
    assert {s: sorted(k) for s, k in by_seg.items()} == expected
    assert got_wm == expected_wm
