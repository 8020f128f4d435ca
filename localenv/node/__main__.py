"""`python -m localenv.node up|prep|down|kubectl ...|leftovers|node-kill|node-start` (make cluster /
cluster-down).

up: installs the Debian packages when missing, builds (or takes from the cache) kubelet,
kube-proxy, the images and the Spark Operator (its chart from the Go module cache; with
EOPIPE_SPARK_WEBHOOK=0, installed with its webhook disabled), creates the network namespaces and
the cgroup roots, and starts `serve` inside node 0's namespace, detached; returns once every
node is Ready (`--nodes N`, default EOPIPE_NODES or 1). down: stops it and sweeps whatever is
left; exits 1 if anything of the tier is still on the host. node-kill NAME: a node lost, as a
power cut (every process of it SIGKILLed, its link to the other nodes down); node-start NAME:
it comes back (link up, its processes started again on the same disk).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from localenv import REPO_ROOT
from localenv.node import (
    MAX_NODES,
    NETNS,
    NETPOL_STATUS,
    NODE_IP,
    NODES_FILE,
    RUN_DIR,
    STATE_DIR,
    NodeSpec,
    host,
    node_specs,
    running_nodes,
)
from localenv.node.addons import KAFKA_PORT

PIDFILE = RUN_DIR / "serve.pid"
IMAGES = RUN_DIR / "images.json"  # {"pause": ref, "app": ref, ...}: what the node and tests run
ARCHIVES = RUN_DIR / "archives.json"  # the images' archives, which a node imports when it starts
SERVE_OUT = STATE_DIR / "serve.out"
KUBECONFIG = STATE_DIR / "cp" / "admin.kubeconfig"
KUBE_CACHE = STATE_DIR / "kube-cache"  # the tier's kubectl discovery cache, gone with the tier


def _serve_pid() -> int | None:
    try:
        pid = int(PIDFILE.read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def kubectl_argv(*args: str) -> list[str]:
    """kubectl run inside the namespace (the apiserver listens only there)."""
    kubectl = _k8s_bin() / "kubectl"
    return ["nsenter", f"--net={host.NETNS_PATH}", "--", str(kubectl), f"--kubeconfig={KUBECONFIG}",
            f"--cache-dir={KUBE_CACHE}", *args]


def forget_api_discovery() -> None:
    """kubectl asks the API server for its resources again: after a CRD loses a version, a
    cached discovery still names it, and kubectl asks the server for a path it no longer serves."""
    shutil.rmtree(KUBE_CACHE / "discovery", ignore_errors=True)


def kill_container(ns: str, pod: str) -> str:
    """SIGKILL to the pod's (first) container through its node's containerd, as an OOM kill or a
    crash does: the kubelet sees it exit and restarts it or fails the pod. Returns the container id."""
    res = subprocess.run(kubectl_argv("-n", ns, "get", "pod", pod, "-o",
                                      "jsonpath={.spec.nodeName} {.status.containerStatuses[0].containerID}"),
                         check=True, capture_output=True, text=True)
    node, _, cid = res.stdout.strip().partition(" ")
    cid = cid.removeprefix("containerd://")
    if not cid:
        raise RuntimeError(f"pod {ns}/{pod} has no running container")
    sock = next(n.containerd_sock for n in running_nodes() if n.name == node)
    subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", cid],
                   check=True, capture_output=True)
    return cid


def _k8s_bin(quiet: bool = True) -> Path:
    out = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-k8s.sh"), "--node"], check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else None,
                         text=True).stdout.split()
    return Path(out[-2])


def prep(app_image: bool = True) -> tuple[dict, Path]:
    """What `up` needs before it starts anything, built or taken from the cache: the Debian
    packages, kubelet and kube-proxy, Kafka's jars (the namespace has no route to Maven), the
    images and the nodes' seed. Its own command too (`make node-prep`), so that on a new machine
    its disk and network work runs beside the other tools' compiles."""
    from localenv.kafka import ensure_kafka_jars
    from localenv.node.images import ensure_images

    if installed := host.ensure_packages():
        print(f"installed Debian packages: {' '.join(installed)}")
    _k8s_bin(quiet=False)
    ensure_kafka_jars()
    images = ensure_images(app=app_image, spark=app_image)
    return images, _shared_bundle(images)


