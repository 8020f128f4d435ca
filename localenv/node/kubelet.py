"""One node's own processes: containerd (with the tier's images imported), the kubelet and
kube-proxy, for node 0 (started by localenv/node/cluster.py, beside the control plane) and for
each further node (`python -m localenv.node serve-node`, run by `up` inside that node's network
namespace, detached: killing a node's processes is a node lost, not the tier stopped)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from localenv import REPO_ROOT
from localenv.controlplane import ControlPlaneError
from localenv.daemon import LoggedProcess
from localenv.node import CLUSTER_DOMAIN, CNI_BIN_DIR, CNI_BRIDGE, POD_RANGE, STATE_DIR, NodeSpec, addons
from localenv.node import config as cfg
from localenv.node.host import node_cgroup_root
from localenv.node.images import import_images
from localenv.node.seed import plant, seed_dir
from localenv.pki import _client_ext, _sign, _write_kubeconfig

CP_DIR = STATE_DIR / "cp"


class Processes:
    """Processes of the tier started and watched by one `serve`: a failed start names the one
    that exited and where its log is."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[LoggedProcess] = []
        self.timings: dict[str, float] = {}

    def spawn(self, name: str, argv: list[str]) -> LoggedProcess:
        p = LoggedProcess(name, argv, self.logs / f"{name}.log")
        self.procs.append(p)
        p.start()
        return p

    def wait(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            dead = [p.name for p in self.procs if not p.alive()]
            if dead:
                raise ControlPlaneError(f"{', '.join(dead)} exited while waiting for {what}; logs in {self.logs}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}; logs in {self.logs}")
            time.sleep(0.5)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop(grace=10)
        self.procs = []


def identities(pki: Path, spec: NodeSpec, server: str) -> None:
    """Client certificates and kubeconfigs of a node's kubelet (the Node authorizer's
    system:node:<name>) and kube-proxy (bound to system:node-proxier by default RBAC). Made by
    node 0's serve for every node before any starts: openssl's serial file is one for the CA."""
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    name = spec.name
    for who, subject, user in (("kubelet", f"/O=system:nodes/CN=system:node:{name}", f"system:node:{name}"),
                               ("kube-proxy", "/CN=system:kube-proxy", "system:kube-proxy")):
        cert = f"{who}-{name}" if spec.index else who
        if not (pki / f"{cert}.crt").exists():
            _sign(pki, cert, subject, _client_ext())
        _write_kubeconfig(spec.state_dir / f"{who}.kubeconfig", server, pki / "ca.crt",
                          pki / f"{cert}.crt", pki / f"{cert}.key", user)


def kubectl_for(kube_bin: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(kube_bin / "kubectl"), f"--kubeconfig={kubeconfig}", *args], check=False,
                          text=True, capture_output=True)


