"""The dedup worker against the real broker, run as real processes, under faults.

Every fault test ends with `verify` (which reads the topics, never the worker's metrics):
lost == 0 and duplicated == 0. Workers are subprocesses, so SIGKILL is a real SIGKILL.
"""

from __future__ import annotations

import json
import random
import time
import uuid

import pytest
import yaml
from confluent_kafka import Consumer
from kubernetes.config import new_client_from_config

from eopipe.control.builders import dedup as dedup_builders
from eopipe.control.kube import Applier
from eopipe.core.assignment import Assignment
from eopipe.core.keys import KeySpec
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from eopipe.tools.verify import TopicReader, verify
from tests.helpers.rebalance_e2e import Load
from tests.helpers.workers import (REPO, assert_clean, background_load, finish_load, metric_sum, open_transaction,
                                   recoveries, resend_all)

pytestmark = pytest.mark.kafka


def test_dedup_reroute_dlq_metrics_and_clean_shutdown(pipe):
    w = pipe.worker([0, 1, 2]).start().wait_ready()
    stats = pipe.load(6000, dup_ratio=0.3, wrong_partition_ratio=0.1, poison=25, seed=1)
    pipe.wait_drained()
    m = w.metrics()
    st = w.status()
    assert st["ready"] and all(v["state"] == "running" for v in st["partitions"].values())
    assert w.terminate() == 0, w.tail()
    rep = pipe.verify()
    assert_clean(rep, poison=25)
    assert rep.unique_in == stats["unique"] and rep.out == stats["unique"]
    assert rep.aborted_reads == 0
    # The worker's own counters agree with the topics (they are not what the test trusts).
    assert metric_sum(m, "eopipe_dedup_emitted_total") == stats["unique"]
    assert metric_sum(m, "eopipe_dedup_dead_lettered_total") == 25
    assert metric_sum(m, "eopipe_dedup_rerouted_total") >= stats["wrong_partition"] * 0.5
    assert metric_sum(m, "eopipe_dedup_duplicates_total") == (
        metric_sum(m, "eopipe_dedup_consumed_total") - stats["unique"] - 25
        - metric_sum(m, "eopipe_dedup_rerouted_total"))
    assert metric_sum(m, "eopipe_dedup_effective_window_seconds") == 3 * 3600
    assert metric_sum(m, "eopipe_dedup_commit_seconds_count") > 0
    # Dead letters carry the reason and where they came from.
    c = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([pipe.dlq])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 25 and time.monotonic() < deadline:
        got += [m for m in c.consume(100, 0.5) if m.error() is None]
    c.close()
    assert len(got) == 25
    h = dict(got[0].headers())
    assert h["eopipe.origin.topic"] == pipe.source.encode()
    assert int(h["eopipe.origin.offset"]) >= 0 and b"key" in h["eopipe.dlq.reason"]
    # The reroute mark is internal: rerouted records reach the output without it.
    marked = [m for m in TopicReader(pipe.bootstrap).read(pipe.output, timeout=60)
              if any(k == "eopipe.rerouted.from" for k, _ in m.headers() or ())]
    assert not marked, f"{len(marked)} output records carry the internal reroute header"


def test_output_keeps_the_source_partition_whatever_the_record_key(pipe):
    """Dedup by a JSON field while record keys say something else (an account): each record
    reaches the output partition it was deduplicated in, its home by the field, never the one
    the producer's partitioner would pick from the record key."""
    from confluent_kafka import Producer

    from eopipe.core.partitioner import murmur2_partition

    w = pipe.worker([0, 1, 2], extra=["--key", "json:id"]).start().wait_ready()
    prod = Producer({"bootstrap.servers": pipe.bootstrap})
    ids = [f"pay-{i}" for i in range(300)]
    for i, id_ in enumerate(ids):
        prod.produce(pipe.source, json.dumps({"id": id_}).encode(), f"account-{i % 7}".encode(),
                     murmur2_partition(id_.encode(), 3))
    assert prod.flush(30) == 0
    pipe.wait_drained()
    assert w.terminate() == 0
    out = {json.loads(m.value())["id"]: m.partition() for m in TopicReader(pipe.bootstrap).read(pipe.output, timeout=60)}
    assert sorted(out) == sorted(ids)
    misplaced = {i: p for i, p in out.items() if p != murmur2_partition(i.encode(), 3)}
    assert not misplaced, f"{len(misplaced)} records not in their home partition, e.g. {list(misplaced.items())[:3]}"


