"""bench/autoscale.py's summary: samples and moves in, the rows of its table out."""

import pytest

from bench.autoscale import move_rows, phase_rows, table, timeline

PHASES = [{"name": "1x", "rate": 300, "start": 0.0, "end": 30.0},
          {"name": "4x", "rate": 1200, "start": 30.0, "end": 90.0},
          {"name": "1x", "rate": 300, "start": 90.0, "end": 160.0}]
SAMPLES = [{"t": 1.0, "replicas": 1, "desired": 1, "lag": 10},
           {"t": 31.0, "replicas": 1, "desired": 3, "lag": 4000},
           {"t": 40.0, "replicas": 3, "desired": 4, "lag": 900},
           {"t": 60.0, "replicas": 4, "desired": 4, "lag": None},
           {"t": 100.0, "replicas": 4, "desired": 1, "lag": 5},
           {"t": 150.0, "replicas": 1, "desired": 1, "lag": 3}]
LATENCY = [(0.5, 20.0), (10.0, 40.0), (29.9, 60.0), (30.0, 900.0), (45.0, 100.0), (120.0, 30.0)]


@pytest.mark.parametrize("i, expected", [
    (0, {"replicas_end": 1, "replicas_range": "1-1", "desired_max": 1, "lag_max": 10, "records": 3,
         "p50_ms": 40.0, "max_ms": 60.0}),
    # the step up: the count lags the wish; an unknown lag is left out, not read as 0
    (1, {"replicas_end": 4, "replicas_range": "1-4", "desired_max": 4, "lag_max": 4000, "records": 2,
         "max_ms": 900.0}),
    (2, {"replicas_end": 1, "replicas_range": "1-4", "desired_max": 1, "records": 1, "p99_ms": 30.0}),
])
def test_phase_rows(i, expected):
    row = phase_rows(PHASES, SAMPLES, LATENCY)[i]
    assert {k: row[k] for k in expected} == expected


def test_a_phase_without_samples_or_records_shows_none():
    row = phase_rows([{"name": "1x", "rate": 1, "start": 500.0, "end": 501.0}], SAMPLES, LATENCY)[0]
    assert row["replicas_end"] is None and row["replicas_range"] == "-" and row["p50_ms"] is None


def test_move_rows_keep_replica_moves_in_order_from_the_runs_start():
    t0 = 1_763_760_000.0  # 2025-11-21T21:20:00Z
    moves = [{"id": 3, "type": "replicas", "startedAt": "2025-11-21T21:21:40Z", "fromReplicas": 4,
              "toReplicas": 1, "durationSeconds": 6.5, "maxPauseMs": 800, "partitionsMoved": 3,
              "snapshot": 3, "rebuild": 0},
             {"id": 1, "type": "replicas", "startedAt": "2025-11-21T21:20:31Z", "fromReplicas": 1,
              "toReplicas": 3, "durationSeconds": 4.0, "maxPauseMs": 450, "partitionsMoved": 2,
              "snapshot": 2, "rebuild": 0},
             {"id": 2, "type": "partitions", "startedAt": "2025-11-21T21:21:00Z"}]
    rows = move_rows(moves, t0)
    assert [(r["at_s"], r["move"], r["max_pause_ms"]) for r in rows] == [(31.0, "1 -> 3", 450), (100.0, "4 -> 1", 800)]


def test_table_names_every_phase_move_and_the_verdict():
    result = {"phases": phase_rows(PHASES, SAMPLES, LATENCY), "moves": [], "samples": SAMPLES,
              "verify": {"unique_in": 10, "out": 10, "lost": 0, "duplicated": 0, "out_of_order": 0}}
    text = table(result)
    assert "4x" in text and "(no move)" in text and "lost 0, duplicated 0" in text


@pytest.mark.parametrize("samples, expected", [
    (SAMPLES, "- 1 1 1 3 3 4 4 4 4 4 4 4 4 4 1"),  # 0 s has no sample yet
    ([], ""),
    ([{"t": 0.0, "replicas": 2}, {"t": 5.0, "replicas": None}, {"t": 12.0, "replicas": 3}], "2 2"),
])
def test_timeline(samples, expected):
    assert timeline(samples) == expected
