"""bench/spark_sink.py's decisions: the batches read from a checkpoint, when to kill the driver,
and the steady rate and CPU per record."""

import json
import os

import pytest

from bench.spark_sink import Batch, finished, kill_due, read_batches, steady


def B(i, end, started, committed=None):
    return Batch(i, end, started, committed)


def test_read_batches_from_a_checkpoint(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for i, ends in enumerate(({"t": {"0": 5, "1": 5}}, {"t": {"0": 12, "1": 9}})):
        f = tmp_path / "offsets" / str(i)
        f.write_text("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(ends) + "\n")
        os.utime(f, (100 + i, 100 + i))
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    os.utime(tmp_path / "commits" / "0", (100.5, 100.5))
    (tmp_path / "offsets" / "2").write_text("v1\n")  # being written: skipped
    (tmp_path / "offsets" / ".1.tmp").write_text("x")  # not a batch
    assert read_batches(tmp_path) == [B(0, 10, 100.0, 100.5), B(1, 21, 101.0, None)]
    assert read_batches(tmp_path / "absent") == []


DONE = [B(i, 10 * (i + 1), 10.0 + 2 * i, 12.0 + 2 * i) for i in range(6)]  # batches 0..5, 2 s each


@pytest.mark.parametrize("batches, now, due", [
    ([], 99.0, False),                                         # nothing yet
    (DONE, 99.0, False),                                       # batch 6 not started
    (DONE + [B(6, 70, 22.0)], 22.9, False),                    # in flight, under half of 2 s
    (DONE + [B(6, 70, 22.0)], 23.0, True),                     # half of the previous batch's 2 s
    (DONE[:5] + [B(5, 60, 20.0)], 99.0, False),                # batch 5 in flight: before the kill batch
    (DONE + [B(6, 70, 22.0, 24.0), B(7, 80, 24.0)], 25.0, True),  # 6 done already: 7 is the one
])
def test_kill_due(batches, now, due):
    assert kill_due(batches, now) is due


def test_steady_rate_and_cpu():
    # commits seen at samples 2 (batch 0) and 6 (batch 5): CPU 3.0 -> 13.0 over 50 records
    samples = [(0.0, 0, 1.0), (1.0, 1, 3.0), (2.0, 3, 8.0), (3.0, 6, 13.0), (4.0, 6, 14.0)]
    got = steady(DONE + [B(6, 70, 22.0)], samples)
    assert got == {"steady_records": 50, "steady_seconds": 10.0, "records_per_s": 5.0, "cpu_seconds": 10.0,
                   "cpu_us_per_record": 200_000.0, "steady_batches": "1..5"}


@pytest.mark.parametrize("batches", [[], DONE[:1], DONE[1:]])  # too few, or batch 0 not in the checkpoint
def test_steady_unknown(batches):
    assert steady(batches, [(0.0, 9, 1.0)])["records_per_s"] is None


def test_steady_without_cpu_samples():
    got = steady(DONE, [])
    assert got["records_per_s"] == 5.0 and got["cpu_us_per_record"] is None


@pytest.mark.parametrize("batches, done", [
    ([], False), (DONE, True), (DONE + [B(6, 70, 22.0)], False), (DONE[:3], False)])
def test_finished(batches, done):
    assert finished(batches, 60) is done
