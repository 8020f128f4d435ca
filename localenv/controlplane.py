"""A real Kubernetes control plane run as local processes: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler (docs/design.md#the-local-environment).

The binaries are built from Go modules by hack/build-k8s.sh (cached by version). Everything a
control plane owns lives under its workdir:

    workdir/pki/            CA, apiserver serving cert, client certs, service-account key pair
                            (localenv/pki.py)
    workdir/etcd/           etcd data
    workdir/logs/<name>.log stdout+stderr of each process
    workdir/*.kubeconfig    admin (system:masters), controller-manager and scheduler identities

All listeners are on free loopback ports. The controller-manager and the scheduler use their own
client certificates (CN system:kube-controller-manager / system:kube-scheduler), so the default
RBAC bootstrap policy applies to them as in a real cluster; the controller-manager runs every
default controller with per-controller service-account credentials. There is no kubelet: Pods
are run by localenv/nodeagent/.

Each process runs in its own process group; stop() sends SIGTERM to the group, then SIGKILL.

    python -m localenv.controlplane up --workdir /tmp/cp    # for humans; Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from localenv import REPO_ROOT
from localenv.daemon import LoggedProcess, free_port, script_output
from localenv.pki import ensure_pki, write_kubeconfigs

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s.sh"

K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def ensure_k8s_binaries() -> dict[str, Path]:
    """Builds (once, cached) and returns the control-plane binaries by name.

    Keys: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd. The first build
    takes many minutes on a small machine; progress goes to stderr.
    """
    lines = script_output(BUILD_SCRIPT)
    k8s_bin, etcd_bin = Path(lines[-2]), Path(lines[-1])
    paths = {name: k8s_bin / name for name in K8S_COMMANDS}
    paths["etcd"] = etcd_bin / "etcd"
    for name, p in paths.items():
        if not os.access(p, os.X_OK):
            raise RuntimeError(f"{name} missing at {p} after {BUILD_SCRIPT}")
    return paths


def _urlopen(url: str, context: ssl.SSLContext | None = None, timeout: float = 5):
    # Loopback only: never through an HTTP(S)_PROXY from the environment.
    handlers = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers).open(url, timeout=timeout)


_ERROR_LINE = re.compile(r'^(Error:|[EF]\d{4} |panic:|\{"level":"(error|fatal|panic)")')


def _failure_report(path: Path, lines: int = 40) -> str:
    """The log's error lines (a flag error is followed by pages of usage), then its tail."""
    try:
        all_lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = [ln for ln in all_lines if _ERROR_LINE.match(ln)][-10:]
    head = ("error lines:\n" + "\n".join(errors) + "\n") if errors else ""
    return head + "last lines:\n" + "\n".join(all_lines[-lines:])


