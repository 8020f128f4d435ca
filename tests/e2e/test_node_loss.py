"""A node lost under load, on the node tier's three nodes (docs/design.md#node-loss): the
operator's node-loss path against a real kubelet that stops, a real node controller that marks
it NotReady, a local volume pinned to the lost node, and the lost pod's container running on,
cut off, until its node comes back."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from bench import node_faults
from bench.node_faults_summary import lag, longest_pause, recovered_after, steady_bound
from eopipe.core.names import LABEL_COMPONENT, LABEL_PIPELINE, consumer_group
from localenv import REPO_ROOT
from localenv.node import NODE_NAME, running_nodes
from tests.helpers.nodepipes import (
    delete_spark_pipeline,
    delete_topics,
    driver_says,
    helm_bin,
    install_operator,
    settled,
    start_load,
    verify_both_stages,
)
from tests.helpers.nodestore import delete_object_store, object_store_pod, s3_secret, s3a_checkpoint
from tests.helpers.nodetier import (
    BOOTSTRAP,
    NODE_TESTS,
    PY,
    eopipe,
    helm,
    in_tier,
    kubectl,
    kubectl_json,
    log,
    node_cmd,
    wait,
)

pytestmark = NODE_TESTS

# Kubernetes' non-graceful node shutdown: the admin's word that a node is down.
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
THRESHOLD_SECONDS = 10  # the operator's nodeLoss.thresholdSeconds here (its default is 60)
RATE = 400  # records/s of the load
# A namespace of its own: a pipeline's topics outlive it (deletionPolicy Retain), and another
# test's pipeline of the same name and namespace would find this one's Spark commit markers.
NS, NAME = "node-loss", "payments"


def _dedup_pods(ns: str, name: str) -> dict[str, dict]:
    items = kubectl_json("-n", ns, "get", "pods", "-l", f"{LABEL_PIPELINE}={name},{LABEL_COMPONENT}=dedup")["items"]
    return {p["metadata"]["name"]: p for p in items}


def _node_ready(node: str) -> str:
    return kubectl("get", "node", node, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')


def _tasks(node: str) -> set[str]:
    """The ids of the containers running on the node, by runc's own state (no containerd needed:
    a lost node's containerd is dead, its containers are not)."""
    run_dir = next(n.run_dir for n in running_nodes() if n.name == node)
    out = subprocess.run(["runc", "--root", str(run_dir / "runc" / "k8s.io"), "list", "--format", "json"],
                         check=False, capture_output=True, text=True).stdout
    return {c["id"] for c in json.loads(out or "null") or [] if c["status"] == "running"}


@pytest.fixture
def operator(node_tier):
    """The operator by Helm, kept on node 0 (a lost operator node is another test), its node-loss
    threshold short; after, passed or not, the cluster as this test found it (the pipeline deleted
    first: its finalizer is the operator's; then the release, its namespace and the CRD): the next
    module's first test follows docs/install.md on a fresh cluster."""
    if len(running_nodes()) < 3:
        pytest.skip(f"the node tier runs {len(running_nodes())} node(s) (EOPIPE_NODES): losing one needs three")
    install_operator(node_tier, "--set", f"nodeLoss.thresholdSeconds={THRESHOLD_SECONDS}",
                     "--set", f"nodeSelector.kubernetes\\.io/hostname={NODE_NAME}")
    yield
    if kubectl("-n", NS, "get", "exactlyoncepipeline", NAME, "-o", "name", check=False).strip():
        delete_spark_pipeline(NS, NAME, check=False)
    kubectl("delete", "namespace", NS, "--ignore-not-found", "--timeout=120s")
    helm(helm_bin(), "uninstall", "eopipe", "-n", "eopipe-system", "--wait", "--timeout", "120s")
    kubectl("delete", "namespace", "eopipe-system", "--timeout=120s")
    kubectl("delete", "crd", "exactlyoncepipelines.eopipe.dev", "--timeout=60s")


@pytest.fixture
def store(node_tier):
    """The SeaweedFS pod (on node 0, with the tier's add-ons) for the Spark checkpoint; gone after
    the test, its data with it, before the next module makes its own."""
    yield object_store_pod()
    delete_object_store(until_gone=True)


