"""bench.pipeline_rate_summary: the samplers' and the watcher's lines in, the rows, the verdicts
(kept up or not, the highest rate kept up, the latency goal) and the table out."""

from __future__ import annotations

import pytest

from bench.pipeline_rate_summary import (
    cpu_shares,
    dedup_points,
    goal,
    latency,
    program,
    request_counts,
    request_rates,
    row,
    spark_points,
    stage,
    sustained,
    table,
)


def points(rate_in: float, rate_done: float, t0: float = 0, t1: float = 60, lag0: int = 0, saw: int = 0) -> list:
    """A stage fed at rate_in and consuming at rate_done, one point a second; `saw`: a lag that
    rises by that much and drops back every other second (Spark's trigger)."""
    return [(float(t), int(rate_done * t) - (saw if t % 2 else 0), int(rate_in * t) + lag0) for t in range(t0, t1 + 1)]


@pytest.mark.parametrize("name, pts, expected", [
    ("keeps up", points(1000, 1000), {"input_per_s": 1000.0, "done_per_s": 1000.0, "kept_up": True}),
    # a sawtooth of one trigger's records is a bounded lag, however high its peaks
    ("sawtooth", points(1000, 1000, saw=1500), {"kept_up": True, "lag_max": 1500}),
    # 1% short over 60 s: 600 records, under two seconds of input (2,000)
    ("just short", points(1000, 990), {"kept_up": True, "done_per_s": 990.0}),
    ("falls behind", points(10000, 6000), {"kept_up": False, "done_per_s": 6000.0, "lag_end": 240000}),
    # a standing backlog that does not grow is kept up with
    ("standing backlog", points(1000, 1000, lag0=50000), {"kept_up": True, "lag_max": 50000}),
])
def test_stage(name, pts, expected):
    got = stage(pts, 0, 60)
    assert {k: got[k] for k in expected} == pytest.approx(expected), name


def test_stage_counts_only_the_window():
    pts = points(10000, 2000, 0, 30) + [(float(t), 60000 + 10000 * (t - 30), 300000 + 10000 * (t - 30))
                                         for t in range(31, 61)]
    assert stage(pts, 31, 60)["kept_up"] and not stage(pts, 0, 30)["kept_up"]
    assert stage(pts, 100, 200) is None and stage(pts[:1], 0, 60) is None


def test_points():
    # a committed -1 (nothing yet) counts as 0
    assert dedup_points([[1.0, [-1, 5], [3, 9]]]) == [(1.0, 5, 12)]
    # a partition read "past" an older end is counted at the end; a line without ends is left out
    lines = [{"t": 2.0, "read": {"0": 10, "1": 30}, "ends": {"0": 12, "1": 25}}, {"t": 3.0, "read": {}, "ends": {}},
             {"t": 4.0, "ready": True}, {"t": 5.0, "read": {}, "ends": {"0": 4}}]
    assert spark_points(lines) == [(2.0, 35, 37), (5.0, 0, 4)]


def test_latency_counts_the_window_and_the_unseen():
    pairs = [(999.0, 2000.0), (1000.0, 1500.0), (1500.0, 3500.0), (2999.0, 3099.0), (3000.0, 9000.0)]
    assert latency(pairs, [1200.0, 5000.0], 1, 3) == {"records": 3, "missing": 1, "p50_ms": 500.0,
                                                       "p99_ms": 2000.0, "max_ms": 2000.0}
    assert latency([], [], 1, 3) == {"records": 0, "missing": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}


def run(rate: int, spark_done: float, p99_ms: float = 1000.0, missing: int = 0, **over) -> dict:
    """A 60 s window at `rate`, 20% resends, dedup keeping up, Spark consuming at spark_done; two
    records of the window seen p99_ms after their produce time, 98 more at 100 ms (the p99 of 100
    is the 99th)."""
    lats = [(10_000.0 + i, 10_100.0 + i) for i in range(98)] + [(20_000.0 + i, 20_000.0 + i + p99_ms) for i in (0, 1)]
    return {"rate": rate, "window": (0.0, 60.0), "dedup": points(rate, rate), "spark": points(0.8 * rate, spark_done),
            "pairs": lats, "unmatched": [30_000.0] * missing, "cpu_ns": {"dedup": int(6e9), "spark": int(30e9)},
            "machine_cores": 1.9, "harness_cores": 0.4, "sent_per_s": rate * 0.99, **over}


def test_row():
    r = row(run(1000, 800))
    assert r["dedup"]["cpu_us_per_record"] == pytest.approx(100.0)  # 6 s over 60,000 records
    assert r["spark"]["cpu_us_per_record"] == pytest.approx(625.0)  # 30 s over 48,000
    assert r["spark"]["cores"] == pytest.approx(0.5) and r["latency"]["records"] == 100
    # no CPU read: no per-record figure rather than a wrong one
    assert "cpu_us_per_record" not in row(run(1000, 800, cpu_ns={}))["dedup"]


