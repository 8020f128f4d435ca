"""bench/dedup_latency.py's summary: raw latency samples in, the rows of its table out."""


import pytest

from bench.dedup_latency import counters, rows, table

# (produced at t seconds from the load's start, latency ms); the window is [3, 13)
SAMPLES = [(0.5, 900.0), (2.99, 500.0), (3.0, 40.0), (5.0, 60.0), (8.0, 80.0), (12.9, 20.0), (13.0, 700.0)]
WORKER = {"commit_seconds_sum": 0.5, "commits": 100, "batch_records_sum": 9000}
VERIFY = {"unique_in": 9000, "out": 9000, "lost": 0, "duplicated": 0, "unexpected": 0, "out_of_order": 0}


def run(**over) -> dict:
    return {"rate": 1000, "commit_interval_ms": 100, "window": (3.0, 13.0), "sent": 9500,
            "latencies": SAMPLES, "worker": WORKER, "verify": VERIFY, **over}


@pytest.mark.parametrize("raw, expected", [
    # warm-up records (before 3 s) and records after the window are left out
    (run(), {"records": 4, "p50_ms": 60.0, "p99_ms": 80.0, "max_ms": 80.0, "achieved": 950.0,
             "txn_per_s": 10.0, "records_per_txn": 90.0, "commit_ms": 5.0}),
    # the producer fell short of the target: achieved is what it sent, not the target
    (run(rate=10000, sent=42000), {"rate": 10000, "achieved": 4200.0}),
    # one sample: every percentile is it
    (run(latencies=[(4.0, 123.0)]), {"records": 1, "p50_ms": 123.0, "p99_ms": 123.0, "max_ms": 123.0}),
    # nothing read in the window: no numbers rather than zeros
    (run(latencies=[(1.0, 5.0)]), {"records": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}),
    # no commit in the window (or no /metrics): no per-transaction numbers
    (run(worker={"commit_seconds_sum": 0.0, "commits": 0, "batch_records_sum": 0}),
     {"txn_per_s": None, "records_per_txn": None, "commit_ms": None}),
    (run(worker=None, verify=None), {"txn_per_s": None, "verify": None}),
    # an empty window cannot give a rate
    (run(window=(3.0, 3.0)), {"achieved": None, "records": 0}),
])
def test_rows(raw, expected):
    row = rows([raw])[0]
    assert {k: row[k] for k in expected} == expected


def test_rows_keep_the_runs_order_and_knob():
    got = rows([run(commit_interval_ms=1000), run(rate=10000, commit_interval_ms=100)])
    assert [(r["rate"], r["commit_interval_ms"]) for r in got] == [(1000, 1000), (10000, 100)]


def test_table_has_a_line_per_run_and_the_verdict():
    result = {"seconds": 10.0, "warmup_s": 3.0, "cpus": 2,
              "rows": rows([run(), run(rate=10000, latencies=[], verify=None)])}
    lines = table(result).splitlines()
    assert "2 cores" in lines[0] and "target/s" in lines[1] and "p99_ms" in lines[1]
    assert lines[2].split()[:3] == ["1000", "950", "100"]
    assert lines[3].split()[4:7] == ["-", "-", "-"]  # no samples: dashes, not nan
    assert lines[-1] == "eopipe verify, 1 of 2 runs: 9,000 records out, lost 0, duplicated 0"


@pytest.mark.parametrize("metrics, expected", [
    ({}, {"commit_seconds_sum": 0, "commits": 0, "batch_records_sum": 0}),
    # summed over partitions; the buckets and other metrics are not counted
    ({'eopipe_dedup_commit_seconds_sum{partition="0"}': 0.25, 'eopipe_dedup_commit_seconds_sum{partition="1"}': 0.5,
      'eopipe_dedup_commit_seconds_count{partition="0"}': 3.0,
      'eopipe_dedup_commit_seconds_bucket{partition="0",le="0.01"}': 3.0,
      'eopipe_dedup_transaction_records_sum{partition="0"}': 700.0,
      "eopipe_dedup_transaction_records_sum_other": 1.0},
     {"commit_seconds_sum": 0.75, "commits": 3.0, "batch_records_sum": 700.0}),
])
def test_counters(metrics, expected):
    assert counters(metrics) == expected
