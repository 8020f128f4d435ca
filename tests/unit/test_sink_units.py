"""The Spark sink's units: which names a batch's tasks write under, from the plan's facts."""

import pytest

from spark_app.sink_units import (PlanFacts, SourceRange, UnknownLegacyWrites, UnsupportedPlan, decide, legacy_may_hold,
                                  legacy_written, one_task_may_write, one_task_unit)


def r(p: int, start: int = 0, end: int = 10) -> tuple[SourceRange, ...]:
    return (SourceRange("t", p, start, end),)


CASES = [
    # (facts, [(marker key, transactional suffix, commit slot)] per task)
    ("no tasks", PlanFacts(()), []),
    ("one task keeps its index", PlanFacts((r(3),)), [("task-0", "0", 0)]),
    ("one task reading several partitions (COALESCE(1)) is one unit", PlanFacts((r(0) + r(1),)),
     [("task-0", "0", 0)]),
    ("narrow: named by source partition, whatever the task order",
     PlanFacts((r(2), r(0), r(1))), [("src-2", "p2", 2), ("src-0", "p0", 0), ("src-1", "p1", 1)]),
    ("narrow, the other order: the same names follow the same partitions",
     PlanFacts((r(0), r(1), r(2))), [("src-0", "p0", 0), ("src-1", "p1", 1), ("src-2", "p2", 2)]),
    ("a split partition: ranked by start offset",
     PlanFacts((r(1, 50, 100), r(0), r(1, 0, 50))),
     [("src-1.1", "p1.1", 1), ("src-0", "p0", 0), ("src-1.0", "p1.0", 1)]),
    ("a shuffle by key: tasks keep their index", PlanFacts((None, None)),
     [("task-0", "0", 0), ("task-1", "1", 1)]),
    ("a task with nothing to read keeps its index", PlanFacts((r(4), ())),
     [("src-4", "p4", 4), ("task-1", "1", 1)]),
]


@pytest.mark.parametrize("facts,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_units(facts, want):
    units = decide(facts)
    assert [(u.marker_key, u.txn_suffix, u.slot) for u in units] == want
    assert [u.task for u in units] == list(range(len(want)))
    for u, ranges in zip(units, facts.tasks):
        # Every narrow unit records what it read (a lost checkpoint starts from there).
        assert u.ranges == (ranges or ())
        assert u.legacy_key == (f"task-{u.task}" if u.marker_key.startswith("src-") else None)


REFUSED = [
    ("coalesced partitions", PlanFacts((r(0) + r(1), r(2))), "without a shuffle"),
    ("round robin over the source", PlanFacts((None, None), ("RoundRobinPartitioning",)), "RoundRobin"),
    ("order by over the source", PlanFacts((None,), ("RangePartitioning",)), "by their order"),
]


@pytest.mark.parametrize("facts,words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_plans_whose_tasks_depend_on_the_scan_order_are_refused(facts, words):
    with pytest.raises(UnsupportedPlan, match=words):
        decide(facts)


LEGACY = [
    # (case, each task's rows in the replay, rows of the old sink's markers for this batch, skipped)
    ("the old sink wrote none of the batch", [4, 5, 6], [], set()),
    ("all of it, whatever the counts", [4, 4, 6], [4, 6, 4], {0, 1, 2}),
    ("all that have rows: an empty task wrote no marker", [4, 0, 6], [6, 4], {0, 2}),
    ("part, told apart by the counts", [2, 5, 3], [3, 2], {0, 2}),
    ("a shared count, both written", [2, 2, 7], [2, 2], {0, 1}),
]


@pytest.mark.parametrize("counts,written,want", [c[1:] for c in LEGACY], ids=[c[0] for c in LEGACY])
def test_which_tasks_the_task_index_sink_wrote(counts, written, want):
    assert legacy_written(counts, written) == want


UNKNOWN = [
    ("a count shared by a written and an unwritten task", [2, 2, 3], [2], "which reached the sink is unknown"),
    ("a count no task has", [2, 5, 3], [4], "which reached the sink is unknown"),
    ("a marker without a count", [2, 5, 3], [2, None], "no row count"),
]


@pytest.mark.parametrize("counts,written,words", [c[1:] for c in UNKNOWN], ids=[c[0] for c in UNKNOWN])
def test_a_replay_the_task_index_sink_wrote_in_part_is_refused_when_the_counts_do_not_tell(counts, written, words):
    with pytest.raises(UnknownLegacyWrites, match=words):
        legacy_written(counts, written)


MAY_HOLD = [
    # (case, this sink's last marker per unit as (query, batch) or None, the old sink may hold batch 5 of q)
    ("no marker of this sink yet: the first batch after an upgrade, or a new pipeline", [None, None], True),
    ("this sink wrote part of batch 5 of q (a replay it died in)", [("q", 5), None], True),
    ("this sink wrote all of batch 5", [("q", 5), ("q", 5)], False),
    ("this sink wrote an earlier batch of q", [("q", 4), None], False),
    ("another query's markers: q is a later checkpoint the old sink never ran", [("q0", 90), None], False),
]


@pytest.mark.parametrize("markers,want", [c[1:] for c in MAY_HOLD], ids=[c[0] for c in MAY_HOLD])
def test_when_the_task_index_sinks_markers_are_read(markers, want):
    assert legacy_may_hold(markers, "q", 5) is want


ONE_TASK = [
    # (case, facts, the one-task unit's (marker key, slot, covered marker keys), or None: tasks apart)
    ("narrow: one task covers every unit with a range; the first names it",
     PlanFacts((r(2), r(0), ())), ("src-2", 2, ["src-2", "src-0"])),
    ("a split partition's parts are covered apart", PlanFacts((r(1, 50, 100), r(1, 0, 50))),
     ("src-1.1", 1, ["src-1.1", "src-1.0"])),
    ("a shuffle by key: its tasks stay apart", PlanFacts((None, None)), None),
    ("a task reading a shuffle beside source tasks: apart", PlanFacts((r(0), None)), None),
    ("one source partition with data: nothing to join", PlanFacts((r(0), ())), None),
    ("one task already", PlanFacts((r(0) + r(1),)), None),
]


@pytest.mark.parametrize("facts,want", [c[1:] for c in ONE_TASK], ids=[c[0] for c in ONE_TASK])
def test_the_one_task_unit_of_a_batch(facts, want):
    one = one_task_unit(facts, decide(facts))
    got = one and (one.marker_key, one.slot, [u.marker_key for u in one.covers])
    assert got == want
    if one:
        assert (one.task, one.txn_suffix) == (0, "batch")
        assert one.ranges == tuple(x for u in one.covers for x in u.ranges)


ONE_TASK_REPLAY = [
    # (case, the covered units' last markers as (query, batch) or None, batch 5 of q in one task)
    ("nothing of batch 5 written", [None, ("q", 4)], True),
    ("all of it written (the task finds its first marker and skips)", [("q", 5), ("q", 5)], True),
    ("a previous run wrote part of it task by task", [("q", 5), ("q", 4)], False),
    ("part of it, the rest never written", [None, ("q", 5)], False),
    ("another query's batch 5 is not this one's", [("q0", 5), None], True),
]


@pytest.mark.parametrize("markers,want", [c[1:] for c in ONE_TASK_REPLAY], ids=[c[0] for c in ONE_TASK_REPLAY])
def test_when_a_replay_may_be_written_in_one_task(markers, want):
    assert one_task_may_write(markers, "q", 5) is want
