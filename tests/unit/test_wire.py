"""The contracts between the planes (eopipe.core.wire): the worker's /status as the dedup worker
writes it and the operator reads it, and the state-transfer paths between dedup pods.

Old and new versions run side by side during a rollout, so the JSON keeps its keys and a
reader tolerates keys it does not know and optional keys that are missing."""

from __future__ import annotations

import json

import pytest

from eopipe.control.rebalance import PodFacts
from eopipe.core.wire import (
    Migration,
    MigrationMethod,
    PartitionState,
    PartitionStatus,
    PodStatus,
    Recovery,
    RecoveryAction,
    ReshardRequest,
    SnapshotRequest,
    parse_transfer,
)
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.partition import PartitionRunner
from eopipe.dedup.worker import Worker

# A /status document as the worker wrote it before these models (commit a7f4b98), verbatim keys.
WRITTEN = json.loads("""{
  "pipeline": "orders", "namespace": "shop", "pod": "orders-dedup-1", "generation": 5,
  "owned": [2, 3], "paused": false, "partition_count": 4, "source_partitions": 4,
  "window_seconds": 10800.0, "ready": false,
  "counts": {"consumed": 1200, "emitted": 1000, "duplicates": 190, "deadLettered": 10},
  "partitions": {
    "2": {"state": "running", "error": null, "committed": 1200, "lag": 0,
          "recovery": {"recovery": "replay", "applied_before": 1100, "replayed": 100,
                       "recovery_seconds": 0.412, "high_watermark": 1200},
          "migration": {"generation": 5, "from": "orders-dedup-0", "method": "snapshot", "bytes": 40960,
                        "sha256": "ab12", "fetch_ms": 35, "stopped_at_ms": 1700000000000,
                        "pause_ms": 512, "running_at_ms": 1700000000512},
          "store": {"keys": 900, "bytes": 40000, "sst_bytes": 39000, "memtable_bytes": 1000,
                    "segments": 4, "applied_offset": 1200, "watermark_ms": 1700000000000,
                    "effective_window_seconds": 10800.0}},
    "3": {"state": "fetching", "error": null, "committed": null, "lag": null, "recovery": {},
          "migration": {"generation": 5, "from": "orders-dedup-0"}, "store": null}
  },
  "released": {"1": {"partition": 1, "generation": 5, "applied_offset": 800, "bytes": 20480,
                     "sha256": "cd34", "keys": 500, "stopped_at_ms": 1700000000000,
                     "created_at_ms": 1700000000100}},
  "memory": {"budget_bytes": 268435456, "cache_usage_bytes": 1024, "cache_pinned_bytes": 0,
             "write_buffer_budget_bytes": 134217728, "write_buffer_usage_bytes": 512}
}""")


