"""verify's order check: output partition order against the first occurrence in the source."""

import pytest

from eopipe.tools.verify import OrderCheck, Report

# Source partition 0 holds a@0 b@1 c@2; partition 1 holds d@0 and a later a@5 (a rerouted copy).
FIRST = {(0, b"a"): 0, (0, b"b"): 1, (0, b"c"): 2, (1, b"d"): 0, (1, b"a"): 5}


@pytest.mark.parametrize("output, violations", [
    ([(0, b"a"), (0, b"b"), (0, b"c")], 0),            # source order kept
    ([(0, b"a"), (0, b"c"), (0, b"b")], 1),            # b after c: out of order
    ([(0, b"c"), (0, b"b"), (0, b"a")], 2),            # reversed: every later one counts
    ([(0, b"a"), (1, b"d"), (0, b"c"), (1, b"a")], 0), # partitions are ordered apart
    ([(1, b"a"), (1, b"d")], 1),                       # the reroute copy came after d
    ([(0, b"x"), (0, b"c"), (0, b"y"), (0, b"a")], 1), # keys not from partition 0 are not ordered
    ([(2, b"a"), (2, b"b")], 0),                       # a partition the source never had
    ([], 0),
])
def test_order_check(output, violations):
    check = OrderCheck(FIRST)
    for partition, key in output:
        check.see(partition, key)
    assert check.violations == violations
    assert len(check.examples) == violations


@pytest.mark.parametrize("out_of_order, ok", [(None, True), (0, True), (1, False)])
def test_out_of_order_fails_the_verdict(out_of_order, ok):
    rep = Report(unique_in=3, out=3, out_of_order=out_of_order)
    assert rep.ok is ok
    assert ("out_of_order=" in rep.line()) is (out_of_order is not None)
