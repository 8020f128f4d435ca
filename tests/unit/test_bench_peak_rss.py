"""bench.common.peak_rss_mb: a contestant's peak RSS is its own, not the benchmark's. A child
forked by a process that holds 200 MB reports at least that in wait4's ru_maxrss (Linux keeps the
peak across exec); VmHWM of the running child does not, and a grandchild's peak counts."""

import subprocess
import sys

from bench.common import peak_rss_mb

# The parent fills 200 MB, then starts a shell whose child (a Python that fills 60 MB) is the
# grandchild, which waits for a line on stdin before it exits; the parent passes it the line the
# test sends once it has measured (sent at once, the tree could be gone before the measurement).
PARENT = r"""
import os, subprocess, sys
ballast = bytearray(200 << 20)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
child = subprocess.Popen(["sh", "-c", sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
print(child.pid, flush=True)
print(child.stdout.readline().decode().strip(), flush=True)
child.stdin.write(sys.stdin.readline().encode()); child.stdin.flush()
_, _, ru = os.wait4(child.pid, 0)
print(ru.ru_maxrss // 1024, flush=True)
"""
GRANDCHILD = ("import sys; b = bytearray(60 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; "
              "print('ready', flush=True); sys.stdin.readline()")


def test_peak_rss_is_the_contestants_own_not_the_forking_process():
    # `; true`: the shell stays, so the Python is its child, not the shell exec'd
    shell = f"{sys.executable} -c \"{GRANDCHILD}\"; true"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, shell], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ready"
        peak = peak_rss_mb(child)
        rusage_mb = int(parent.communicate("measured\n", timeout=30)[0].split()[-1])
    finally:
        parent.kill()
    assert rusage_mb >= 200           # what wait4 says: the parent's ballast
    assert 60 <= peak < 150           # the grandchild's 60 MB, none of the parent's 200
    assert peak_rss_mb(child) == 0    # gone: nothing to read
