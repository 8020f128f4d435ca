"""Start and stop the test-only helper daemons (node agent, Spark runner) the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def terminate(proc: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM, then SIGKILL after timeout; idempotent."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