@pytest.fixture
def cordoned():
    """Names of nodes a test drained: uncordoned after it, passed or not."""
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        kubectl("uncordon", node, check=False)


@pytest.fixture
def lost_nodes():
    """Names of nodes a test lost: brought back after it, passed or not."""
    lost: list[str] = []
    yield lost
    for node in lost:
        if _node_ready(node) != "True":
            res = node_cmd("node-start", node)
            if res.returncode != 0:  # what stopped it, then a power cycle: all of it killed, started again
                spec = next(n for n in running_nodes() if n.name == node)
                tail = (spec.state_dir / "serve.out").read_text(errors="replace").splitlines()[-40:]
                log(f"bringing {node} back: {res.stdout.strip()}\n" + "\n".join(tail))
                node_cmd("node-kill", node)
                res = node_cmd("node-start", node)
            log(f"bringing {node} back: {res.stdout.strip()}")
        kubectl("taint", "node", node, f"{OUT_OF_SERVICE}-", check=False)


def _off_node_0() -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [NODE_NAME]}]}]}}}


def _sampler(ns: str, name: str, src: str, out: Path) -> subprocess.Popen:
    """bench.node_faults' lag sampler in the tier's network: the dedup group's committed offsets
    and the source's ends, read from Kafka. Into files, not pipes: a pipe read only at the end
    fills in about 100 s and stops the sampler, leaving no samples of the drain."""
    with open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:
        return subprocess.Popen(in_tier(PY, "-m", "bench.node_faults", "sample", "--bootstrap", BOOTSTRAP,
                                        "--group", consumer_group(ns, name), "--topic", src),
                                cwd=REPO_ROOT, stdout=stdout, stderr=stderr)


def _timings(samples: list, at: dict[str, float]) -> dict:
    """What bench.node_faults reports, from the test's wall-clock marks and the samples."""
    pause, partition = longest_pause(samples, at["drain"], at["drained"])
    return {"threshold_s": THRESHOLD_SECONDS, "rate": RATE, "samples": len(samples),
            "sample_every_s": (samples[-1][0] - samples[0][0]) / max(1, len(samples) - 1),
            "not_ready_s": at["not_ready"] - at["lost"], "moved_s": at["moved"] - at["lost"],
            "pods_ready_s": at["pods_ready"] - at["lost"],
            "pipeline_ready_s": at["ready"] - at["lost"],
            "full_rate_s": recovered_after(samples, at["lost"], at["load"] + 3),
            "lag_bound": steady_bound(samples, at["lost"], at["load"] + 3), "lag_at_end": lag(samples[-1]),
            "drain_s": at["drain_done"] - at["drain"], "drain_pause_s": pause, "drain_pause_partition": partition,
            "drain_ready_s": at["drained"] - at["drain"]}


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _owned(ns: str, name: str) -> dict[str, list[int]]:
    """The published assignment as status has it: partitions by pod."""
    st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
    return {k: v for k, v in (st.get("assignment") or {}).items() if k != "generation"}


def _condition(ns: str, name: str, type_: str) -> dict:
    st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def _events(ns: str, name: str, reason: str) -> str:
    return kubectl("-n", ns, "get", "events", "--field-selector", f"reason={reason},involvedObject.name={name}",
                   "-o", "jsonpath={range .items[*]}{.message}{'\\n'}{end}")


