"""Rebalancing with state migration at the worker level (docs/design.md#rebalancing), under load
with duplicates: a real broker, workers as processes, and the assignment file written by the test
as the operator would. Handoff by snapshot, rebuild when the old owner is gone, re-shard of
4 -> 8 -> 12 partitions, and a lost volume after a re-shard (the rebuild must find keys
deduplicated in other partitions before the change). Each test ends in verify with lost=0 and
duplicated=0.
"""

from __future__ import annotations

import time

import pytest

from eopipe.core.assignment import Assignment, Handoff
from tests.helpers.rebalance import reshard, running_at, wait_until, write_assignment
from tests.helpers.workers import Pipeline, assert_clean, background_load, finish_load, metric_sum, recoveries

pytestmark = pytest.mark.kafka


def test_worker_handoff_by_snapshot_under_load(pipe):
    path = pipe.tmp / "assignment.json"
    write_assignment(path, Assignment(1, {0: "pod-a", 1: "pod-a", 2: "pod-a"}, partition_count=3))
    a = pipe.worker(path, state="a", extra=["--pod-name", "pod-a"]).start().wait_ready()
    b = pipe.worker(path, state="b", extra=["--pod-name", "pod-b"]).start().wait_ready()
    t, res = background_load(pipe, 24_000, dup_ratio=0.3, rate=6000, seed=21)
    time.sleep(1.5)  # mid-load
    write_assignment(path, Assignment(2, {0: "pod-a", 1: "pod-b", 2: "pod-b"}, partition_count=3,
                                      handoffs={p: Handoff("pod-a", f"http://127.0.0.1:{a.port}")
                                                for p in (1, 2)}))
    parts = {p: wait_until(lambda p=p: running_at(b, p, 2), what=f"partition {p} at pod-b") for p in (1, 2)}
    for p, part in parts.items():
        mig = part["migration"]
        assert mig["method"] == "snapshot", mig
        assert mig["bytes"] > 0 and len(mig["sha256"]) == 64 and mig["pause_ms"] >= 0
        assert part["recovery"]["recovery"] in ("none", "replay")
    released = a.status()["released"]
    assert set(released) == {"1", "2"} and all(r["bytes"] > 0 for r in released.values())
    # Finalize: the handoffs go away, and so does the served snapshot.
    write_assignment(path, Assignment(3, {0: "pod-a", 1: "pod-b", 2: "pod-b"}, partition_count=3))
    wait_until(lambda: a.status()["generation"] == 3 and not a.status()["released"], what="snapshot cleanup")
    finish_load(t, res)
    pipe.wait_drained()
    assert a.terminate() == 0 and b.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_worker_snapshot_missing_falls_back_to_rebuild(pipe):
    path = pipe.tmp / "assignment.json"
    write_assignment(path, Assignment(1, {0: "pod-a", 1: "pod-a", 2: "pod-a"}, partition_count=3))
    a = pipe.worker(path, state="a", extra=["--pod-name", "pod-a"]).start().wait_ready()
    b = pipe.worker(path, state="b", extra=["--pod-name", "pod-b"],
                    env={"EOPIPE_HANDOFF_TIMEOUT_SECONDS": "5"}).start().wait_ready()
    stats = pipe.load(6000, dup_ratio=0.3, seed=22)
    pipe.wait_drained()
    a.kill()  # the old owner is gone: nobody serves the snapshot
    write_assignment(path, Assignment(2, {0: "pod-b", 1: "pod-b", 2: "pod-b"}, partition_count=3,
                                      handoffs={p: Handoff("pod-a", f"http://127.0.0.1:{a.port}")
                                                for p in range(3)}))
    for p in range(3):
        part = wait_until(lambda p=p: running_at(b, p, 2), what=f"partition {p} at pod-b")
        assert part["migration"]["method"] == "rebuild" and part["recovery"]["recovery"] == "rebuild"
    from tests.helpers.workers import resend_all
    resend_all(pipe)  # every key again: the rebuilt state must know them all
    pipe.wait_drained()
    assert b.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == stats["unique"]


@pytest.fixture
def pipe4(kafka_bootstrap, tmp_path):
    p = Pipeline(kafka_bootstrap, tmp_path, partitions=4)
    yield p
    p.stop_all()


def test_worker_reshard_4_to_8_to_12_with_duplicates_spanning(pipe4):
    """Keys seen before the increase are re-sent to their new home afterwards (resend_all),
    while the load keeps producing by the old count (rerouted): nothing lost, nothing twice."""
    from tests.helpers.workers import resend_all

    pipe = pipe4
    path = pipe.tmp / "assignment.json"
    owners = {0: "pod-a", 1: "pod-a", 2: "pod-b", 3: "pod-b"}
    write_assignment(path, Assignment(1, owners, partition_count=4))
    workers = {n: pipe.worker(path, state=n, extra=["--pod-name", n]).start() for n in ("pod-a", "pod-b")}
    for w in workers.values():
        w.wait_ready()
    t, res = background_load(pipe, 30_000, dup_ratio=0.3, rate=5000, seed=23)
    time.sleep(1.5)
    owners, hist = reshard(pipe, workers, owners, 8, 2, ())
    imported = [w.status()["partitions"][str(p)]["migration"] for p in range(4, 8)
                for w in [workers[owners[p]]]]
    assert all(m["method"] == "reshard-import" for m in imported), imported
    assert sum(m["keys"] for m in imported) > 0
    finish_load(t, res)
    pipe.wait_drained()
    # A volume lost after the re-shard: the rebuild must also find the keys of its partitions
    # that were deduplicated in other partitions before the change (within the window).
    import shutil
    b = workers["pod-b"]
    b.kill()
    shutil.rmtree(b.state_dir)
    b.start().wait_ready(180)
    rebuilt = {d["partition"] for d in recoveries(b) if d["recovery"] == "rebuild"}
    assert rebuilt == set(b.status()["owned"]) and rebuilt & set(range(4, 8))
    # The restarted process counts one rebuild per owned partition, from records it scanned.
    m = b.metrics()
    assert metric_sum(m, "eopipe_dedup_rebuilds_total") == len(b.status()["owned"]), m
    assert metric_sum(m, "eopipe_dedup_replayed_total") > 0 and metric_sum(m, "eopipe_dedup_state_keys") > 0, m
    assert resend_all(pipe) > 0
    pipe.wait_drained()
    owners, hist = reshard(pipe, workers, owners, 12, 4, hist)
    stats2 = pipe.load(4000, dup_ratio=0.3, seed=24)
    resend_all(pipe)
    pipe.wait_drained()
    for w in workers.values():
        assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"] + stats2["unique"]


# == operator level: real control plane, node agent, Kafka, the operator as a process ==========
