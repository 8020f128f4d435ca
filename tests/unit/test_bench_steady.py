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
