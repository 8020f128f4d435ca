"""`make demo` (hack/demo.py) run as a user runs it: its verdict, its teardown, the full pipeline.

The quick demo starts its own Kafka on free ports, next to the suite's; the full one runs on the
run's node tier (tests/e2e/conftest.py), as `make demo DEMO_ARGS=--on-cluster` after `make
cluster`. Each test gives it its own workdir.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "hack" / "demo.py"
VERIFY_LINE = re.compile(r"^verify: unique_in=(\d+) out=(\d+) lost=(\d+) duplicated=(\d+) .* (OK|FAILED)  \[(.+)\]$",
                         re.M)

pytestmark = pytest.mark.kafka


def run_demo(tmp_path: Path, *args: str, timeout: float) -> tuple[int, str]:
    res = subprocess.run([sys.executable, str(DEMO), "--workdir", str(tmp_path / "demo"), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return res.returncode, res.stdout + res.stderr


def verify_lines(out: str) -> dict[str, tuple[int, int, int, int, str]]:
    return {m[6]: (int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5]) for m in VERIFY_LINE.finditer(out)}


def leftovers(workdir: Path) -> list[str]:
    """Processes whose command line names the demo's workdir (brokers, workers, pods)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in cmd and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {cmd[:200]}")
    return found


def test_verdict_fails_a_broken_dedup_step(tmp_path):
    """The quick demo's run (a worker SIGKILLed, the broker restarted) with the dedup step turned
    off (EOPIPE_FAULT=no_dedup in the workers): exit 1 and the duplicates named. The same verdict
    passing a working pipeline is test_make_demo_end_to_end's, on the node tier."""
    code, out = run_demo(tmp_path, "--quick", "--break-dedup", "--records", "6000", timeout=400)
    assert code == 1, out[-4000:]
    (unique, n_out, lost, dups, verdict), = verify_lines(out).values()
    # 20% of the records are resends: with no dedup most of them reach the output.
    assert verdict == "FAILED" and dups > 500 and n_out > unique, out[-2000:]
    assert "duplicated, e.g.:" in out and "verdict: FAILED" in out
    assert not leftovers(tmp_path / "demo")


def test_ctrl_c_tears_everything_down(tmp_path):
    workdir = tmp_path / "demo"
    proc = subprocess.Popen([sys.executable, str(DEMO), "--quick", "--records", "200000", "--rate", "2000",
                             "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "load:" in line:  # broker and workers up, load running
                break
        time.sleep(3)
        assert leftovers(workdir), "nothing was running before Ctrl-C"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            # Its broker and workers run in sessions of their own: a failed run must not leave
            # them to the rest of the suite.
            for line in leftovers(workdir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted: tearing down" in out and "verdict" not in out
    deadline = time.monotonic() + 30
    while leftovers(workdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(workdir), leftovers(workdir)


@pytest.mark.node
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("EOPIPE_NODE_TESTS") != "1",
                    reason="node tier: run by `make test` / `make test-node` (EOPIPE_NODE_TESTS=1)")
@pytest.mark.skipif(os.geteuid() != 0, reason="the node tier needs root")
def test_make_demo_end_to_end(tmp_path, node_tier):
    """`make demo` itself (smaller load) on the run's node tier (`--on-cluster`, as after
    `make cluster`): chart-installed operator, payments example as written, the faults, both
    verifications exact, exit 0; then nothing of the demo left on the cluster (its release, the
    namespaces it made and its topics: the install doc's test creates eopipe-system itself), the
    tier itself left up for the next test."""
    from tests.helpers.nodetier import kubectl, topics

    code, out = run_demo(tmp_path, "--on-cluster", "--records", "20000", timeout=1800)
    assert code == 0, out[-6000:]
    lines = verify_lines(out)
    assert set(lines) == {"dedup stage (source -> deduped)", "end to end (source -> Spark sink)"}, out[-3000:]
    for unique, n_out, lost, dups, verdict in lines.values():
        assert (lost, dups, verdict) == (0, 0, "OK") and n_out == unique > 15_000, out[-3000:]
    # status.processing (the operator reads the driver's progress) caught up, lag 0, after the kill.
    for step in ("helm install eopipe", "Ready again", "driver resubmitted", "status.processing after",
                 "autoscaling on", "Autoscaled event: dedup replicas 2 -> 3", "replicas 2 -> 3: 2 partitions moved",
                 "keys (", "re-sharded"):
        assert step in out, (step, out[-3000:])
    table = [ln.split() for ln in out.splitlines() if ln.startswith("payments ")]
    assert table and table[-1][:5] == ["payments", "Running", "True", "12", "3"], table
    assert not re.search(r"teardown: \w+(Error|Exception)", out), out[-2000:]  # each undo step worked
    assert not leftovers(tmp_path / "demo")
    assert "demo" not in kubectl("get", "namespaces", "-o", "name", check=False).split("namespace/")
    assert not kubectl("get", "namespace", "eopipe-system", "--ignore-not-found", "-o", "name").strip()
    assert not {"payments", "payments-enriched"} & topics(), topics()
