"""The agent process: registers the Node, keeps it alive, provisions claims, and runs a
PodWorker for each pod bound to it (from a pod informer), each pod on its own loopback IP."""

from __future__ import annotations

import ipaddress
import os
import random
import re
import threading
from pathlib import Path

from localenv.nodeagent.kube import Kube, informer, kv, log
from localenv.nodeagent.podfiles import kill_leftover_groups
from localenv.nodeagent.pods import PodWorker
from localenv.nodeagent.status import Node
from localenv.nodeagent.volumes import Provisioner

HEARTBEAT_PERIOD = 10.0
POD_NET = ipaddress.ip_network("127.1.0.0/16")


def pod_network_for(node_name: str) -> ipaddress.IPv4Network:
    """127.(1+N).0.0/16 for a node named `...-N` (eopipe-node-0 -> 127.1.0.0/16), so that
    several agents (nodes) on one machine never hand out the same pod IP."""
    m = re.search(r"(\d+)$", node_name)
    n = int(m.group(1)) % 250 if m else 0
    return ipaddress.ip_network(f"127.{1 + n}.0.0/16")


class IPAllocator:
    def __init__(self, net: ipaddress.IPv4Network = POD_NET, offset: int = 0):
        """`offset`: where in the range the first address is handed out (the agent picks one at
        random: agents of two test sessions on one machine share the range of their node name,
        and a pod given an address another session's pod listens on fails to bind its ports)."""
        self.net = net
        self.used: set[str] = set()
        self.cursor = int(net.network_address) + 2 + offset % (net.num_addresses - 3)
        self.lock = threading.Lock()

    def reserve(self, ip: str | None) -> bool:
        with self.lock:
            if not ip or ip in self.used or ipaddress.ip_address(ip) not in self.net:
                return False
            self.used.add(ip)
            return True

    def allocate(self) -> str:
        with self.lock:
            lo, hi = int(self.net.network_address) + 2, int(self.net.broadcast_address) - 1
            for _ in range(hi - lo + 1):
                ip = ipaddress.ip_address(self.cursor)
                self.cursor = self.cursor + 1 if self.cursor < hi else lo
                if str(ip).endswith((".0", ".255")) or str(ip) in self.used:
                    continue
                self.used.add(str(ip))
                return str(ip)
            raise RuntimeError("pod IP range exhausted")

    def release(self, ip: str | None) -> None:
        with self.lock:
            self.used.discard(ip or "")


class Agent:
    def __init__(self, kubeconfig: Path, workdir: Path, node_name: str, extra_path: list[str]):
        self.kubeconfig = Path(kubeconfig).resolve()
        self.workdir = Path(workdir).resolve()
        self.node_name = node_name
        self.extra_path = extra_path
        self.kube = Kube(self.kubeconfig)
        self.stop_event = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.workers_lock = threading.Lock()
        self.ips = IPAllocator(pod_network_for(node_name), offset=random.randrange(1 << 16))
        self.host_ip = "127.0.0.1"
        self.node = Node(self.kube, node_name, self.host_ip)
        self.provisioner = Provisioner(self.kube, self.workdir)
        self.threads: list[threading.Thread] = []
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        (self.workdir / "volumes").mkdir(parents=True, exist_ok=True)
        u = self.kube.server.split("://", 1)[-1].rstrip("/")
        host, _, port = u.rpartition(":")
        self.service_host, self.service_port = host.strip("[]") or u, port or "443"

    def base_env(self, pod_ip: str | None, hostname: str) -> dict[str, str]:
        """Where a container's environment starts: the agent's own, PATH with extra_path first,
        and stand-ins for in-cluster configuration."""
        base = dict(os.environ)
        base["PATH"] = os.pathsep.join(list(self.extra_path) + [base.get("PATH", "")])
        base.update({
            "KUBECONFIG": str(self.kubeconfig),
            "KUBERNETES_SERVICE_HOST": self.service_host,
            "KUBERNETES_SERVICE_PORT": self.service_port,
            "POD_IP": pod_ip or "",
            "HOSTNAME": hostname,
        })
        return base

    def _heartbeat_loop(self) -> None:
        while not self.stop_event.wait(HEARTBEAT_PERIOD):
            try:
                if self.kube.get(self.node.path) is None:
                    log.warning(kv(event="node.missing", node=self.node_name))
                    self.node.register()
                else:
                    self.node.heartbeat()
            except Exception as e:  # noqa: BLE001
                log.warning(kv(event="heartbeat.error", error=f"{type(e).__name__}: {e}"[:300]))
            self.provisioner.resync()

    # ---------- pods ----------
    def _pods_listed(self, pods: list[dict]) -> None:
        uids = set()
        for p in pods:
            uids.add(p["metadata"]["uid"])
            self._pod_event("MODIFIED", p)
        with self.workers_lock:
            gone = [w for uid, w in self.workers.items() if uid not in uids]
        for w in gone:
            w.mark_gone()

    def _pod_event(self, typ: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        if (pod.get("spec") or {}).get("nodeName") != self.node_name:
            return
        with self.workers_lock:
            w = self.workers.get(uid)
            if typ == "DELETED":
                if w:
                    w.mark_gone()
                return
            if w is None:
                w = PodWorker(self, pod)
                self.workers[uid] = w
                w.thread.start()
                return
        w.update(pod)

    def worker_done(self, w: "PodWorker") -> None:
        with self.workers_lock:
            if self.workers.get(w.uid) is w:
                del self.workers[w.uid]

    # ---------- lifecycle ----------
    def run(self) -> None:
        self.provisioner.ensure_storage_class()
        self.node.register()
        pods_ready, pvcs_ready = threading.Event(), threading.Event()

        def pods_list(items: list[dict]) -> None:
            self._pods_listed(items)
            pods_ready.set()

        def pvc_list(items: list[dict]) -> None:
            for p in items:
                self.provisioner.event("ADDED", p)
            pvcs_ready.set()

        specs = [
            ("heartbeat", self._heartbeat_loop),
            ("pod-informer", lambda: informer(
                self.kube.new_watch_client(), "/api/v1/pods",
                {"fieldSelector": f"spec.nodeName={self.node_name}"},
                pods_list, self._pod_event, self.stop_event, "pods")),
            ("pvc-informer", lambda: informer(
                self.kube.new_watch_client(), "/api/v1/persistentvolumeclaims", {},
                pvc_list, self.provisioner.event, self.stop_event, "pvcs")),
        ]
        for name, fn in specs:
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        pods_ready.wait(60)
        pvcs_ready.wait(60)
        (self.workdir / "ready").write_text(str(os.getpid()))
        log.info(kv(event="agent.ready", node=self.node_name, pid=os.getpid()))

    def shutdown(self) -> None:
        log.info(kv(event="agent.stopping"))
        self.stop_event.set()
        with self.workers_lock:
            workers = list(self.workers.values())
        for w in workers:
            w.wake.set()
        for w in workers:
            w.thread.join(10)
        kill_leftover_groups(self.workdir)
        log.info(kv(event="agent.stopped"))
