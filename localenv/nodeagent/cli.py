"""The agent as a process: `main` is `python -m localenv.nodeagent`, and NodeAgent is the
tests' handle that starts it and reads what its pods leave on disk."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from localenv import daemon
from localenv.nodeagent import podfiles
from localenv.nodeagent.agent import Agent
from localenv.nodeagent.kube import kv, log


class NodeAgent(daemon.HelperDaemon):
    """Runs the agent as a subprocess (`python -m localenv.nodeagent`).

    A subprocess, not threads in pytest: the agent's life is independent of the tests (a hung
    or failing test cannot stall pod supervision, and tests can stop/restart the "node"), it
    has its own GIL, and it watches the test process and exits (killing its pods) if pytest
    dies. Pod processes are reachable from tests through pid files.
    """

    module, name, pid_files, stop_timeout = "localenv.nodeagent", "nodeagent", "pods/*/pid", 20.0

    def __init__(self, kubeconfig: Path, workdir: Path, node_name: str = "eopipe-node-0",
                 extra_path: list[str] | None = None):
        super().__init__(workdir)
        self.kubeconfig = Path(kubeconfig)
        self.node_name = node_name
        self.extra_path = extra_path if extra_path is not None else [os.path.dirname(sys.executable)]

    def args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig), "--node-name", self.node_name,
                *(a for p in self.extra_path for a in ("--extra-path", p))]

    # ---------- helpers for tests ----------
    def pod_dir(self, namespace: str, pod: str) -> Path:
        return podfiles.pod_dir(self.workdir, namespace, pod)

    def volume_dir(self, namespace: str, claim: str) -> Path:
        return podfiles.claim_dir(self.workdir, namespace, claim)

    def pod_pid(self, namespace: str, pod: str) -> int | None:
        return podfiles.read_pid(self.pod_dir(namespace, pod))

    def kill_pod_process(self, namespace: str, pod: str, sig: int = signal.SIGKILL,
                         group: bool = True) -> int:
        """Sends `sig` to the pod's process group (or only its main process). Returns the pid."""
        pid = self.pod_pid(namespace, pod)
        if pid is None:
            raise ProcessLookupError(f"pod {namespace}/{pod} has no running process")
        (os.killpg if group else os.kill)(pid, sig)
        return pid

    def pod_logs(self, namespace: str, pod: str) -> str:
        return podfiles.read_logs(self.pod_dir(namespace, pod))


def main(argv: list[str] | None = None) -> int:
    ap = daemon.helper_parser("localenv.nodeagent", "A test-only node agent: plays kubelet for one Node by "
                                                    "running pods as local processes.", "killing pods")
    ap.add_argument("--kubeconfig", required=True, type=Path)
    ap.add_argument("--node-name", default="eopipe-node-0")
    ap.add_argument("--extra-path", action="append", default=None,
                    help="prepended to pods' PATH (repeatable; default: dir of this python)")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=str(args.workdir / "nodeagent.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s [%(threadName)s] %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    extra = args.extra_path if args.extra_path is not None else [os.path.dirname(sys.executable)]
    agent = Agent(args.kubeconfig, args.workdir, args.node_name, extra)
    done = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info(kv(event="agent.signal", signal=signal.Signals(signum).name))
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(kv(event="agent.starting", node=args.node_name, pid=os.getpid(), server=agent.kube.server))
    try:
        agent.run()
        while not done.wait(2.0):
            if args.parent_pid and os.getppid() != args.parent_pid:
                log.warning(kv(event="agent.parent_gone", parent=args.parent_pid))
                break
    finally:
        agent.shutdown()
    return 0
