"""Dedup snapshots in a real object store (SeaweedFS's S3 gateway), with a real worker and Kafka
(docs/design.md#snapshots): a worker uploads snapshots; its volume is lost; the restarted
worker restores the newest snapshot and replays the source only from the snapshot's offset,
catching duplicates of records seen before the snapshot; `verify` finds nothing lost or
duplicated. The worker keeps the pipeline's manifest there too, as it changes, and `eopipe
restore` reads it back. And a corrupt snapshot file is not used: the partition is rebuilt, logged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import yaml

from eopipe.control.builders.dedup import manifest
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from tests.helpers.rebalance import wait_until

pytestmark = pytest.mark.kafka

PARTS = [0, 1, 2]


def snapshots(w) -> dict[int, dict]:
    """The last snapshot each partition uploaded, from the worker's log."""
    out = {}
    for doc in w.logs():
        if doc.get("msg") == "snapshot uploaded":
            out[doc["partition"]] = doc
    return out


def uploads(w) -> list[dict]:
    return [d for d in w.logs() if d.get("msg") == "pipeline manifest uploaded"]


def _manifest(replicas: int) -> str:
    """What the operator puts in the assignment ConfigMap for shop/payments."""
    spec = PipelineSpec.model_validate({"kafka": {"bootstrapServers": "kafka:9092"},
                                        "source": {"topic": "events", "partitions": 3},
                                        "dedup": {"replicas": replicas}})
    return manifest(Names("shop", "payments", spec))


def events(w, msg: str) -> dict[int, dict]:
    return {d["partition"]: d for d in w.logs() if d.get("msg") == msg}


def test_a_lost_volume_is_restored_from_the_snapshot_and_replayed_from_its_offset(pipe, object_store):
    bucket = f"snap-{uuid.uuid4().hex[:8]}"
    object_store.client().create_bucket(bucket)
    backups = ["--backup-uri", f"s3://{bucket}/dedup", "--backup-interval", "1s", "--backup-retention", "2"]
    env = {**object_store.creds.env(), "AWS_ENDPOINT_URL": object_store.endpoint}

    # 1. Backups on: a load, drained, then snapshots at the committed offsets.
    kept = pipe.tmp / "pipeline.yaml"  # the assignment ConfigMap's pipeline.yaml, as a pod has it
    kept.write_text(_manifest(replicas=1))
    w = pipe.worker(PARTS, extra=[*backups, "--pipeline-manifest", str(kept)], env=env).start().wait_ready()
    first = pipe.load(20_000, dup_ratio=0.2, seed=71)
    pipe.wait_drained()
    committed = {p: w.status()["partitions"][str(p)]["committed"] for p in PARTS}
    wait_until(lambda: all(snapshots(w).get(p, {}).get("applied_offset") == committed[p] for p in PARTS),
               what="snapshots at the committed offsets", timeout=60)
    taken = snapshots(w)
    # The pipeline's manifest, uploaded again once it changed; `eopipe restore` reads the newest.
    wait_until(lambda: len(uploads(w)) == 1, what="the pipeline's manifest uploaded", timeout=30)
    kept.write_text(_manifest(replicas=2))
    wait_until(lambda: len(uploads(w)) == 2, what="the changed manifest uploaded", timeout=30)
    res = subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "restore", f"s3://{bucket}/dedup",
                          "--namespace", "shop-restored"], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    back = yaml.safe_load(res.stdout)
    assert back["metadata"] == {"name": "payments", "namespace": "shop-restored"}, back
    assert back["spec"]["restoreFrom"] == {"namespace": "shop", "name": "payments"}, back
    assert back["spec"]["dedup"]["replicas"] == 2, back
    assert w.terminate() == 0
    # 2. Without backups: more records (new ones and resends of the first), committed after the
    # snapshot. A load with the same seed and ratios sends the same keys again (its prefix).
    w = pipe.worker(PARTS, env=env).start().wait_ready()
    second = pipe.load(4_000, dup_ratio=0.2, seed=72)
    pipe.load(2_000, dup_ratio=0.2, seed=71)
    pipe.wait_drained()
    assert w.terminate() == 0
    # 3. The volume is lost; while the worker is down, resends of both loads and new records.
    shutil.rmtree(w.state_dir)
    pipe.load(2_000, dup_ratio=0.2, seed=71)
    pipe.load(1_000, dup_ratio=0.2, seed=72)
    third = pipe.load(3_000, dup_ratio=0.2, seed=73)
    w = pipe.worker(PARTS, extra=backups, env=env).start().wait_ready()
    pipe.wait_drained()
    restored, running = events(w, "restored from snapshot"), events(w, "partition running")
    for p in PARTS:
        snap = taken[p]["applied_offset"]
        assert restored[p]["snapshot_offset"] == snap, restored
        # The replay read only [snapshot, committed): not a rebuild over the window.
        r = running[p]
        assert r["recovery"] == "replay" and r["applied_before"] == snap and r["snapshot_offset"] == snap, r
        assert 0 < r["replayed"] <= r["committed"] - snap, r
    assert sum(running[p]["replayed"] for p in PARTS) < sum(committed.values())
    m = w.metrics()
    assert m.get('eopipe_dedup_rebuilds_total{partition="0"}', 0) == 0
    assert sum(m[f'eopipe_dedup_snapshot_restores_total{{outcome="snapshot",partition="{p}"}}'] for p in PARTS) == 3
    assert w.terminate() == 0
    rep = pipe.verify()
    unique = first["unique"] + second["unique"] + third["unique"]
    assert rep.lost == 0 and rep.duplicated == 0 and rep.out == unique, rep.line()

    # Retention: at most 2 manifests per partition, and every file named by one of them.
    keys = object_store.client().keys(bucket, "dedup/")
    for p in PARTS:
        assert 1 <= sum(1 for k in keys if k.startswith(f"dedup/p-{p}/m-")) <= 2

    # 4. A file of partition 0's newest snapshot corrupted (one bit): not used, p 0 is rebuilt from the
    # source (logged); the others restore theirs.
    s3 = object_store.client()
    newest = max(k for k in keys if k.startswith("dedup/p-0/m-"))
    key = "dedup/p-0/f/" + json.loads(s3.get(bucket, newest))["files"][0]["sha256"]
    data = bytearray(s3.get(bucket, key))
    data[-1] ^= 1  # one bit, the size kept: only the digest can tell
    s3.put(bucket, key, bytes(data))
    shutil.rmtree(w.state_dir)
    w = pipe.worker(PARTS, env=env, extra=[*backups[:2], "--backup-interval", "1h"]).start().wait_ready()
    pipe.wait_drained()
    reason = events(w, "not restored from snapshot: rebuilding from the source")[0]["reason"]
    assert "download failed" in reason and "not the file the manifest names" in reason, reason
    assert events(w, "partition running")[0]["recovery"] == "rebuild"
    assert "snapshot_offset" not in events(w, "partition running")[0]
    assert sorted(events(w, "restored from snapshot")) == [1, 2]
    assert w.terminate() == 0  # nothing new to process: the verification above stands
