"""`make bench` end to end in its quick mode, on the real broker and real Spark: every metric of
the combined table has a finite, positive value in the JSON, and the plot is a PNG. Its recovery
step starts a broker of its own behind toxiproxy: a worker kill and a network partition."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow, pytest.mark.bench, pytest.mark.timeout(660)]

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The combined table of `python -m bench --quick` (memory sizes 20k and 100k keys).
EXPECTED = {
    "copy_records_per_s": "records/s",
    "dedup_records_per_s": "records/s",
    "dedup_json_records_per_s": "records/s",
    "dedup_vs_copy_ratio": "ratio",
    "scale_4p_1pods_records_per_s": "records/s",
    "scale_4p_2pods_records_per_s": "records/s",
    "dedup_latency_p50_ms_1000_100": "ms",
    "dedup_latency_p99_ms_1000_100": "ms",
    "latency_p50_ms_100": "ms",
    "latency_p99_ms_100": "ms",
    "latency_p50_ms_1000": "ms",
    "latency_p99_ms_1000": "ms",
    "recovery_worker_kill_s": "s",
    "recovery_worker_kill_max_s": "s",
    "recovery_partition_s": "s",
    "recovery_partition_max_s": "s",
    "handoff_pause_snapshot_s": "s",
    "handoff_pause_rebuild_s": "s",
    "migration_mb_per_s": "MB/s",
    "memory_peak_rss_mb_20k": "MB",
    "memory_peak_rss_mb_100k": "MB",
}
# --quick leaves out autoscale, spark_sink, snapshots and node_faults (each runs alone: a control plane; seven
# Spark JVMs; an object store; the node tier).


def test_bench_quick_writes_every_metric_and_a_png(kafka_bootstrap, tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--bootstrap", kafka_bootstrap,
                           "--json", str(out_json), "--png", str(out_png)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
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
    assert rows["dedup_latency_p50_ms_1000_100"]["value"] <= rows["dedup_latency_p99_ms_1000_100"]["value"] < 60_000
    # Scale and the dedup latency runs each had their output read back by eopipe verify.
    for run in doc["details"]["scale"]["runs"]:
        assert (run["verify"]["lost"], run["verify"]["duplicated"]) == (0, 0) and run["verify"]["out"] > 0
    for r in doc["details"]["dedup_latency"]["rows"]:
        assert (r["verify"]["lost"], r["verify"]["duplicated"]) == (0, 0) and r["verify"]["out"] > 0
    # Recovery: one round per quick fault class, each judged against its target, and the output
    # of the whole fault sequence counted by eopipe verify.
    rec = doc["details"]["recovery"]
    assert [r["fault"] for r in rec["rows"]] == ["worker_kill", "partition"]
    for r in rec["rows"]:
        assert rows[f"recovery_{r['fault']}_s"]["value"] <= rows[f"recovery_{r['fault']}_max_s"]["value"] < 120
        assert 0 <= r["first_commit_max_s"] <= r["caught_up_max_s"] < r["caught_up_from_start_max_s"]
        assert r["verdict"] == ("pass" if r["caught_up_max_s"] < r["target_s"] else "FAIL")
        assert r["verdict"] in rows[f"recovery_{r['fault']}_max_s"]["notes"]
    assert rec["rows"][1]["held_s"] > rec["transaction_timeout_s"]  # the partition outlasted it
    v = rec["verify"]
    assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0) and v["out"] == v["unique_in"] > 1000
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
    assert "<svg" in out_png.with_suffix(".svg").read_text()[:2000]



PEERS = {"copy", "dedup", "dedup_json", "c_copy", "java_copy", "java_tx_copy", "kstreams_dedup", "spark_dedup"}


@pytest.mark.timeout(600)
def test_peers_each_produce_their_expected_records(kafka_bootstrap, tmp_path):
    """Every contestant of the peer table at a tiny count, its output read back by eopipe verify:
    the dedup ones (eopipe, Kafka Streams, Spark) hold each source id once, the copiers every
    record; Spark restarted after a driver SIGKILL loses nothing (its duplicates are the point).
    The Java peers end by themselves at the expected count (--expect): else this times out."""
    out_json = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, "-m", "bench.dedup_vs_copy", "--peers", "--records", "2000",
                           "--rounds", "1", "--bootstrap", kafka_bootstrap, "--json", str(out_json)],
                          cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    result = json.loads(out_json.read_text())
    rows = {r["id"]: r for r in result["rows"]}
    assert set(rows) == PEERS
    unique, total = result["unique"], result["records"]
    assert total == 2000 and 1000 < unique < total  # the source holds resends
    for cid, r in rows.items():
        assert r["lost"] == 0, cid
        if r["dedups"]:
            assert (r["out"], r["duplicated"]) == (unique, 0), cid
        else:
            assert r["out"] == total, cid
        assert r["records_per_s"] > 0 and r["cpu_us_per_record"] > 0 and r["max_rss_mb"] > 10, cid
        assert r["name"] in proc.stdout
    # The peers print their configuration; it is kept with the result.
    assert "processing.guarantee=exactly_once_v2" in rows["kstreams_dedup"]["config"]
    assert "producer.transactional.id=" in " ".join(rows["java_tx_copy"]["config"])
    assert any(c.startswith("dedup=dropDuplicatesWithinWatermark") for c in rows["spark_dedup"]["config"])
    kill = result["spark_kill"]
    assert kill["lost"] == 0 and kill["unique"] == unique
    assert 0 < kill["written_at_kill"] < unique  # killed part way
    assert kill["out"] - unique >= kill["duplicated"] >= 0
