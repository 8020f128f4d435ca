"""The node tier end to end: `python -m localenv.node up` (what `make cluster` runs) brings up a
kubelet and containerd in the tier's network namespace; a pod from the image built from the
project's Dockerfile runs there; the operator installed by Helm runs examples/minimal.yaml and
examples/payments.yaml (Spark on pods) exactly once under pod faults, scaling and partition
growth; `down` leaves nothing of the tier on the host."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from localenv import REPO_ROOT
from localenv.node import NETNS, NODE_NAME, POD_CIDR, RUN_DIR
from localenv.node.__main__ import kill_container
from localenv.node.host import KUBELET_SYSCTLS, shim_sockets
from tests.helpers import nodetier
from tests.helpers.nodetier import (
    BOOTSTRAP,
    EOPIPE,
    eopipe,
    helm,
    in_tier,
    kubectl,
    kubectl_json,
    log,
    topics,
    wait,
)

# `make test` and `make test-node` set EOPIPE_NODE_TESTS=1; a bare pytest skips these (a first run
# installs Debian packages and builds the images: minutes). They need root (docs/design.md#the-node-tier).
pytestmark = [pytest.mark.node,
              pytest.mark.skipif(os.environ.get("EOPIPE_NODE_TESTS") != "1",
                                 reason="node tier: run by `make test` / `make test-node` (EOPIPE_NODE_TESTS=1)"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the node tier needs root")]


# The version, then the apiserver through the `kubernetes` Service (kube-proxy's rules).
POD_SCRIPT = ("eopipe --version && python -c \"import socket; "
              "socket.create_connection(('10.0.0.1', 443), 5); print('service ok')\" && exec sleep 3600")


def _node(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localenv.node", *args], check=False, cwd=REPO_ROOT,
                          text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def node_tier():
    # One tier per machine (fixed namespace and paths): a concurrent run waits for this one.
    with open("/run/lock/eopipe-node-tier.lock", "w") as lock:
        deadline = time.monotonic() + 1200
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "another run holds the node tier"
                time.sleep(2)
        if (RUN_DIR / "serve.pid").exists() and (RUN_DIR / "ready").exists():
            pytest.fail("a node tier is already up (make cluster?): `make cluster-down` first")
        yield from _tier()


@pytest.fixture(scope="module", autouse=True)
def _log_to_terminal(pytestconfig):
    """The tier's start, pods, steps and verdicts in the run's own output, passed or not
    (module scope: before the tier starts)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def write(text: str) -> None:
        with capture.global_and_fixture_disabled():
            print(text, flush=True)
    before, nodetier.emit = nodetier.emit, write
    yield
    nodetier.emit = before


def _sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text() for k in KUBELET_SYSCTLS}


def _tier():
    before = _sysctls()
    res = _node("up")
    log(f"make cluster: {res.stdout}")
    assert res.returncode == 0, res.stdout
    yield {**json.loads((RUN_DIR / "images.json").read_text()), "sysctls": before}
    _node("down")


def test_pod_from_the_project_image_runs_on_the_kubelet(node_tier):
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "eopipe-version", "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "eopipe", "image": node_tier["app"], "imagePullPolicy": "Never",
            "command": ["sh", "-c", POD_SCRIPT]}]},
    }
    res = subprocess.run([sys.executable, "-m", "localenv.node", "kubectl", "apply", "-f", "-"], check=False,
                         cwd=REPO_ROOT,
                         input=json.dumps(pod), text=True, capture_output=True)
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 120
    while json.loads(kubectl("get", "pod", "eopipe-version", "-o", "json"))["status"].get("phase") != "Running":
        assert time.monotonic() < deadline, kubectl("describe", "pod", "eopipe-version")
        time.sleep(1)
    wide = kubectl("get", "pods", "-o", "wide")
    log(f"kubectl get pods -o wide\n{wide}")
    row = next(ln.split() for ln in wide.splitlines() if ln.startswith("eopipe-version "))
    header = wide.splitlines()[0].split()
    ip, node = row[header.index("IP")], row[header.index("NODE")]
    assert node == NODE_NAME
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(POD_CIDR), ip
    deadline = time.monotonic() + 30
    while "service ok" not in (logs := kubectl("logs", "eopipe-version")):
        assert time.monotonic() < deadline, logs
        time.sleep(1)
    assert logs.startswith("eopipe "), logs  # eopipe --version ran in the image
    # kube-proxy's rules are in the namespace's tables, none in the host's.
    inside = subprocess.run(["ip", "netns", "exec", NETNS, "iptables-save"], check=False,
                            capture_output=True, text=True).stdout
    assert "KUBE-SERVICES" in inside
    assert json.loads(_node("leftovers").stdout)["iptables"] == []
    # The pod's shim socket: at a fixed host path; the teardown test checks it is gone.
    node_tier["shim_sockets"] = shim_sockets()
    assert node_tier["shim_sockets"], "no shim socket found for the running pod"


