"""pytest plugin: CRDs installed on the local control plane, and the operator as a process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.localenv.kafka import free_port

REPO = Path(__file__).resolve().parents[2]
CRDS = [REPO / "crds" / "exactlyoncepipelines.eopipe.dev.yaml",
        REPO / "tests" / "crds" / "sparkapplications.sparkoperator.k8s.io.yaml"]


def kubectl(cp, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(cp.kubectl), "--kubeconfig", str(cp.kubeconfig), *args],
                         input=input, capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res


@pytest.fixture(scope="session")
def crds(control_plane):
    for path in CRDS:
        kubectl(control_plane, "apply", "--server-side", "-f", str(path))
    for path in CRDS:
        kubectl(control_plane, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(path))
    return control_plane


class OperatorProcess:
    def __init__(self, cp, namespace: str, workdir: Path):
        self.cp, self.namespace = cp, namespace
        self.log = workdir / f"operator-{namespace}.log"
        self.proc: subprocess.Popen | None = None
        self.health_port, self.metrics_port = free_port(), free_port()

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.cp.kubeconfig), "EOPIPE_RESYNC_SECONDS": "3",
               "EOPIPE_DELETE_ATTEMPTS": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eopipe.cli", "operator", "--namespace", self.namespace,
             "--bind", "127.0.0.1", "--health-port", str(self.health_port),
             "--metrics-port", str(self.metrics_port), "--verbose"],
            env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


@pytest.fixture
def operator(crds, running_node_agent, k8s_namespace, tmp_path, request):
    op = OperatorProcess(crds, k8s_namespace, tmp_path)
    request.node.stash[_OP_KEY] = op
    op.start()
    yield op
    op.stop()


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
