"""What the node tier changes on the host, made and unmade: the nodes' network namespaces and
the one that joins them (SWITCH_NETNS, a bridge and nothing else: the nodes' L2 network, as
kind's nodes share a Docker network), each node's pods' cgroup root, the Debian packages it needs; and `leftovers()`, the
list of anything of the tier still on the host (processes, mounts, links, network namespaces,
iptables rules, cgroups, directories), which `sweep()` removes and a test checks is empty."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from localenv.node import (
    CNI_BRIDGE,
    NETNS,
    NODE_IP,
    NODE_LINK,
    NODE_PREFIX,
    RUN_DIR,
    SERVICE_CIDR,
    STATE_DIR,
    NodeSpec,
)
from localenv.node.config import CNI_NETWORK, cgroup_root

NETNS_PATH = Path("/run/netns") / NETNS
# The nodes' network: a bridge (no address, no iptables rules) in a namespace of its own, so
# that traffic between two nodes crosses neither another node's netfilter nor the host.
SWITCH_NETNS, SWITCH = f"{NETNS}-net", "eopswitch"
CGROUP_FS = Path("/sys/fs/cgroup")
# The kubelet links each container's log here (a fixed path, not under its root dir).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# Paths fixed in the binaries, outside the tier's directories (see their helpers below).
SHIM_SOCKETS = Path("/run/containerd/s")
CNI_CACHE = Path("/var/lib/cni/results")
KUBELET_DEVICE_SOCK = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
# command -> Debian package: installed when missing (apt-get), never anything else.
PACKAGES = {"containerd": "containerd", "runc": "runc", "buildah": "buildah",
            "mmdebstrap": "mmdebstrap", "iptables-save": "iptables", "nsenter": "util-linux",
            # `nft`: the check that the kernel takes kube-network-policies' rules, and that they are in.
            "nft": "nftables",
            "/usr/lib/cni/bridge": "containernetworking-plugins"}


# Host-wide sysctls the kubelet sets at start (its kernel tunables, with protectKernelDefaults
# false; true would refuse to start unless they already match): saved before, put back by sweep().
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
SAVED_SYSCTLS = RUN_DIR / "host-sysctls.json"


def save_sysctls() -> None:
    if not SAVED_SYSCTLS.exists():
        SAVED_SYSCTLS.write_text(json.dumps(
            {k: (Path("/proc/sys") / k).read_text().strip() for k in KUBELET_SYSCTLS}) + "\n")


def restore_sysctls() -> None:
    try:
        saved = json.loads(SAVED_SYSCTLS.read_text())
    except (OSError, ValueError):
        return
    for k, v in saved.items():
        (Path("/proc/sys") / k).write_text(v)
    SAVED_SYSCTLS.unlink()


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def ensure_packages(packages: dict[str, str] = PACKAGES) -> list[str]:
    """apt-get install of the Debian packages (command or path -> package) whose command is
    missing; returns what it installed."""
    missing = sorted({pkg for cmd, pkg in packages.items()
                      if not (Path(cmd).exists() if cmd.startswith("/") else shutil.which(cmd))})
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    return missing


def node_cgroup_root(name: str = NETNS) -> str:
    return cgroup_root(Path("/proc/self/cgroup").read_text(), name)


def _cgroup_roots() -> list[str]:
    """The cgroup roots of every node of the tier present on the host (node 0's and its siblings
    named after the other nodes)."""
    first = node_cgroup_root().strip("/")
    parent, name = (first.rsplit("/", 1) if "/" in first else ("", first))
    found = {first}
    for h in _hierarchies():
        top = h / parent if parent else h
        if top.is_dir():
            found.update(f"{parent}/{p.name}".strip("/") for p in top.glob(f"{name}-*") if p.is_dir())
    return sorted(found)


def _hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies, or the v2 root."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]
    return [p for p in sorted(CGROUP_FS.iterdir())
            if p.is_dir() and p.name != "unified" and (p / "cgroup.procs").exists()]


def ensure_cgroups(root: str) -> None:
    """The kubelet's cgroup root in every hierarchy (the kubelet refuses a missing one); a new
    cpuset cgroup starts with no CPUs, so it inherits its parent's."""
    for h in _hierarchies():
        cur = h
        for part in root.strip("/").split("/"):
            parent, cur = cur, cur / part
            if not cur.exists():
                cur.mkdir()
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (parent / f).exists():
                        (cur / f).write_text((parent / f).read_text())


