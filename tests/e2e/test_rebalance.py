"""Rebalancing with state migration through the operator (docs/design.md#rebalancing), under
load with duplicates: real control plane, node agent, Kafka, the operator as a process. Replicas
1 -> 3 -> 2 -> 4 (the 3 -> 2 through the scale subresource), SIGKILL of the old owner mid-handoff
and of the new owner after ingest, the operator killed mid-rebalance. Each test ends in verify
with lost=0 and duplicated=0. A partition decrease is refused at admission, before the operator
sees it (test_operator.py::test_partition_decrease_is_refused_by_the_api_server). Partition
growth under load with duplicates spanning the change is proved by the workers
(tests/integration/test_rebalance_workers.py), the soak, and on the node tier (test_node_tier.py
4 -> 6, the demo 8 -> 12).
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from localenv.fixtures_operator import kubectl, wait_for
from tests.helpers.pipelines import object_events
from tests.helpers.rebalance_e2e import Load, Pipe, assert_verified, resend_all_to

pytestmark = pytest.mark.kafka


@pytest.mark.slow
@pytest.mark.k8s
def test_replicas_1_3_2_4_under_load(operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace, **{"dedup.replicas": 1})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 200_000, rate=500, seed=31)  # until stop()
    time.sleep(2)  # mid-load
    last, summaries = -1, []
    for r in (3, 2, 4):
        if r == 2:  # through the scale subresource, as an HPA or KEDA changes it
            kubectl(p.cp, "scale", "-n", p.ns, "eop/minimal", "--replicas=2")
            p.doc["spec"]["dedup"]["replicas"] = 2
        else:
            p.set(**{"dedup.replicas": r})
        obj = p.wait_settled(last)
        lr = obj["status"]["lastRebalance"]
        summaries.append(lr)
        last = lr["id"]
        assert lr["type"] == "replicas" and (lr["fromReplicas"], lr["toReplicas"]) == ({3: 1, 2: 3, 4: 2}[r], r)
        owners = obj["status"]["assignment"]
        assert sorted(q for pod, ps in owners.items() if pod != "generation" for q in ps) == [0, 1, 2, 3], obj["status"]
        assert set(owners) - {"generation"} == {f"minimal-dedup-{i}" for i in range(min(r, 4))}
        if r == 2:
            scale = json.loads(kubectl(p.cp, "get", "-n", p.ns, "eop/minimal", "--subresource=scale",
                                       "-o", "json").stdout)
            assert (scale["kind"], scale["spec"]["replicas"], scale["status"]["replicas"]) == ("Scale", 2, 2), scale
            pods = client.CoreV1Api(kube_api).list_namespaced_pod(
                p.ns, label_selector=scale["status"]["selector"]).items
            assert sorted(x.metadata.name for x in pods) == ["minimal-dedup-0", "minimal-dedup-1"]
    stats = load.stop()
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    assert [s["partitionsMoved"] for s in summaries] == [2, 1, 2]
    assert all(s["snapshot"] == s["partitionsMoved"] and s["bytesMoved"] > 0 for s in summaries), summaries
    reasons = [e.reason for e in object_events(kube_api, k8s_namespace)]
    assert "RebalanceStarted" in reasons and "RebalanceCompleted" in reasons
    msgs = [e.message for e in object_events(kube_api, k8s_namespace) if e.reason == "RebalanceCompleted"]
    assert any("replicas 3 -> 2: 1 partitions moved (1 by snapshot" in m for m in msgs), msgs


@pytest.mark.k8s
def test_old_owner_killed_mid_handoff_and_new_owner_killed_after_ingest(
        operator, kube_api, kafka_bootstrap, k8s_namespace, running_node_agent):
    ns = k8s_namespace
    p = Pipe(operator, kube_api, kafka_bootstrap, ns, **{"dedup.replicas": 1})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 200_000, rate=500, seed=33)  # until stop()
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
    stats = load.stop()
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])


@pytest.mark.k8s
def test_operator_killed_in_the_middle_of_rebalances(operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace, **{"dedup.replicas": 1})
    p.wait_settled()
    load = Load(kafka_bootstrap, p.topic, 200_000, rate=500, seed=34)  # until stop()
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
    stats = load.stop()
    resend_all_to(kafka_bootstrap, p.topic, 8)
    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    # Still so, many resync passes later.
    assert p.get()["status"]["lastRebalance"] == lr2
    started = [e.message or "" for e in client.CoreV1Api(kube_api).list_namespaced_event(
        k8s_namespace, field_selector=f"involvedObject.name={p.name}").items if e.reason == "RebalanceStarted"]
    assert all(m.startswith((f"rebalance {lr['id']} ", f"rebalance {rb['id']} ")) for m in started), started
