"""bench.snapshots' pure parts: the worker's log read into times and rates, the verdicts, the table."""

from __future__ import annotations

import json

import pytest

from bench.common import json_log as logs
from bench.snapshots import derived, recovery_seconds, table, upload_row


def doc(msg: str, ts: str, **kw) -> dict:
    return {"ts": f"2026-11-26T10:00:{ts}Z", "msg": msg, **kw}


@pytest.mark.parametrize("docs, want", [
    # one life: assignment -> partition running of p 0
    ([doc("dedup worker starting", "00.000"), doc("assignment", "01.000"),
      doc("partition running", "03.500", partition=0)], 2.5),
    # two lives in one appended log: the last one counts
    ([doc("dedup worker starting", "00.000"), doc("assignment", "01.000"),
      doc("partition running", "09.000", partition=0),
      doc("dedup worker starting", "20.000"), doc("assignment", "20.250"),
      doc("partition running", "20.500", partition=1), doc("partition running", "21.000", partition=0)], 0.75),
])
def test_recovery_seconds_from_the_last_life(docs, want):
    assert recovery_seconds(docs) == pytest.approx(want)


def test_recovery_seconds_without_the_partition_running_fails():
    with pytest.raises(StopIteration):
        recovery_seconds([doc("dedup worker starting", "00.000"), doc("assignment", "01.000")])


@pytest.mark.parametrize("event, mb_per_s", [
    ({"applied_offset": 10, "files": 3, "bytes": 50_000_000, "uploaded_bytes": 50_000_000, "seconds": 2.0}, 25.0),
    ({"applied_offset": 11, "files": 4, "bytes": 51_000_000, "uploaded_bytes": 1_000_000, "seconds": 0.5}, 2.0),
    ({"applied_offset": 12, "files": 4, "bytes": 51_000_000, "uploaded_bytes": 0, "seconds": 0.0}, 0.0),
])
def test_upload_row_counts_only_the_bytes_sent(event, mb_per_s):
    row = upload_row(event)
    assert row["mb_per_s"] == pytest.approx(mb_per_s)
    assert row["state_mb"] == event["bytes"] / 1e6


def result(restore_s=0.5, rebuild_s=6.0, off=20_000.0, on=19_500.0) -> dict:
    up = upload_row({"applied_offset": 1, "files": 3, "bytes": 9_000_000, "uploaded_bytes": 9_000_000, "seconds": 1})
    return {"keys": 1_000_000, "records": 300_000, "interval": "5s", "state_mb": 9.0,
            "upload": {"full": up, "incremental": up},
            "recovery": {"restore_s": restore_s, "rebuild_s": rebuild_s, "download_s": 0.2,
                         "restore_replayed": 0, "rebuild_replayed": 1_000_000},
            "cost": {"off": {"steady_records_per_s": off, "steady_cpu_us_per_record": 40.0, "snapshots": 0},
                     "on": {"steady_records_per_s": on, "steady_cpu_us_per_record": 41.0, "snapshots": 3,
                            "snapshot_cpu_s": 0.25, "snapshot_uploaded_mb": 30.0}},
            "verify": {"recovery": {"lost": 0, "duplicated": 0}}}


@pytest.mark.parametrize("kw, x, pct", [
    ({}, 12.0, 2.5),
    ({"restore_s": 0.0}, None, 2.5),          # no time to divide by: no ratio, not a crash
    ({"on": None}, 12.0, None),              # a run too short for a steady rate
    ({"off": 10_000.0, "on": 11_000.0}, 12.0, -10.0),
])
def test_derived(kw, x, pct):
    d = derived(result(**kw))
    assert (d["restore_x"] is None) == (x is None) and (x is None or d["restore_x"] == pytest.approx(x))
    assert (d["cost_pct"] is None) == (pct is None) and (pct is None or d["cost_pct"] == pytest.approx(pct))


def test_table_shows_every_row_and_the_verdicts():
    text = table(result())
    for label in ("upload, full snapshot", "upload, incremental snapshot", "restore from snapshot",
                  "rebuild from Kafka", "restore speed-up over rebuild", "backups off", "backups on",
                  "throughput cost of backups", "lost 0 dup 0"):
        assert label in text, label
    assert "12.00" in text and "2.50" in text and "30 MB sent, 0.25 s of the worker's CPU" in text
    assert "n/a" in table(result(on=None))


def test_logs_skips_lines_that_are_not_json(tmp_path):
    p = tmp_path / "w.log"
    p.write_text("Traceback...\n" + json.dumps(doc("assignment", "01.000")) + "\n{broken\n")
    assert [d["msg"] for d in logs(p)] == ["assignment"]