def _switch_port(spec: NodeSpec) -> str:
    return f"eopn{spec.index}"


def ensure_netns(specs: list[NodeSpec]) -> None:
    """Each node's namespace, loopback up, forwarding on (it routes its pods' traffic), its IP on
    NODE_LINK, one end of a veth whose other end is a port of SWITCH; a route for each other
    node's pod /24 through that node, and one for the service CIDR to NODE_LINK, so that node
    processes' traffic to a Service is routed and kube-proxy's rules translate it. No default
    route: nothing leads out."""
    for ns in (SWITCH_NETNS, *(n.netns for n in specs)):
        if not (Path("/run/netns") / ns).exists():
            run("ip", "netns", "add", ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
    sw = ("ip", "-n", SWITCH_NETNS)
    if run(*sw, "link", "show", SWITCH, check=False).returncode != 0:
        run(*sw, "link", "add", SWITCH, "type", "bridge")
    run(*sw, "link", "set", SWITCH, "up")
    for n in specs:
        ns, port = ("ip", "-n", n.netns), _switch_port(n)
        if run(*sw, "link", "show", port, check=False).returncode != 0:
            run(*sw, "link", "add", port, "type", "veth", "peer", "name", NODE_LINK, "netns", n.netns)
        run(*sw, "link", "set", port, "master", SWITCH, "up")
        run(*ns, "addr", "replace", f"{n.ip}/{NODE_PREFIX}", "dev", NODE_LINK)
        run(*ns, "link", "set", NODE_LINK, "up")
        run(*ns, "route", "replace", SERVICE_CIDR, "dev", NODE_LINK, "src", n.ip)
        for other in specs:
            if other is not n:
                run(*ns, "route", "replace", other.pod_cidr, "via", other.ip)
        run("ip", "netns", "exec", n.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def cut_node(spec: NodeSpec, up: bool = False) -> None:
    """The node's cable pulled out of the switch (or put back): nothing reaches it or leaves it."""
    run("ip", "-n", SWITCH_NETNS, "link", "set", _switch_port(spec), "up" if up else "down")


def join_netns() -> int:
    """Moves the calling thread (call it before any other starts: threads made later inherit it)
    into the tier's namespace, as `nsenter --net` does for a command; for a process, such as the
    demo, that then talks to the tier's addresses itself. Returns a descriptor of the namespace
    it left, for leave_netns: a process found in the tier's namespace is one `down` kills."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    _setns(NETNS_PATH)
    return home


def leave_netns(home: int) -> None:
    _setns(f"/proc/self/fd/{home}")
    os.close(home)


def _setns(path) -> None:
    import ctypes

    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def _tier_netns() -> list[str]:
    """The tier's namespaces present: the nodes' (eopipe-node, eopipe-node-<i>) and the switch's."""
    d = Path("/run/netns")
    return sorted(p.name for p in d.glob(f"{NETNS}*")) if d.is_dir() else []


def _netns_inodes() -> set[int]:
    out = set()
    for name in _tier_netns():
        try:
            out.add((Path("/run/netns") / name).stat().st_ino)
        except OSError:
            pass
    return out


def tier_pids(spec: NodeSpec | None = None) -> list[int]:
    """Processes of the tier (or of one node): those in its network namespaces (control plane,
    containerd and its shims, kubelet, kube-proxy), those whose command line names its
    directories, and the containers' processes in its cgroups."""
    inos = {(spec.netns_path.stat().st_ino if spec.netns_path.exists() else -1)} if spec else _netns_inodes()
    me = os.getpid()
    marks = (str(spec.state_dir) + "/", str(spec.run_dir) + "/") if spec and spec.index else \
        (str(STATE_DIR), str(RUN_DIR))
    pids: set[int] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if os.stat(d / "ns" / "net").st_ino in inos:
                pids.add(int(d.name))
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in marks):
            pids.add(int(d.name))
    for root in [node_cgroup_root(spec.cgroup).strip("/")] if spec else _cgroup_roots():
        pids.update(_cgroup_pids(root))
    pids.discard(me)
    return sorted(pids)


def _cgroup_pids(root: str) -> set[int]:
    """The processes in a cgroup root and below it, in any hierarchy (the pods' containers)."""
    pids: set[int] = set()
    for h in _hierarchies():
        for d in _cgroup_dirs(h / root):
            try:
                pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
    return pids


def _cgroup_dirs(top: Path) -> list[Path]:
    """top and the cgroups below it, deepest first. os.walk, not rglob: a pod's cgroup that the
    kubelet removes mid-walk is skipped, not a FileNotFoundError."""
    return [Path(d) for d, _, _ in os.walk(top, topdown=False)]


def kill_node(spec: NodeSpec, containers: bool = True) -> int:
    """SIGKILL to everything of one node, as a power cut: kubelet, containerd, shims and the
    containers; or (containers False) to its agents only (serve-node, containerd, kubelet,
    kube-proxy), its pods' containers left running, as a node cut off from the cluster whose
    pods live on. Its files stay, as a disk does. Returns how many processes it killed."""
    if containers:
        return _kill_all(lambda: tier_pids(spec))

    def agents() -> list[int]:
        pods = _cgroup_pids(node_cgroup_root(spec.cgroup).strip("/"))
        return [p for p in tier_pids(spec) if p not in pods
                and not _cmdline(p).startswith(("containerd-shim", "/usr/bin/containerd-shim"))]
    return _kill_all(agents)


def _kill_all(find) -> int:
    """SIGKILL to what find() lists, again until it lists nothing (a dying containerd's shims)."""
    killed: set[int] = set()
    for _ in range(20):
        pids = find()
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except ProcessLookupError:
                pass
        time.sleep(0.25)
    return len(killed)


def tier_mounts() -> list[str]:
    """Mounts under the tier's directories, its namespaces, and /run/netns itself once it holds
    no namespace (`ip netns add` bind-mounts that directory onto itself the first time)."""
    marks = (str(STATE_DIR) + "/", str(RUN_DIR) + "/", str(NETNS_PATH), "/run/netns/cni-")
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4]
        empty_netns_dir = mp == str(NETNS_PATH.parent) and not any(NETNS_PATH.parent.iterdir())
        if mp in (str(STATE_DIR), str(RUN_DIR)) or mp.startswith(marks) or empty_netns_dir:
            out.append(mp)
    return out