class NodeProcesses(Processes):
    """containerd, kubelet and kube-proxy of one node (its kubeconfigs made by `identities`)."""

    def __init__(self, spec: NodeSpec, kube_bin: Path, pki: Path, images: dict[str, str]):
        super().__init__(spec.state_dir / "logs")
        self.spec, self.kube_bin, self.pki, self.images = spec, kube_bin, pki, images

    def ctr(self) -> list[str]:
        return ["ctr", "--address", str(self.spec.containerd_sock)]

    def start_runtime(self, archives: list[Path]) -> None:
        t = time.monotonic()
        sd = self.spec.state_dir
        cni_conf = sd / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-eopipe.conflist").write_text(cfg.cni_conflist(CNI_BRIDGE, self.spec.pod_cidr, sd / "cni" / "ipam"))
        toml = sd / "containerd.toml"
        toml.write_text(cfg.containerd_toml(sd, self.spec.run_dir, self.spec.containerd_sock, CNI_BIN_DIR, cni_conf,
                                            self.images["pause"]))
        # A new node's images from the bundle's seed (localenv/node/seed.py): the rest imported.
        seeded = plant(seed_dir(archives[0]), sd / "containerd")
        self.spawn("containerd", ["containerd", "--config", str(toml)])
        self.wait("containerd", lambda: subprocess.run([*self.ctr(), "version"], check=False,
                                                       capture_output=True).returncode == 0, 60)
        # A node that comes back has its images on its disk still, as a real one does.
        held = subprocess.run([*self.ctr(), "-n", "k8s.io", "images", "ls", "-q"], check=True, text=True,
                              capture_output=True).stdout.split()
        if not set(self.images.values()) <= set(held):
            import_images(self.ctr(), archives[1:] if seeded else archives)
        self.timings["containerd + image import"] = time.monotonic() - t

    def start_kubelet(self) -> None:
        t = time.monotonic()
        sd, name = self.spec.state_dir, self.spec.name
        kcfg = sd / "kubelet.json"
        kcfg.write_text(cfg.kubelet_config(node_ip=self.spec.ip, sock=self.spec.containerd_sock,
                                           cgroup_root_path=node_cgroup_root(self.spec.cgroup),
                                           ca=self.pki / "ca.crt", cluster_domain=CLUSTER_DOMAIN,
                                           cluster_dns=addons.DNS_IP, pod_logs_dir=sd / "pod-logs"))
        self.spawn("kubelet", cfg.kubelet_argv(
            self.kube_bin / "kubelet", config=kcfg, kubeconfig=sd / "kubelet.kubeconfig",
            root_dir=sd / "kubelet", cert_dir=sd / "kubelet-pki", node_name=name, node_ip=self.spec.ip))
        self.wait(f"node {name} Ready", self.node_ready, 180)
        self.timings["kubelet to node Ready"] = time.monotonic() - t

        t = time.monotonic()
        pcfg = sd / "kube-proxy.json"
        pcfg.write_text(cfg.kube_proxy_config(kubeconfig=sd / "kube-proxy.kubeconfig", cluster_cidr=POD_RANGE,
                                              node_name=name))
        self.spawn("kube-proxy", [str(self.kube_bin / "kube-proxy"), f"--config={pcfg}", "--v=1"])
        self.wait("kube-proxy /healthz", proxy_healthy, 60)
        self.timings["kube-proxy healthy"] = time.monotonic() - t

    def node_ready(self) -> bool:
        # The kubelet's own identity may read its Node (the Node authorizer).
        r = kubectl_for(self.kube_bin, self.spec.state_dir / "kubelet.kubeconfig", "get", "node", self.spec.name,
                        "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')
        return r.returncode == 0 and r.stdout.strip() == "True"


def proxy_healthy() -> bool:
    """kube-proxy's health on the calling thread's namespace's loopback."""
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open("http://127.0.0.1:10256/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def launch(spec: NodeSpec, images: Path, archives: list[Path], kube_bin: Path) -> int:
    """Starts serve-node for `spec` in its namespace, detached (its own session: the tier's
    `serve` may stop, a node's processes stop only with the node). Returns its pid."""
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    (spec.run_dir / "ready").unlink(missing_ok=True)
    argv = ["nsenter", f"--net={spec.netns_path}", "--", sys.executable, "-m", "localenv.node", "serve-node",
            "--index", str(spec.index), "--images", str(images), "--kube-bin", str(kube_bin),
            *map(str, archives)]
    with open(spec.state_dir / "serve.out", "ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (spec.run_dir / "serve.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def serve_until_stopped(what: str, start, running, stop, ready: Path, timings: dict[str, float],
                        also_remove: tuple[Path, ...] = ()) -> int:
    """start(), then `ready` written with the timings, then wait: 1 once a process exits (running()
    false), 0 on SIGTERM or SIGINT; stop() and the ready files removed either way."""
    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        start()
        ready.write_text(json.dumps({k: round(v, 1) for k, v in timings.items()}) + "\n")
        print(f"{what} ready: {timings}", flush=True)
        while running():
            time.sleep(1)
        print("a node process exited; stopping", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for f in (ready, *also_remove):
            f.unlink(missing_ok=True)
        stop()


def serve_node(spec: NodeSpec, images: dict[str, str], archives: list[Path], kube_bin: Path) -> int:
    """A further node's processes until SIGTERM; writes run_dir/ready with its timings."""
    node = NodeProcesses(spec, kube_bin, CP_DIR / "pki", images)

    def start() -> None:
        node.start_runtime(archives)
        node.start_kubelet()
    return serve_until_stopped(f"node {spec.name}", start, lambda: all(p.alive() for p in node.procs),
                               node.stop_all, spec.run_dir / "ready", node.timings)


def stop(spec: NodeSpec, timeout: float = 30) -> None:
    """SIGTERM to a node's serve-node (its pods' containers stop with containerd's shims later,
    in `down`'s sweep), waited for."""
    try:
        pid = int((spec.run_dir / "serve.pid").read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.25)


def _running(pid: int) -> bool:
    """Not gone and not a zombie: the tier's serve launched the node and, waiting here, has not
    reaped it (a zombie answers kill 0, which read as running until the timeout)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # a child of this process that exited: reaped
            return False
    except ChildProcessError:  # not a child of this process
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
