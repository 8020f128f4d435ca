"""The sink's unit of idempotency: which source records a task of a micro-batch writes.

A replayed micro-batch must give every unit the same records as its first run, or a task
that finds its unit's marker skips records another unit wrote, and another writes them again.
The task index alone does not name them: Spark 4.2's Kafka source orders a batch's input
partitions by iterating a set of topic-partitions, and for up to four partitions that order
is the insertion order, which differs between the live plan (offsets as the broker returned
them) and a replay (offsets read back from the offset log). So:

* a task that reads source ranges straight from the scan (no shuffle on its way) is named by
  them: `src-<partition>` (`src-<partition>.<k>` when Spark splits one partition's range);
* a task that reads a hash shuffle's output holds the rows whose keys hash to its index,
  whatever the order of the map tasks, so it keeps its index: `task-<i>` (the sink's first
  naming, so markers written before this change keep their meaning);
* a plan whose task contents depend on the scan's order without a hash shuffle (COALESCE,
  REPARTITION without columns, ORDER BY straight over the source) is refused with a reason.

`decide` is the pure part (facts in, units out); `observe` reads the facts from the batch's
RDD lineage and executed plan through py4j, on the driver.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence


class UnsupportedPlan(ValueError):
    pass


class UnknownLegacyWrites(ValueError):
    """A replayed batch that the task-index sink wrote in part, where the facts it left do not
    say which of the batch's tasks it wrote."""


@dataclass(frozen=True)
class SourceRange:
    topic: str
    partition: int
    start: int
    end: int

    def as_json(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "from": self.start, "until": self.end}


@dataclass(frozen=True)
class Unit:
    """What task `task` of a batch writes, and the names its writes go by."""
    task: int
    marker_key: str          # key of its marker in the commit topic
    txn_suffix: str          # transactional.id = <prefix>.<txn_suffix>
    slot: int                # commit topic partition = slot % partitions
    ranges: tuple[SourceRange, ...] = ()
    legacy_key: str | None = None  # the task-index marker an older sink may have written instead
    parts: int = 0  # how many parts Spark split this unit's source range into (0: not split)
    # A one-task batch's unit: the units of the narrow plan it writes together, each under
    # its own marker (one_task_unit).
    covers: tuple["Unit", ...] = ()


@dataclass(frozen=True)
class PlanFacts:
    # Per task index: the source ranges it reads through narrow dependencies only, or None
    # when everything it reads comes through a shuffle.
    tasks: tuple[tuple[SourceRange, ...] | None, ...]
    # Exchanges whose output depends on the order of the source's partitions (a round-robin
    # or range exchange with the scan below it and no other exchange between).
    order_dependent: tuple[str, ...] = ()


def _by_index(i: int, ranges: tuple[SourceRange, ...] = ()) -> Unit:
    return Unit(i, f"task-{i}", str(i), i, ranges)


def decide(facts: PlanFacts) -> list[Unit]:
    if facts.order_dependent:
        raise UnsupportedPlan(
            f"the query's plan spreads the source's records over tasks by their order "
            f"({', '.join(facts.order_dependent)}), which a replayed batch does not keep; the "
            "exactly-once Kafka sink needs one task per source partition or a shuffle by key: "
            "drop REPARTITION(n) without columns, COALESCE or ORDER BY over the stream, or "
            "repartition by a column")
    n = len(facts.tasks)
    if n <= 1:  # one task reads the whole batch, in any order: its index names it, its ranges are all
        return [_by_index(0, facts.tasks[0] or ())] if n else []
    split: dict[int, list[SourceRange]] = {}
    for ranges in facts.tasks:
        if ranges is not None and len(ranges) > 1:
            raise UnsupportedPlan(
                f"a task of the query's plan reads {len(ranges)} source partitions without a "
                "shuffle (COALESCE or a union), grouped by the order a replayed batch does not "
                "keep; the exactly-once Kafka sink needs one task per source partition or a "
                "shuffle by key")
        if ranges:
            split.setdefault(ranges[0].partition, []).append(ranges[0])
    units = []
    for i, ranges in enumerate(facts.tasks):
        if not ranges:  # a shuffle's output, or a task with nothing to read
            units.append(_by_index(i))
            continue
        r = ranges[0]
        parts = sorted(split[r.partition], key=lambda x: x.start)
        name = str(r.partition) if len(parts) == 1 else f"{r.partition}.{parts.index(r)}"
        units.append(Unit(i, f"src-{name}", f"p{name}", r.partition, ranges, legacy_key=f"task-{i}",
                          parts=len(parts) if len(parts) > 1 else 0))
    return units


