"""Argo CD's own application controller and repo server, run as local processes against a
control plane (localenv/controlplane.py), with the Redis and the git server they need:

    workdir/git/<repo>.git   the bare repository `git daemon` serves at repo_url (read-only;
                             commit() pushes to it through the file system)
    workdir/checkout/        the working copy commit() writes and pushes from
    workdir/logs/<name>.log  redis, git-daemon, repo-server, application-controller
    workdir/repo-server/     the repo server's HOME and TMPDIR (its git clones, helm's caches)
    workdir/controller.kubeconfig  the controller's identity (below)

The binary is Argo CD v3.2 built by `hack/build-tools.sh argocd` (hack/argocd/main.go: only the
controller, the repo server and git's credential helper; no API server or UI). Without the API
server, Applications are created and read with kubectl, and the `default` AppProject, which the
API server would create, is created here.

In the argocd namespace: Argo CD's CRDs, ConfigMaps, Secret and the application controller's
ServiceAccount and RBAC, from the core install manifest of the same module (so as upstream
ships them), with argocd-cm's data merged with the snippet of argocd/README.md (eopipe's
health check, the one the docs tell users to add).

Cluster credentials: the controller runs as its own ServiceAccount (a token from the
TokenRequest API in controller.kubeconfig), given two ways because Argo CD reads two:
`--kubeconfig` (+ `--namespace argocd`) for its own client (Applications, settings), and
KUBECONFIG with ARGOCD_FAKE_IN_CLUSTER=true for the in-cluster destination
https://kubernetes.default.svc, which otherwise needs a pod's rest.InClusterConfig (what
`argocd admin` and Argo CD's core mode do off-cluster).

Git is served by `git daemon` (git://, anonymous, no credentials). Argo CD polls it every
`app_resync` seconds (ARGOCD_RECONCILIATION_TIMEOUT, upstream's default 120 s plus up to 60 s
jitter; here no jitter); refresh() asks for an immediate look, as a git webhook would.

    argo = ArgoCD(workdir, cp.kubeconfig, cp.kubectl); argo.start()
    argo.commit({"chart/Chart.yaml": ..., "chart/templates/cm.yaml": ...}, "add chart")
    argo.kubectl("apply", "-f", "app.yaml"); argo.wait_app("demo", revision=sha)

On the node tier, whose API server has addresses only in node 0's network namespace, the same
processes run there as a helper daemon (`python -m localenv.argocd`, started by ArgoCDDaemon
through nsenter), and the test drives them with ArgoCD.attached(): git through the file
system, kubectl through nsenter.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from localenv import REPO_ROOT
from localenv.daemon import HelperDaemon, LoggedProcess, free_port, helper_parser, last_lines
from localenv.node.host import ensure_packages

BUILD_TOOLS = REPO_ROOT / "hack" / "build-tools.sh"
README = REPO_ROOT / "argocd" / "README.md"
ARGO_MODULE = "github.com/argoproj/argo-cd/v3"
NAMESPACE = "argocd"
CONTROLLER = "argocd-application-controller"


def build_tool(name: str) -> Path:
    """A hack/build-tools.sh binary (built once from the Go module proxy, cached)."""
    out = subprocess.run(["bash", str(BUILD_TOOLS), name], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1]) / name


def argo_module_dir() -> Path:
    """The argo-cd module hack/argocd builds (its manifests are read from there, not copied)."""
    out = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", ARGO_MODULE], cwd=REPO_ROOT / "hack" / "argocd",
                         check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip())


def install_objects(module_dir: Path) -> list[dict]:
    """What the argocd namespace needs from upstream's core install: CRDs, ConfigMaps, the
    Secret, and the controller's ServiceAccount/RBAC (the Deployments are our processes)."""
    docs = yaml.safe_load_all((module_dir / "manifests" / "core-install.yaml").read_text())
    keep = []
    for d in filter(None, docs):
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in ("CustomResourceDefinition", "ConfigMap", "Secret") or \
                (name == CONTROLLER and kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                                 "ClusterRoleBinding")):
            if kind not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
                d["metadata"]["namespace"] = NAMESPACE
            if kind in ("RoleBinding", "ClusterRoleBinding"):
                for s in d.get("subjects", []):
                    s["namespace"] = NAMESPACE
            keep.append(d)
    return keep