def test_a_json_id_without_a_utf8_form_is_dead_lettered_not_a_crash_loop(pipe):
    """`"\\ud800"` is valid JSON syntax but a lone surrogate, which has no UTF-8 form: the
    worker once failed its partition on it, restarted, read it again, and so on forever."""
    from confluent_kafka import Producer

    w = pipe.worker([0, 1, 2], extra=["--key", "json:id"]).start().wait_ready()
    prod = Producer({"bootstrap.servers": pipe.bootstrap})
    for i in range(30):
        prod.produce(pipe.source, json.dumps({"id": f"ok-{i}"}).encode(), partition=i % 3)
    for p in range(3):
        prod.produce(pipe.source, b'{"id": "\\ud800", "n": 1}', partition=p)
    assert prod.flush(30) == 0
    pipe.wait_drained()
    assert w.terminate() == 0, w.tail()
    assert not [d for d in w.logs() if d.get("msg") == "partition failed"]
    rep = verify(pipe.bootstrap, pipe.source, pipe.output, key_spec=KeySpec.parse("json:id"),
                 dlq_topic=pipe.dlq, settle=5)
    assert_clean(rep, poison=3)
    assert rep.out == 30
    dead = list(TopicReader(pipe.bootstrap).read(pipe.dlq, timeout=60))
    assert len(dead) == 3 and all(b"not valid Unicode" in dict(m.headers())["eopipe.dlq.reason"] for m in dead)


