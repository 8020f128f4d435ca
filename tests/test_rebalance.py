"""Rebalancing with state migration (DESIGN.md section 4, issue 6), under load with duplicates.

Two layers, each test ending in verify with lost=0 and duplicated=0:
- worker level (real broker, workers as processes, the assignment file written by the test as
  the operator would): handoff by snapshot, rebuild when the old owner is gone, re-shard of
  4 -> 8 -> 12 partitions, and a lost volume after a re-shard (the rebuild must find keys
  deduplicated in other partitions before the change);
- operator level (real control plane, node agent, Kafka, the operator as a process): replicas
  1 -> 3 -> 2 -> 4, partitions 4 -> 8 -> 12, SIGKILL of the old owner mid-handoff and of the
  new owner after ingest, the operator killed mid-rebalance, a decrease refused.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from kubernetes import client
from confluent_kafka.admin import AdminClient, NewPartitions

from eopipe.assignment import Assignment
from tests.localenv.fixtures_operator import wait_for
from tests.test_dedup_worker import (Pipeline, assert_clean, background_load, finish_load,  # noqa: F401
                                     pipe, recoveries)

pytestmark = pytest.mark.kafka


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


def test_worker_handoff_by_snapshot_under_load(pipe):
    path = pipe.tmp / "assignment.json"
    write_assignment(path, Assignment(1, {0: "pod-a", 1: "pod-a", 2: "pod-a"}, partition_count=3))
    a = pipe.worker(path, state="a", extra=["--pod-name", "pod-a"]).start().wait_ready()
    b = pipe.worker(path, state="b", extra=["--pod-name", "pod-b"]).start().wait_ready()
    t, res = background_load(pipe, 24_000, dup_ratio=0.3, rate=6000, seed=21)
    time.sleep(1.5)  # mid-load
    write_assignment(path, Assignment(2, {0: "pod-a", 1: "pod-b", 2: "pod-b"}, partition_count=3,
                                      handoffs={p: {"from": "pod-a", "url": f"http://127.0.0.1:{a.port}"}
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
                                      handoffs={p: {"from": "pod-a", "url": f"http://127.0.0.1:{a.port}"}
                                                for p in range(3)}))
    for p in range(3):
        part = wait_until(lambda p=p: running_at(b, p, 2), what=f"partition {p} at pod-b")
        assert part["migration"]["method"] == "rebuild" and part["recovery"]["recovery"] == "rebuild"
    from tests.test_dedup_worker import resend_all
    resend_all(pipe)  # every key again: the rebuilt state must know them all
    pipe.wait_drained()
    assert b.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == stats["unique"]


def _reshard(pipe, workers, owners_before, new_count, gen, history, rid=None):
    """What the operator does for a partition increase: pause, create, re-shard."""
    path = pipe.tmp / "assignment.json"
    old = pipe.partitions
    write_assignment(path, Assignment(gen, owners_before, partition_count=old, paused=True, reshards=history))
    wait_until(lambda: all(w.status()["paused"] and w.status()["generation"] >= gen for w in workers.values()),
               what="all paused")
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": pipe.group})
    offsets = {str(tp.partition): max(0, tp.offset) for tp in
               c.committed([TopicPartition(pipe.source, p) for p in range(old)], timeout=30)}
    c.close()
    # The boundaries are exactly where each partition stopped: a paused pod's last commit is
    # visible to other clients (a stale boundary loses keys for a later rebuild).
    stopped = {d["partition"]: d["committed"] for w in workers.values() for d in w.logs()
               if d.get("msg") == "partition stopped"}
    assert {int(p): o for p, o in offsets.items()} == {p: stopped[p] for p in range(old)}, stopped
    admin = AdminClient({"bootstrap.servers": pipe.bootstrap})
    admin.create_partitions([NewPartitions(pipe.source, new_count)])[pipe.source].result(30)
    pipe.partitions = new_count
    from eopipe.assignment import grow
    owners = grow(new_count, sorted(workers), owners_before)
    rid = rid or gen + 1
    history = tuple(history) + ({"id": rid, "from": old, "to": new_count, "at": int(time.time() * 1000),
                                 "offsets": offsets},)
    peers = {n: f"http://127.0.0.1:{w.port}" for n, w in workers.items()}
    write_assignment(path, Assignment(gen + 1, owners, partition_count=new_count,
                                      reshard={"id": rid, "from": old, "to": new_count, "peers": peers},
                                      reshards=history))
    for p, o in owners.items():
        wait_until(lambda p=p, o=o: running_at(workers[o], p, gen + 1), what=f"partition {p} running")
    write_assignment(path, Assignment(gen + 2, owners, partition_count=new_count, reshards=history))
    return owners, history


@pytest.fixture
def pipe4(kafka_bootstrap, tmp_path):
    p = Pipeline(kafka_bootstrap, tmp_path, partitions=4)
    yield p
    p.stop_all()


def test_worker_reshard_4_to_8_to_12_with_duplicates_spanning(pipe4):
    """Keys seen before the increase are re-sent to their new home afterwards (resend_all),
    while the load keeps producing by the old count (rerouted): nothing lost, nothing twice."""
    from tests.test_dedup_worker import resend_all

    pipe = pipe4
    path = pipe.tmp / "assignment.json"
    owners = {0: "pod-a", 1: "pod-a", 2: "pod-b", 3: "pod-b"}
    write_assignment(path, Assignment(1, owners, partition_count=4))
    workers = {n: pipe.worker(path, state=n, extra=["--pod-name", n]).start() for n in ("pod-a", "pod-b")}
    for w in workers.values():
        w.wait_ready()
    t, res = background_load(pipe, 30_000, dup_ratio=0.3, rate=5000, seed=23)
    time.sleep(1.5)
    owners, hist = _reshard(pipe, workers, owners, 8, 2, ())
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
    assert resend_all(pipe) > 0
    pipe.wait_drained()
    owners, hist = _reshard(pipe, workers, owners, 12, 4, hist)
    stats2 = pipe.load(4000, dup_ratio=0.3, seed=24)
    resend_all(pipe)
    pipe.wait_drained()
    for w in workers.values():
        assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"] + stats2["unique"]


# == operator level: real control plane, node agent, Kafka, the operator as a process ==========
from tests.test_operator import _apply, _condition, _get, _manifest  # noqa: E402


def resend_all_to(bootstrap: str, topic: str, partitions: int) -> int:
    """Every keyed record of the topic once more, to its home by the CURRENT count."""
    from confluent_kafka import Producer

    from eopipe import partitioner
    from eopipe.verify import TopicReader

    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    seen, n = set(), 0
    for m in TopicReader(bootstrap).read(topic, timeout=120):
        if not m.key() or m.key() in seen:
            continue
        seen.add(m.key())
        prod.produce(topic, m.value(), m.key(), partitioner.murmur2_partition(m.key(), partitions),
                     timestamp=m.timestamp()[1])
        prod.poll(0)
        n += 1
    assert prod.flush(60) == 0
    return n


class Load:
    """run_load in a thread with a rate: continuous load with duplicates."""

    def __init__(self, bootstrap, topic, count, rate, seed):
        from eopipe.loadgen import run_load
        self.result: dict = {}

        def run():
            try:
                self.result.update(run_load(bootstrap, topic, count, dup_ratio=0.3,
                                            wrong_partition_ratio=0.05, rate=rate, seed=seed))
            except BaseException as e:  # noqa: BLE001
                self.result["error"] = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finish(self, timeout=300) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "load did not finish"
        if "error" in self.result:
            raise self.result["error"]
        return self.result


class _Probe(Pipeline):
    """Only Pipeline's read-based drain check, for a pipeline the operator runs."""

    def __init__(self, bootstrap, source, partitions, group):
        self.bootstrap, self.source, self.partitions, self._group = bootstrap, source, partitions, group

    @property
    def group(self) -> str:
        return self._group