def _shared_bundle(images: dict) -> Path:
    """The archive of every image but the app's (every source change makes a new app image, and
    the bundle would be copied again), and the nodes' containerd seed made from it."""
    from localenv.node.imagebundle import bundle
    from localenv.node.images import CACHE as IMAGE_CACHE
    from localenv.node.seed import ensure_seed

    shared = bundle([p for name, (_, p) in images.items() if name != "app"], IMAGE_CACHE)
    ensure_seed(shared, images["pause"][0])  # the nodes' containerd roots start from it
    return shared


def up(app_image: bool, timeout: float, count: int) -> int:
    t0 = time.monotonic()
    if _serve_pid():
        print(f"node tier already running (pid {_serve_pid()})")
        return 0
    images, shared = prep(app_image)
    t_prep = time.monotonic() - t0
    if any(host.leftovers().values()):  # a crashed run: start clean
        host.sweep()
    for d in (STATE_DIR, RUN_DIR):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
    host.save_sysctls()
    specs = node_specs(count)
    NODES_FILE.write_text(json.dumps({"count": count}) + "\n")
    host.ensure_netns(specs)
    for spec in specs:
        host.ensure_cgroups(host.node_cgroup_root(spec.cgroup))
    archives = [str(shared), *([str(images["app"][1])] if "app" in images else [])]
    if "spark-operator" in images:
        from localenv.node.cluster import SPARK_OPERATOR_CONF
        from localenv.node.sparkoperator import chart_dir

        # Resolved here: the namespace has no route to the Go module proxy.
        helm = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "helm"], check=True, text=True,
                              stdout=subprocess.PIPE).stdout.split()[-1]
        SPARK_OPERATOR_CONF.write_text(json.dumps({"helm": f"{helm}/helm", "chart": str(chart_dir()),
                                                   "webhook": os.environ.get("EOPIPE_SPARK_WEBHOOK", "1") != "0"}))
    IMAGES.write_text(json.dumps({name: ref for name, (ref, _) in images.items()}) + "\n")
    ARCHIVES.write_text(json.dumps(archives) + "\n")
    argv = ["nsenter", f"--net={host.NETNS_PATH}", "--", sys.executable, "-m", "localenv.node", "serve",
            "--images", str(IMAGES), "--nodes", str(count), *archives]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(SERVE_OUT, "ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    PIDFILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    ready = RUN_DIR / "ready"
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"node tier failed to start; {SERVE_OUT}:\n{SERVE_OUT.read_text()[-4000:]}", file=sys.stderr)
            down()
            return 1
        time.sleep(0.5)
    steps = json.loads(ready.read_text())
    print(f"node tier ready in {time.monotonic() - t0:.0f}s (packages, binaries, images {t_prep:.0f}s; "
          + ", ".join(f"{k} {v}s" for k, v in steps.items()) + ")")
    for name, (ref, _) in images.items():
        print(f"  image {name}: {ref}")
    netpol = json.loads(NETPOL_STATUS.read_text())
    print(f"  NetworkPolicy: enforced by {netpol['agent']}" if netpol["enforced"]
          else f"  NetworkPolicy: NOT ENFORCED: {netpol['reason']}")
    print(f"  nodes: {', '.join(f'{n.name} {n.ip} (netns {n.netns})' for n in specs)}; "
          f"kubectl: python -m localenv.node kubectl get pods -o wide")
    print(f"  Kafka: {NODE_IP}:{KAFKA_PORT} in the namespace, kafka.kafka.svc:{KAFKA_PORT} from pods")
    print(f"  logs: {STATE_DIR / 'logs'}, {STATE_DIR / 'cp' / 'logs'}")
    return 0


def down(timeout: float = 60) -> int:
    pid = _serve_pid()
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _serve_pid() and time.monotonic() < deadline:
            time.sleep(0.25)
    host.sweep()
    left = {k: v for k, v in host.leftovers().items() if v}
    if left:
        print(f"node tier: left behind: {json.dumps(left, indent=2)}", file=sys.stderr)
        return 1
    print("node tier down: no process, mount, link, netns, iptables rule, cgroup or directory left")
    return 0