class ControlPlaneError(RuntimeError):
    pass


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback.

    `stop()` keeps the workdir (etcd data, certificates), so `start()` again resumes the same
    cluster on the same ports.
    """

    extra_san_ips: tuple[str, ...] = ()  # more addresses the apiserver is reached at

    def __init__(self, workdir: Path, binaries: dict[str, Path] | None = None):
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binaries = binaries or ensure_k8s_binaries()
        self.kubectl: Path = self.binaries["kubectl"]
        self.pki = self.workdir / "pki"
        self.logs_dir = self.workdir / "logs"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.kcm_port = free_port()
        self.scheduler_port = free_port()
        self.server: str = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.kubeconfig: Path = self.workdir / "admin.kubeconfig"
        self.ca_cert: Path = self.pki / "ca.crt"
        self._procs: list[LoggedProcess] = []
        self._lock = threading.Lock()
        self._atexit = False

    # -- public API --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.alive() for p in self._procs)

    def log_paths(self) -> dict[str, Path]:
        return {n: self.logs_dir / f"{n}.log"
                for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")}

    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG pointing at the admin kubeconfig (for subprocesses)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def start(self, timeout: float = 120) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        if self._procs:
            raise ControlPlaneError("control plane already started")
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        try:
            self._prepare()
            logs = self.log_paths()

            etcd = self._spawn("etcd", self._etcd_argv(), logs["etcd"])
            self._wait("etcd", deadline, etcd, self._etcd_healthy)

            apiserver = self._spawn("kube-apiserver", self._apiserver_argv(), logs["kube-apiserver"])
            self._wait("kube-apiserver /readyz", deadline, apiserver,
                       lambda: self._get("/readyz")[0] == 200, also=[etcd])

            # The controller-manager gives up if the apiserver is not healthy within seconds
            # of its start, so it starts once /readyz is ok.
            kcm = self._spawn("kube-controller-manager", self._kcm_argv(),
                              logs["kube-controller-manager"])
            sched = self._spawn("kube-scheduler", self._scheduler_argv(), logs["kube-scheduler"])
            every = [etcd, apiserver, kcm, sched]
            # The serviceaccount controller creates it: proof that the controllers run.
            self._wait("default ServiceAccount in namespace default", deadline, kcm,
                       lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default")[0]
                       == 200, also=every)
            self._wait("kube-scheduler /healthz", deadline, sched,
                       lambda: self._local_healthz(self.scheduler_port), also=every)
            self._wait("kube-controller-manager /healthz", deadline, kcm,
                       lambda: self._local_healthz(self.kcm_port), also=every)
        except BaseException:
            self.stop()
            raise
        print(f"control plane ready in {time.monotonic() - t0:.1f}s ({self.server})", flush=True)

    def stop(self) -> None:
        with self._lock:
            # Reverse start order: clients first, etcd last.
            for p in reversed(self._procs):
                p.stop()
            self._procs = []

    def kubectl_run(self, *args: str, check: bool = True, timeout: float = 60,
                    **kw) -> subprocess.CompletedProcess:
        """Runs kubectl with the admin kubeconfig; returns the CompletedProcess (text)."""
        return subprocess.run(
            [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            check=check, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, **kw,
        )

    def __enter__(self) -> "ControlPlane":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        ensure_pki(self.pki, self.extra_san_ips)
        write_kubeconfigs(self.workdir, self.pki, self.server)
        (self.workdir / "etcd").mkdir(exist_ok=True)
        os.chmod(self.workdir / "etcd", 0o700)
        self.logs_dir.mkdir(exist_ok=True)

    def _spawn(self, name: str, argv: list[str], log: Path) -> LoggedProcess:
        p = LoggedProcess(name, argv, log)
        with self._lock:
            self._procs.append(p)
        p.start()
        return p

    def _etcd_argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self.binaries["etcd"]),
            "--name=eopipe",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=eopipe={peer}",
            "--initial-cluster-state=new",
            # A throwaway test cluster: no fsync makes it much faster on slow disks.
            "--unsafe-no-fsync",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki
        return [
            str(self.binaries["kube-apiserver"]),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # The "kubernetes" Service cannot get a loopback endpoint (validation rejects
            # 127.0.0.1), so the apiserver does not try; local processes use `server` directly.
            "--endpoint-reconciler-type=none",
            # Aggregation layer / request-header authentication. Also lets the delegated
            # authentication of the controller-manager and scheduler find a complete
            # kube-system/extension-apiserver-authentication ConfigMap.
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--profiling=false",
        ]

    def _common_component_argv(self, kubeconfig: Path, port: int, certs: str) -> list[str]:
        return [
            f"--kubeconfig={kubeconfig}",
            # Delegated authn/authz of the component's own secure port, as kubeadm sets it up.
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / certs}",
            "--profiling=false",
        ]

    def _kcm_argv(self) -> list[str]:
        pki = self.pki
        return [
            str(self.binaries["kube-controller-manager"]),
            *self._common_component_argv(self.workdir / "controller-manager.kubeconfig",
                                         self.kcm_port, "kcm-serving"),
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            # CSR signing with the cluster CA (so CertificateSigningRequests really get issued).
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]

    def _scheduler_argv(self) -> list[str]:
        return [
            str(self.binaries["kube-scheduler"]),
            *self._common_component_argv(self.workdir / "scheduler.kubeconfig",
                                         self.scheduler_port, "scheduler-serving"),
        ]

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _get(self, path: str) -> tuple[int, str]:
        """GET on the apiserver as admin; (status, body), (0, error) when unreachable."""
        try:
            with _urlopen(self.server + path, self._ssl_context(), timeout=5) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as e:
            return 0, str(e)

    def _etcd_healthy(self) -> bool:
        try:
            with _urlopen(self.etcd_url + "/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    @staticmethod
    def _local_healthz(port: int) -> bool:
        # Components serve a self-signed cert; /healthz is always allowed anonymously.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            with _urlopen(f"https://127.0.0.1:{port}/healthz", ctx, timeout=2) as r:
                return r.status == 200
        except (OSError, ssl.SSLError):
            return False

    def _wait(self, what: str, deadline: float, proc: LoggedProcess, ok,
              also: list[LoggedProcess] = ()) -> None:
        while True:
            for p in (proc, *also):
                if not p.alive():
                    code = p.popen.returncode if p.popen else None
                    raise ControlPlaneError(
                        f"{p.name} exited (code {code}) while waiting for {what}; "
                        f"log {p.log}:\n{_failure_report(p.log)}")
            if ok():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out waiting for {what}; log {proc.log}:\n{_failure_report(proc.log)}")
            time.sleep(0.25)


# --- CLI -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.controlplane",
                                 description="Run the local Kubernetes control plane.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start it and keep it up until Ctrl-C")
    up.add_argument("--workdir", type=Path, required=True)
    up.add_argument("--timeout", type=float, default=120)
    sub.add_parser("build", help="build the binaries (cached) and print their paths")
    args = ap.parse_args(argv)

    if args.cmd == "build":
        for name, p in ensure_k8s_binaries().items():
            print(f"{name}\t{p}")
        return 0

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    # SIGINT and SIGTERM both stop it cleanly, also in the middle of start() (which then
    # cleans up). SIGINT is set explicitly: a shell starting us in the background ignores it.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cp = ControlPlane(args.workdir)
    code = 0
    try:
        cp.start(timeout=args.timeout)
        print(f"kubeconfig: {cp.kubeconfig}")
        print(f"kubectl:    {cp.kubectl}")
        print(f"logs:       {cp.logs_dir}")
        print(f"export KUBECONFIG={cp.kubeconfig}")
        print("up; Ctrl-C stops it", flush=True)
        while cp.running:
            time.sleep(1)
        dead = [p.name for p in cp._procs if not p.alive()]
        print(f"control-plane process exited: {', '.join(dead)}; stopping", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        pass
    finally:
        cp.stop()
        print("control plane stopped", flush=True)
    return code

if __name__ == "__main__":
    sys.exit(main())
