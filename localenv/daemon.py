"""Local processes of the harness, handled one way: process groups signalled and stopped,
supervised processes that log to a file and die with their parent, helper daemons (node agent,
Spark runner) started and stopped, log tails, free loopback ports, and the hack/ scripts that
fetch or build what the harness runs."""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from localenv import REPO_ROOT


def signal_group(pgid: int, sig: int) -> None:
    """Signals a process group that may be gone already."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen, grace: float, first: int = signal.SIGTERM,
               reap: float | None = None) -> int | None:
    """Stops the process group `proc` leads: `first` while the leader runs, up to `grace`
    seconds for it to exit, then SIGKILL to whatever is left of the group (the leader, or
    anything it spawned). Returns the exit code, None if the leader outlives `reap` more
    seconds (None: wait for it)."""
    if proc.poll() is None:
        signal_group(proc.pid, first)
        try:
            proc.wait(max(grace, 0.0))
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(reap)
    except subprocess.TimeoutExpired:
        return None


def kill_groups(pidfiles: Iterable[Path]) -> None:
    """SIGKILL to the process group named in each pid file, which is then removed."""
    for pidfile in pidfiles:
        try:
            os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, FileNotFoundError):
            pass
        pidfile.unlink(missing_ok=True)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if the Python process that started us dies without
    # cleaning up (SIGKILL of pytest), the kernel kills us too. (Process group: start_new_session.)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort
        pass


class LoggedProcess:
    """A named process in its own process group, appending its output to a log file."""

    def __init__(self, name: str, argv: list[str], log: Path):
        self.name, self.argv, self.log = name, argv, log
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            # PDEATHSIG fires when the *thread* that forked exits, so only use it from the main
            # thread (a process started from a helper thread must outlive that thread).
            in_main = threading.current_thread() is threading.main_thread()
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent if in_main else None,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is not None:
            stop_group(self.popen, grace, reap=5)
            self.popen = None


def spawn(cmd: list[str], workdir: Path, name: str, timeout: float,
          tail: Callable[[], str], stop: Callable[[], None]) -> subprocess.Popen:
    """Runs cmd in its own session with the repo importable, output to <workdir>/<name>.out,
    and waits until it creates <workdir>/ready. On a time-out: kill it, stop(), raise with tail()."""
    ready = workdir / "ready"
    ready.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with open(workdir / f"{name}.out", "ab") as out:
        proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail()}")
        if time.monotonic() > deadline:
            terminate(proc, 10)
            stop()  # the owner's own cleanup (leftover process groups)
            raise TimeoutError(f"{name} not ready after {timeout}s:\n{tail()}")
        time.sleep(0.1)
    return proc


def terminate(proc: subprocess.Popen | None, timeout: float, sig: int = signal.SIGTERM) -> None:
    """`sig` to the process alone (it cleans up its own children), SIGKILL after timeout;
    idempotent."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def helper_parser(module: str, description: str, on_parent_exit: str) -> argparse.ArgumentParser:
    """The command line of a helper daemon: what HelperDaemon.start passes every one of them."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--parent-pid", type=int, default=0, help=f"exit ({on_parent_exit}) when it dies")
    return ap


class HelperDaemon:
    """Test-side handle of a helper daemon run as `python -m <module> --workdir W --parent-pid P
    ...`: it exits (stopping what it runs) when the test process dies or on SIGTERM, and
    stop() then kills any process group it left in its pid files."""

    module = ""          # what `python -m` runs
    name = ""            # <workdir>/<name>.out (stdout+stderr) and <name>.log (its log)
    pid_files = ""       # glob under workdir of the pid files of what it runs
    stop_timeout = 20.0  # SIGTERM to SIGKILL

    def __init__(self, workdir: Path, wrap: tuple[str, ...] = ()):
        self.workdir = Path(workdir)
        self.wrap = wrap  # runs the daemon through it, e.g. nsenter into the node tier's network
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / f"{self.name}.log"

    def args(self) -> list[str]:
        """The daemon's own command-line arguments."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [*self.wrap, sys.executable, "-m", self.module, "--workdir", str(self.workdir),
               "--parent-pid", str(os.getpid()), *self.args()]
        self.proc = spawn(cmd, self.workdir, self.name, timeout, self.tail, self.stop)

    def stop(self, timeout: float | None = None) -> None:
        if self.proc is None:
            return
        terminate(self.proc, self.stop_timeout if timeout is None else timeout)
        kill_groups(self.workdir.glob(self.pid_files))
        self.proc = None

    def tail(self, n: int = 60) -> str:
        return "".join(f"--- {f}\n" + last_lines(f, n) + "\n"
                       for f in (self.workdir / f"{self.name}.out", self.log_path) if f.exists())


def last_lines(path: Path, n: int = 40) -> str:
    """The end of a log file ("" when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


NODE_PORTS = range(30000, 32768)  # Kubernetes' default Service NodePort range


def listen_ports(ephemeral: tuple[int, int]) -> list[int]:
    """The ports free_port picks from: above 20000 (below, the fixed ports daemons default to:
    8080, 9092, 10250), outside the kernel's ephemeral range (`ip_local_port_range`) and the
    NodePort range. A port bind(0) gives is an ephemeral one, which any process's next outgoing
    connection may take before the listener binds it (two pytest-xdist workers make thousands of
    connections); one outside that range stays free for the restarts of the process it was picked
    for."""
    low, high = ephemeral
    return [p for p in range(20000, 65536) if not low <= p <= high and p not in NODE_PORTS]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port nothing listens on or uses now, for a local daemon to listen on."""
    ports = listen_ports(_ephemeral_range())
    for port in random.sample(ports, min(200, len(ports))):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))  # refused if any address holds the port
            except OSError:
                continue
            return port
    raise OSError("no free TCP port outside the ephemeral range")


def script_output(script: Path) -> list[str]:
    """Runs a hack/ script that fetches or builds something (cached; progress goes to stderr)
    and returns its stdout lines, the last of which name what it made."""
    out = subprocess.run(["bash", str(script)], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()