def _node(name: str) -> NodeSpec | None:
    """A node other than node 0 (which runs the control plane), or None after saying why not."""
    for n in running_nodes()[1:]:
        if n.name == name:
            return n
    others = ", ".join(n.name for n in running_nodes()[1:]) or "none: the tier runs one node"
    print(f"no node {name} to lose or bring back (the others than {NETNS}: {others})", file=sys.stderr)
    return None


def node_kill(name: str, keep_containers: bool) -> int:
    if (spec := _node(name)) is None:
        return 2
    host.cut_node(spec)
    killed = host.kill_node(spec, containers=not keep_containers)
    print(f"node {name}: link cut, {killed} processes killed"
          + (" (its agents; its pods' containers run on)" if keep_containers else ""))
    return 0


def node_start(name: str, timeout: float = 300) -> int:
    from localenv.node import kubelet

    if (spec := _node(name)) is None:
        return 2
    archives = [Path(a) for a in json.loads(ARCHIVES.read_text())]
    host.cut_node(spec, up=True)
    kubelet.launch(spec, IMAGES, archives, _k8s_bin())
    deadline = time.monotonic() + timeout
    while not (spec.run_dir / "ready").exists():
        if time.monotonic() > deadline:
            print(f"node {name} not back in {timeout:.0f}s; {spec.state_dir / 'serve.out'}", file=sys.stderr)
            return 1
        time.sleep(0.5)
    print(f"node {name} back")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the node tier (make cluster)")
    u.add_argument("--no-app-image", action="store_true", help="only the pause image (node Ready)")
    u.add_argument("--timeout", type=float, default=600)
    u.add_argument("--nodes", type=int, default=int(os.environ.get("EOPIPE_NODES") or 1),
                   help="how many nodes (node 0 also runs the control plane and the broker)")
    sub.add_parser("prep", help="build or fetch what up needs, start nothing (make node-prep)")
    sub.add_parser("down", help="stop it and remove everything it made (make cluster-down)")
    sub.add_parser("leftovers", help="what of the tier is on the host (JSON)")
    k = sub.add_parser("kubectl", help="kubectl inside the namespace")
    k.add_argument("args", nargs=argparse.REMAINDER)
    s = sub.add_parser("serve", help="(internal) run the processes; started by up in the namespace")
    s.add_argument("--images", type=Path, required=True, help="JSON: name -> image ref")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("archives", nargs="*", type=Path)
    sn = sub.add_parser("serve-node", help="(internal) one further node's processes; started in its namespace")
    sn.add_argument("--index", type=int, required=True)
    sn.add_argument("--images", type=Path, required=True)
    sn.add_argument("--kube-bin", type=Path, required=True)
    sn.add_argument("archives", nargs="*", type=Path)
    nk = sub.add_parser("node-kill", help="lose a node: its processes killed, its link cut")
    nk.add_argument("name")
    nk.add_argument("--keep-containers", action="store_true",
                    help="kill its agents only (containerd, kubelet, kube-proxy): its pods run on, cut off")
    sub.add_parser("node-start", help="bring a lost node back").add_argument("name")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kubectl"]:  # everything after it is kubectl's, options included
        args = argparse.Namespace(cmd="kubectl", args=argv[1:])
    else:
        args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("the node tier needs root (network namespace, mounts, cgroups)", file=sys.stderr)
        return 2
    if args.cmd == "up":
        if not 1 <= args.nodes <= MAX_NODES:
            print(f"--nodes: 1 to {MAX_NODES}, not {args.nodes}", file=sys.stderr)
            return 2
        return up(not args.no_app_image, args.timeout, args.nodes)
    if args.cmd == "prep":
        prep()
        return 0
    if args.cmd == "node-kill":
        return node_kill(args.name, args.keep_containers)
    if args.cmd == "node-start":
        return node_start(args.name)
    if args.cmd == "down":
        return down()
    if args.cmd == "leftovers":
        print(json.dumps(host.leftovers(), indent=2))
        return 0
    if args.cmd == "kubectl":
        return subprocess.run(kubectl_argv(*args.args), check=False).returncode
    if args.cmd == "serve-node":
        from localenv.node.kubelet import serve_node
        spec = running_nodes()[args.index]
        return serve_node(spec, json.loads(args.images.read_text()), args.archives, args.kube_bin)
    from localenv.node.cluster import serve
    return serve(args.images, args.archives, args.nodes)


if __name__ == "__main__":
    sys.exit(main())
