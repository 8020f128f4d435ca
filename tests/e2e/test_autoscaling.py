"""The built-in autoscaler (spec.dedup.autoscale, docs/design.md#autoscaling) through the operator:
real control plane, node agent, Kafka, the operator as a process. A burst of load with duplicates
scales the dedup pods 1 -> 3 by live snapshot handoff, its end scales them back to 1 after the
down window, and the run verifies with lost=0 and duplicated=0.
"""

from __future__ import annotations

import pytest

from localenv.fixtures_operator import wait_for
from tests.helpers.pipelines import object_events
from tests.helpers.rebalance_e2e import Load, Pipe, assert_verified

pytestmark = pytest.mark.kafka

AUTOSCALE = {"minReplicas": 1, "maxReplicas": 3, "targetLagPerReplica": 200,
             "targetRecordsPerSecondPerReplica": 300, "scaleUpStabilization": "0s",
             "scaleDownStabilization": "10s", "maxStep": 2}


@pytest.mark.k8s
def test_a_burst_scales_the_dedup_pods_up_and_its_end_down(operator, kube_api, kafka_bootstrap, k8s_namespace):
    p = Pipe(operator, kube_api, kafka_bootstrap, k8s_namespace,
             **{"dedup.replicas": 1, "dedup.autoscale": AUTOSCALE})
    first = p.wait_settled()
    auto = first["status"]["autoscale"]
    assert auto["desiredReplicas"] == 1 and first["status"]["replicas"] == 1, auto

    # 1200 records/s for at most 30 s (stopped once scaled up): four times what one pod is asked
    # to take (300/s), so the autoscaler wants 4, capped at maxReplicas 3 (and at most +2 per step).
    load = Load(kafka_bootstrap, p.topic, 36_000, rate=1200, seed=41)

    # One step or two (1 -> 3, or 1 -> 2 -> 3 when the first sample saw the burst only starting),
    # each a live handoff: every moved partition by snapshot, none rebuilt.
    moves: dict[int, dict] = {}

    def settled_at(replicas):
        def check():
            obj = p.get()
            lr = (obj.get("status") or {}).get("lastRebalance") or {}
            if lr.get("id") is not None and lr.get("finishedAt"):
                moves[lr["id"]] = lr
            obj = p.settled((first["status"].get("lastRebalance") or {}).get("id", -1))
            return obj if obj and (obj["status"].get("lastRebalance") or {}).get("toReplicas") == replicas else None
        return check
    up = wait_for(settled_at(3), 90, interval=1,
                  what=f"scaled up to 3: {(p.get().get('status') or {}).get('autoscale')}")
    assert load.thread.is_alive(), "the scale-up came only after the burst"
    lr = up["status"]["lastRebalance"]
    assert lr["type"] == "replicas" and lr["fromReplicas"] < lr["toReplicas"] == 3, lr
    for m in [*moves.values(), lr]:
        assert m["rebuild"] == 0 and m["snapshot"] == m["partitionsMoved"] > 0, m  # live handoff
    auto = up["status"]["autoscale"]
    # The reason is the last pass's (it may be "Rebalancing", from a pass during the move).
    assert auto["desiredReplicas"] == 3 and auto["reason"], auto
    assert up["spec"]["dedup"]["replicas"] == 1, "the autoscaler must not write the spec"

    stats = load.stop()  # the burst ends once it has done its part

    def scaled_down():
        obj = p.settled(lr["id"])
        return obj if obj and obj["status"]["lastRebalance"]["toReplicas"] == 1 else None
    down = wait_for(scaled_down, 120, interval=1,
                    what=f"scaled down to 1: {(p.get().get('status') or {}).get('autoscale')}")
    lr2 = down["status"]["lastRebalance"]
    assert lr2["fromReplicas"] > lr2["toReplicas"] == 1, lr2
    assert lr2["rebuild"] == 0 and lr2["snapshot"] == lr2["partitionsMoved"] > 0, lr2
    assert down["status"]["autoscale"]["lastScaleTime"] and down["status"]["replicas"] == 1

    p.wait_drained()
    assert_verified(p.verify(), stats["unique"])
    # The health figures the pods report, in status (pod 0 ran throughout: its counts are non-zero).
    health = p.get()["status"]["dedupStats"]
    assert health["stateKeys"] > 0 and health["stateBytes"] > 0, health
    assert health["records"]["consumed"] >= health["records"]["emitted"] > 0, health
    assert set(health["perSecond"]) == {"consumed", "emitted", "duplicates", "deadLettered"}, health
    msgs = [e.message for e in object_events(kube_api, k8s_namespace) if e.reason == "Autoscaled"]
    assert any(m.startswith("dedup replicas ") and " -> 3" in m for m in msgs), msgs
    assert any(m.startswith("dedup replicas ") and " -> 1" in m for m in msgs), msgs
