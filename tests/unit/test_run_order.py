"""The run's order (tests/conftest.py): the unit tier overlaps the node tier's start, whose tests
come next, then the rest."""

import pytest

from tests.conftest import in_phase, run_group


@pytest.mark.parametrize("nodeid, fixtures, group", [
    ("tests/unit/test_spec.py::test_x", ["tmp_path"], 0),
    ("tests/unit/test_node_addons.py::test_y", ["node_tier"], 0),  # a unit test never waits for the tier
    ("tests/e2e/test_node_tier.py::test_down_leaves_nothing_behind", ["node_tier"], 1),
    ("tests/e2e/test_demo.py::test_make_demo_end_to_end", ["tmp_path", "node_tier"], 1),
    ("tests/e2e/test_demo.py::test_ctrl_c_tears_everything_down", ["tmp_path"], 2),
    ("tests/integration/test_faults.py::test_a", ["kafka_bootstrap"], 2),
    ("tests/harness/test_kafka_smoke.py::test_b", [], 2),
    ("tests/unitx/test_c.py::test_c", [], 2),
])
def test_run_group(nodeid, fixtures, group):
    assert run_group(nodeid, fixtures) == group


def test_the_sort_is_stable_within_a_group():
    ids = ["tests/e2e/test_a.py::t1", "tests/unit/test_b.py::t2", "tests/e2e/test_node_tier.py::t3",
           "tests/e2e/test_node_tier.py::t4", "tests/unit/test_b.py::t5", "tests/integration/test_c.py::t6"]
    fixtures = {"tests/e2e/test_node_tier.py::t3": ["node_tier"], "tests/e2e/test_node_tier.py::t4": ["node_tier"]}
    got = sorted(ids, key=lambda i: run_group(i, fixtures.get(i, [])))
    assert [i.rsplit("::", 1)[1] for i in got] == ["t2", "t5", "t3", "t4", "t1", "t6"]


@pytest.mark.parametrize("group, phase, runs", [
    (0, "all", True), (1, "all", True), (2, "all", True),
    (0, "node", True), (1, "node", True), (2, "node", False),  # the unit tier and the node tier's tests
    (0, "local", False), (1, "local", False), (2, "local", True),  # the rest, in two workers
])
def test_in_phase(group, phase, runs):
    assert in_phase(group, phase) is runs
