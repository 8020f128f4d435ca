"""The node tier end to end: `python -m localenv.node up` (what `make cluster` runs) brings up a
kubelet and containerd in the tier's network namespace; a pod from the image built from the
project's Dockerfile runs there; `down` leaves nothing of the tier on the host."""

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

from localenv import REPO_ROOT
from localenv.node import NETNS, NODE_NAME, POD_CIDR, RUN_DIR
from localenv.node.host import KUBELET_SYSCTLS, shim_sockets

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


def kubectl(*args: str) -> str:
    res = _node("kubectl", *args, timeout=120)
    assert res.returncode == 0, res.stdout
    return res.stdout


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


def _sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text() for k in KUBELET_SYSCTLS}


def _tier():
    before = _sysctls()
    res = _node("up")
    print(res.stdout)
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
    print(wide)
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


def test_down_leaves_nothing_behind(node_tier):
    """Last in the module: cluster-down with a pod still running."""
    res = _node("down", timeout=180)
    assert res.returncode == 0, res.stdout
    left = json.loads(_node("leftovers").stdout)
    assert not any(left.values()), left
    assert not [p for p in node_tier.get("shim_sockets", []) if p.exists()]
    assert _sysctls() == node_tier["sysctls"]  # the host-wide ones the kubelet sets, put back