@pytest.mark.timeout(1500)
def test_a_lost_node_and_a_drain_lose_and_duplicate_nothing(node_tier, operator, store, lost_nodes, cordoned,
                                                              tmp_path):
    """examples/payments.yaml (both stages) on three nodes, its Spark checkpoint on s3a:// in the
    SeaweedFS pod: the operator and the store on node 0 (the control plane's), the dedup and
    Spark pods off it (spec.dedup.podTemplate.affinity, spec.processing.affinity), the dedup pods
    spread by the operator's preferred anti-affinity. Under duplicated load:
    - the node of the Spark driver is lost, with the dedup pod there: its kubelet, containerd and
      kube-proxy killed and its link cut, its pods' containers left running cut off (zombies).
      The node controller marks it NotReady; past the threshold the operator gives the dedup
      pod's partitions to the other pod (rebuilt there from Kafka, the zombie fenced by Kafka)
      and force-deletes the pod and its claim pinned there (NodeLost); the StatefulSet makes both
      again on a live node, and the pod gets partitions back by snapshot once it serves. The
      driver it does not delete: the pipeline says DriverNodeLost, the admin taints the node
      out-of-service (Kubernetes' non-graceful node shutdown), Kubernetes deletes its pods and the
      Spark Operator runs the driver again on the live node, from the checkpoint in the store.
      The node then comes back (the taint removed): its kubelet kills the zombies, which
      changes nothing.
    - scaled to three pods: the third lands on the node that came back.
    - the node of the other two is drained (`kubectl drain`): their budget (maxUnavailable 0)
      holds the evictions while the operator hands their partitions to the third pod by
      snapshot, then deletes them (NodeDrained); their replacements, pending on claims pinned
      there, are deleted with the claims and made again on a node that takes pods, and get
      partitions back by snapshot once they serve. The drain then ends.
    `eopipe verify` of both stages: nothing lost, nothing twice."""
    ns, name, src, sink = NS, NAME, "payments", "payments-enriched"
    kubectl("create", "namespace", ns)
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(s3_secret("payments-s3", name, store)))
    doc = yaml.safe_load((REPO_ROOT / "examples" / "payments.yaml").read_text())
    doc["spec"]["processing"].update(affinity=_off_node_0(), **s3a_checkpoint(f"{ns}/{name}/checkpoint", "payments-s3"))
    doc["spec"]["dedup"]["podTemplate"] = {"affinity": _off_node_0()}
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
    t = time.monotonic()
    wait(lambda: settled(ns, name) and driver_says(ns, f"{name}-spark", "streaming query running"), 400,
         "the pipeline Ready, its streaming query running")
    log(f"{name} Ready, its query running in {time.monotonic() - t:.0f}s\n"
        f"{kubectl('get', 'pods', '-A', '-o', 'wide')}")
    pods = _dedup_pods(ns, name)
    on = {p: pod["spec"]["nodeName"] for p, pod in pods.items()}
    log(f"dedup pods on {len(set(on.values()))} nodes: {on}")
    # Spread by the preferred anti-affinity: nothing else writes a new claim while the scheduler
    # binds it (control/teardown.py), so no retry lands both on one node.
    assert len(set(on.values())) == 2, on
    pdb = kubectl_json("-n", ns, "get", "poddisruptionbudget", f"{name}-dedup")
    assert pdb["spec"]["maxUnavailable"] == 0, pdb["spec"]
    driver = kubectl_json("-n", ns, "get", "pod", f"{name}-spark-driver")
    victim = driver["spec"]["nodeName"]
    gone = next(p for p, node in on.items() if node == victim)  # two nodes off node 0, a dedup pod on each
    other = next(p for p in on if p != gone)
    log(f"the Spark driver and {gone} on {victim}")
    old_uid, old_claim = pods[gone]["metadata"]["uid"], kubectl_json("-n", ns, "get", "pvc", f"state-{gone}")
    zombies = {c["containerID"].removeprefix("containerd://")
               for pod in (pods[gone], driver) for c in pod["status"]["containerStatuses"]}

    poison = eopipe("load", "--bootstrap", BOOTSTRAP, "--topic", src, "--count", "0", "--poison", "10",
                    "--seed", "41", "--quiet", "--json")
    assert poison.returncode == 0, poison.stderr
    sampled = tmp_path / "samples.jsonl"
    sampler = _sampler(ns, name, src, sampled)
    # its first sample: the steady lag before the loss is sampled
    wait(lambda: "\n" in sampled.read_text(), 60, "the sampler's first sample")
    at = {"load": time.time()}  # wall clock: the sampler's clock too
    load = start_load(src, "1000000", str(RATE), "41")
    try:
        time.sleep(10)
        lost_nodes.append(victim)
        at["lost"] = time.time()
        res = node_cmd("node-kill", victim, "--keep-containers")
        assert res.returncode == 0, res.stdout
        t_lost = time.monotonic()
        log(f"{res.stdout.strip()}; {gone} on it")
        wait(lambda: _node_ready(victim) != "True", 120, f"{victim} NotReady")
        at["not_ready"] = time.time()
        log(f"{victim} NotReady {time.monotonic() - t_lost:.0f}s after its loss")
        wait(lambda: not _owned(ns, name).get(gone), 120, f"{gone}'s partitions given to the live pod")
        at["moved"] = time.time()
        log(f"{gone}'s partitions given to the live pod {time.monotonic() - t_lost:.0f}s after the loss: "
            f"{_owned(ns, name)}")

        def replaced() -> bool:
            now = _dedup_pods(ns, name)
            return (gone in now and now[gone]["metadata"]["uid"] != old_uid and _ready(now[gone])
                    and now[gone]["spec"]["nodeName"] != victim)
        wait(replaced, 300, f"{gone} made again on a live node and Ready")
        at["pods_ready"] = time.time()
        log(f"{gone} Ready again {time.monotonic() - t_lost:.0f}s after the loss")

        # The driver is left to the admin: said, then moved by Kubernetes and the Spark Operator
        # once the node is declared down.
        said = wait(lambda: (c := _condition(ns, name, "ProcessingReady")).get("reason") == "DriverNodeLost" and c,
                    120, "ProcessingReady=False/DriverNodeLost")
        log(f"DriverNodeLost {time.monotonic() - t_lost:.0f}s after the loss: {said['message']}")
        assert kubectl_json("-n", ns, "get", "pod", f"{name}-spark-driver")["metadata"]["uid"] == \
            driver["metadata"]["uid"], "the operator deleted the driver"
        kubectl("taint", "node", victim, OUT_OF_SERVICE)
        t = time.monotonic()

        def driver_moved() -> bool:
            pod = json.loads(kubectl("-n", ns, "get", "pod", f"{name}-spark-driver", "-o", "json",
                                     "--ignore-not-found", check=False) or "{}")
            return bool(pod) and pod["metadata"]["uid"] != driver["metadata"]["uid"] \
                and pod["spec"].get("nodeName") not in (None, victim) and pod["status"].get("phase") == "Running"
        wait(driver_moved, 400, "a new Spark driver on a live node", interval=3)
        wait(lambda: driver_says(ns, f"{name}-spark", "streaming query running"), 300,
             "the new driver's streaming query running", interval=3)
        log(f"{victim} tainted out-of-service: a new driver's query running on a live node "
            f"{time.monotonic() - t:.0f}s later")
        wait(lambda: settled(ns, name) and _owned(ns, name).get(gone), 300,
             f"the pipeline Ready after the loss, {gone} owning partitions again")
        at["ready"] = time.time()
        log(f"{name} Ready {time.monotonic() - t_lost:.0f}s after the loss: {_owned(ns, name)}")
        assert kubectl_json("-n", ns, "get", "pvc", f"state-{gone}")["metadata"]["uid"] != old_claim["metadata"]["uid"]
        st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)["status"]
        assert victim in st["lastNodeLoss"]["nodes"] and gone in st["lastNodeLoss"]["pods"], st
        started, events = _events(ns, name, "RebalanceStarted"), _events(ns, name, "NodeLost")
        log(f"RebalanceStarted events:\n{started}NodeLost events:\n{events}")
        assert f"moving the partitions of {gone} off a lost node" in started, started
        assert gone in events and f"state-{gone}" in events, events
        after = {p: pod["metadata"]["uid"] for p, pod in _dedup_pods(ns, name).items()}

        # The node comes back while the load runs (the admin removes the taint): its kubelet finds
        # the zombies' pods gone from the API and kills them; their writes were fenced all along.
        # A zombie may end on its own first, as a real one may (CI saw one gone after five minutes
        # cut off); those still running are the kubelet's to stop.
        log(f"{len(zombies & _tasks(victim))} of the {len(zombies)} zombie containers still run")
        res = node_cmd("node-start", victim)
        assert res.returncode == 0, res.stdout
        wait(lambda: _node_ready(victim) == "True", 120, f"{victim} Ready again")
        kubectl("taint", "node", victim, f"{OUT_OF_SERVICE}-")
        wait(lambda: not zombies & _tasks(victim), 120, "the zombies' containers stopped by its kubelet")
        log(f"{victim} back, its taint removed; its zombies stopped by its kubelet")
        time.sleep(5)
        now = _dedup_pods(ns, name)
        assert {p: pod["metadata"]["uid"] for p, pod in now.items()} == after, "the node's return changed a pod"

        # Three pods: the third on the node that came back, the other two together.
        third = f"{name}-dedup-2"
        kubectl("-n", ns, "patch", "exactlyoncepipeline", name, "--type=merge", "-p",
                json.dumps({"spec": {"dedup": {"replicas": 3}}}))
        wait(lambda: settled(ns, name) and len(_owned(ns, name)) == 3, 300, "three dedup pods, each owning partitions")
        now = _dedup_pods(ns, name)
        drained = now[other]["spec"]["nodeName"]
        moved = sorted(p for p, pod in now.items() if pod["spec"]["nodeName"] == drained)
        log(f"scaled to three: {_owned(ns, name)}; {', '.join(moved)} on {drained}")
        assert moved == sorted([gone, other]) and now[third]["spec"]["nodeName"] == victim, \
            {p: pod["spec"]["nodeName"] for p, pod in now.items()}

        old_claims = {p: kubectl_json("-n", ns, "get", "pvc", f"state-{p}")["metadata"]["uid"] for p in moved}
        cordoned.append(drained)
        t_drain, at["drain"] = time.monotonic(), time.time()
        kubectl("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=400s", timeout=420)
        at["drain_done"] = time.time()
        log(f"kubectl drain {drained} ({', '.join(moved)} on it) done in {time.monotonic() - t_drain:.0f}s")

        # The drain ends once the pods are gone: their replacements may still be coming, and their
        # partitions on their way back.
        def back() -> bool:
            pods, owned = _dedup_pods(ns, name), _owned(ns, name)
            return (len(pods) == 3 and settled(ns, name) and all(owned.get(p) for p in pods)
                    and all(_ready(pod) and pod["spec"].get("nodeName") not in (drained, NODE_NAME)
                            for pod in pods.values()))
        wait(back, 300, f"every dedup pod Ready off {drained} and owning partitions, the pipeline Ready")
        at["drained"] = time.time()
        log(f"{name} Ready {time.monotonic() - t_drain:.0f}s after the drain began: {_owned(ns, name)}")
        for p in moved:
            assert kubectl_json("-n", ns, "get", "pvc", f"state-{p}")["metadata"]["uid"] != old_claims[p], p
        started, events = _events(ns, name, "RebalanceStarted"), _events(ns, name, "NodeDrained")
        # Each rebalance's own account of its handoffs' pauses, beside the sampler's.
        log(f"RebalanceStarted events:\n{started}NodeDrained events:\n{events}"
            f"RebalanceCompleted events:\n{_events(ns, name, 'RebalanceCompleted')}")
        assert f"moving the partitions of {', '.join(moved)} off a cordoned node" in started, started
        assert all(f"deleted pod {p}: node {drained} is cordoned" in events and f"state-{p}" in events
                   for p in moved), events
        time.sleep(5)
    finally:
        load.terminate()
        out, err = load.communicate(timeout=300)
        sampler.terminate()
        sampler.wait(60)
    assert load.returncode == 0, err
    sent = json.loads(out)
    log(f"load: {sent}")
    samples = [json.loads(line) for line in sampled.read_text().splitlines()]
    assert samples, sampled.with_suffix(".err").read_text()
    timings = _timings(samples, at)
    # Measured, not asserted: the verdict is the verify's (bench.node_faults shows a None as FAILED).
    log(f"timings (bench.node_faults):\n{node_faults.table(timings)}")
    # Ready again within a bound, not at one instant: a CI rehearsal (81511b5) found it not Ready
    # here, after it had settled, and the reason was not kept: the message now carries the status.
    def status() -> str:
        st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
        return json.dumps({k: st.get(k) for k in ("phase", "conditions", "rebalance")})
    wait(lambda: settled(ns, name), 300, "the pipeline Ready at the end", explain=status)
    rep = verify_both_stages(ns, name, src, sink)["dedup stage"]
    assert rep["unique_in"] == sent["unique"] and rep["malformed_in"] == rep["dead_lettered"] == 10, rep
    if os.environ.get(node_faults.OUT_ENV):  # bench.node_faults' numbers: only from a verified run
        Path(os.environ[node_faults.OUT_ENV]).write_text(json.dumps(timings))
    delete_spark_pipeline(ns, name)
    delete_topics(ns, name, src, sink)
