"""verify's order check: output partition order against the first occurrence in the source."""

import pytest

from eopipe.core.headers import H_REROUTED
from eopipe.tools.verify import OrderCheck, Report

# (partition, offset, key, headers). Partition 0: a@0 b@1 c@2; partition 1: d@0 and a@5, a copy.
# Then partition growth: e was produced to partition 3 (@0, not its home then) and rerouted to 2
# (@7); after growth its home is 3, so the copy was rerouted again, to 3 (@9); f@4 lies between.
SOURCE = [(0, 0, b"a", None), (0, 1, b"b", None), (0, 2, b"c", None), (1, 0, b"d", None),
          (1, 5, b"a", [(H_REROUTED, b"2:3")]),
          (3, 0, b"e", None), (2, 7, b"e", [(H_REROUTED, b"3:0")]), (3, 4, b"f", None),
          (3, 9, b"e", [(H_REROUTED, b"2:7")])]


@pytest.mark.parametrize("output, violations", [
    ([(0, b"a"), (0, b"b"), (0, b"c")], 0),            # source order kept
    ([(0, b"a"), (0, b"c"), (0, b"b")], 1),            # b after c: out of order
    ([(0, b"c"), (0, b"b"), (0, b"a")], 2),            # reversed: every later one counts
    ([(0, b"a"), (1, b"d"), (0, b"c"), (1, b"a")], 0), # partitions are ordered apart
    ([(1, b"a"), (1, b"d")], 1),                       # the reroute copy came after d
    ([(0, b"x"), (0, b"c"), (0, b"y"), (0, b"a")], 1), # keys not from partition 0 are not ordered
    ([(5, b"a"), (5, b"b")], 0),                       # a partition the source never had
    ([(3, b"f"), (3, b"e")], 0),                       # e taken from its last copy, after f
    ([(3, b"e"), (3, b"f")], 1),                       # ... so before f is out of order
    ([], 0),
])
def test_order_check(output, violations):
    check = OrderCheck()
    for partition, offset, key, headers in SOURCE:
        check.source(partition, offset, key, headers)
    for partition, key in output:
        check.see(partition, key)
    assert check.violations == violations
    assert len(check.examples) == violations


@pytest.mark.parametrize("out_of_order, ok", [(None, True), (0, True), (1, False)])
def test_out_of_order_fails_the_verdict(out_of_order, ok):
    rep = Report(unique_in=3, out=3, out_of_order=out_of_order)
    assert rep.ok is ok
    assert ("out_of_order=" in rep.line()) is (out_of_order is not None)
