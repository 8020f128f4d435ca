"""The node tier's processes, run by `python -m localenv.node serve` inside node 0's network
namespace: the control plane of localenv/controlplane.py (listening on the namespace's
addresses), node 0's containerd, kubelet and kube-proxy (localenv/node/kubelet.py), the other
nodes' serve-node launched, and a Kafka broker on the node address (as a
Kafka outside the cluster: pods reach it through the `kafka.kafka` Service). It applies the
add-ons (localenv/node/addons.py) and the Kubeflow Spark Operator (helm install of its own chart,
localenv/node/sparkoperator.py), writes RUN_DIR/ready once every node is Ready, kube-proxy
healthy, the add-ons available and NetworkPolicy enforced on each node (kube-network-policies' nftables rules
in place; or, on a kernel without nftables' queue statement, why not: RUN_DIR/networkpolicy.json),
and stops everything on SIGTERM (`down` sweeps the rest)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from localenv.controlplane import ControlPlane, ControlPlaneError
from localenv.kafka import KafkaBroker
from localenv.node import (
    NETPOL_STATUS,
    NODE_IP,
    POD_CIDR,
    RUN_DIR,
    STATE_DIR,
    NodeSpec,
    addons,
    kubelet,
    node_specs,
    sparkoperator,
)
from localenv.node import config as cfg
from localenv.node.kubelet import CP_DIR, NodeProcesses, Processes

# Written by `up` (localenv/node/__main__.py): {"helm": path, "chart": path, "webhook": bool}.
SPARK_OPERATOR_CONF = RUN_DIR / "spark-operator.json"
READY = RUN_DIR / "ready"
NETPOL_TABLE = ("inet", addons.NETPOL)  # the agent's nftables table (its default name)
# What the agent's rules need of the kernel beyond plain nftables: the `queue` statement (its
# rule `ip daddr @podips-v4 queue to 98`), here in a throwaway table. `nft --check` has the kernel
# validate the batch and apply none of it.
QUEUE_PROBE = f"""table inet eopipe-queue-probe {{
  chain postrouting {{ type filter hook postrouting priority srcnat - 5;
    ip daddr {POD_CIDR} queue num {addons.NETPOL_QUEUE}; }}
}}
"""


def _kernel_config(*names: str) -> dict[str, str]:
    """The kernel's build settings (/proc/config.gz, when it has one): name -> y/m/'not set'."""
    try:
        lines = gzip.decompress(Path("/proc/config.gz").read_bytes()).decode().splitlines()
    except OSError:
        return {}
    out = {}
    for ln in lines:
        for n in names:
            if ln.startswith(f"{n}="):
                out[n] = ln.split("=", 1)[1]
            elif ln == f"# {n} is not set":
                out[n] = "not set"
    return out


def nft_queue_problem() -> str | None:
    """None when this kernel takes nftables' queue statement; else exactly why not (it is what
    kube-network-policies passes packets to itself with; nothing else can stand in for it)."""
    res = subprocess.run(["nft", "--check", "-f", "-"], input=QUEUE_PROBE, text=True, capture_output=True,
                         check=False)
    if res.returncode == 0:
        return None
    err = " ".join(ln.strip() for ln in res.stderr.splitlines() if "Error" in ln) or res.stderr.strip()
    conf = _kernel_config("CONFIG_NFT_QUEUE", "CONFIG_NETFILTER_NETLINK_QUEUE", "CONFIG_MODULES")
    why = ", ".join(f"{k}={v}" for k, v in conf.items()) or "no /proc/config.gz to say why"
    return (f"kernel {os.uname().release} refuses nftables' queue statement, which kube-network-policies' "
            f"rules use to hand it each new connection of a pod a NetworkPolicy selects: "
            f"`nft --check` of `queue num {addons.NETPOL_QUEUE}`: {err} ({why}); the agent runs but "
            f"cannot install its table, so NetworkPolicy is NOT enforced on this node")


