"""The node tier, once per run: every node-tier test (tests/e2e/test_node_*.py, the full
`make demo` in test_demo.py) shares one cluster, of NODES nodes. test_node_tier.py's last test takes it down and
checks nothing is left; the teardown here only runs when that test did not."""

from __future__ import annotations

import fcntl
import json
import os
import time

import pytest

from localenv.node import RUN_DIR
from tests.helpers import nodetier
from tests.helpers.nodetier import kubectl, log, node_cmd, sysctls, wait

LOCK = "/run/lock/eopipe-node-tier.lock"
# The tier's nodes: node 0 (control plane, broker) and two more, so that pods spread and a node
# can be lost (tests/e2e/test_node_loss.py). EOPIPE_NODES=1 for a single node (its tests skip).
NODES = int(os.environ.get("EOPIPE_NODES") or 3)


@pytest.fixture(scope="session")
def node_tier():
    # One tier per machine (fixed namespace and paths): a concurrent run waits for this one.
    with open(LOCK, "w") as lock:
        deadline = time.monotonic() + 1200
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "another run holds the node tier"
                time.sleep(2)
        if (RUN_DIR / "serve.pid").exists() and (RUN_DIR / "ready").exists():
            pytest.fail("a node tier is already up (make cluster?): `make cluster-down` first")
        before = sysctls()
        res = node_cmd("up", "--nodes", str(NODES))
        log(f"make cluster: {res.stdout}")
        assert res.returncode == 0, res.stdout
        yield {**json.loads((RUN_DIR / "images.json").read_text()), "sysctls": before}
        if RUN_DIR.exists():  # `down` removes it
            node_cmd("down")


@pytest.fixture(scope="module")
def node_log_to_terminal(pytestconfig):
    """The tier's start, pods, steps and verdicts in the run's own output, passed or not
    (module scope: before the tier starts)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def write(text: str) -> None:
        with capture.global_and_fixture_disabled():
            print(text, flush=True)
    before, nodetier.emit = nodetier.emit, write
    yield
    nodetier.emit = before


@pytest.fixture
def node_failure_frees_the_node(request):
    """After a failed test, its pipelines are deleted and their Spark pods gone: a driver left
    running holds the node's two cores, and every later Spark test's driver would stay Pending
    (one failure read as five)."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed == failed or "node_tier" not in request.fixturenames:
        return
    left = kubectl("get", "exactlyoncepipelines", "-A", "-o",
                   "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}", check=False)
    for ref in left.split():
        ns, name = ref.split("/")
        log(f"after the failure: deleting pipeline {ref}")
        kubectl("-n", ns, "delete", "exactlyoncepipeline", name, "--timeout=120s", check=False)
    wait(lambda: not kubectl("get", "pods", "-A", "-l", "spark-role", "-o", "name", check=False), 180,
         "the failed test's Spark pods gone")