ONE_TASK_SUFFIX = "batch"  # the one-task unit's transactional.id suffix


def one_task_unit(facts: PlanFacts, units: list[Unit]) -> Unit | None:
    """The unit of ONE task writing a whole batch of a narrow plan, or None where the plan is
    not narrow (a shuffle's tasks keep their own) or one task reads it already.

    Where the job has one task slot the plan's tasks run one after another anyway, and each
    costs a fixed tens of milliseconds (Spark's scheduling, a transaction): one task does
    them together. The order it reads the partitions in does not matter, since it reads all;
    what its transaction writes is every covered unit's own marker, so a replay that has the
    plan's tasks run apart finds each of them written, exactly as if they had run apart."""
    covers = tuple(u for u in units if u.ranges)
    if len(covers) < 2 or any(t is None for t in facts.tasks):
        return None
    first = covers[0]
    return Unit(0, first.marker_key, ONE_TASK_SUFFIX, first.slot,
                tuple(r for u in covers for r in u.ranges), covers=covers)


def one_task_may_write(markers: Sequence[tuple[str | None, int] | None], query: str, batch: int) -> bool:
    """Whether the first batch of a run (maybe a replay) may be written by one task, from the
    last marker of each unit it covers ((query, batch), None if never written): only if none
    of them or all of them hold this batch. A previous run that wrote it task by task and
    stopped part way needs the tasks apart, each skipping what it finds written."""
    held = [m is not None and m[0] == query and m[1] == batch for m in markers]
    return all(held) or not any(held)


def legacy_may_hold(markers: Sequence[tuple[str | None, int] | None], query: str, batch: int) -> bool:
    """Whether the task-index sink may have written part of `batch` of `query`, from this sink's
    last marker of each of the batch's units ((query, batch), None if never written). That sink
    ran before this one on a pipeline, and this one's first batch of that sink's query is the
    only one it can share. So no once this sink wrote an earlier batch of the query, any batch
    of another query (a later checkpoint: the common case of a new query over a long commit
    topic, whose old markers are then never searched for), or all of this batch."""
    ours = [m for m in markers if m is not None and m[0] == query]
    if any(m is not None and m[0] != query for m in markers) or any(b < batch for _, b in ours):
        return False
    return len(ours) < len(markers)


def legacy_written(counts: Sequence[int], written: Sequence[int | None]) -> frozenset[int]:
    """The tasks of a replayed batch whose rows the task-index sink (before units were named by
    their source) already wrote, from its markers that hold this batch.

    `counts`: each task's rows in the replay; `written`: the `rows` of each of the old sink's
    markers for this batch (None if the marker has none). Its marker says "task i" of the first
    run, which read another partition than task i of the replay may (the order differs), so
    the index says nothing. The rows do: a unit's rows are a function of its source range, so
    a task the old sink wrote has the count of one of its markers. Where a count is shared by
    a written and an unwritten task, which one reached the sink is unknown: refuse rather than
    lose one and duplicate the other."""
    if not written:
        return frozenset()
    tasks = [i for i, n in enumerate(counts) if n > 0]
    if len(written) == len(tasks):  # every task with rows: none to tell apart
        return frozenset(tasks)
    if None in written:
        raise UnknownLegacyWrites(f"{len(written)} of the batch's {len(tasks)} tasks were written by a sink whose "
                                  "markers hold no row count")
    done: set[int] = set()
    for rows, k in sorted(Counter(written).items()):
        same = [i for i in tasks if counts[i] == rows]
        if k != len(same):
            raise UnknownLegacyWrites(f"{k} task(s) of {rows} rows were written and {len(same)} task(s) of the "
                                      f"replay have {rows} rows: which reached the sink is unknown")
        done.update(same)
    return frozenset(done)