class Pipe:
    def __init__(self, operator, kube_api, bootstrap, ns, name="minimal", **spec):
        self.cp, self.kube_api, self.bootstrap, self.ns, self.name = operator.cp, kube_api, bootstrap, ns, name
        self.topic = f"rb-{ns}"
        self.doc = _manifest("minimal.yaml", bootstrap, **{"source.topic": self.topic, **spec})
        _apply(self.cp, ns, self.doc)

    def get(self) -> dict:
        return _get(self.kube_api, self.ns, self.name)

    def set(self, check=True, **spec):
        for path, value in spec.items():
            node = self.doc["spec"]
            *parents, last = path.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        return _apply(self.cp, self.ns, self.doc, check=check)

    def settled(self, last_id=None):
        obj = self.get()
        st = obj.get("status") or {}
        ok = (_condition(obj, "Ready").get("status") == "True" and st.get("phase") == "Running"
              and st.get("observedGeneration") == obj["metadata"]["generation"] and not st.get("rebalance")
              and (last_id is None or (st.get("lastRebalance") or {}).get("id", -1) > last_id))
        return obj if ok else None

    def wait_settled(self, last_id=None, timeout=240):
        return wait_for(lambda: self.settled(last_id), timeout, interval=1,
                        what=f"pipeline settled after rebalance > {last_id}: "
                             f"{json.dumps((self.get().get('status') or {}).get('rebalance'))[:400]}")

    def rebalance(self) -> dict:
        return (self.get().get("status") or {}).get("rebalance") or {}

    def wait_phase(self, phases, timeout=180) -> dict:
        return wait_for(lambda: (rb := self.rebalance()).get("phase") in phases and rb, timeout, interval=0.3,
                        what=f"rebalance phase in {phases}")

    def pod_status(self, pod: str) -> dict | None:
        from kubernetes import client as k
        try:
            ip = k.CoreV1Api(self.kube_api).read_namespaced_pod(pod, self.ns).status.pod_ip
            with urllib.request.urlopen(f"http://{ip}:8080/status", timeout=2) as r:
                return json.loads(r.read())
        except Exception:  # noqa: BLE001
            return None

    def group(self) -> str:
        return f"{self.ns}.{self.name}.dedup"

    def wait_drained(self, timeout=240):
        from confluent_kafka.admin import AdminClient as _A

        n = len(_A({"bootstrap.servers": self.bootstrap}).list_topics(self.topic, timeout=10)
                .topics[self.topic].partitions)
        probe = _Probe(self.bootstrap, self.topic, n, self.group())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if Pipeline.committed_and_drained(probe):
                return
            time.sleep(1)
        raise AssertionError(f"dedup stage did not drain {self.topic} in {timeout}s")

    def verify(self):
        from eopipe.keys import KeySpec
        from eopipe.verify import verify
        rep = verify(self.bootstrap, self.topic, f"{self.topic}.deduped", key_spec=KeySpec(),
                     dlq_topic=f"{self.topic}.dlq", settle=5, timeout=300)
        print(rep.line())
        return rep


