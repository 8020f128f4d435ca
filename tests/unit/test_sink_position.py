"""Where a query without a checkpoint starts over a sink that holds output: from its markers."""

import json

import pytest

from spark_app.sink_position import EARLIEST, LATEST, plan_start, unplanned_leftovers


def m(unit, batch, *ranges, query="q1", parts=0, topic="src"):
    return {"unit": unit, "batch": batch, "query": query, "parts": parts,
            "source": [{"topic": topic, "partition": p, "from": a, "until": b} for p, a, b in ranges]}


CASES = [
    # (id, markers, partitions (each with its end offset far ahead), default, offsets, placed by markers)
    ("a new sink: the config's start", [], [0, 1], "earliest", {0: EARLIEST, 1: EARLIEST}, {}),
    ("every partition written", [m("src-0", 4, (0, 10, 20)), m("src-1", 4, (1, 7, 9))], [0, 1], "earliest",
     {0: 20, 1: 9}, {0: 20, 1: 9}),
    ("a batch committed by some units only: each partition goes on from its own",
     [m("src-0", 5, (0, 20, 30)), m("src-1", 4, (1, 7, 9))], [0, 1], "earliest", {0: 30, 1: 9}, {0: 30, 1: 9}),
    ("markers of several query ids (checkpoints lost before): the furthest range counts",
     [m("src-0", 9, (0, 40, 50), query="q2"), m("src-1", 30, (1, 7, 9), query="q1")], [0, 1], "latest",
     {0: 50, 1: 9}, {0: 50, 1: 9}),
    ("a grown source: new partitions start at the config's start",
     [m("src-0", 4, (0, 10, 20))], [0, 1, 2], "latest", {0: 20, 1: LATEST, 2: LATEST}, {0: 20}),
    ("a one-task batch's marker names every range it wrote",
     [m("task-0", 7, (0, 0, 40), (1, 0, 30))], [0, 1], "earliest", {0: 40, 1: 30}, {0: 40, 1: 30}),
    ("a stateful query's markers name no range", [m("task-0", 3), m("task-1", 3)], [0], "earliest",
     {0: EARLIEST}, {}),
    ("another topic's ranges (a source renamed) are not this one's",
     [m("src-0", 4, (0, 10, 20), topic="old")], [0], "earliest", {0: EARLIEST}, {}),
    ("a split range with every part committed",
     [m("src-0.0", 6, (0, 0, 50), parts=2), m("src-0.1", 6, (0, 50, 100), parts=2)], [0], "earliest",
     {0: 100}, {0: 100}),
    ("after compaction only the latest marker per key is left: still the furthest",
     [m("src-0", 12, (0, 300, 310)), m("src-0.0", 6, (0, 0, 50), parts=2), m("src-0.1", 6, (0, 50, 100), parts=2)],
     [0], "earliest", {0: 310}, {0: 310}),
]


@pytest.mark.parametrize("markers,partitions,default,offsets,placed", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_start(markers, partitions, default, offsets, placed):
    plan = plan_start(markers, "src", {p: 10**6 for p in partitions}, default)
    assert (plan.offsets, plan.from_markers, plan.problems) == (offsets, placed, ())
    assert json.loads(plan.spark_json("src")) == {"src": {str(p): o for p, o in offsets.items()}}


def test_a_split_range_with_a_part_missing_has_no_exact_start():
    plan = plan_start([m("src-0.1", 6, (0, 50, 100), parts=2)], "src", {0: 100}, "earliest")
    assert plan.problems and "batch 6 committed 1 of its 2 parts" in plan.problems[0]


@pytest.mark.parametrize("bad", [{"source": [{"topic": "src", "partition": "x", "from": 0, "until": 5}]},
                                 {"source": [{"topic": "src", "partition": 0}]},
                                 {"source": ["not a range"]}, {"source": [{"topic": "src", "partition": 0, "from": 0,
                                                                          "until": 9}], "parts": 2}])
def test_a_malformed_marker_is_a_problem_not_a_guess(bad):
    plan = plan_start([{"unit": "src-0", **bad}], "src", {0: 100}, "earliest")
    assert plan.problems and "malformed source range" in plan.problems[0], plan


@pytest.mark.parametrize("ends, problem", [
    ({0: 30, 1: 9}, None),  # the sink is up to the end: nothing new yet, not a problem
    ({0: 29, 1: 9}, "source partition 0: the sink holds its records up to offset 30, but src ends at offset 29"),
    ({0: 0, 1: 0}, "source partition 0: the sink holds its records up to offset 30, but src ends at offset 0"),
    ({0: 500}, "source partition 1: the sink holds its records up to offset 9, but src has no such partition"),
], ids=["at the end", "one short", "made again, empty", "made again with fewer partitions"])
def test_markers_past_the_end_of_the_topic_are_a_problem(ends, problem):
    """The topic was deleted and made again since the sink wrote: starting at the markers would
    read nothing until its offsets caught up, and skip that many new records."""
    plan = plan_start([m("src-0", 5, (0, 20, 30)), m("src-1", 4, (1, 7, 9))], "src", ends, "earliest")
    if problem is None:
        assert plan.problems == () and plan.offsets == {0: 30, 1: 9}
    else:
        assert any(p.startswith(problem) for p in plan.problems), plan.problems
        assert all("delete the commit topic or set spec.processing.upgradeMode to reprocess" in p
                   for p in plan.problems)


@pytest.mark.parametrize("listing, removed", [
    ({}, []),
    ({"offsets": []}, []),
    # A driver stopped while writing batch 0's offsets (write, then rename): its temp file and the
    # Kafka source's first offsets; Spark refuses a new start beside them.
    ({"offsets": [".0.c99.tmp"], "sources": ["0"], "commits": []}, ["offsets/.0.c99.tmp", "sources/0"]),
    ({"offsets": [".0.crc"], "state": ["0"], "commits": [".1.x.tmp"]}, ["offsets/.0.crc", "commits/.1.x.tmp", "state/0"]),
    ({"offsets": ["0", ".1.c99.tmp"], "sources": ["0"]}, None),  # batch 0 planned: Spark resumes it
    ({"offsets": ["7"], "commits": ["6"]}, None),
], ids=["no checkpoint", "an empty offset log", "a first batch stopped mid-write", "only hidden files logged",
        "a batch logged beside a temp file", "batches logged"])
def test_what_a_checkpoint_with_no_batch_planned_has_removed(listing, removed):
    assert unplanned_leftovers(listing) == removed
