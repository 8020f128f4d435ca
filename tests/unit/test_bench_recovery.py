"""bench.recovery_summary: recovery rounds in, per-class median, max and verdict out; samples in, the longest time without a commit out."""

from __future__ import annotations

import pytest

from bench.recovery_summary import FAULTS, Stood, parse_faults, passed, summarize, table, verdict


def rnd(fault, first, caught, held=0.0):
    return {"fault": fault, "held_s": held, "first_commit_s": first, "caught_up_s": caught}


@pytest.mark.parametrize("caught, target, expected", [
    ([1.0, 2.0, 9.9], 10.0, "pass"),
    ([1.0, 10.0], 10.0, "FAIL"),         # "under 10 s": 10.0 is not under
    ([31.0], 30.0, "FAIL"),
    ([12.0, 1.0, 1.0], 10.0, "FAIL"),    # the median would pass; the slowest round decides
    ([500.0], None, "-"),                # no target: no verdict
])
def test_verdict(caught, target, expected):
    assert verdict(caught, target) == expected


@pytest.mark.parametrize("text, expected", [
    ("worker_kill", ["worker_kill"]),
    ("partition,worker_kill", ["worker_kill", "partition"]),  # FAULTS order, whatever the given order
    (" broker_kill , partition ,", ["broker_kill", "partition"]),
    (",".join(FAULTS), list(FAULTS)),
])
def test_parse_faults(text, expected):
    assert parse_faults(text) == expected


@pytest.mark.parametrize("text", ["", "worker_kill,nope", "WORKER_KILL"])
def test_parse_faults_refuses_unknown_names(text):
    with pytest.raises(ValueError, match="known: worker_kill"):
        parse_faults(text)


def test_summary_per_class_from_end_and_from_start():
    rounds = [
        rnd("worker_kill", 1.0, 2.0, held=0.1),
        rnd("worker_kill", 3.0, 4.0, held=0.3),
        rnd("worker_kill", 2.0, 3.0, held=0.2),
        rnd("partition", 5.0, 40.0, held=10.0),
        rnd("broker_kill", 8.0, 9.0, held=6.0),
    ]
    rows = summarize(rounds)
    assert [r["fault"] for r in rows] == ["worker_kill", "broker_kill", "partition"]  # FAULTS order
    kill, broker, part = rows
    assert kill["rounds"] == 3 and kill["target_s"] == 10.0
    assert (kill["first_commit_median_s"], kill["first_commit_max_s"]) == (2.0, 3.0)
    assert (kill["caught_up_median_s"], kill["caught_up_max_s"]) == (3.0, 4.0)
    assert kill["caught_up_from_start_median_s"] == pytest.approx(3.2)
    assert kill["caught_up_from_start_max_s"] == pytest.approx(4.3)
    assert kill["first_commit_from_start_max_s"] == pytest.approx(3.3)
    assert kill["held_s"] == pytest.approx(0.2)
    assert kill["verdict"] == "pass"
    assert broker["verdict"] == "pass" and broker["caught_up_from_start_max_s"] == 15.0
    # 40 s after the heal misses 30 s; the 50 s from the partition's start are not what is judged
    assert part["verdict"] == "FAIL" and part["caught_up_from_start_max_s"] == 50.0
    assert not passed(rows)
    assert passed(rows[:2])


@pytest.mark.parametrize("rounds, expected", [
    ([], []),
    ([rnd("worker_pause", 1.0, 25.0, held=10.0)], [("worker_pause", "-")]),
    ([rnd("partition", 1.0, 29.0, held=10.0)], [("partition", "pass")]),
    ([rnd("broker_kill", 1.0, 2.0), rnd("broker_kill", 1.0, 30.5)], [("broker_kill", "FAIL")]),
])
def test_summary_verdicts(rounds, expected):
    rows = summarize(rounds)
    assert [(r["fault"], r["verdict"]) for r in rows] == expected
    assert passed(rows) == all(v != "FAIL" for _, v in expected)


def test_table_shows_each_class_with_median_max_target_and_verdict():
    rows = summarize([rnd("worker_kill", 1.25, 2.5, held=0.25), rnd("worker_kill", 1.75, 3.5, held=0.25),
                      rnd("worker_pause", 4.0, 6.0, held=10.0)])
    text = table(rows)
    kill = next(line for line in text.splitlines() if line.startswith("worker SIGKILL"))
    assert "1.5 / 1.8" in kill and "3.0 / 3.5" in kill and "3.2 / 3.8" in kill
    assert "< 10" in kill and kill.endswith("pass")
    pause = next(line for line in text.splitlines() if line.startswith("worker SIGSTOP"))
    assert pause.endswith("-") and "16.0 / 16.0" in pause
    assert "broker SIGKILL" not in text  # only the classes that ran


@pytest.mark.parametrize("samples, expected", [
    ([], 0.0),                                          # no sample: nothing stood still
    ([(0.1, 5), (0.2, 6), (0.3, 7)], 0.1),
    ([(0.1, 5), (0.2, 6), (3.0, 6), (5.5, 9), (6.0, 10)], 5.3),   # 0.2 -> 5.5 at 6
    ([(1.0, 5), (9.0, 5)], 0.0),                        # never advanced again: no gap closed yet
    ([(1.0, 5), (4.0, 9), (4.5, 9), (5.0, 12)], 3.0),
])
def test_stood_longest_time_without_a_commit(samples, expected):
    s = Stood(0.0)
    for t, committed in samples:
        s.see(t, committed)
    assert s.longest == pytest.approx(expected)