def _settled(ns: str, name: str, after: int | None = None) -> dict | None:
    obj = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)
    st = obj.get("status") or {}
    ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
    ok = (ready.get("status") == "True" and st.get("phase") == "Running" and not st.get("rebalance")
          and st.get("observedGeneration") == obj["metadata"]["generation"]
          and (after is None or (st.get("lastRebalance") or {}).get("id", -1) > after))
    return obj if ok else None


def _restarts(ns: str, pod: str) -> int:
    st = kubectl_json("-n", ns, "get", "pod", pod)["status"].get("containerStatuses") or [{}]
    return st[0].get("restartCount", 0)


def _ready_pods(ns: str, name: str) -> int:
    return kubectl_json("-n", ns, "get", "statefulset", f"{name}-dedup")["status"].get("readyReplicas", 0)


def _last_rebalance(ns: str, name: str) -> int:
    st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
    return (st.get("lastRebalance") or {}).get("id", -1)


def _rescale(ns: str, name: str, change: list[str], what: str) -> None:
    before = _last_rebalance(ns, name)
    kubectl("-n", ns, *change)
    t = time.monotonic()
    wait(lambda: _settled(ns, name, before), 300, f"{name} settled after {what}")
    log(f"{what}: settled in {time.monotonic() - t:.0f}s")


