"""Driving the node tier from a test as a user drives a cluster: kubectl, helm and eopipe's own
CLI run inside the tier's network namespace (the only place its addresses exist)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from localenv import REPO_ROOT
from localenv.node import NODE_IP, running_nodes
from localenv.node.__main__ import KUBECONFIG, kubectl_argv
from localenv.node.addons import KAFKA_PORT
from localenv.node.host import NETNS_PATH

# Every node-tier test module's marks. `make test` and `make test-node` set EOPIPE_NODE_TESTS=1; a
# bare pytest skips these (a first run installs Debian packages and builds the images: minutes).
# They need root (docs/design.md#the-node-tier). The fixtures are tests/e2e/conftest.py's.
NODE_TESTS = [pytest.mark.node,
              pytest.mark.skipif(os.environ.get("EOPIPE_NODE_TESTS") != "1",
                                 reason="node tier: run by `make test` / `make test-node` (EOPIPE_NODE_TESTS=1)"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the node tier needs root"),
              pytest.mark.usefixtures("node_log_to_terminal", "node_failure_frees_the_node")]

# Where tests (in the namespace, not in a pod) reach the broker; pods use kafka.kafka.svc.
BOOTSTRAP = f"{NODE_IP}:{KAFKA_PORT}"
PY = str(REPO_ROOT / ".venv" / "bin" / "python")
EOPIPE = str(REPO_ROOT / ".venv" / "bin" / "eopipe")


def tag_image(ref: str, new: str) -> None:
    """A second name for an image every node holds (what `docker tag` before a push would give)."""
    for node in running_nodes():
        subprocess.run(["ctr", "--address", str(node.containerd_sock), "-n", "k8s.io", "images", "tag", "--force",
                        ref, new], check=True, capture_output=True)


def import_image(archive: Path) -> None:
    """An image archive built after `up` (the upgrade test's earlier operator) loaded into every
    node, as `kind load image-archive` does."""
    from localenv.node.images import import_images

    with ThreadPoolExecutor() as pool:  # each node's containerd on its own: both cores busy
        list(pool.map(lambda node: import_images(["ctr", "--address", str(node.containerd_sock)], [archive]),
                      running_nodes()))


def shell_env(tools_bin: str) -> dict[str, str]:
    """A user's shell at the repository's root: kubectl and helm on PATH, KUBECONFIG the tier's."""
    return {**os.environ, "KUBECONFIG": str(KUBECONFIG),
            "PATH": os.pathsep.join([str(Path(kubectl_argv()[3]).parent), tools_bin, os.environ["PATH"]])}


def in_tier(*argv: str) -> list[str]:
    return ["nsenter", f"--net={NETNS_PATH}", "--", *argv]


def run(argv: list[str], timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=False, cwd=REPO_ROOT, text=True, input=input, capture_output=True,
                          timeout=timeout)


def kubectl(*args: str, timeout: float = 120, input: str | None = None, check: bool = True) -> str:
    res = run(kubectl_argv(*args), timeout=timeout, input=input)
    assert res.returncode == 0 or not check, f"kubectl {' '.join(args)}: {res.stderr}"
    return res.stdout


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def helm(tools_bin: str, *args: str, timeout: float = 300) -> str:
    res = run(in_tier(f"{tools_bin}/helm", f"--kubeconfig={KUBECONFIG}", *args), timeout=timeout)
    assert res.returncode == 0, f"helm {' '.join(args)}: {res.stdout}{res.stderr}"
    return res.stdout


def eopipe(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The eopipe CLI of this checkout, inside the namespace."""
    return run(in_tier(EOPIPE, *args), timeout=timeout)


def python(code: str, timeout: float = 60) -> str:
    res = run(in_tier(PY, "-c", code), timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout


def topics() -> set[str]:
    out = python("from confluent_kafka.admin import AdminClient\n"
                 f"print('\\n'.join(AdminClient({{'bootstrap.servers': '{BOOTSTRAP}'}})"
                 ".list_topics(timeout=10).topics))")
    return set(out.split())


# Run in a pod by `kubectl exec`: one TCP connection attempt, bounded; prints how it ended.
TCP_PROBE = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except TimeoutError:
    print("timeout")
except OSError as e:
    print(f"refused: {e}")
"""


def tcp_probe(ns: str, pod: str, ip: str, port: int, timeout: float = 2.0) -> str:
    """From inside the pod `ns/pod` (its python): "connected", "timeout" or "refused: ..."."""
    out = kubectl("-n", ns, "exec", pod, "--", "python", "-c", TCP_PROBE, ip, str(port), str(timeout),
                  timeout=timeout + 30)
    return out.strip()


def wait(fn, timeout: float, what: str, interval: float = 1.0, explain=None):
    """fn()'s first truthy result; on timeout an AssertionError, with explain()'s text (the
    state that tells why) when given."""
    deadline = time.monotonic() + timeout
    while True:
        if out := fn():
            return out
        if time.monotonic() > deadline:
            why = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{why}")
        time.sleep(interval)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


emit = _stderr  # the test module points this past pytest's capture: the CI log shows the tier


_T0 = time.monotonic()


def log(msg: str) -> None:
    """Each line with the seconds since the run began: the CI log then says where a test's time went."""
    emit(f"[node tier {time.monotonic() - _T0:6.0f}s] {msg}")


def kubectl_as(user: str, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """kubectl as `user` (the tier's admin impersonates it, as `kubectl --as` does for a cluster's
    admin), e.g. a tenant's ServiceAccount `system:serviceaccount:<ns>:<name>`. The answer whole:
    a refusal is a result here, not a failure."""
    return run(kubectl_argv(f"--as={user}", *args), timeout=timeout, input=input)


# Run in a pod by `kubectl exec`: raw requests to ip:port, one connection each, exactly the bytes
# given (no client library to tidy a request line); prints per request whether it connected and
# everything the server sent back, base64.
HTTP_RAW = """import base64, json, socket, sys, time
ip, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
out = []
for req in json.loads(base64.b64decode(sys.argv[4])):
    try:
        s = socket.create_connection((ip, port), timeout=timeout)
    except OSError as e:
        out.append({"connected": False, "error": str(e)})
        continue
    data, err, deadline = b"", None, time.monotonic() + timeout
    try:
        s.sendall(base64.b64decode(req))
        while len(data) < (1 << 20) and time.monotonic() < deadline:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        err = str(e)
    finally:
        s.close()
    out.append({"connected": True, "error": err, "response": base64.b64encode(data).decode()})
print(json.dumps(out))
"""


def http_raw(ns: str, pod: str, ip: str, port: int, requests: list[bytes], timeout: float = 5.0,
             container: str | None = None) -> list[dict]:
    """From inside the pod `ns/pod` (its python): each request's {"connected", "error",
    "response": bytes}, in order."""
    arg = base64.b64encode(json.dumps([base64.b64encode(r).decode() for r in requests]).encode()).decode()
    out = kubectl("-n", ns, "exec", pod, *(["-c", container] if container else []), "--", "python", "-c",
                  HTTP_RAW, ip, str(port), str(timeout), arg, timeout=timeout * len(requests) + 30)
    res = json.loads(out)
    for r in res:
        if "response" in r:
            r["response"] = base64.b64decode(r["response"])
    return res


def node_argv(*args: str) -> list[str]:
    """`python -m localenv.node ARGS` (what `make cluster` / `make cluster-down` run)."""
    return [sys.executable, "-m", "localenv.node", *args]


def node_cmd(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(node_argv(*args), check=False, cwd=REPO_ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def sysctls() -> dict[str, str]:
    """The host-wide sysctls the kubelet sets (put back by `down`)."""
    from localenv.node.host import KUBELET_SYSCTLS

    return {k: (Path("/proc/sys") / k).read_text() for k in KUBELET_SYSCTLS}