@pytest.mark.parametrize("name, runs, expected", [
    ("keeps up at both", [run(1000, 800), run(10000, 8000)],
     {"kept_up_per_s": 8000.0, "behind_at": None, "reached_per_s": None}),
    ("behind at 10k", [run(1000, 800), run(10000, 5000)],
     {"kept_up_per_s": 800.0, "behind_at": 10000, "reached_per_s": 5000.0, "input_there_per_s": 8000.0}),
    ("behind at every rate", [run(10000, 5000), run(1000, 500)],
     {"kept_up_per_s": None, "behind_at": 1000, "reached_per_s": 500.0}),
])
def test_sustained(name, runs, expected):
    got = sustained([row(r) for r in runs], "spark")
    assert {k: got[k] for k in expected} == expected, name


@pytest.mark.parametrize("name, runs, met, p99", [
    ("under 1.5 s", [run(1000, 800), run(10000, 8000, p99_ms=1400)], True, 1400.0),
    ("over", [run(10000, 8000, p99_ms=1600)], False, 1600.0),
    # records of the window never seen: not met whatever the p99 of those seen
    ("unseen records", [run(10000, 8000, missing=3)], False, 1000.0),
    ("10k not run", [run(1000, 800)], None, None),
])
def test_goal(name, runs, met, p99):
    assert goal([row(r) for r in runs], 1.0) == {"bound_ms": 1500.0, "met": met, "p99_ms": p99}, name


def test_table():
    rows = [row(run(1000, 800)), row(run(10000, 5000, p99_ms=90_000))]
    text = table({"example": "examples/payments.yaml", "nodes": 1, "trigger_s": 1.0, "dup_ratio": 0.2, "seconds": 60,
                  "warmup_s": 20, "cpus": 2, "rows": rows,
                  "verify": {"dedup stage": {"unique_in": 10, "out": 10, "lost": 0, "duplicated": 0}}})
    assert "Spark trigger 1 s, 20% resends; 60 s measured per rate after 20 s; 2 cores" in text
    assert next(line for line in text.splitlines() if line.split()[:1] == ["10,000"]).split()[1] == "9,900"
    spark_10k = next(line for line in text.splitlines() if line.split()[:2] == ["10,000", "spark"])
    assert spark_10k.split()[2:] == ["8,000", "5,000", "180,000", "+180,000", "NO", "100.0", "0.50"]
    assert ("highest rate kept up: dedup 10,000 source records/s (kept up at every rate run); Spark 800 deduped "
            "records/s; at 10,000/s it fell behind, reaching 5,000 of 8,000/s") in text
    assert "at 10,000 records/s: NOT MET (p99 90,000 ms)" in text
    assert "eopipe verify, dedup stage: 10 unique in, 10 out, lost 0, duplicated 0" in text
    # a stage with no samples in its window says so instead of failing
    rows[0]["spark"] = None
    assert "(no samples in the window)" in table({**{"example": "x", "nodes": 3, "trigger_s": 1.0, "dup_ratio": 0.2,
                                                     "seconds": 60, "warmup_s": 20, "cpus": 2}, "rows": rows})
    # where the busy cores went, per rate that measured it
    rows[1]["cpu_by"] = [("kafka.Kafka", 0.5), ("hypervisor steal", 0.25)]
    text = table({**{"example": "x", "nodes": 1, "trigger_s": 1.0, "dup_ratio": 0.2, "seconds": 60,
                     "warmup_s": 20, "cpus": 2}, "rows": rows})
    assert "where the 1.90 busy cores went at 10,000/s (pods by namespace/name, host processes by program):" in text
    assert "   0.50  kafka.Kafka\n   0.25  hypervisor steal" in text and "at 1,000/s (pods" not in text
    rows[1]["requests_by"] = [("Produce", 673.2), ("Fetch", 220.3), ("1 others", 40.0)]
    assert "the broker's 934 requests/s at 10,000/s: Produce 673, Fetch 220, 1 others 40" in table(
        {"example": "x", "nodes": 1, "trigger_s": 1.0, "dup_ratio": 0.2, "seconds": 60, "warmup_s": 20, "cpus": 2,
         "rows": rows})
    # the Spark pods' request, when the run set one, is in the header
    assert "Spark trigger 1 s, executor cores 2, 20% resends" in table(
        {"example": "x", "nodes": 1, "trigger_s": 1.0, "executor_cores": 2, "dup_ratio": 0.2, "seconds": 60,
         "warmup_s": 20, "cpus": 2, "rows": rows})
    assert "Spark trigger 5 s, Spark pods' coreRequest 500m, 20% resends" in table(
        {"example": "x", "nodes": 1, "trigger_s": 5.0, "spark_cpu": "500m", "dup_ratio": 0.2, "seconds": 60,
         "warmup_s": 20, "cpus": 2, "rows": rows})