def _containerd_run_dirs() -> list[Path]:
    """The run directory of each node's containerd present (node 0's, then the others')."""
    nodes = RUN_DIR / "nodes"
    return [RUN_DIR, *(sorted(p for p in nodes.iterdir() if p.is_dir()) if nodes.is_dir() else [])]


def shim_sockets() -> list[Path]:
    """containerd 1.6 puts each shim's socket at a fixed place, /run/containerd/s/<sha256 of
    its containerd address/namespace/id>, whatever containerd's own state directory; a shim
    killed by SIGKILL leaves it."""
    out = []
    for run_dir in _containerd_run_dirs():
        tasks = run_dir / "containerd" / "io.containerd.runtime.v2.task" / "k8s.io"
        sock = run_dir / "containerd" / "containerd.sock"
        for i in sorted(p.name for p in tasks.iterdir()) if tasks.is_dir() else []:
            h = hashlib.sha256(os.path.join(str(sock), "k8s.io", i).encode()).hexdigest()
            if (SHIM_SOCKETS / h).exists():
                out.append(SHIM_SOCKETS / h)
    return out


def _cni_cache_files() -> list[Path]:
    """libcni's cache of the tier's pods (fixed at /var/lib/cni): its network's results, and the
    loopback results of the same sandboxes. CNI DEL removes them; a killed pod leaves them."""
    if not CNI_CACHE.is_dir():
        return []
    ours = [p for p in CNI_CACHE.glob(f"{CNI_NETWORK}-*")]
    ids = {p.name[len(CNI_NETWORK) + 1:].rsplit("-", 1)[0] for p in ours}
    return ours + [p for p in CNI_CACHE.glob("cni-loopback-*") if p.name[13:].rsplit("-", 1)[0] in ids]