def test_a_record_too_large_to_send_is_dead_lettered_by_reference_not_retried_forever(pipe):
    """The source takes 1.5 MB records, the worker's producer at most librdkafka's 1,000,000
    bytes: such a record went back to the committed offset and failed again, forever, and held
    its partition. Now a reference to it goes to the DLQ, and verify finds its key there."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    from eopipe.core.partitioner import murmur2_partition

    admin = AdminClient({"bootstrap.servers": pipe.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, pipe.source, incremental_configs=[
        ConfigEntry("max.message.bytes", "3000000", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    w = pipe.worker([0, 1, 2]).start().wait_ready()
    prod = Producer({"bootstrap.servers": pipe.bootstrap, "message.max.bytes": 3_000_000})
    big = json.dumps({"id": "big", "pad": "x" * 1_500_000}).encode()
    home = murmur2_partition(b"big", 3)  # its own partition: on the output's path, not a reroute
    for i in range(60):
        if i in (20, 40):  # the big record and its resend
            prod.produce(pipe.source, big, b"big", partition=home)
        prod.produce(pipe.source, json.dumps({"id": f"r{i}"}).encode(), f"r{i}".encode(), partition=0)
    assert prod.flush(30) == 0
    pipe.wait_drained(timeout=60)
    assert w.terminate() == 0, w.tail()
    rep = pipe.verify()
    assert (rep.lost, rep.duplicated, rep.too_large, rep.dead_lettered, rep.out) == (0, 0, 1, 1, 60), rep.line()
    assert rep.ok, rep.line()
    [ref] = TopicReader(pipe.bootstrap).read(pipe.dlq, timeout=60)
    h = dict(ref.headers())
    assert ref.value() is None and ref.key() == b"big"
    assert b"too large" in h["eopipe.dlq.reason"] and h["eopipe.origin.partition"] == str(home).encode()


def test_crash_between_kafka_commit_and_rocksdb_write(pipe):
    """The test hook exits right after commit_transaction, before the RocksDB write: the
    restart must replay [applied, committed) into the state or it would re-emit."""
    w = pipe.worker([0, 1, 2])
    # The load lasts until the faults have fired: each crash needs commits after a restart.
    load = Load(pipe.bootstrap, pipe.source, 1_000_000, rate=6000, seed=3)
    for nth in (3, 7, 2):
        w.start(env={"EOPIPE_FAULT": f"crash_after_commit:{nth}"})
        assert w.wait_exit(120) == 137, w.tail()
        assert any(d.get("msg", "").startswith("fault injected") for d in w.logs())
    w.start().wait_ready()
    # Every restart after a crash found the store behind Kafka and replayed the gap.
    rec = recoveries(w)
    replays = sum(1 for d in rec if d["recovery"] == "replay" and d["replayed"] > 0)
    assert replays >= 3, rec
    res = load.stop()
    resend_all(pipe)
    pipe.wait_drained()
    assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_two_workers_for_the_same_partitions_older_is_fenced(pipe):
    a = pipe.worker([0, 1, 2], state="a").start().wait_ready()
    t, res = background_load(pipe, 40_000, dup_ratio=0.3, rate=8000, seed=6)
    time.sleep(1.5)  # let A be mid-stream (not an assertion: the test checks A got fenced)
    b = pipe.worker([0, 1, 2], state="b").start().wait_ready()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = a.status()["partitions"]
        if all(v["state"] == "fenced" for v in parts.values()):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"A was not fenced: {a.status()}")
    assert a.get("/readyz")[0] == 503
    assert a.running  # a fenced partition stops; the process stays to report it
    finish_load(t, res)
    pipe.wait_drained()
    assert b.terminate() == 0
    assert a.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_broker_restart_during_load(pipe, kafka):
    w = pipe.worker([0, 1, 2]).start().wait_ready()
    t, res = background_load(pipe, 30_000, dup_ratio=0.25, rate=5000, seed=7)
    time.sleep(2)  # mid-load (the load thread keeps producing through the restart)
    kafka.restart(kill=True, down_seconds=3)
    finish_load(t, res)
    pipe.wait_drained(timeout=300)
    assert w.running, w.tail()
    assert w.terminate() == 0
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


@pytest.mark.slow
def test_sigkill_mid_transaction_repeatedly_100k(pipe):
    """Kafka's transactions system test, shape-wise: >= 100,000 records with duplicates
    copied while workers are SIGKILLed again and again."""
    pipe2 = pipe
    ws = [pipe2.worker([0, 1], state="a"), pipe2.worker([2], state="b")]
    for w in ws:
        w.start()
    for w in ws:
        w.wait_ready()
    rng = random.Random(8)
    # At least 4 kills while records flow, whatever the machine's speed (on a busy machine a
    # restart can outlast a whole load: then another load follows); that they hit open
    # transactions is asserted below (aborted reads), not assumed from timing.
    kills, loads = 0, []
    while kills < 4:
        t, res = background_load(pipe2, 120_000 if not loads else 20_000, dup_ratio=0.25, rate=8_000,
                                 seed=8 + len(loads))
        loads.append(res)
        while t.is_alive() and kills < 6:
            time.sleep(rng.uniform(0.5, 2.0))  # pacing between kills, not an assertion
            if not t.is_alive():
                break
            w = rng.choice(ws)
            # Inside one of its open transactions: a busy machine's restarted worker may not have
            # begun one yet 2 s after it is ready.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not open_transaction(pipe2.bootstrap, pipe2.output, w.partitions):
                time.sleep(0.05)
            w.kill()
            kills += 1
            w.start().wait_ready()
        finish_load(t, res)
    pipe2.wait_drained(timeout=300)
    for w in ws:
        assert w.terminate() == 0
    rep = pipe2.verify()
    assert_clean(rep)
    unique = sum(r["unique"] for r in loads)
    assert rep.unique_in == unique and rep.out == unique
    assert sum(r["records"] for r in loads) >= 100_000
    # The kills really hit open transactions: their records were aborted, not delivered.
    assert rep.aborted_reads > 0, rep.line()


@pytest.mark.k8s
def test_assignment_configmap_watched_with_the_pods_own_rbac(pipe, control_plane, kube_api, k8s_namespace):
    """A new generation reaches the worker through its watch on the ConfigMap while the mounted
    file is still old (a real kubelet refreshes it only every minute or so), using the token of
    the ServiceAccount the operator gives dedup pods; partition 2 then moves under load."""
    from kubernetes import client

    names = Names(k8s_namespace, pipe.name, PipelineSpec.model_validate(
        yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())["spec"]))
    applier = Applier(kube_api)
    for manifest in dedup_builders.rbac(names):
        applier.apply(manifest)
    gen1 = Assignment(1, {0: "pod-a", 1: "pod-a", 2: "pod-a"})
    applier.apply(dedup_builders.assignment_configmap(names, gen1))
    token = client.CoreV1Api(kube_api).create_namespaced_service_account_token(
        names.dedup, k8s_namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))).status.token
    kubeconfig = pipe.tmp / "dedup-pod.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "c", "cluster": {"server": control_plane.server,
                                               "certificate-authority": str(control_plane.ca_cert)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "sa"}}]}))
    # The Role grants that one ConfigMap and nothing else.
    as_pod = client.CoreV1Api(new_client_from_config(config_file=str(kubeconfig)))
    as_pod.read_namespaced_config_map(names.assignment_configmap, k8s_namespace)
    for forbidden in (lambda: as_pod.list_namespaced_config_map(k8s_namespace),
                      lambda: as_pod.read_namespaced_config_map("kube-root-ca.crt", k8s_namespace)):
        with pytest.raises(client.ApiException) as e:
            forbidden()
        assert e.value.status == 403

    pipe.namespace = k8s_namespace
    path = pipe.tmp / "assignment.json"
    path.write_text(json.dumps(gen1.to_json()))
    watch = ["--assignment-configmap", names.assignment_configmap]
    env = {"KUBECONFIG": str(kubeconfig)}
    a = pipe.worker(path, state="a", env=env, extra=["--pod-name", "pod-a", *watch]).start().wait_ready()
    b = pipe.worker(path, state="b", env=env, extra=["--pod-name", "pod-b", *watch]).start().wait_ready()
    t, res = background_load(pipe, 20_000, dup_ratio=0.3, rate=8000, seed=19)
    time.sleep(1)  # mid-load
    applier.apply(dedup_builders.assignment_configmap(
        names, Assignment(2, {0: "pod-a", 1: "pod-a", 2: "pod-b"})))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sa, sb = a.status(), b.status()
        if (sa["generation"], sb["generation"]) == (2, 2) and sa["ready"] and sb["ready"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"the ConfigMap's generation 2 was not followed: {a.status()} {b.status()}")
    assert json.loads(path.read_text())["generation"] == 1  # the file never changed
    assert sa["owned"] == [0, 1] and sb["owned"] == [2]
    finish_load(t, res)
    pipe.wait_drained()
    assert a.terminate() == 0 and b.terminate() == 0
    assert not [d for d in a.logs() + b.logs() if "cannot watch" in d.get("msg", "")]
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]


def test_assignment_file_moves_a_partition_between_workers(pipe):
    """The operator's assignment (a mounted file) is re-read on change: partition 2 moves
    from pod-a to pod-b under load; pod-b has no state for it and rebuilds from the source."""
    path = pipe.tmp / "assignment.json"
    path.write_text(json.dumps({"generation": 1, "assignments": {"pod-a": [0, 1, 2]}}))
    a = pipe.worker(path, state="a", extra=["--pod-name", "pod-a"]).start().wait_ready()
    b = pipe.worker(path, state="b", extra=["--pod-name", "pod-b"]).start().wait_ready()
    assert b.status()["owned"] == [] and b.get("/readyz")[0] == 200
    t, res = background_load(pipe, 20_000, dup_ratio=0.3, rate=8000, seed=9)
    time.sleep(1)  # mid-load
    tmp = path.with_suffix(".new")  # replaced atomically, as a ConfigMap volume does
    tmp.write_text(json.dumps({"generation": 2, "assignments": {"pod-a": [0, 1], "pod-b": [2]}}))
    tmp.replace(path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sa, sb = a.status(), b.status()
        if (sa["generation"], sb["generation"]) == (2, 2) and sb["ready"] and sa["ready"] \
                and "2" not in sa["partitions"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"assignment not followed: {a.status()} {b.status()}")
    assert sb["owned"] == [2] and sa["owned"] == [0, 1]
    finish_load(t, res)
    pipe.wait_drained()
    assert a.terminate() == 0 and b.terminate() == 0
    assert any(d["partition"] == 2 and d["recovery"] == "rebuild" for d in recoveries(b))
    rep = pipe.verify()
    assert_clean(rep)
    assert rep.out == res["unique"]