def assert_verified(rep, unique: int | None = None):
    assert rep.lost == 0 and rep.duplicated == 0 and rep.unexpected == 0, rep.line()
    if unique is not None:
        assert rep.out == rep.unique_in == unique, rep.line()


def _events(kube_api, ns, name="minimal"):
    from kubernetes import client as k
    return k.CoreV1Api(kube_api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items




@pytest.mark.slow
@pytest.mark.k8s
def test_replicas_1_3_2_4_under_load(operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace, **{"dedup.replicas": 1})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 50_000, rate=500, seed=31)
    time.sleep(2)  # mid-load
    last, summaries = -1, []
    for r in (3, 2, 4):
        p.set(**{"dedup.replicas": r})
        obj = p.wait_settled(last)
        lr = obj["status"]["lastRebalance"]
        summaries.append(lr)
        last = lr["id"]
        assert lr["type"] == "replicas" and (lr["fromReplicas"], lr["toReplicas"]) == ({3: 1, 2: 3, 4: 2}[r], r)
        owners = obj["status"]["assignment"]
        assert sorted(q for pod, ps in owners.items() if pod != "generation" for q in ps) == [0, 1, 2, 3], obj["status"]
        assert set(owners) - {"generation"} == {f"minimal-dedup-{i}" for i in range(min(r, 4))}
    stats = load.finish()
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    assert [s["partitionsMoved"] for s in summaries] == [2, 1, 2]
    assert all(s["snapshot"] == s["partitionsMoved"] and s["bytesMoved"] > 0 for s in summaries), summaries
    reasons = [e.reason for e in _events(kube_api, k8s_namespace)]
    assert "RebalanceStarted" in reasons and "RebalanceCompleted" in reasons
    msgs = [e.message for e in _events(kube_api, k8s_namespace) if e.reason == "RebalanceCompleted"]
    assert any("replicas 3 -> 2: 1 partitions moved (1 by snapshot" in m for m in msgs), msgs


@pytest.mark.k8s
def test_partitions_4_8_12_with_duplicates_spanning_the_change(operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace, **{"dedup.replicas": 2})
    p.wait_settled()
    # The load's producer computed its partitions at the start (4): after the increase its
    # records land in old partitions and are rerouted to their new homes.
    load = Load(kafka_bootstrap, p.topic, 40_000, rate=600, seed=32)
    time.sleep(3)
    last = -1
    for n in (8, 12):
        p.set(**{"source.partitions": n})
        rb = p.wait_phase({"Pausing", "CreatingPartitions", "Resharding", "Finalizing"}, timeout=60)
        assert rb["type"] == "partitions"
        obj = p.wait_settled(last)
        lr = obj["status"]["lastRebalance"]
        last = lr["id"]
        assert (lr["fromPartitions"], lr["toPartitions"]) == (n - 4, n) and lr["keysMoved"] > 0, lr
        assert lr["rebuilt"] == [] and lr["pauseMs"] > 0, lr
        assert obj["status"]["partitions"] == n
        # Duplicates spanning the change: every key seen so far, again, to its NEW home.
        assert resend_all_to(kafka_bootstrap, p.topic, n) > 0
    stats = load.finish()
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    md = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert len(md[p.topic].partitions) == 12 and len(md[f"{p.topic}.deduped"].partitions) == 12
    msgs = [e.message for e in _events(kube_api, k8s_namespace) if e.reason == "RebalanceCompleted"]
    assert any("partitions 4 -> 8" in m and "keys" in m for m in msgs), msgs


