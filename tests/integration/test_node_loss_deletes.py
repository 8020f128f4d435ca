"""Node loss wired to a real API server and its controllers (control/stage_nodes.py): the facts
read, the deletes made, and the StatefulSet making the pod and its claim again. One pipeline's
StatefulSet (a pod that never runs: no node takes it), a Node that stopped reporting 10 minutes
ago, the pod bound to it, its claim bound to a local PersistentVolume there. No kubelet, no Kafka."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client

from eopipe.control import stage_nodes
from eopipe.control.builders.dedup import STATE_VOLUME
from eopipe.control.kube import Applier
from eopipe.control.observe import Observer
from eopipe.control.passctx import Outcome, Pass, Plane
from eopipe.control.recorder import StatusRecorder
from eopipe.control.settings import Settings
from eopipe.core.names import Names
from tests.helpers.pipelines import example_names


def _node(core: client.CoreV1Api, name: str, status: str, since: datetime) -> None:
    cond = client.V1NodeCondition(type="Ready", status=status, reason="NodeStatusUnknown",
                                  last_heartbeat_time=since, last_transition_time=since)
    core.patch_node_status(name, {"status": {"conditions": [cond.to_dict() | {
        "lastHeartbeatTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ")}]}})


def _wait(what, fn, timeout=30.0):
    end = time.monotonic() + timeout
    while (got := fn()) is None:
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def _pass(api: client.ApiClient, names: Names) -> Pass:
    core, applier = client.CoreV1Api(api), Applier(api)
    plane = Plane(api=api, core=core, applier=applier, observer=Observer(core, applier, 5.0),
                  recorder=StatusRecorder(api), settings=Settings(node_lost_seconds=60), kafka_timeout=5.0)
    return Pass(plane, names, {"metadata": {"namespace": names.namespace, "name": names.pipeline}}, Outcome())


def _statefulset_pod_on(core: client.CoreV1Api, apps: client.AppsV1Api, names: Names, node: str,
                        pin: tuple[str, str] | None = None):
    """The pipeline's dedup StatefulSet of one pod, bound to `node` as the scheduler would, its
    claim bound to a local volume there (named after the node), pinned by the node label `pin`
    (key, value; default its hostname, the node's name). Returns the pod and its claim's name
    and uid."""
    k8s_namespace = names.namespace
    labels = names.labels("dedup")
    apps.create_namespaced_stateful_set(k8s_namespace, {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": names.dedup, "labels": labels},
        "spec": {"replicas": 1, "serviceName": names.dedup, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": names.selector("dedup")},
                 # No scheduler serves this name: the test binds the pod itself, whatever
                 # nodes other tests left on the shared control plane (eopipe-node-0).
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "schedulerName": "eopipe-test-binds-it", "containers": [
                     {"name": "dedup", "image": "eopipe:never-runs",
                      "volumeMounts": [{"name": STATE_VOLUME, "mountPath": "/state"}]}]}},
                 # No class: bound only to the local volume below, never provisioned (the
                 # process tier's node agent, if another test started it, provisions its class).
                 "volumeClaimTemplates": [{"metadata": {"name": STATE_VOLUME}, "spec": {
                     "storageClassName": "", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Mi"}}}}]}})
    key, value = pin or ("kubernetes.io/hostname", node)
    pod_name, claim_name = f"{names.dedup}-0", f"{STATE_VOLUME}-{names.dedup}-0"
    pod = _wait("the StatefulSet's pod", lambda: next(iter(core.list_namespaced_pod(
        k8s_namespace, field_selector=f"metadata.name={pod_name}").items), None))
    # As the scheduler and the volume binder would have done for a local volume: the pod
    # bound to the node, the claim to a volume there.
    core.create_namespaced_pod_binding(pod_name, k8s_namespace, client.V1Binding(
        metadata=client.V1ObjectMeta(name=pod_name),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node)), _preload_content=False)
    claim_uid = core.read_namespaced_persistent_volume_claim(claim_name, k8s_namespace).metadata.uid
    core.create_persistent_volume({
        "metadata": {"name": node}, "spec": {
            "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain", "local": {"path": "/nonexistent"},
            "claimRef": {"namespace": k8s_namespace, "name": claim_name, "uid": claim_uid},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}]}]}}}})
    _wait("the claim bound to the local volume", lambda: core.read_namespaced_persistent_volume_claim(
        claim_name, k8s_namespace).spec.volume_name or None)
    return pod, claim_name, claim_uid


def _remove_node(core: client.CoreV1Api, node: str) -> None:
    """The Node and the local volume named after it (if the test got as far as making it)."""
    core.delete_node(node)
    try:
        core.delete_persistent_volume(node)
    except client.ApiException as e:
        if e.status != 404:
            raise


@pytest.mark.k8s
@pytest.mark.parametrize("pin", ["hostname", "topolvm"])
def test_a_pod_on_a_lost_node_and_its_local_claim_are_replaced(kube_api, k8s_namespace, pin):
    """`pin`: the local volume names its node by the hostname label, which is the Node's name
    (local-path, local PVs), or by TopoLVM's own label, on a Node whose hostname label is not
    its name either (a cloud's short hostname)."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    ex = example_names()
    names = Names(k8s_namespace, ex.pipeline, ex.spec)
    lost = f"eopipe-lost-{uuid.uuid4().hex[:6]}"
    node_labels = {"kubernetes.io/hostname": lost}
    if pin == "topolvm":
        node_labels = {"kubernetes.io/hostname": f"{lost}-short", "topology.topolvm.io/node": f"{lost}-lvm"}
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=lost, labels=node_labels)))
    try:
        _node(core, lost, "Unknown", datetime.now(timezone.utc) - timedelta(minutes=10))
        pod, claim_name, claim_uid = _statefulset_pod_on(
            core, apps, names, lost, ("topology.topolvm.io/node", f"{lost}-lvm") if pin == "topolvm" else None)
        pod_name, labels = pod.metadata.name, names.labels("dedup")
        # A pod of the tenant's with the dedup labels on the same node: not the StatefulSet's.
        core.create_namespaced_pod(k8s_namespace, {
            "metadata": {"name": "decoy", "labels": labels}, "spec": {
                "nodeName": lost, "containers": [{"name": "c", "image": "eopipe:never-runs"}]}})

        # Back Ready: nothing, whatever came before.
        _node(core, lost, "True", datetime.now(timezone.utc) - timedelta(minutes=10))
        p = _pass(kube_api, names)
        assert stage_nodes.run(p) is None and not p.out.events and "lastNodeLoss" not in p.out.fields

        _node(core, lost, "Unknown", datetime.now(timezone.utc) - timedelta(minutes=10))
        p = _pass(kube_api, names)
        assert stage_nodes.leaving(p) == (set(), {pod_name})  # its partitions go to live pods
        condition = stage_nodes.run(p)
        assert (condition.type, condition.status, condition.reason) == ("DedupReady", False, "NodeLost")
        assert [(t, r) for t, r, _ in p.out.events] == [("Warning", "NodeLost")] * 2
        assert f"deleted claim {claim_name} of pod {pod_name}" in p.out.events[0][2]
        assert f"force-deleted pod {pod_name}" in p.out.events[1][2] and lost in p.out.events[1][2]
        record = p.out.fields["lastNodeLoss"]
        assert (record["nodes"], record["pods"], record["claims"]) == ([lost], [pod_name], [claim_name])

        # The StatefulSet makes the claim, then the pod, again (it waits for the old claim to go).
        def replaced():
            pods = {x.metadata.name: x for x in core.list_namespaced_pod(k8s_namespace).items}
            claims = {x.metadata.name: x for x in core.list_namespaced_persistent_volume_claim(k8s_namespace).items}
            new_pod, new_claim = pods.get(pod_name), claims.get(claim_name)
            if new_pod and new_claim and new_pod.metadata.uid != pod.metadata.uid and new_claim.metadata.uid != claim_uid:
                return pods
            return None
        pods = _wait("a new pod and a new claim", replaced)
        assert not pods[pod_name].spec.node_name and "decoy" in pods  # the tenant's pod is not the operator's
        # The replacement is pending and its claim pinned nowhere: nothing more to do.
        p = _pass(kube_api, names)
        assert stage_nodes.run(p) is None and not p.out.events
    finally:
        _remove_node(core, lost)