# ----------------------------------------------------------------------------- py4j facts

def _name(obj) -> str:
    return obj.getClass().getSimpleName()


def _seq(seq) -> list:
    return [seq.apply(i) for i in range(seq.size())]


def _kafka_range(input_partition) -> SourceRange:
    if _name(input_partition) != "KafkaBatchInputPartition":
        raise UnsupportedPlan(f"the query reads a {_name(input_partition)}, not the Kafka source")
    r = input_partition.offsetRange()
    tp = r.topicPartition()
    return SourceRange(tp.topic(), tp.partition(), r.fromOffset(), r.untilOffset())


def _scan_inputs(rdd, index: int):
    """Source ranges task `index` of `rdd` reads, None if all through shuffles."""
    if _name(rdd) == "DataSourceRDD":
        part = rdd.partitions()[index].inputPartition()
        return () if part.isEmpty() else (_kafka_range(part.get()),)
    found, shuffled = [], False
    for dep in _seq(rdd.dependencies()):
        if _name(dep) == "ShuffleDependency":
            shuffled = True
            continue
        for parent in _seq(dep.getParents(index)):
            got = _scan_inputs(dep.rdd(), parent)
            if got is None:
                shuffled = True
            else:
                found.extend(got)
    if shuffled and found:
        raise UnsupportedPlan("a task of the query's plan reads both a shuffle and the source directly")
    return None if shuffled else tuple(found)


def _one_to_one_end(rdd):
    """Where a chain of one-to-one dependencies from `rdd` ends: ("scan", the DataSourceRDD),
    ("shuffle", None) at a single shuffle dependency, else (None, None)."""
    while _name(rdd) != "DataSourceRDD":
        deps = _seq(rdd.dependencies())
        if len(deps) != 1:
            return None, None
        if _name(deps[0]) == "ShuffleDependency":
            return "shuffle", None
        if _name(deps[0]) != "OneToOneDependency":
            return None, None
        rdd = deps[0].rdd()
    return "scan", rdd


def _order_dependent(plan) -> list[str]:
    """Round-robin or range exchanges with the scan below them and no other exchange between."""
    found = [k for child in _seq(plan.children()) for k in _order_dependent(child)]
    if _name(plan) == "ShuffleExchangeExec":
        kind = _name(plan.outputPartitioning())
        if kind in ("RoundRobinPartitioning", "RangePartitioning") and _scan_directly_below(plan):
            found.append(kind)
    return found


def _scan_directly_below(plan) -> bool:
    for child in _seq(plan.children()):
        if _name(child) == "MicroBatchScanExec":
            return True
        if _name(child) != "ShuffleExchangeExec" and _scan_directly_below(child):
            return True
    return False


def observe(rdd, plan) -> PlanFacts:
    """The facts of a batch: `rdd` is the Python RDD the tasks will run over (its partitions
    are the tasks), `plan` the batch's executed plan."""
    jrdd = rdd._jrdd.rdd()
    n = len(jrdd.partitions())
    # The common plans take one walk, not one per task: stateless (a scan) and stateful (a shuffle).
    end, scan = _one_to_one_end(jrdd)
    if end == "scan":
        tasks = tuple(_scan_inputs(scan, i) for i in range(n))
    elif end == "shuffle":
        tasks = (None,) * n
    else:
        tasks = tuple(_scan_inputs(jrdd, i) for i in range(n))
    return PlanFacts(tasks, tuple(_order_dependent(plan)))
