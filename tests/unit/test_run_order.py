"""The run's order (tests/conftest.py): the unit tier overlaps the node tier's start, whose tests
come next, then the rest; `make test` runs the node tier's tests beside the rest (tests/run.py)."""

import pytest

from tests.conftest import run_group
from tests.run import Outcome, counts, runs, verdict


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


def test_make_test_splits_by_the_node_marker_and_leaves_nothing_out():
    assert [r.marks for r in runs(True)] == ["node and not bench", "not node and not bench"]
    assert [r.marks for r in runs(False)] == ["not bench"]


@pytest.mark.parametrize("codes, want_code, want_tail", [
    ((0, 0), 0, "3 passed, 1 failed, 2 skipped"),
    ((1, 0), 1, "(node tier: pytest exit 1)"),
    ((0, 5), 1, "(the rest: pytest exit 5)"),  # a run that ran no test fails make test
    ((2, 1), 1, "(node tier: pytest exit 2; the rest: pytest exit 1)"),
])
def test_verdict(codes, want_code, want_tail):
    outcomes = [Outcome("node tier", codes[0], 2, 1, 0, 10.0), Outcome("the rest", codes[1], 1, 0, 2, 5.0)]
    line, code = verdict(outcomes)
    assert code == want_code and line.startswith("tests: 3 passed, 1 failed, 2 skipped") and line.endswith(want_tail)


def test_counts_from_junit(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite tests="10" failures="1" errors="2" skipped="3"/></testsuites>')
    assert counts(junit) == (4, 3, 3)
    assert counts(tmp_path / "missing.xml") == (0, 0, 0)
    (tmp_path / "cut.xml").write_text("<testsuites><testsu")
    assert counts(tmp_path / "cut.xml") == (0, 0, 0)