@pytest.mark.k8s
def test_a_pod_on_a_cordoned_node_is_deleted_gracefully(kube_api, k8s_namespace):
    """The pod a drain waits for (its budget allows no eviction) is the operator's to delete:
    with a grace period, so that it commits and stops as on any stop; its claim is kept until its
    replacement is pending on it."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    ex = example_names()
    names = Names(k8s_namespace, ex.pipeline, ex.spec)
    node = f"eopipe-cordoned-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={"kubernetes.io/hostname": node}),
                                   spec=client.V1NodeSpec(unschedulable=True)))
    try:
        _node(core, node, "True", datetime.now(timezone.utc) - timedelta(minutes=10))
        pod, claim_name, claim_uid = _statefulset_pod_on(core, apps, names, node)
        p = _pass(kube_api, names)
        assert stage_nodes.leaving(p) == ({pod.metadata.name}, set())
        condition = stage_nodes.run(p)
        assert (condition.type, condition.status, condition.reason) == ("DedupReady", False, "NodeDrained")
        (kind, reason, message), = p.out.events
        assert (kind, reason) == ("Warning", "NodeDrained") and f"deleted pod {pod.metadata.name}" in message
        gone = core.read_namespaced_pod(pod.metadata.name, k8s_namespace)  # no kubelet: Terminating
        assert gone.metadata.uid == pod.metadata.uid and gone.metadata.deletion_timestamp is not None
        assert gone.metadata.deletion_grace_period_seconds == pod.spec.termination_grace_period_seconds > 0
        assert core.read_namespaced_persistent_volume_claim(claim_name, k8s_namespace).metadata.uid == claim_uid
    finally:
        _remove_node(core, node)
