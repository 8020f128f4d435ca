import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

# The harness's brokers and local Spark drivers run C1 only (localenv.quick_jit): set before any
# fixture starts one, and inherited by the node tier's start and `make demo` runs of the tests.
os.environ.setdefault("EOPIPE_QUICK_JIT", "1")

pytest_plugins = [
    "localenv.fixtures_kafka",
    "localenv.fixtures_k8s",
    "localenv.fixtures_agent",
    "localenv.fixtures_operator",
    "localenv.fixtures_spark",
    "localenv.fixtures_objectstore",
]


@pytest.fixture
def pipe(kafka_bootstrap, tmp_path):
    """A test pipeline's topics on the real broker; its worker processes are killed at the end."""
    from tests.helpers.workers import Pipeline

    p = Pipeline(kafka_bootstrap, tmp_path)
    yield p
    p.stop_all()


# A test's markers follow the real parts its fixtures start, so `-m kafka` or `-m "not spark"`
# selects by what must run rather than by what each module remembered to declare.
_PARTS = {
    "kafka": {"kafka", "kafka_bootstrap", "kafka3", "kafka3_cluster", "pipe"},
    "k8s": {"control_plane", "kube_api", "k8s_namespace", "crds", "operator", "node_agent"},
    "spark": {"spark_jars", "spark_driver"},
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(item.fixturenames)
        for mark, fixtures in _PARTS.items():
            if used & fixtures:
                item.add_marker(mark)
        if "node_tier" in used:
            # The first node-tier test's setup waits for the tier's start, which on a cold
            # machine builds the images (over 17 minutes on 2 cores): the test's timeout counts
            # from its own call, and that wait has its own bound (tests/e2e/conftest.py).
            mark = item.get_closest_marker("timeout")
            own = (mark.kwargs.get("timeout") or (mark.args or [None])[0]) if mark else None
            item.add_marker(pytest.mark.timeout(own or float(config.getini("timeout")), func_only=True), append=False)
    items.sort(key=lambda i: run_group(i.nodeid, i.fixturenames))  # stable: each group keeps its order
    phase = config.getoption("phase")
    if phase != "all":
        keep, drop = [], []
        for i in items:
            (keep if in_phase(run_group(i.nodeid, i.fixturenames), phase) else drop).append(i)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_addoption(parser):
    parser.addoption("--phase", choices=PHASES, default="all",
                     help="part of the run: 'node', the unit tier and the node tier's tests (one process, "
                          "the tier's start overlapping the unit tier); 'local', the rest (make test runs it "
                          "in two pytest-xdist workers); 'all' (default) both, in one process")


def run_group(nodeid: str, fixtures) -> int:
    """The unit tier first (one core of pure Python) while the node tier starts on the other
    (tests/e2e/conftest.py), then the node tier's tests, then the rest: the tier is up only as
    long as its tests need it."""
    return 0 if nodeid.startswith("tests/unit/") else 1 if "node_tier" in fixtures else 2


PHASES = ("all", "node", "local")


def in_phase(group: int, phase: str) -> bool:
    """The node tier's tests keep the machine's cores busy on their own, so they run alone; the
    local tiers' tests wait on brokers and timeouts enough that two run side by side."""
    return phase == "all" or (group < 2) == (phase == "node")


# Wall time per tier (tests/<tier>/...), setup and teardown included, printed at the end so the
# CI log carries what README's test-time table reports.
_TIER_SECONDS: dict[str, float] = defaultdict(float)
_TIER_TESTS: dict[str, set] = defaultdict(set)
_FILE_SECONDS: dict[str, float] = defaultdict(float)
_TESTS_DIR = Path(__file__).resolve().parent


def pytest_runtest_logreport(report):
    parts = Path(report.fspath).resolve().relative_to(_TESTS_DIR).parts if report.fspath else ()
    tier = parts[0] if len(parts) > 1 else "other"
    _TIER_SECONDS[tier] += report.duration
    _TIER_TESTS[tier].add(report.nodeid)
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


_STARTED = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    if not _TIER_SECONDS:
        return
    terminalreporter.section("time per tier")
    for tier in sorted(_TIER_SECONDS, key=_TIER_SECONDS.get, reverse=True):
        terminalreporter.write_line(
            f"{tier:<12} {len(_TIER_TESTS[tier]):>5} tests {_TIER_SECONDS[tier]:>8.0f} s")
    terminalreporter.write_line(f"{'session':<12} {'':>11} {time.monotonic() - _STARTED:>8.0f} s")
    terminalreporter.section("time per file, the 20 slowest")
    for f in sorted(_FILE_SECONDS, key=_FILE_SECONDS.get, reverse=True)[:20]:
        terminalreporter.write_line(f"{_FILE_SECONDS[f]:>8.0f} s  {f}")
