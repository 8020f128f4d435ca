"""`python -m localenv.node up|down|status|kubectl ...|leftovers` (make cluster / cluster-down).

up: installs the Debian packages when missing, builds (or takes from the cache) kubelet,
kube-proxy, the images and the Spark Operator (its chart from the Go module cache; with
EOPIPE_SPARK_WEBHOOK=0, installed with its webhook disabled), creates the network namespace and the cgroup root, and starts
`serve` inside the namespace, detached; returns once the node is Ready. down: stops it and
sweeps whatever is left; exits 1 if anything of the tier is still on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localenv import REPO_ROOT
from localenv.node import NETNS, NETPOL_STATUS, NODE_IP, RUN_DIR, STATE_DIR, host
from localenv.node.addons import KAFKA_PORT

PIDFILE = RUN_DIR / "serve.pid"
IMAGES = RUN_DIR / "images.json"  # {"pause": ref, "app": ref, ...}: what the node and tests run
SERVE_OUT = STATE_DIR / "serve.out"
KUBECONFIG = STATE_DIR / "cp" / "admin.kubeconfig"


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
    return ["nsenter", f"--net={host.NETNS_PATH}", "--", str(kubectl), f"--kubeconfig={KUBECONFIG}", *args]


def kill_container(ns: str, pod: str) -> str:
    """SIGKILL to the pod's (first) container through containerd, as an OOM kill or a crash does:
    the kubelet sees it exit and restarts it or fails the pod. Returns the container id."""
    from localenv.node import CONTAINERD_SOCK

    res = subprocess.run(kubectl_argv("-n", ns, "get", "pod", pod, "-o",
                                      "jsonpath={.status.containerStatuses[0].containerID}"),
                         check=True, capture_output=True, text=True)
    cid = res.stdout.strip().removeprefix("containerd://")
    if not cid:
        raise RuntimeError(f"pod {ns}/{pod} has no running container")
    subprocess.run(["ctr", "--address", str(CONTAINERD_SOCK), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", cid],
                   check=True, capture_output=True)
    return cid


def _k8s_bin(quiet: bool = True) -> Path:
    out = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-k8s.sh"), "--node"], check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else None,
                         text=True).stdout.split()
    return Path(out[-2])


def up(app_image: bool, timeout: float) -> int:
    from localenv.kafka import ensure_kafka_jars
    from localenv.node.images import ensure_images

    t0 = time.monotonic()
    if _serve_pid():
        print(f"node tier already running (pid {_serve_pid()})")
        return 0
    if installed := host.ensure_packages():
        print(f"installed Debian packages: {' '.join(installed)}")
    _k8s_bin(quiet=False)
    ensure_kafka_jars()  # before the namespace: it has no route to Maven
    images = ensure_images(app=app_image, spark=app_image)
    t_prep = time.monotonic() - t0
    if any(host.leftovers().values()):  # a crashed run: start clean
        host.sweep()
    for d in (STATE_DIR, RUN_DIR):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
    host.save_sysctls()
    host.ensure_netns()
    host.ensure_cgroups(host.node_cgroup_root())
    archives = [str(p) for _, p in images.values()]
    if "spark-operator" in images:
        from localenv.node.cluster import SPARK_OPERATOR_CONF
        from localenv.node.sparkoperator import chart_dir

        # Resolved here: the namespace has no route to the Go module proxy.
        helm = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "helm"], check=True, text=True,
                              stdout=subprocess.PIPE).stdout.split()[-1]
        SPARK_OPERATOR_CONF.write_text(json.dumps({"helm": f"{helm}/helm", "chart": str(chart_dir()),
                                                   "webhook": os.environ.get("EOPIPE_SPARK_WEBHOOK", "1") != "0"}))
    IMAGES.write_text(json.dumps({name: ref for name, (ref, _) in images.items()}) + "\n")
    argv = ["nsenter", f"--net={host.NETNS_PATH}", "--", sys.executable, "-m", "localenv.node", "serve",
            "--images", str(IMAGES), *archives]
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
    print(f"  network namespace {NETNS}; kubectl: python -m localenv.node kubectl get pods -o wide")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the node tier (make cluster)")
    u.add_argument("--no-app-image", action="store_true", help="only the pause image (node Ready)")
    u.add_argument("--timeout", type=float, default=300)
    sub.add_parser("down", help="stop it and remove everything it made (make cluster-down)")
    sub.add_parser("leftovers", help="what of the tier is on the host (JSON)")
    k = sub.add_parser("kubectl", help="kubectl inside the namespace")
    k.add_argument("args", nargs=argparse.REMAINDER)
    s = sub.add_parser("serve", help="(internal) run the processes; started by up in the namespace")
    s.add_argument("--images", type=Path, required=True, help="JSON: name -> image ref")
    s.add_argument("archives", nargs="*", type=Path)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kubectl"]:  # everything after it is kubectl's, options included
        args = argparse.Namespace(cmd="kubectl", args=argv[1:])
    else:
        args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("the node tier needs root (network namespace, mounts, cgroups)", file=sys.stderr)
        return 2
    if args.cmd == "up":
        return up(not args.no_app_image, args.timeout)
    if args.cmd == "down":
        return down()
    if args.cmd == "leftovers":
        print(json.dumps(host.leftovers(), indent=2))
        return 0
    if args.cmd == "kubectl":
        return subprocess.run(kubectl_argv(*args.args), check=False).returncode
    from localenv.node.cluster import serve
    return serve(json.loads(args.images.read_text()), args.archives)


if __name__ == "__main__":
    sys.exit(main())
