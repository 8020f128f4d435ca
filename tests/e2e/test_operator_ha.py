"""Two operator processes with leader election on the real control plane (control/leader.py):
only the Lease holder reconciles; killing it hands over within 30 s; a stolen Lease ends the
leader; a stopped leader hands over at once."""

import time
import urllib.request

import pytest
from confluent_kafka.admin import AdminClient
from kubernetes import client

from localenv.fixtures_operator import OperatorProcess, wait_for
from tests.helpers.pipelines import example_manifest, get_pipeline, kubectl_apply, topic_config, unique_topic

pytestmark = [pytest.mark.k8s]

LEASE = "eopipe-operator"
# Shorter than production (15/10/2 s): the test waits seconds. The ratios are the chart's.
TIMINGS = {"EOPIPE_LEASE_DURATION_SECONDS": "4", "EOPIPE_RENEW_DEADLINE_SECONDS": "3",
           "EOPIPE_RETRY_PERIOD_SECONDS": "0.5"}


@pytest.fixture
def operators(crds, k8s_namespace, tmp_path):
    ops = {}
    for name in ("op-a", "op-b"):
        ops[name] = OperatorProcess(crds, k8s_namespace, tmp_path, name=name, env={
            "EOPIPE_LEADER_ELECTION": "true", "POD_NAME": name, "POD_NAMESPACE": k8s_namespace, **TIMINGS})
    yield ops
    for op in ops.values():
        op.stop(kill=True)


def holder(kube_api, ns: str) -> str | None:
    try:
        return client.CoordinationV1Api(kube_api).read_namespaced_lease(LEASE, ns).spec.holder_identity
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def metrics(op: OperatorProcess) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("eopipe_operator_leader ", "eopipe_operator_reconciles_total{")):
            key = line.split("{")[0].split()[0]
            out[key] = out.get(key, 0.0) + float(line.split()[-1])
    return out


def kopf_serves(op: OperatorProcess) -> bool:
    """Kopf's own /healthz answers (not the one a follower serves while it waits)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{op.health_port}/healthz", timeout=5).read()
    except OSError:
        return False
    return b'"leader": false' not in body


def start_both(ops, kube_api, ns):
    for op in ops.values():
        op.start()
    lead = wait_for(lambda: holder(kube_api, ns), 60, interval=0.2, what="a Lease holder")
    return ops[lead], ops[next(n for n in ops if n != lead)]


@pytest.mark.kafka
def test_only_the_leader_reconciles_and_a_killed_leader_hands_over(operators, running_node_agent, kube_api,
                                                                   kafka_bootstrap, k8s_namespace):
    ns = k8s_namespace
    leader, follower = start_both(operators, kube_api, ns)
    topic = unique_topic("ha", ns)
    doc = example_manifest("minimal.yaml", kafka_bootstrap, **{"source.topic": topic})
    kubectl_apply(leader.cp, ns, doc)
    wait_for(lambda: (get_pipeline(kube_api, ns, "minimal").get("status") or {}).get("observedGeneration") == 1,
             120, what="status written by the leader")
    # Several resyncs (every 3 s) later, the follower has reconciled nothing and does not lead.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        lm, fm = metrics(leader), metrics(follower)
        assert lm["eopipe_operator_leader"] == 1 and fm["eopipe_operator_leader"] == 0, (lm, fm)
        assert fm.get("eopipe_operator_reconciles_total", 0) == 0, fm
        time.sleep(1)
    assert metrics(leader)["eopipe_operator_reconciles_total"] >= 2
    assert "reconciled" not in follower.tail(400)
    # The follower is alive and ready for its probes.
    assert urllib.request.urlopen(f"http://127.0.0.1:{follower.health_port}/healthz", timeout=5).status == 200

    leader.stop(kill=True)
    killed = time.monotonic()
    doc["spec"]["source"]["config"] = {"max.message.bytes": "2000000"}  # a change made after the kill
    kubectl_apply(leader.cp, ns, doc)
    gen = get_pipeline(kube_api, ns, "minimal")["metadata"]["generation"]
    wait_for(lambda: holder(kube_api, ns) == follower.name, 30, interval=0.2, what="the follower holding the Lease")
    took = time.monotonic() - killed

    def reconciled():
        return (get_pipeline(kube_api, ns, "minimal").get("status") or {}).get("observedGeneration") == gen
    wait_for(reconciled, 30 - took, interval=0.5, what="the change reconciled by the new leader")
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(LEASE, ns)
    assert lease.spec.lease_transitions == 1
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert topic_config(admin, topic, "max.message.bytes") == "2000000"
    assert metrics(follower)["eopipe_operator_leader"] == 1
    print(f"handover after SIGKILL: Lease in {took:.1f}s, change reconciled in {time.monotonic() - killed:.1f}s")


def test_a_leader_whose_lease_is_taken_exits(operators, kube_api, k8s_namespace):
    """Another holder in the Lease (here written by hand): the leader ends at once, non-zero,
    rather than reconcile beside it; the follower waits out the intruder's lease."""
    ns = k8s_namespace
    leader, follower = start_both(operators, kube_api, ns)
    coord = client.CoordinationV1Api(kube_api)
    lease = coord.read_namespaced_lease(LEASE, ns)
    lease.spec.holder_identity = "intruder"
    coord.replace_namespaced_lease(LEASE, ns, lease)
    stolen = time.monotonic()
    assert leader.proc.wait(10) == 1
    assert time.monotonic() - stolen < 5  # within the renew period, not the deadline
    assert "leadership lost (the Lease is held by intruder)" in leader.tail(50)
    wait_for(lambda: holder(kube_api, ns) == follower.name, 15, interval=0.2, what="the follower after the intruder")
    assert time.monotonic() - stolen >= 4  # the intruder's lease ran out first


def test_a_stopped_leader_hands_over_at_once(operators, kube_api, k8s_namespace):
    """SIGTERM (a rollout, a drain): Kopf stops, then the Lease is released, and the follower
    leads without waiting out the lease duration."""
    ns = k8s_namespace
    for op in operators.values():  # a lease long enough to tell a release from an expiry
        op.env.update({"EOPIPE_LEASE_DURATION_SECONDS": "15", "EOPIPE_RENEW_DEADLINE_SECONDS": "10"})
    leader, follower = start_both(operators, kube_api, ns)
    wait_for(lambda: "waits for Lease" in follower.tail(50), 30, what="the follower waiting")
    wait_for(lambda: kopf_serves(leader), 30, interval=0.2, what="Kopf running in the leader")
    leader.stop()
    assert leader.proc.returncode == 0
    stopped = time.monotonic()
    wait_for(lambda: holder(kube_api, ns) == follower.name, 20, interval=0.1, what="the follower leading")
    assert time.monotonic() - stopped < 10, "took as long as an expired lease"
    assert "released Lease" in leader.tail(50)