def roundtrip(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_a_status_as_the_worker_wrote_it_parses_and_writes_back_the_same():
    st = PodStatus.from_json(WRITTEN)
    assert st.generation == 5 and st.owned == [2, 3] and not st.paused
    p2, p3 = st.partitions[2], st.partitions[3]
    assert p2.state is PartitionState.RUNNING and p3.state is PartitionState.FETCHING
    assert p2.recovery.recovery is RecoveryAction.REPLAY and p2.recovery.replayed == 100
    assert p2.migration.method is MigrationMethod.SNAPSHOT and p2.migration.from_ == "orders-dedup-0"
    assert p2.migration.pause_ms == 512 and p2.store.keys == 900
    assert p3.migration.method is None and p3.recovery == Recovery()
    assert st.released[1]["bytes"] == 20480
    assert roundtrip(st.to_json()) == WRITTEN


def test_the_operator_reads_the_status():
    pf = PodFacts("orders-dedup-1", "10.0.0.7", True, PodStatus.from_json(WRITTEN))
    assert pf.url == "http://10.0.0.7:8080" and pf.generation == 5 and not pf.paused
    assert pf.running(2, 5) and not pf.running(2, 6) and not pf.running(3, 5) and not pf.running(9, 5)
    assert pf.partition(2).migration.bytes == 40960 and pf.partition(9) is None
    assert PodFacts("x").generation == -1 and not PodFacts("x").paused and PodFacts("x").partition(0) is None


def test_readers_tolerate_a_newer_and_an_older_writer():
    newer = {**WRITTEN, "zone": "eu-1", "partitions": {
        "2": {**WRITTEN["partitions"]["2"], "state": "draining", "cpu": 0.5,
              "migration": {"method": "teleport", "bytes": 1, "via": "x"}}}}
    st = PodStatus.from_json(newer)
    p = st.partitions[2]
    assert p.state == "draining" and not isinstance(p.state, PartitionState)
    assert p.migration.method == "teleport" and p.migration.bytes == 1
    assert not PodFacts("x", status=st).running(2, 0)   # an unknown state is never "running"
    older = PodStatus.from_json({"generation": 3, "partitions": {"0": {"state": "running"}}})
    assert older.paused is False and older.partitions[0].recovery == Recovery()
    assert older.partitions[0].migration is None and older.memory == {}
    assert PodFacts("x", status=older).running(0, 3)


def test_a_partition_without_a_state_is_not_a_status():
    with pytest.raises(ValueError):
        PodStatus.from_json({"generation": 1, "partitions": {"0": {"committed": 5}}})


def test_the_worker_writes_what_the_operator_reads(tmp_path):
    cfg = WorkerConfig(bootstrap="127.0.0.1:9", source_topic="src", output_topic="out", pipeline="orders",
                       namespace="shop", partitions=[0, 1], state_dir=tmp_path, window_seconds=3600)
    w = Worker(cfg)
    try:
        w.generation = 2
        w.owned = (0, 1)
        r0 = w.runners[0] = PartitionRunner(w.context, 0)
        r0.set_state(PartitionState.RUNNING)
        r0.committed, r0.lag = 77, 3
        r0.recovery = Recovery(recovery=RecoveryAction.REBUILD, applied_before=None, replayed=77,
                               recovery_seconds=1.5, high_watermark=80)
        r0.migration = Migration(method=MigrationMethod.RESHARD_IMPORT, reshard=4, keys=10, bytes=100)
        w.runners[1] = PartitionRunner(w.context, 1)
        w.outgoing.released[5] = {"bytes": 7}
        w.metrics.totals.add(5, 4, 1, 0)
        w.metrics.totals.add(3, 2, 0, 1)
        doc = roundtrip(w.status().to_json())
    finally:
        w.store.close()
    assert doc["partitions"]["0"] == {
        "state": "running", "error": None, "committed": 77, "lag": 3,
        "recovery": {"recovery": "rebuild", "applied_before": None, "replayed": 77, "recovery_seconds": 1.5,
                     "high_watermark": 80},
        "migration": {"method": "reshard-import", "reshard": 4, "keys": 10, "bytes": 100}, "store": None}
    assert doc["partitions"]["1"] == {"state": "starting", "error": None, "committed": None, "lag": None,
                                      "recovery": {}, "migration": None, "store": None}
    assert set(doc) == set(WRITTEN) and doc["released"] == {"5": {"bytes": 7}}
    assert doc["counts"] == {"consumed": 8, "emitted": 6, "duplicates": 1, "deadLettered": 1}
    assert doc["pod"] == "local" and doc["window_seconds"] == 3600 and doc["ready"] is False
    pf = PodFacts("local", "10.0.0.1", True, PodStatus.from_json(doc))
    assert pf.running(0, 2) and not pf.running(1, 2)
    assert pf.partition(0).migration == r0.migration and pf.partition(0).recovery == r0.recovery


def test_partition_status_requires_only_its_state():
    assert PartitionStatus(state=PartitionState.STOPPED).to_json() == {"state": "stopped"}


@pytest.mark.parametrize("req", [SnapshotRequest(3, 12), SnapshotRequest(0), ReshardRequest(7, 2, 9)],
                         ids=["snapshot", "snapshot without a generation", "re-shard export"])
def test_transfer_paths_round_trip(req):
    path, _, query = req.path.partition("?")
    assert parse_transfer(path, query) == req


def test_transfer_paths_that_are_not_or_are_malformed():
    assert parse_transfer("/snapshots/3", "") == SnapshotRequest(3, 0)
    assert parse_transfer("/status", "") is None
    # Strict: only what `.path` writes (the router answers the rest 400; tests/unit/test_state_routes.py).
    for path, query in [("/snapshots/3", "generation=x"), ("/snapshots/3", "generation=1&foo=1"),
                        ("/snapshots/3", "generation=1&generation=2"), ("/snapshots/3", "generation"),
                        ("/reshard/1/2", ""), ("/reshard/1/2/3/4", ""), ("/reshard/1/2/3", "generation=1"),
                        ("/snapshots/three", ""), ("/reshard/1/2/x", ""), ("/snapshots/\u0661", ""),
                        ("/snapshots/01", ""), ("/snapshots/+1", ""), ("/snapshots/1_0", ""),
                        ("/snapshots/" + "9" * 19, ""), ("snapshots/1", "")]:
        with pytest.raises(ValueError):
            parse_transfer(path, query)
