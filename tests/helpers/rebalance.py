"""Worker-level rebalancing driven as the operator drives it: the assignment file written
atomically, a generation at a time (tests/integration/test_rebalance_workers.py, tests/soak)."""

from __future__ import annotations

import json
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from eopipe.core.assignment import Assignment, Reshard, ReshardEra, grow
from localenv.fixtures_operator import wait_for


def write_assignment(path, a: Assignment) -> None:
    tmp = path.with_suffix(".new")  # replaced atomically, as a ConfigMap volume does
    tmp.write_text(json.dumps(a.to_json()))
    tmp.replace(path)


def wait_until(fn, timeout=90, what="condition", interval=0.3):
    return wait_for(fn, timeout, interval, what)


def running_at(w, p, generation):
    st = w.status()
    part = st["partitions"].get(str(p)) or {}
    return st["generation"] >= generation and part.get("state") == "running" and part


def reshard(pipe, workers, owners_before, new_count, gen, history, rid=None):
    """What the operator does for a partition increase: pause, create, re-shard."""
    path = pipe.tmp / "assignment.json"
    old = pipe.partitions
    write_assignment(path, Assignment(gen, owners_before, partition_count=old, paused=True, reshards=history))
    wait_until(lambda: all(w.status()["paused"] and w.status()["generation"] >= gen for w in workers.values()),
               what="all paused")
    c = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": pipe.group})
    offsets = {tp.partition: max(0, tp.offset) for tp in
               c.committed([TopicPartition(pipe.source, p) for p in range(old)], timeout=30)}
    c.close()
    # The boundaries are exactly where each partition stopped: a paused pod's last commit is
    # visible to other clients (a stale boundary loses keys for a later rebuild).
    stops = sorted((d for w in workers.values() for d in w.logs() if d.get("msg") == "partition stopped"),
                   key=lambda d: d["ts"])  # a partition that moved stopped at each owner: the last counts
    last = {d["partition"]: d for d in stops}
    assert set(range(old)) <= set(last), f"no stop logged for {set(range(old)) - set(last)}"
    for p in range(old):
        if last[p].get("interrupted"):
            # Stopped while recovering (after a stall, say): a commit in flight then may have
            # gone through since, so Kafka's offset can only be at or past the logged one.
            assert offsets[p] >= (last[p]["committed"] or 0), (p, last[p], offsets)
        else:
            assert offsets[p] == last[p]["committed"], (p, last[p], offsets)
    admin = AdminClient({"bootstrap.servers": pipe.bootstrap})
    admin.create_partitions([NewPartitions(pipe.source, new_count)])[pipe.source].result(30)
    pipe.partitions = new_count
    owners = grow(new_count, sorted(workers), owners_before)
    rid = rid or gen + 1
    history = tuple(history) + (ReshardEra(rid, old, new_count, offsets, at=int(time.time() * 1000)),)
    peers = {n: f"http://127.0.0.1:{w.port}" for n, w in workers.items()}
    write_assignment(path, Assignment(gen + 1, owners, partition_count=new_count,
                                      reshard=Reshard(rid, old, new_count, peers),
                                      reshards=history))
    for p, o in owners.items():
        wait_until(lambda p=p, o=o: running_at(workers[o], p, gen + 1), what=f"partition {p} running")
    write_assignment(path, Assignment(gen + 2, owners, partition_count=new_count, reshards=history))
    return owners, history
