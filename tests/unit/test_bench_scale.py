"""bench/scale.py's summary: the timed runs in, the rows of its table out."""

import argparse

import pytest

from bench.common import positive_ints
from bench.scale import rows, rows_table, table


def run(partitions, pods, seconds, startup=2.0, steady=80_000, cpu=40.0, steady_cpu=30.0, records=100_000):
    return {"partitions": partitions, "pods": pods, "records": records, "seconds": seconds, "startup_s": startup,
            "steady_records": steady, "cpu_s": cpu, "steady_cpu_s": steady_cpu}


RUNS = [run(16, 2, 25.0), run(4, 1, 50.0, startup=10.0), run(4, 2, 25.0, startup=5.0), run(16, 4, 20.0),
        run(16, 1, 40.0, startup=12.0, steady=50_000)]


@pytest.mark.parametrize("runs, expected", [
    # sorted by partitions then pods; the speed-up is over the 1-pod run at the same partitions
    (RUNS, [(4, 1, 2000.0, 1.0, 2000.0, 1.0), (4, 2, 4000.0, 2.0, 4000.0, 2.0), (16, 1, 2500.0, 1.0, 50_000 / 28, 1.0),
            (16, 2, 4000.0, 1.6, 80_000 / 23, 80_000 / 23 / (50_000 / 28)),
            (16, 4, 5000.0, 2.0, 80_000 / 18, 80_000 / 18 / (50_000 / 28))]),
    # no 1-pod run at 16 partitions: no speed-up there, the 4-partition ones still have theirs
    ([r for r in RUNS if (r["partitions"], r["pods"]) != (16, 1)],
     [(4, 1, 2000.0, 1.0, 2000.0, 1.0), (4, 2, 4000.0, 2.0, 4000.0, 2.0), (16, 2, 4000.0, None, 80_000 / 23, None),
      (16, 4, 5000.0, None, 80_000 / 18, None)]),
    # start-up not measured: no steady rate, and so no steady speed-up, but the total still counts
    ([run(4, 1, 50.0, startup=None, steady=None, steady_cpu=None), run(4, 2, 20.0)],
     [(4, 1, 2000.0, 1.0, None, None), (4, 2, 5000.0, 2.5, 80_000 / 18, None)]),
    # every record committed before start-up was seen (a tiny run): no steady rate, not a division by 0
    ([run(4, 1, 10.0, startup=10.0, steady=0)], [(4, 1, 10_000.0, 1.0, None, None)]),
    # start-up overlapped most of the run (partitions come up one by one): too few records to time
    ([run(16, 1, 10.0, startup=8.0, steady=49_999), run(16, 2, 5.0, startup=3.0, steady=50_000)],
     [(16, 1, 10_000.0, 1.0, None, None), (16, 2, 20_000.0, 2.0, 25_000.0, None)]),
    ([], []),
])
def test_rows(runs, expected):
    got = [(r["partitions"], r["pods"], r["records_per_s"], r["speedup"], r["steady_records_per_s"],
            r["steady_speedup"]) for r in rows(runs)]
    assert got == [pytest.approx(e) for e in expected]  # approx compares None by equality


@pytest.mark.parametrize("given, expected", [
    (run(4, 1, 50.0), {"cpu_us_per_record": 400.0, "steady_cpu_us_per_record": 375.0}),
    (run(4, 1, 50.0, cpu=None, steady_cpu=None), {"cpu_us_per_record": None, "steady_cpu_us_per_record": None}),
    (run(4, 1, 50.0, steady=None), {"cpu_us_per_record": 400.0, "steady_cpu_us_per_record": None}),
])
def test_cpu_per_record(given, expected):
    row = rows([given])[0]
    assert {k: row[k] for k in expected} == pytest.approx(expected)


def test_table_shows_a_missing_value_as_a_dash_and_one_line_per_run():
    lines = rows_table(rows([r for r in RUNS if r["pods"] != 1])).splitlines()
    assert len(lines) == 2 + 3
    assert "x 1 pod" in lines[0] and set(lines[1]) == {"-"}
    cells = lines[2].split()
    assert cells[:5] == ["4", "2", "25.0", "4,000", "-"]


def test_report_says_what_was_verified():
    result = {"records": 100_000, "unique": 83_000, "cores": 2, "rows": rows(RUNS),
              "runs": [dict(r, verify={"out": 83_000} if r["pods"] == 4 else None) for r in RUNS]}
    text = table(result)
    assert "2 cores" in text and "83,000 unique" in text and "1 of 5 runs read back" in text


@pytest.mark.parametrize("text, expected", [("1,2,4", (1, 2, 4)), ("16", (16,)), ("4,1", (4, 1))])
def test_positive_ints(text, expected):
    assert positive_ints(text) == expected


@pytest.mark.parametrize("text", ["", "1,,2", "1000,", "0,1", "2,2", "a"])
def test_positive_ints_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        positive_ints(text)