def test_pipeline_exactly_once_on_the_kubelet(node_tier):
    """As a user installs and runs it: `helm install` of charts/eopipe with the built image,
    `kubectl apply -f examples/minimal.yaml` unchanged (its Kafka is kafka.kafka.svc), its
    dedup pods on the kubelet with claims from the provisioner. Under duplicated load: a pod
    force-deleted, a container killed under the kubelet, 2 -> 3 -> 2 pods, 4 -> 6 source
    partitions; then `eopipe verify` reads source and output: nothing lost, nothing twice."""
    helm_bin = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "helm"], check=True,
                              capture_output=True, text=True).stdout.split()[-1]
    (repo, tag), (spark_repo, spark_tag) = node_tier["app"].rsplit(":", 1), node_tier["spark"].rsplit(":", 1)
    t = time.monotonic()
    helm(helm_bin, "install", "eopipe", str(REPO_ROOT / "charts" / "eopipe"), "-n", "eopipe-system",
         "--create-namespace", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
         "--set", f"sparkImage.repository={spark_repo}", "--set", f"sparkImage.tag={spark_tag}",
         "--wait", "--timeout", "180s")
    log(f"helm install: operator available in {time.monotonic() - t:.0f}s")
    ns, name = "default", "minimal"
    kubectl("-n", ns, "apply", "-f", str(REPO_ROOT / "examples" / "minimal.yaml"))
    wait(lambda: _settled(ns, name), 180, "the pipeline Ready")
    _rescale(ns, name, ["scale", "exactlyoncepipeline", name, "--replicas=2"], "scale 1 -> 2")

    load = subprocess.Popen(in_tier(EOPIPE, "load", "--bootstrap", BOOTSTRAP, "--topic", "events",
                                    "--count", "60000", "--rate", "1500", "--dup-ratio", "0.3",
                                    "--poison", "20", "--seed", "14", "--quiet", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    kubectl("-n", ns, "delete", "pod", f"{name}-dedup-0", "--grace-period=0", "--force")
    log("deleted pod minimal-dedup-0 (--grace-period=0 --force)")
    time.sleep(4)
    log(f"killed the container of minimal-dedup-1 under the kubelet: {kill_container(ns, f'{name}-dedup-1')[:12]}")
    wait(lambda: _restarts(ns, f"{name}-dedup-1") >= 1 and _ready_pods(ns, name) == 2 and _settled(ns, name),
         240, "both pods back and the pipeline Ready after the pod faults")
    log("both pods back, pipeline Ready")
    _rescale(ns, name, ["scale", "exactlyoncepipeline", name, "--replicas=3"], "scale 2 -> 3")
    _rescale(ns, name, ["scale", "exactlyoncepipeline", name, "--replicas=2"], "scale 3 -> 2")
    _rescale(ns, name, ["patch", "exactlyoncepipeline", name, "--type=merge",
                        "-p", '{"spec": {"source": {"partitions": 6}}}'], "source partitions 4 -> 6")
    out, err = load.communicate(timeout=300)
    assert load.returncode == 0, err
    sent = json.loads(out)
    log(f"load: {sent}")

    log(f"kubectl get pods -A -o wide\n{kubectl('get', 'pods', '-A', '-o', 'wide')}")
    res = eopipe("verify", "--bootstrap", BOOTSTRAP, "--source", "events", "--output", f"{ns}.{name}.deduped",
                 "--dlq", f"{ns}.{name}.dlq", "--json", "--timeout", "400")
    log(f"eopipe verify: {res.stdout}{res.stderr}")
    rep = json.loads(res.stdout)
    assert res.returncode == 0, rep
    assert rep["lost"] == 0 and rep["duplicated"] == 0 and rep["unique_in"] > 40000, rep

    # Deletion: Retain (the default) keeps the topics; Delete removes the ones it created, never
    # the adopted source.
    kubectl("-n", ns, "delete", "exactlyoncepipeline", name, "--timeout=120s")
    assert {"events", f"{ns}.{name}.deduped", f"{ns}.{name}.dlq"} <= topics()
    kubectl("create", "namespace", "team-b")
    doc = yaml.safe_load((REPO_ROOT / "examples" / "minimal.yaml").read_text())
    doc["spec"].update(deletionPolicy="Delete", source={"topic": "events", "partitions": 6})
    kubectl("-n", "team-b", "apply", "-f", "-", input=json.dumps(doc))
    wait(lambda: _settled("team-b", name), 180, "team-b's pipeline Ready")
    assert {f"team-b.{name}.deduped", f"team-b.{name}.dlq"} <= topics()
    kubectl("-n", "team-b", "delete", "exactlyoncepipeline", name, "--timeout=120s")
    left = topics()
    assert "events" in left and not {f"team-b.{name}.deduped", f"team-b.{name}.dlq"} & left, left


def _spark_app(ns: str, name: str) -> dict:
    return kubectl_json("-n", ns, "get", "sparkapplication", name).get("status") or {}


def test_spark_stage_on_pods_exactly_once(node_tier):
    """examples/payments.yaml as written, on the operator installed above: spark-submit (the Spark
    Operator's part) starts the driver pod from the Spark image, the driver its executor pod;
    the checkpoint is on a claim from the provisioner. Under duplicated load the driver pod is
    deleted (resubmitted from its checkpoint, restartPolicy OnFailure) and a dedup pod
    force-deleted; then verify the dedup stage and end to end, source -> Spark's Kafka sink."""
    ns, name = "payments", "payments"
    kubectl("create", "namespace", ns)
    kubectl("-n", ns, "apply", "-f", str(REPO_ROOT / "examples" / "payments.yaml"))
    t = time.monotonic()
    wait(lambda: _settled(ns, name) and _spark_app(ns, f"{name}-spark").get("applicationState", {}).get("state")
         == "RUNNING", 400, "payments Ready with its Spark driver RUNNING")
    log(f"payments Ready, Spark driver RUNNING in {time.monotonic() - t:.0f}s")
    wait(lambda: "Running" in kubectl("-n", ns, "get", "pods", "-l", "spark-role=executor",
                                      "-o", "jsonpath={.items[*].status.phase}"), 180, "a Spark executor pod Running")
    log(f"kubectl get pods,pvc -o wide\n{kubectl('-n', ns, 'get', 'pods,pvc', '-o', 'wide')}")

    load = subprocess.Popen(in_tier(EOPIPE, "load", "--bootstrap", BOOTSTRAP, "--topic", "payments",
                                    "--count", "24000", "--rate", "800", "--dup-ratio", "0.3",
                                    "--poison", "10", "--seed", "15", "--quiet", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(10)
    kubectl("-n", ns, "delete", "pod", f"{name}-spark-driver", "--wait=false")
    log("deleted the Spark driver pod")
    wait(lambda: (st := _spark_app(ns, f"{name}-spark")).get("executionAttempts", 0) >= 2
         and st.get("applicationState", {}).get("state") == "RUNNING", 300, "the driver resubmitted and RUNNING")
    log("driver resubmitted (attempt 2) and RUNNING")
    kubectl("-n", ns, "delete", "pod", f"{name}-dedup-1", "--grace-period=0", "--force")
    log("deleted pod payments-dedup-1 (--grace-period=0 --force)")
    out, err = load.communicate(timeout=300)
    assert load.returncode == 0, err
    log(f"load: {json.loads(out)}")
    log(f"kubectl get pods -o wide\n{kubectl('-n', ns, 'get', 'pods', '-o', 'wide')}")

    common = ["--bootstrap", BOOTSTRAP, "--source", "payments", "--key", "json:id", "--dlq", f"{ns}.{name}.dlq",
              "--json", "--timeout", "400"]
    for what, extra in (("dedup stage", ["--output", f"{ns}.{name}.deduped"]),
                        ("end to end", ["--output", "payments-enriched", "--no-order", "--settle", "30"])):
        res = eopipe("verify", *common, *extra)
        log(f"eopipe verify, {what}: {res.stdout}{res.stderr}")
        rep = json.loads(res.stdout)
        assert res.returncode == 0 and rep["lost"] == 0 and rep["duplicated"] == 0, (what, rep)
        assert rep["unique_in"] > 15000, (what, rep)


def test_down_leaves_nothing_behind(node_tier):
    """Last in the module: cluster-down with a pod still running."""
    res = _node("down", timeout=180)
    assert res.returncode == 0, res.stdout
    left = json.loads(_node("leftovers").stdout)
    assert not any(left.values()), left
    assert not [p for p in node_tier.get("shim_sockets", []) if p.exists()]
    assert _sysctls() == node_tier["sysctls"]  # the host-wide ones the kubelet sets, put back
