"""bench/dedup_vs_copy.steady: (seconds, committed offsets, CPU seconds) samples in, the steady
records/s and CPU per record between 10% and 90% of the source committed out."""

import pytest

from bench.dedup_vs_copy import steady

# 1000 offsets holding 1000 records: 10% at 1.0 s, 90% at 3.0 s
SAMPLES = [(0.0, 0, 0.5), (0.5, 50, 0.9), (1.0, 100, 1.0), (2.0, 500, 1.5), (3.0, 900, 2.0), (3.5, 1000, 2.6)]


@pytest.mark.parametrize("samples, end, records, rate, cpu_us", [
    (SAMPLES, 1000, 1000, 400.0, 1250.0),
    # a transactional source: 1000 offsets, 800 records (markers): records, not offsets
    (SAMPLES, 1000, 800, 320.0, 1562.5),
    # the first sample past 10% counts, not an interpolation
    ([(0.0, 0, 0.0), (1.0, 150, 1.0), (2.0, 950, 2.0)], 1000, 1000, 800.0, 1250.0),
    # one step from below 10% to the end: too short to tell
    ([(0.0, 0, 0.0), (1.0, 1000, 1.0)], 1000, 1000, None, None),
    ([], 1000, 1000, None, None),
    (SAMPLES, 0, 1000, None, None),
])
def test_steady(samples, end, records, rate, cpu_us):
    got = steady(samples, end, records)
    assert got["steady_records_per_s"] == (pytest.approx(rate) if rate is not None else None)
    assert got["steady_cpu_us_per_record"] == (pytest.approx(cpu_us) if cpu_us is not None else None)


def _rows(copy, dedup, dedup_json, cpu=3.0):
    return [{"id": "copy", "steady_records_per_s": copy, "steady_cpu_us_per_record": 2.0},
            {"id": "dedup", "steady_records_per_s": dedup, "steady_cpu_us_per_record": cpu},
            {"id": "dedup_json", "steady_records_per_s": dedup_json, "steady_cpu_us_per_record": cpu + 1},
            {"id": "c_copy", "steady_records_per_s": 500.0, "steady_cpu_us_per_record": 1.5}]


@pytest.mark.parametrize("sizes, result, want", [
    # one row per size, contestant and measure, from the rows of that size
    ("200000,1000000", {"sizes": {"200000": _rows(100.0, 90.0, 50.0), "1000000": _rows(200.0, 100.0, 160.0, 5.0)}},
     {"dedup_steady_ratio_200k": 0.9, "dedup_steady_cpu_us_200k": 3.0, "dedup_json_steady_ratio_200k": 0.5,
      "dedup_json_steady_cpu_us_200k": 4.0, "dedup_steady_ratio_1M": 0.5, "dedup_steady_cpu_us_1M": 5.0,
      "dedup_json_steady_ratio_1M": 0.8, "dedup_json_steady_cpu_us_1M": 6.0,
      "c_copy_steady_cpu_us_200k": 1.5, "c_copy_steady_cpu_us_1M": 1.5}),
    # a size that did not run, or a run too short to tell: the rows are there, without a value
    ("1000000", {"sizes": {"200000": _rows(100.0, 90.0, 50.0)}},
     {"dedup_steady_ratio_1M": None, "dedup_steady_cpu_us_1M": None, "dedup_json_steady_ratio_1M": None,
      "dedup_json_steady_cpu_us_1M": None, "c_copy_steady_cpu_us_1M": None}),
    ("20000", {"sizes": {"20000": _rows(None, 90.0, 50.0)}},
     {"dedup_steady_ratio_20k": None, "dedup_steady_cpu_us_20k": 3.0, "dedup_json_steady_ratio_20k": None,
      "dedup_json_steady_cpu_us_20k": 4.0, "c_copy_steady_cpu_us_20k": 1.5}),
    # no C copier row (a run from before it): its row is there, without a value
    ("20000", {"sizes": {"20000": _rows(100.0, 90.0, 50.0)[:3]}},
     {"dedup_steady_ratio_20k": 0.9, "dedup_steady_cpu_us_20k": 3.0, "dedup_json_steady_ratio_20k": 0.5,
      "dedup_json_steady_cpu_us_20k": 4.0, "c_copy_steady_cpu_us_20k": None}),
    ("", {"sizes": {}}, {}),  # --quick: none
])
def test_copy_goal_rows(sizes, result, want):
    import argparse

    from bench.__main__ import copy_goal_rows

    got = {}

    def row(step, mid, metric, unit, notes, get):
        assert step == "dedup_vs_copy" and ("goal" in notes)
        try:
            got[mid] = float(get(result))
        except (KeyError, TypeError, ZeroDivisionError):
            got[mid] = None
    copy_goal_rows(row, argparse.Namespace(steady_sizes=sizes, rounds=2))
    assert got == {k: (pytest.approx(v) if v is not None else None) for k, v in want.items()}