def nft_table_present(netns: str | None = None) -> bool:
    """The agent's table in this namespace (or in the named one)."""
    where = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*where, "nft", "list", "table", *NETPOL_TABLE], capture_output=True,
                          check=False).returncode == 0


class NodeControlPlane(ControlPlane):
    extra_san_ips = (NODE_IP,)  # the other nodes' kubelets and kube-proxies reach it there

    def _apiserver_argv(self) -> list[str]:
        return cfg.apiserver_argv(super()._apiserver_argv(), NODE_IP, self.pki)


class Node(Processes):
    """Node 0: the control plane, its own kubelet, the broker, the add-ons; and the launch of
    the other nodes (`others`), each its own serve-node in its own namespace."""

    def __init__(self, images: dict[str, str], archives: list[Path], others: list[NodeSpec], images_file: Path):
        super().__init__(STATE_DIR / "logs")
        self.images, self.archives, self.others, self.images_file = images, archives, others, images_file
        self.kafka: KafkaBroker | None = None
        self.cp = NodeControlPlane(CP_DIR)
        self.kube_bin = self.cp.binaries["kube-apiserver"].parent

    def kubectl(self, *args: str) -> subprocess.CompletedProcess:
        return self.cp.kubectl_run(*args, check=False)

    def start(self) -> None:
        t0 = time.monotonic()
        self.cp.start()
        self.timings["control plane"] = time.monotonic() - t0
        first = node_specs(1)[0]
        kubelet.identities(self.cp.pki, first, self.cp.server)
        for spec in self.others:  # their images import while this node's do; they reach the
            # apiserver at node 0's address
            kubelet.identities(self.cp.pki, spec, f"https://{NODE_IP}:{self.cp.port}")
            kubelet.launch(spec, self.images_file, self.archives, self.kube_bin)
        own = NodeProcesses(first, self.kube_bin, self.cp.pki, self.images)
        own.procs = self.procs  # one list: a start that fails names whichever process exited
        own.start_runtime(self.archives)
        own.start_kubelet()
        self.timings.update(own.timings)

        t = time.monotonic()
        for spec in self.others:
            self.wait(f"node {spec.name} (its log: {spec.state_dir / 'serve.out'})",
                      lambda spec=spec: (spec.run_dir / "ready").exists(), 600)
        if self.others:
            self.timings["other nodes Ready"] = time.monotonic() - t

        t = time.monotonic()
        # The broker's CLIENT listener on the node address, advertised there; the PLAINTEXT one
        # stays on the namespace's loopback for the broker's own use.
        self.kafka = KafkaBroker(STATE_DIR / "kafka", client_port=addons.KAFKA_PORT, client_host=NODE_IP,
                                 client_advertised=f"{NODE_IP}:{addons.KAFKA_PORT}")
        self.kafka.launch()
        self._apply(addons.manifests(self.images, NODE_IP, self.others))
        self._start_spark_operator()
        for ns, name in addons.DEPLOYMENTS:
            self.wait(f"deployment {ns}/{name} available", lambda: self._available(ns, name), 120)
        for ns, name in addons.DAEMONSETS:
            self.wait(f"daemonset {ns}/{name} available on every node",
                      lambda: self._available(ns, name, "daemonset"), 120)
        self._network_policy()
        self.kafka._wait_ready(time.monotonic() + 90)
        self.timings["add-ons and Kafka"] = time.monotonic() - t
        self.timings["total"] = time.monotonic() - t0

    def _network_policy(self) -> None:
        """Waits for kube-network-policies' table (it writes it at start, whether or not there
        are policies), or records that this kernel cannot take its rules. Either way `up` says
        which; a kernel that takes them and no table is a failed start."""
        agent = f"{addons.NETPOL} (DaemonSet kube-system/{addons.NETPOL}, nfqueue {addons.NETPOL_QUEUE})"
        problem = nft_queue_problem()
        if problem is None:
            self.wait(f"{addons.NETPOL}'s nftables table {' '.join(NETPOL_TABLE)}", nft_table_present, 60)
            for spec in self.others:
                self.wait(f"{addons.NETPOL}'s nftables table on {spec.name}",
                          lambda spec=spec: nft_table_present(spec.netns), 60)
        NETPOL_STATUS.write_text(json.dumps({"enforced": problem is None, "agent": agent,
                                             "reason": problem or ""}) + "\n")
        if problem:
            print(f"WARNING: {problem}", flush=True)

    def _start_spark_operator(self) -> None:
        """The Kubeflow Spark Operator, controller and webhook, by `helm install` of its own chart
        (localenv/node/sparkoperator.py), waited for; skipped on a tier without the app images."""
        if "spark-operator" not in self.images or not SPARK_OPERATOR_CONF.exists():
            return
        conf = json.loads(SPARK_OPERATOR_CONF.read_text())
        self._apply(sparkoperator.extra_rbac())
        vals = STATE_DIR / "spark-operator-values.json"
        vals.write_text(json.dumps(sparkoperator.values(self.images["spark-operator"], conf.get("webhook", True))))
        argv = sparkoperator.helm_install_argv(conf["helm"], self.cp.kubeconfig, Path(conf["chart"]), vals)
        res = subprocess.run(argv, check=False, text=True, capture_output=True, timeout=330)
        (self.logs / "helm-spark-operator.log").write_text(res.stdout + res.stderr)
        if res.returncode != 0:
            raise ControlPlaneError(f"helm install of the Spark Operator failed: {res.stdout}{res.stderr}")

    def _apply(self, objs: list[dict]) -> None:
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        res = self.cp.kubectl_run("apply", "-f", "-", input=doc, check=False)
        if res.returncode != 0:
            raise ControlPlaneError(f"applying the add-ons failed: {res.stderr}")

    def _available(self, ns: str, name: str, kind: str = "deployment") -> bool:
        """A Deployment with a replica available; a DaemonSet available on every node."""
        field = "numberAvailable" if kind == "daemonset" else "availableReplicas"
        r = self.kubectl("-n", ns, "get", kind, name, "-o", f"jsonpath={{.status.{field}}}")
        want = 1 + len(self.others) if kind == "daemonset" else 1
        return r.returncode == 0 and r.stdout.strip().isdigit() and int(r.stdout) >= want

    @property
    def running(self) -> bool:
        return self.cp.running and all(p.alive() for p in self.procs) and (self.kafka is None or self.kafka.running)

    def _drain(self, timeout: float = 30) -> None:
        """Deletes every pod and waits for the kubelet to tear their sandboxes down (CNI DEL
        releases the addresses, libcni's cache and the pods' network namespaces), so that what
        is left for `down` to kill is only processes."""
        if not (self.cp.running and all(p.alive() for p in self.procs)):
            return
        # Their controllers first: a DaemonSet's or Deployment's pod deleted alone comes back,
        # and the wait below would run to its end.
        self.kubectl("delete", "daemonsets,deployments,statefulsets,replicasets,jobs", "--all", "--all-namespaces",
                     "--wait=false")
        self.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force",
                     "--wait=false")
        deadline = time.monotonic() + timeout
        while any(Path("/run/netns").glob("cni-*")) and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop(self) -> None:
        self._drain()
        with ThreadPoolExecutor() as pool:  # each node stops its own processes: at once
            list(pool.map(kubelet.stop, self.others))
        self.stop_all()
        if self.kafka is not None:
            self.kafka.stop()
        self.cp.stop()


def serve(images_file: Path, archives: list[Path], count: int) -> int:
    node = Node(json.loads(images_file.read_text()), archives, node_specs(count)[1:], images_file)
    return kubelet.serve_until_stopped("node tier", node.start, lambda: node.running, node.stop, READY,
                                       node.timings, also_remove=(NETPOL_STATUS,))
