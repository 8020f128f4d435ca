"""localenv/node/kubelet.py's wait for a node's serve-node: an exited child of the waiting
process is a zombie, which answers `kill 0`; it counts as stopped (it held `down` 30 s a node)."""

import subprocess
import sys
import time

from localenv.node.kubelet import _running


def test_a_running_child_runs_and_an_exited_one_does_not():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _running(proc.pid)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    while _running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(proc.pid)


def test_a_zombie_child_is_stopped_and_reaped():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(1.0)  # exited, not waited for: a zombie
    assert not _running(proc.pid)
    assert proc.poll() is not None  # reaped above: nothing left


def test_a_process_of_another_parent_and_a_gone_pid():
    assert _running(1)  # not a child: read from /proc
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not _running(proc.pid)
