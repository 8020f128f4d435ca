#!/usr/bin/env python3
"""`make test`: the suite as two pytest runs side by side, the node tier's tests and the rest.

The node tier's tests (marker `node`: one shared cluster, tests/e2e/conftest.py) spend most of
their time waiting on the kubelet, pods and Spark drivers; the rest of the suite runs its own
brokers and processes. One after the other they took 68 minutes of tests on this 2-core machine;
side by side the run takes about as long as the node tier alone (README, "Developing eopipe").
The two selections are complements (`-m node` and `-m "not node"`), so no test runs twice or
falls between them. Each run prints its own summary and time per tier; the node run's lines carry
a `node | ` prefix, the other's `rest | `. Exit status: 0 when both pass, else the first failure's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

LANES = {"node": "node and not bench", "rest": "not node and not bench"}
_out = threading.Lock()


def _relay(name: str, proc: subprocess.Popen) -> None:
    """Whole lines only, so that the two runs' output never mixes within a line."""
    for line in proc.stdout:
        with _out:
            sys.stdout.write(f"{name} | {line}")
            sys.stdout.flush()


def main(extra: list[str]) -> int:
    env = {**os.environ, "EOPIPE_NODE_TESTS": "1", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    procs, relays, took = {}, [], {}
    for name, marks in LANES.items():
        argv = [sys.executable, "-m", "pytest", "-m", marks, "--ignore=tests/soak", *extra]
        procs[name] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, bufsize=1)
        relays.append(threading.Thread(target=_relay, args=(name, procs[name]), daemon=True))
        relays[-1].start()
    # A terminal's Ctrl-C reaches both runs (same process group); CI's SIGTERM is passed on.
    signal.signal(signal.SIGTERM, lambda *_: [p.send_signal(signal.SIGTERM) for p in procs.values()])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pending = dict(procs)
    while pending:
        for name, proc in list(pending.items()):
            if proc.poll() is not None:
                took[name] = time.monotonic() - started
                del pending[name]
        time.sleep(1)
    for t in relays:
        t.join(10)
    codes = {name: p.returncode for name, p in procs.items()}
    summary = ", ".join(f"{name} exit {codes[name]} after {took[name]:.0f} s" for name in LANES)
    print(f"make test: {summary}; {time.monotonic() - started:.0f} s in all", flush=True)
    return next((c for c in codes.values() if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