@pytest.mark.parametrize("comm, argv, expected", [
    ("java", ["java", "-Xmx1g", "-cp", "/c/kafka.jar:/c/x.jar", "kafka.Kafka", "/w/server.properties"], "kafka.Kafka"),
    ("java", ["java", "-version"], "java"),
    ("python3.11", ["/v/bin/python", "/v/bin/eopipe", "load", "--rate", "5000"], "eopipe load"),
    ("eopipe", ["/v/bin/python", "/v/bin/eopipe", "load", "--rate", "5000"], "eopipe load"),  # a console script
    ("python", ["python", "-u", "-m", "bench.pipeline_rate", "watch", "--bootstrap", "h:1"], "bench.pipeline_rate watch"),
    ("python3", ["python3", "-m", "pytest", "tests/e2e/x.py"], "pytest"),
    ("python3", ["python3"], "python3"),
    ("python3", ["python3", "-c", "import time; time.sleep(1)"], "python3 -c"),
    ("kworker/1:2H", [""], "kworker"),
    ("kube-apiserver", ["kube-apiserver", "--etcd-servers=x"], "kube-apiserver"),
])
def test_program(comm, argv, expected):
    assert program(comm, argv) == expected


def test_cpu_shares():
    before = {(1, 10): ("kafka.Kafka", 100.0, 0.0, 0), (2, 10): ("kubelet", 50.0, 5.0, 0),
              (3, 10): ("runc", 2.0, 1.0, 2),          # kubelet's child, reaped in the window
              (4, 10): ("pods/a", 1.0, 0.0, 0), (6, 10): ("orphan", 9.0, 0.0, 77)}
    after = {(1, 10): ("kafka.Kafka", 130.0, 0.0, 0),   # 30 s over a 60 s window: 0.5 cores
             (2, 10): ("kubelet", 56.0, 14.0, 0),        # its own 0.1; its children's 9 s less runc's 3 before
             (4, 10): ("pods/a", 4.0, 0.0, 0), (5, 11): ("pods/a", 3.0, 0.0, 0),  # one pod, two processes; one new
             (4, 99): ("idle", 0.0, 0.0, 0)}            # a reused pid is a new process
    shares = cpu_shares(before, after, 60.0, busy_cores=1.2, steal_cores=0.1)
    assert [(w, round(c, 3)) for w, c in shares] == [
        ("kafka.Kafka", 0.5), ("kubelet", 0.1), ("kubelet (exited children)", 0.1), ("pods/a", 0.1),
        ("hypervisor steal", 0.1), ("no process (unreaped exits, interrupts)", 0.3)]
    top = cpu_shares(before, after, 60.0, top=2)
    assert [w for w, _ in top] == ["kafka.Kafka", "kubelet", "2 others"]
    assert round(top[-1][1], 3) == 0.2


def test_trigger_and_cores_options_refuse_what_the_crd_refuses(capsys):
    from bench.pipeline_rate import main

    for bad in ("5", "five seconds", ""):
        with pytest.raises(SystemExit) as e:
            main(["--trigger", bad])
        assert e.value.code == 2
        assert "bad duration" in capsys.readouterr().err
    for bad in ("0", "65", "two", "-1"):
        with pytest.raises(SystemExit) as e:
            main(["--executor-cores", bad])
        assert e.value.code == 2
        assert "expected a whole number from 1 to 64" in capsys.readouterr().err


def test_request_counts_sum_versions_and_count_a_fetch_once():
    text = "Produce 100\nProduce 5\nFetch 40\nFetchConsumer 30\nFetchFollower 10\nEndTxn 2\n"
    assert request_counts(text) == {"Produce": 105, "Fetch": 40, "EndTxn": 2}
    assert request_counts("") == {}


def test_request_rates():
    before = (100.0, "Produce 1000\nFetch 500\nEndTxn 10\nMetadata 7\n")
    after = (110.0, "Produce 3000\nFetch 900\nEndTxn 30\nMetadata 7\nListOffsets 50\n")  # a new type: all of it
    assert request_rates(before, after) == [("Produce", 200.0), ("Fetch", 40.0), ("ListOffsets", 5.0), ("EndTxn", 2.0)]
    assert request_rates(before, after, top=2) == [("Produce", 200.0), ("Fetch", 40.0), ("2 others", 7.0)]