def eopipe_argocd_cm() -> dict:
    """The argocd-cm of argocd/README.md (eopipe's documented health customization)."""
    m = re.search(r"```yaml\n(apiVersion: v1\nkind: ConfigMap.*?)```", README.read_text(), re.S)
    if not m:
        raise RuntimeError(f"{README} has no argocd-cm snippet")
    return yaml.safe_load(m.group(1))


# What argocd-server creates on its first start (util/db, project "default").
DEFAULT_PROJECT = {
    "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
    "metadata": {"name": "default", "namespace": NAMESPACE},
    "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
             "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
}


class ArgoCDError(RuntimeError):
    pass


class ArgoCD:
    def __init__(self, workdir: Path, kubeconfig: Path, kubectl: Path, repo: str = "eopipe",
                 app_resync: int = 30, loglevel: str = "info", persist_resource_health: bool = True,
                 kubectl_argv: list[str] | None = None):
        self.workdir = Path(workdir).resolve()
        self.kubeconfig, self.kubectl_bin = Path(kubeconfig), Path(kubectl)
        self.kubectl_argv = kubectl_argv or [str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig)]
        self.app_resync, self.loglevel, self.persist_resource_health = app_resync, loglevel, persist_resource_health
        self.binary = self.helm = Path()  # start() builds them (cached)
        self.logs_dir = self.workdir / "logs"
        self.bare = self.workdir / "git" / f"{repo}.git"
        self.checkout = self.workdir / "checkout"
        self.controller_kubeconfig = self.workdir / "controller.kubeconfig"
        self.redis_port, self.git_port = free_port(), free_port()
        self.repo_port, self.repo_metrics_port, self.controller_metrics_port = free_port(), free_port(), free_port()
        self.repo_url = f"git://127.0.0.1:{self.git_port}/{repo}.git"
        self.procs: dict[str, LoggedProcess] = {}

    @classmethod
    def attached(cls, workdir: Path, kubectl_argv: list[str]) -> "ArgoCD":
        """The test's handle on an Argo CD that `python -m localenv.argocd` runs (ArgoCDDaemon):
        its git repository and Applications, from its workdir's `ready` file."""
        ready = json.loads((Path(workdir) / "ready").read_text())
        a = cls(workdir, Path(), Path(), kubectl_argv=kubectl_argv)
        a.repo_url = ready["repo_url"]
        return a

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        atexit.register(self.stop)  # as ControlPlane: nothing outlives the Python process
        try:
            self.binary, self.helm = build_tool("argocd"), build_tool("helm")
            ensure_packages({"redis-server": "redis-server"})  # Argo CD's cache, from Debian
            self._prepare_git()
            self._spawn("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port),
                                  # A cache only, as upstream runs it: no persistence.
                                  "--save", "", "--appendonly", "no", "--dir", str(self.workdir)])
            self._spawn("git-daemon", ["git", "daemon", "--reuseaddr", "--export-all", "--informative-errors",
                                       "--listen=127.0.0.1", f"--port={self.git_port}",
                                       f"--base-path={self.bare.parent}", str(self.bare.parent)])
            self._wait("redis", deadline, lambda: self._redis_ping())
            self._wait("git-daemon", deadline, lambda: subprocess.run(
                ["git", "ls-remote", self.repo_url], capture_output=True).returncode == 0)
            self._install()
            self._spawn("repo-server", self._repo_server_argv())
            self._wait("repo-server", deadline, lambda: self._healthz(self.repo_metrics_port, "?full=true"))
            self._spawn("application-controller", self._controller_argv())
            self._wait("application-controller", deadline, lambda: self._healthz(self.controller_metrics_port))
        except BaseException:
            self.stop()
            raise
        print(f"argocd ready in {time.monotonic() - t0:.1f}s (git {self.repo_url})", flush=True)

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()
            (self.workdir / "pids" / p.name).unlink(missing_ok=True)
        self.procs = {}

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of each process (its group leader), in MiB."""
        out = {}
        for name, p in self.procs.items():
            if p.alive():
                m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p.popen.pid}/status").read_text())
                out[name] = int(m.group(1)) / 1024 if m else 0.0
        return out

    # -- git -----------------------------------------------------------------------------------

    def commit(self, files: dict[str, str | None], message: str) -> str:
        """Writes files (None removes one) in the checkout, commits, pushes; returns the sha."""
        for rel, text in files.items():
            path = self.checkout / rel
            if text is None:
                self._git("rm", "-rq", "--ignore-unmatch", rel)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                self._git("add", rel)
        self._git("commit", "-qm", message, "--allow-empty")
        self._git("push", "-q", "origin", "HEAD:main")
        return self._git("rev-parse", "HEAD").strip()

    @staticmethod
    def tree(src: Path, dest: str) -> dict[str, str]:
        """The files under src as commit() takes them, at dest/ in the repository (e.g. this
        repository's charts/eopipe, laid out as a user's GitOps repository holds it)."""
        src = Path(src)
        return {f"{dest}/{f.relative_to(src)}": f.read_text() for f in sorted(src.rglob("*")) if f.is_file()}

    # -- Applications --------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        r = subprocess.run([*self.kubectl_argv, *args], input=input, capture_output=True, text=True, timeout=60)
        if check and r.returncode:
            raise ArgoCDError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def apply(self, objects: list[dict]) -> None:
        # Server-side: Argo CD's Application CRD is too large for client-side apply's annotation.
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def app(self, name: str) -> dict:
        return json.loads(self.kubectl("-n", NAMESPACE, "get", "application", name, "-o", "json"))

    def refresh(self, name: str, kind: str = "normal") -> None:
        """Asks the controller to compare with git now (what the UI's Refresh or a webhook does;
        `hard`: its manifest and diff caches dropped too)."""
        self.kubectl("-n", NAMESPACE, "annotate", "--overwrite", "application", name,
                     f"argocd.argoproj.io/refresh={kind}")

    def compare_now(self, name: str, kind: str = "normal", timeout: float = 120) -> dict:
        """refresh(), then the Application once the controller has compared it (the annotation
        gone) and no sync of it is under way: a sync the comparison started (self-heal) has
        ended. The controller sets `operation` before it drops the annotation."""
        self.refresh(name, kind)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            app = self.app(name)
            if ("argocd.argoproj.io/refresh" not in (app["metadata"].get("annotations") or {})
                    and "operation" not in app
                    and (app["status"].get("operationState") or {}).get("phase") != "Running"):
                return app
            time.sleep(0.5)
        raise ArgoCDError(f"Application {name} not compared again after {timeout}s\n{self.tail()}")

    @staticmethod
    def last_sync(app: dict) -> int:
        """The id of the Application's last sync in its history (-1: none yet)."""
        return max((h["id"] for h in app["status"].get("history") or []), default=-1)

    def wait_app(self, name: str, sync: str = "Synced", health: str | None = "Healthy",
                 revision: str | None = None, timeout: float = 120) -> dict:
        """Waits until the Application's status has this sync and health status (None: any) and
        synced revision; returns the Application."""
        deadline, last = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = self.app(name)
            except ArgoCDError as e:  # not made yet (an app-of-apps' later wave)
                if "NotFound" not in str(e):
                    raise
                time.sleep(0.5)
                continue
            st = last.get("status", {})
            if (st.get("sync", {}).get("status") == sync and health in (None, st.get("health", {}).get("status"))
                    and (revision is None or st.get("sync", {}).get("revision") == revision)):
                return last
            time.sleep(0.5)
        raise ArgoCDError(f"Application {name} not {sync}/{health}@{revision} after {timeout}s: "
                          f"{json.dumps(last.get('status'), indent=1)[:3000]}\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        return "".join(f"--- {log}\n{last_lines(log, n)}\n" for log in sorted(self.logs_dir.glob("*.log")))

    # -- internals -----------------------------------------------------------------------------

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        r = subprocess.run(["git", "-c", "user.name=eopipe-test", "-c", "user.email=test@eopipe.invalid", *args],
                           cwd=cwd or self.checkout, capture_output=True, text=True)
        if r.returncode:
            raise ArgoCDError(f"git {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def _prepare_git(self) -> None:
        if not self.bare.exists():
            self.bare.parent.mkdir(parents=True, exist_ok=True)
            self._git("init", "-q", "--bare", "-b", "main", str(self.bare), cwd=self.workdir)
        if not self.checkout.exists():
            self._git("clone", "-q", str(self.bare), str(self.checkout), cwd=self.workdir)
            self._git("checkout", "-q", "-B", "main")
        if not self._git("ls-remote", str(self.bare)).strip():
            self.commit({"README.md": "GitOps repository of the eopipe tests.\n"}, "initial commit")

    def _install(self) -> None:
        objs = install_objects(argo_module_dir())
        ours = eopipe_argocd_cm()
        for o in objs:
            if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "argocd-cm":
                # Upstream's exclusions and ignoreResourceUpdates stay; eopipe's keys are added.
                o["data"] = {**(o.get("data") or {}), **ours["data"]}
                o["metadata"].setdefault("labels", {}).update(ours["metadata"].get("labels", {}))
        self.kubectl("create", "namespace", NAMESPACE, check=False)
        self.apply(objs)
        # Polled: `kubectl wait --for=condition=Established` fails outright while a new CRD has
        # no status.conditions yet (".status.conditions accessor error: <nil>").
        crds = [f"crd/{o['metadata']['name']}" for o in objs if o["kind"] == "CustomResourceDefinition"]
        self._wait("Argo CD's CRDs Established", time.monotonic() + 60, lambda: self.kubectl(
            "get", *crds, "-o", 'jsonpath={.items[*].status.conditions[?(@.type=="Established")].status}',
            check=False).split() == ["True"] * len(crds))
        self.apply([DEFAULT_PROJECT])
        token = self.kubectl("-n", NAMESPACE, "create", "token", CONTROLLER, "--duration=48h").strip()
        cfg = yaml.safe_load(self.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "yaml"))
        cfg["users"] = [{"name": CONTROLLER, "user": {"token": token}}]
        cfg["contexts"][0]["context"].update(user=CONTROLLER, namespace=NAMESPACE)
        self.controller_kubeconfig.write_text(yaml.safe_dump(cfg))
        self.controller_kubeconfig.chmod(0o600)

    def _env_argv(self, binary_name: str, **env: str) -> list[str]:
        # LoggedProcess passes our environment on; env(1) adds to it without a shell.
        path = os.pathsep.join([str(self.binary.parent), str(self.helm.parent), os.environ.get("PATH", "")])
        return ["env", f"PATH={path}", f"ARGOCD_BINARY_NAME={binary_name}",
                # argocd-cm's timeout.reconciliation as upstream's manifests pass it to both: the
                # controller's git poll period and the repo server's cache of branch heads (3 min
                # by default: a shorter poll alone would still see the old commit).
                f"ARGOCD_RECONCILIATION_TIMEOUT={self.app_resync}s",
                *[f"{k}={v}" for k, v in env.items()], str(self.binary)]

    def _repo_server_argv(self) -> list[str]:
        home = self.workdir / "repo-server"
        for d in ("tmp", "gpg", "ssh", "tls"):
            (home / d).mkdir(parents=True, exist_ok=True)
        return [
            *self._env_argv(
                "argocd-repo-server",
                HOME=str(home), TMPDIR=str(home / "tmp"),  # its clones and helm's caches
                # The image's /app/config paths do not exist here; GnuPG is not used.
                ARGOCD_GPG_ENABLED="false", ARGOCD_GNUPGHOME=str(home / "gpg"),
                ARGOCD_SSH_DATA_PATH=str(home / "ssh"), ARGOCD_TLS_DATA_PATH=str(home / "tls")),
            "--address=127.0.0.1", f"--port={self.repo_port}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.repo_metrics_port}",
            "--disable-tls", f"--redis=127.0.0.1:{self.redis_port}",
            "--logformat=text", f"--loglevel={self.loglevel}",
        ]

    def _controller_argv(self) -> list[str]:
        kc = str(self.controller_kubeconfig)
        return [
            *self._env_argv(CONTROLLER, KUBECONFIG=kc, ARGOCD_FAKE_IN_CLUSTER="true"),
            f"--kubeconfig={kc}", f"--namespace={NAMESPACE}",
            f"--repo-server=127.0.0.1:{self.repo_port}", "--repo-server-plaintext",
            f"--redis=127.0.0.1:{self.redis_port}",
            f"--metrics-port={self.controller_metrics_port}",
            # No jitter (default up to 60 s more): a test waits at most app_resync for a poll.
            "--app-resync-jitter=0",
            # Each resource's health (status and the health check's message) in the Application's
            # status.resources, as before v3.0: with no API server, kubectl can read it only there.
            f"--persist-resource-health={str(self.persist_resource_health).lower()}",
            "--logformat=text", f"--loglevel={self.loglevel}",
        ]

    def _spawn(self, name: str, argv: list[str]) -> None:
        p = LoggedProcess(name, argv, self.logs_dir / f"{name}.log")
        self.procs[name] = p
        p.start()
        # Its process group, for HelperDaemon.stop() should the daemon running it be killed.
        (self.workdir / "pids").mkdir(parents=True, exist_ok=True)
        (self.workdir / "pids" / name).write_text(str(p.popen.pid))

    def _check_alive(self) -> None:
        for p in self.procs.values():
            if not p.alive():
                raise ArgoCDError(f"{p.name} exited (code {p.popen.returncode if p.popen else None}); "
                                  f"log {p.log}:\n{last_lines(p.log, 40)}")

    def _wait(self, what: str, deadline: float, ok) -> None:
        while not ok():
            self._check_alive()
            if time.monotonic() > deadline:
                raise ArgoCDError(f"timed out waiting for {what}\n{self.tail()}")
            time.sleep(0.25)

    def _redis_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @staticmethod
    def _healthz(port: int, query: str = "") -> bool:
        # Loopback only: never through an HTTP(S)_PROXY from the environment.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://127.0.0.1:{port}/healthz{query}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


# -- as a helper daemon (the node tier) ------------------------------------------------------

class ArgoCDDaemon(HelperDaemon):
    """Argo CD run by `python -m localenv.argocd` through `wrap` (nsenter into the node tier's
    network namespace); ready once every process answers, its git repository in workdir."""

    module, name, pid_files, stop_timeout = "localenv.argocd", "argocd", "pids/*", 30.0

    def __init__(self, workdir: Path, kubeconfig: Path, kubectl: Path, wrap: tuple[str, ...], app_resync: int = 30):
        super().__init__(workdir, wrap)
        self.kubeconfig, self.kubectl, self.app_resync = kubeconfig, kubectl, app_resync

    def args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig), "--kubectl", str(self.kubectl),
                "--app-resync", str(self.app_resync)]

    @staticmethod
    def prepare() -> None:
        """What start() would fetch, fetched where the network is (the tier's namespace has
        none): Redis from Debian, the binaries and the argo-cd module from the Go proxy."""
        ensure_packages({"redis-server": "redis-server"})
        for tool in ("argocd", "helm"):
            build_tool(tool)
        argo_module_dir()


def main(argv: list[str] | None = None) -> int:
    ap = helper_parser("localenv.argocd", "Argo CD's controller and repo server, Redis and a git server, until "
                                          "SIGTERM (the node tier's GitOps tests).", "stopping Argo CD")
    ap.add_argument("--kubeconfig", required=True, type=Path)
    ap.add_argument("--kubectl", required=True, type=Path)
    ap.add_argument("--app-resync", type=int, default=30)
    args = ap.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    argo = ArgoCD(args.workdir, args.kubeconfig, args.kubectl, app_resync=args.app_resync)
    argo.start(timeout=300)
    tmp = args.workdir / "ready.tmp"
    tmp.write_text(json.dumps({"repo_url": argo.repo_url}))
    tmp.rename(args.workdir / "ready")
    try:
        while not done.wait(1):
            if args.parent_pid and os.getppid() != args.parent_pid:
                print(f"parent {args.parent_pid} gone: stopping", flush=True)
                break
            gone = [p.name for p in argo.procs.values() if not p.alive()]
            if gone:
                print(f"exited: {gone}\n{argo.tail()}", file=sys.stderr, flush=True)
                return 1
    finally:
        argo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
