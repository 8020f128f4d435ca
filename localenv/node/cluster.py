"""The node tier's processes, run by `python -m localenv.node serve` inside the tier's network
namespace: the control plane of localenv/controlplane.py (listening on the namespace's
addresses), containerd, the kubelet, kube-proxy and a Kafka broker on the node address (as a
Kafka outside the cluster: pods reach it through the `kafka.kafka` Service). It applies the
add-ons (localenv/node/addons.py) and the Kubeflow Spark Operator (helm install of its own chart,
localenv/node/sparkoperator.py), writes RUN_DIR/ready once the node is Ready, kube-proxy
healthy, the add-ons available and NetworkPolicy enforced (kube-network-policies' nftables rules
in place; or, on a kernel without nftables' queue statement, why not: RUN_DIR/networkpolicy.json),
and stops everything on SIGTERM (`down` sweeps the rest)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from localenv.controlplane import ControlPlane, ControlPlaneError
from localenv.daemon import LoggedProcess
from localenv.kafka import KafkaBroker
from localenv.node import (
    CLUSTER_DOMAIN,
    CNI_BIN_DIR,
    CNI_BRIDGE,
    CONTAINERD_SOCK,
    NETPOL_STATUS,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    RUN_DIR,
    STATE_DIR,
    addons,
    sparkoperator,
)
from localenv.node import config as cfg
from localenv.node.host import node_cgroup_root
from localenv.node.images import import_images
from localenv.pki import _client_ext, _sign, _write_kubeconfig

CP_DIR = STATE_DIR / "cp"
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


def nft_table_present() -> bool:
    return subprocess.run(["nft", "list", "table", *NETPOL_TABLE], capture_output=True,
                          check=False).returncode == 0


class NodeControlPlane(ControlPlane):
    def _apiserver_argv(self) -> list[str]:
        return cfg.apiserver_argv(super()._apiserver_argv(), NODE_IP, self.pki)


def _ctr() -> list[str]:
    return ["ctr", "--address", str(CONTAINERD_SOCK)]


class Node:
    def __init__(self, images: dict[str, str], archives: list[Path]):
        self.images, self.archives = images, archives
        self.pause_image = images["pause"]
        self.kafka: KafkaBroker | None = None
        self.cp = NodeControlPlane(CP_DIR)
        self.logs = STATE_DIR / "logs"
        self.procs: list[LoggedProcess] = []
        self.timings: dict[str, float] = {}

    def kubectl(self, *args: str) -> subprocess.CompletedProcess:
        return self.cp.kubectl_run(*args, check=False)

    def _spawn(self, name: str, argv: list[str]) -> LoggedProcess:
        p = LoggedProcess(name, argv, self.logs / f"{name}.log")
        self.procs.append(p)
        p.start()
        return p

    def _wait(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            dead = [p.name for p in self.procs if not p.alive()]
            if dead:
                raise ControlPlaneError(f"{', '.join(dead)} exited while waiting for {what}; logs in {self.logs}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}; logs in {self.logs}")
            time.sleep(0.5)

    def _identities(self) -> None:
        """Client certificates and kubeconfigs of the kubelet (the Node authorizer's
        system:node:<name>) and kube-proxy (bound to system:node-proxier by default RBAC)."""
        pki = self.cp.pki
        for name, subject, user in (("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}",
                                     f"system:node:{NODE_NAME}"),
                                    ("kube-proxy", "/CN=system:kube-proxy", "system:kube-proxy")):
            if not (pki / f"{name}.crt").exists():
                _sign(pki, name, subject, _client_ext())
            _write_kubeconfig(STATE_DIR / f"{name}.kubeconfig", self.cp.server, pki / "ca.crt",
                              pki / f"{name}.crt", pki / f"{name}.key", user)

    def start(self) -> None:
        t0 = time.monotonic()
        self.cp.start()
        self.timings["control plane"] = time.monotonic() - t0
        self._identities()

        t = time.monotonic()
        cni_conf = STATE_DIR / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-eopipe.conflist").write_text(
            cfg.cni_conflist(CNI_BRIDGE, POD_CIDR, STATE_DIR / "cni" / "ipam"))
        toml = STATE_DIR / "containerd.toml"
        toml.write_text(cfg.containerd_toml(STATE_DIR, RUN_DIR, CONTAINERD_SOCK, CNI_BIN_DIR, cni_conf,
                                            self.pause_image))
        self._spawn("containerd", ["containerd", "--config", str(toml)])
        self._wait("containerd", lambda: subprocess.run([*_ctr(), "version"], check=False,
                                                        capture_output=True).returncode == 0,
                   60)
        import_images(_ctr(), self.archives)
        self.timings["containerd + image import"] = time.monotonic() - t

        t = time.monotonic()
        kcfg = STATE_DIR / "kubelet.json"
        kcfg.write_text(cfg.kubelet_config(node_ip=NODE_IP, sock=CONTAINERD_SOCK,
                                           cgroup_root_path=node_cgroup_root(), ca=self.cp.ca_cert,
                                           cluster_domain=CLUSTER_DOMAIN, cluster_dns=addons.DNS_IP,
                                           pod_logs_dir=STATE_DIR / "pod-logs"))
        self._spawn("kubelet", cfg.kubelet_argv(
            self.cp.binaries["kube-apiserver"].with_name("kubelet"), config=kcfg,
            kubeconfig=STATE_DIR / "kubelet.kubeconfig", root_dir=STATE_DIR / "kubelet",
            cert_dir=STATE_DIR / "kubelet-pki", node_name=NODE_NAME, node_ip=NODE_IP))
        self._wait(f"node {NODE_NAME} Ready", self._node_ready, 180)
        self.timings["kubelet to node Ready"] = time.monotonic() - t

        t = time.monotonic()
        pcfg = STATE_DIR / "kube-proxy.json"
        pcfg.write_text(cfg.kube_proxy_config(kubeconfig=STATE_DIR / "kube-proxy.kubeconfig",
                                              cluster_cidr=POD_CIDR, node_name=NODE_NAME))
        self._spawn("kube-proxy", [str(self.cp.binaries["kube-apiserver"].with_name("kube-proxy")),
                                   f"--config={pcfg}", "--v=1"])
        self._wait("kube-proxy /healthz", self._proxy_healthy, 60)
        self.timings["kube-proxy healthy"] = time.monotonic() - t

        t = time.monotonic()
        # The broker's CLIENT listener on the node address, advertised there; the PLAINTEXT one
        # stays on the namespace's loopback for the broker's own use.
        self.kafka = KafkaBroker(STATE_DIR / "kafka", client_port=addons.KAFKA_PORT, client_host=NODE_IP,
                                 client_advertised=f"{NODE_IP}:{addons.KAFKA_PORT}")
        self.kafka.launch()
        self._apply(addons.manifests(self.images, NODE_IP))
        self._start_spark_operator()
        for ns, name in addons.DEPLOYMENTS:
            self._wait(f"deployment {ns}/{name} available", lambda: self._available(ns, name), 120)
        for ns, name in addons.DAEMONSETS:
            self._wait(f"daemonset {ns}/{name} available", lambda: self._available(ns, name, "daemonset"), 120)
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
            self._wait(f"{addons.NETPOL}'s nftables table {' '.join(NETPOL_TABLE)}", nft_table_present, 60)
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
        field = "numberAvailable" if kind == "daemonset" else "availableReplicas"
        r = self.kubectl("-n", ns, "get", kind, name, "-o", f"jsonpath={{.status.{field}}}")
        return r.returncode == 0 and r.stdout.strip() not in ("", "0")

    def _node_ready(self) -> bool:
        r = self.kubectl("get", "node", NODE_NAME, "-o",
                         'jsonpath={.status.conditions[?(@.type=="Ready")].status}')
        return r.returncode == 0 and r.stdout.strip() == "True"

    @staticmethod
    def _proxy_healthy() -> bool:
        try:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open("http://127.0.0.1:10256/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.cp.running and all(p.alive() for p in self.procs) and (self.kafka is None or self.kafka.running)

    def _drain(self, timeout: float = 30) -> None:
        """Deletes every pod and waits for the kubelet to tear their sandboxes down (CNI DEL
        releases the addresses, libcni's cache and the pods' network namespaces), so that what
        is left for `down` to kill is only processes."""
        if not (self.cp.running and all(p.alive() for p in self.procs)):
            return
        self.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force",
                     "--wait=false")
        deadline = time.monotonic() + timeout
        while any(Path("/run/netns").glob("cni-*")) and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop(self) -> None:
        self._drain()
        for p in reversed(self.procs):
            p.stop(grace=10)
        self.procs = []
        if self.kafka is not None:
            self.kafka.stop()
        self.cp.stop()


def serve(images: dict[str, str], archives: list[Path]) -> int:
    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node = Node(images, archives)
    try:
        node.start()
        READY.write_text(json.dumps({k: round(v, 1) for k, v in node.timings.items()}) + "\n")
        print(f"node ready: {node.timings}", flush=True)
        while node.running:
            time.sleep(1)
        print("a node process exited; stopping", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        READY.unlink(missing_ok=True)
        NETPOL_STATUS.unlink(missing_ok=True)
        node.stop()
