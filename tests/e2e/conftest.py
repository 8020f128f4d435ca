"""The node tier, once per run: every node-tier test (tests/e2e/test_node_tier.py, the full
`make demo` in test_demo.py) shares one cluster. test_node_tier.py's last test takes it down and
checks nothing is left; the teardown here only runs when that test did not."""

from __future__ import annotations

import fcntl
import json
import time

import pytest

from localenv.node import RUN_DIR
from tests.helpers.nodetier import log, node_cmd, sysctls

LOCK = "/run/lock/eopipe-node-tier.lock"


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
        res = node_cmd("up")
        log(f"make cluster: {res.stdout}")
        assert res.returncode == 0, res.stdout
        yield {**json.loads((RUN_DIR / "images.json").read_text()), "sysctls": before}
        if RUN_DIR.exists():  # `down` removes it
            node_cmd("down")