@pytest.mark.k8s
def test_old_owner_killed_mid_handoff_and_new_owner_killed_after_ingest(
        operator, kube_api, kafka_bootstrap, k8s_namespace, running_node_agent):
    ns = k8s_namespace
    p = Pipe(operator, kube_api, kafka_bootstrap, ns, **{"dedup.replicas": 1})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 40_000, rate=500, seed=33)
    time.sleep(2)
    p.set(**{"dedup.replicas": 2})
    p.wait_phase({"HandingOff"})
    running_node_agent.kill_pod_process(ns, "minimal-dedup-0")  # the old owner, mid-handoff
    obj = p.wait_settled(-1)
    first = obj["status"]["lastRebalance"]
    assert first["partitionsMoved"] == 2
    # The new owner, right after it installed the snapshot (or its rebuild decision).
    p.set(**{"dedup.replicas": 3})
    p.wait_phase({"HandingOff"})

    def ingested():
        st = p.pod_status("minimal-dedup-2") or {}
        return any((v.get("migration") or {}).get("method") for v in (st.get("partitions") or {}).values())
    wait_for(ingested, 120, interval=0.2, what="minimal-dedup-2 ingested its partition")
    running_node_agent.kill_pod_process(ns, "minimal-dedup-2")
    obj = p.wait_settled(first["id"])
    assert obj["status"]["lastRebalance"]["partitionsMoved"] == 1
    stats = load.finish()
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])


@pytest.mark.k8s
def test_operator_killed_in_the_middle_of_rebalances(operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace, **{"dedup.replicas": 1})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 40_000, rate=500, seed=34)
    time.sleep(2)
    p.set(**{"dedup.replicas": 3})
    rb = p.wait_phase({"HandingOff"})
    operator.stop(kill=True)
    time.sleep(3)
    operator.start()
    obj = p.wait_settled(-1)
    lr = obj["status"]["lastRebalance"]
    # Continued, not started over: the same rebalance (id, start time) finished.
    assert (lr["id"], lr["startedAt"], lr["partitionsMoved"]) == (rb["id"], rb["startedAt"], 2), lr
    p.set(**{"source.partitions": 8})
    rb = p.wait_phase({"Pausing", "CreatingPartitions", "Resharding"}, timeout=60)
    operator.stop(kill=True)
    time.sleep(3)
    operator.start()
    obj = p.wait_settled(lr["id"])
    # The same partition rebalance completed (continued, not started over) and no partition fell
    # back to a rebuild; nothing followed it (no empty "replicas 3 -> 3" clean-up rebalance).
    lr2 = obj["status"]["lastRebalance"]
    assert (lr2["id"], lr2["startedAt"], lr2["type"]) == (rb["id"], rb["startedAt"], "partitions"), lr2
    assert lr2["rebuilt"] == [], lr2
    stats = load.finish()
    resend_all_to(kafka_bootstrap, p.topic, 8)
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    # Still so, many resync passes later.
    assert p.get()["status"]["lastRebalance"] == lr2
    started = [e.message or "" for e in client.CoreV1Api(kube_api).list_namespaced_event(
        k8s_namespace, field_selector=f"involvedObject.name={p.name}").items if e.reason == "RebalanceStarted"]
    assert all(m.startswith((f"rebalance {lr['id']} ", f"rebalance {rb['id']} ")) for m in started), started


@pytest.mark.k8s
def test_partition_decrease_refused_while_the_pipeline_keeps_running(
        operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace, **{"dedup.replicas": 2})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 15_000, rate=1000, seed=35)
    time.sleep(2)
    res = p.set(check=False, **{"source.partitions": 2})
    assert res.returncode != 0 and "may not decrease" in res.stderr, res.stderr
    stats = load.finish()
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    obj = p.get()
    assert obj["status"]["phase"] == "Running" and obj["spec"]["source"]["partitions"] == 4
