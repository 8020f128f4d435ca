"""`make bench` end to end in its quick mode, on the real broker and real Spark: every metric of
the combined table has a finite, positive value in the JSON, and the plot is a PNG."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The combined table of `python -m bench --quick` (memory sizes 20k and 100k keys).
EXPECTED = {
    "copy_records_per_s": "records/s",
    "dedup_records_per_s": "records/s",
    "dedup_vs_copy_ratio": "ratio",
    "latency_p50_ms_100": "ms",
    "latency_p99_ms_100": "ms",
    "latency_p50_ms_1000": "ms",
    "latency_p99_ms_1000": "ms",
    "recovery_first_commit_s": "s",
    "recovery_caught_up_s": "s",
    "handoff_pause_snapshot_s": "s",
    "handoff_pause_rebuild_s": "s",
    "migration_mb_per_s": "MB/s",
    "memory_peak_rss_mb_20k": "MB",
    "memory_peak_rss_mb_100k": "MB",
}


def test_bench_quick_writes_every_metric_and_a_png(kafka_bootstrap, tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--bootstrap", kafka_bootstrap,
                           "--json", str(out_json), "--png", str(out_png)],
                          cwd=REPO, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"

    doc = json.loads(out_json.read_text())
    assert doc["mode"] == "quick" and doc["errors"] == {}
    rows = {r["id"]: r for r in doc["summary"]}
    assert set(rows) == set(EXPECTED), f"metrics differ: {sorted(set(rows) ^ set(EXPECTED))}"
    for mid, unit in EXPECTED.items():
        v = rows[mid]["value"]
        assert isinstance(v, float) and math.isfinite(v) and v > 0, f"{mid} = {v!r}"
        assert rows[mid]["unit"] == unit
    # Sanity bounds, loose enough for a busy 2-core machine.
    assert 100 < rows["dedup_records_per_s"]["value"] < 10_000_000
    assert rows["latency_p50_ms_100"]["value"] <= rows["latency_p99_ms_100"]["value"] < 120_000
    assert rows["recovery_first_commit_s"]["value"] <= rows["recovery_caught_up_s"]["value"] < 300
    assert 10 < rows["memory_peak_rss_mb_20k"]["value"] < 4096
    # The details back the table: the memory runs really held their keys, the store was used.
    mem = doc["details"]["memory"]
    assert [m["keys"] for m in mem] == [20_000, 100_000]
    assert all(m["duplicates"] >= m["old_key_dups"] > 0 for m in mem)

    # Every metric appears in the printed table too.
    for r in rows.values():
        assert r["metric"] in proc.stdout

    data = out_png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
