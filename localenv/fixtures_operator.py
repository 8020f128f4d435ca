"""pytest plugin: CRDs installed on the local control plane, and the operator as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localenv import REPO_ROOT, daemon

CRDS = [REPO_ROOT / "crds" / "exactlyoncepipelines.eopipe.dev.yaml",
        REPO_ROOT / "localenv" / "crds" / "sparkapplications.sparkoperator.k8s.io.yaml"]


def kubectl(cp, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    res = cp.kubectl_run(*args, input=input, check=False, timeout=120)
    if check and res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res


def wait_established(cp, *target: str, timeout: float = 60) -> None:
    """`kubectl wait --for=condition=Established` on CRDs, from right after their creation: a CRD
    whose status has no conditions yet makes kubectl wait fail at once ("status.conditions
    accessor error: <nil>"), not wait; so it is asked again until the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        res = kubectl(cp, "wait", "--for=condition=Established", f"--timeout={timeout:.0f}s", *target, check=False)
        if res.returncode == 0:
            return
        if "accessor error" not in res.stderr or time.monotonic() > deadline:
            raise RuntimeError(f"kubectl wait Established {' '.join(target)} failed ({res.returncode}):\n{res.stderr}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def crds(control_plane):
    for path in CRDS:
        kubectl(control_plane, "apply", "--server-side", "-f", str(path))
    for path in CRDS:
        wait_established(control_plane, "-f", str(path))
    return control_plane


class OperatorProcess:
    def __init__(self, cp, namespace: str, workdir: Path, name: str = "operator", env: dict | None = None):
        self.cp, self.namespace, self.name = cp, namespace, name
        self.namespaces = [namespace]  # watched (--namespace each); a test may add one and restart
        self.env = dict(env or {})     # extra environment (e.g. leader election's settings)
        self.log = workdir / f"{name}-{namespace}.log"
        self.proc: subprocess.Popen | None = None
        self.health_port, self.metrics_port = daemon.free_port(), daemon.free_port()

    def start(self) -> None:
        # Shorter than production: tests wait seconds, not minutes (a worker's own transaction
        # lasts ~0.1 s and a killed one's is aborted when its partition restarts).
        env = {**os.environ, "KUBECONFIG": str(self.cp.kubeconfig), "EOPIPE_RESYNC_SECONDS": "3",
               "EOPIPE_DELETE_ATTEMPTS": "3", "EOPIPE_HANGING_TRANSACTION_SECONDS": "15", **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eopipe.tools.cli", "operator",
             *(f"--namespace={ns}" for ns in self.namespaces), "--bind", "127.0.0.1", "--health-port", str(self.health_port),
             "--metrics-port", str(self.metrics_port), "--verbose"],
            env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, kill: bool = False) -> None:
        daemon.terminate(self.proc, 30, signal.SIGKILL if kill else signal.SIGTERM)

    def tail(self, n: int = 60) -> str:
        return daemon.last_lines(self.log, n)


@pytest.fixture
def operator(crds, running_node_agent, k8s_namespace, tmp_path, request):
    op = OperatorProcess(crds, k8s_namespace, tmp_path)
    request.node.stash[_OP_KEY] = op
    op.start()
    yield op
    # Killed, not stopped: nothing is checked of its exit here (tests that need a clean stop call
    # stop() themselves), and Kopf's graceful stop waits for the pass in flight (0.3-4.5 s a test).
    op.stop(kill=True)


_OP_KEY = pytest.StashKey[OperatorProcess]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    op = item.stash.get(_OP_KEY, None)
    if op is not None and rep.failed:
        rep.sections.append((f"operator log (tail of {op.log})", op.tail()))


def wait_for(fn, timeout: float = 120, interval: float = 1.0, what: str = "condition"):
    """Polls fn until it returns a truthy value; bounded."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")