def _log_links() -> list[Path]:
    if not CONTAINER_LOG_LINKS.is_dir():
        return []
    return [p for p in CONTAINER_LOG_LINKS.iterdir()
            if p.is_symlink() and os.readlink(p).startswith(str(STATE_DIR) + "/")]


def leftovers() -> dict[str, list[str]]:
    """Everything of the tier on the host; all lists empty after `down`."""
    links = [ln.split(":")[1].strip().split("@")[0] for ln in run("ip", "-o", "link").stdout.splitlines()]
    netns = [ln.split()[0] for ln in run("ip", "netns", "list").stdout.splitlines() if ln.strip()]
    rules = []
    for save in ("iptables-save", "iptables-legacy-save", "iptables-nft-save"):
        if shutil.which(save):
            res = run(save, check=False)
            rules += [f"{save}: {ln}" for ln in res.stdout.splitlines()
                      if "KUBE-" in ln or "CNI-" in ln or NODE_IP in ln]
    return {
        "processes": [f"{p} {_cmdline(p)}" for p in tier_pids()],
        "mounts": tier_mounts(),
        "links": [n for n in links if n in (NODE_LINK, CNI_BRIDGE, SWITCH)],
        "netns": [n for n in netns if n.startswith((NETNS, "cni-"))],
        "iptables": rules,
        "cgroups": [str(h / root) for root in _cgroup_roots() for h in _hierarchies() if (h / root).exists()],
        "dirs": [str(d) for d in (STATE_DIR, RUN_DIR) if d.exists()],
        "files": [str(p) for p in (*_log_links(), *_cni_cache_files(), *shim_sockets(),
                                   *([KUBELET_DEVICE_SOCK] if KUBELET_DEVICE_SOCK.exists() else []))],
    }


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "(gone)"


def sweep() -> None:
    """Removes whatever the tier left: SIGKILL to its processes (by pid), the host sysctls the
    kubelet changed set back, lazy unmounts
    (deepest first), its namespaces, its cgroups (deepest first), its directories."""
    _kill_all(tier_pids)
    restore_sysctls()
    for f in (*shim_sockets(), *_cni_cache_files(), KUBELET_DEVICE_SOCK):
        f.unlink(missing_ok=True)
    for mp in sorted(tier_mounts(), key=len, reverse=True):
        run("umount", "-l", mp, check=False)
    for n in leftovers()["netns"]:
        run("ip", "netns", "delete", n, check=False)
    for mp in tier_mounts():  # /run/netns, now empty
        run("umount", "-l", mp, check=False)
    for top in (h / root for root in _cgroup_roots() for h in _hierarchies()):
        for d in _cgroup_dirs(top):
            try:
                d.rmdir()
            except OSError:
                pass
    for d in (RUN_DIR, STATE_DIR):
        shutil.rmtree(d, ignore_errors=True)
    for link in _log_links():
        link.unlink(missing_ok=True)
    empty_dirs = (CONTAINER_LOG_LINKS, NETNS_PATH.parent, SHIM_SOCKETS, SHIM_SOCKETS.parent / "runc",
                  SHIM_SOCKETS.parent, CNI_CACHE, CNI_CACHE.parent, KUBELET_DEVICE_SOCK.parent,
                  KUBELET_DEVICE_SOCK.parent.parent)
    for d in empty_dirs:
        try:
            d.rmdir()  # only when empty: it may hold others' links or namespaces
        except OSError:
            pass
