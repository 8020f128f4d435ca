"""The node tier, once per run: every node-tier test (tests/e2e/test_node_*.py, test_gitops.py,
the full `make demo` in test_demo.py) shares one cluster, of NODES nodes. test_node_tier.py's last test takes it down and
checks nothing is left; the teardown here only runs when that test did not."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
import time

import pytest

from localenv import REPO_ROOT
from localenv.node import RUN_DIR
from tests.helpers import nodetier
from tests.helpers.nodetier import kubectl, log, node_argv, node_cmd, sysctls, wait

LOCK = "/run/lock/eopipe-node-tier.lock"
# The tier's nodes: node 0 (control plane, broker) and two more, so that pods spread and a node
# can be lost (tests/e2e/test_node_loss.py). EOPIPE_NODES=1 for a single node (its tests skip).
NODES = int(os.environ.get("EOPIPE_NODES") or 3)


class _Start:
    """The tier's start (`make cluster`), begun as soon as the run is collected when it has
    node-tier tests: the unit tier, which runs first (tests/conftest.py), overlaps it. Holds the
    machine's tier lock from then on."""

    def __init__(self) -> None:
        self.lock = self.proc = self.out = None
        self.before: dict[str, str] = {}
        self.used = False

    def begin(self) -> None:
        lock = open(LOCK, "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another run's tier: the fixture waits for it
            lock.close()
            return
        if (RUN_DIR / "serve.pid").exists() and (RUN_DIR / "ready").exists():
            lock.close()  # the fixture says so
            return
        self.lock, self.before, self.out = lock, sysctls(), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(node_argv("up", "--nodes", str(NODES)), cwd=REPO_ROOT, text=True,
                                     stdout=self.out, stderr=subprocess.STDOUT)

    def wait(self) -> tuple[int, str]:
        self.used = True
        code = self.proc.wait(timeout=1800)
        self.out.seek(0)
        return code, self.out.read()

    def abandon(self) -> None:
        """A run that started the tier and ended before a test used it (-x, an interrupt)."""
        if self.proc is not None and not self.used:
            self.proc.wait(timeout=1800)
            node_cmd("down")


_START = _Start()


def pytest_collection_finish(session):
    """After -m and -k have deselected: only a run that will use the tier starts it."""
    if (os.environ.get("EOPIPE_NODE_TESTS") == "1" and os.geteuid() == 0 and not session.config.option.collectonly
            and any("node_tier" in i.fixturenames for i in session.items)):
        _START.begin()


def pytest_sessionfinish():
    _START.abandon()


@pytest.fixture(scope="session")
def node_tier():
    # One tier per machine (fixed namespace and paths): a concurrent run waits for this one.
    with (_START.lock or open(LOCK, "w")) as lock:
        if _START.proc is not None:
            before, (code, out) = _START.before, _START.wait()
        else:
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
            code, out = res.returncode, res.stdout
        log(f"make cluster: {out}")
        assert code == 0, out
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
